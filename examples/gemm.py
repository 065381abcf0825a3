"""Hopper GEMM, C = A @ B, as a ws-tune kernel file.

A is M x K (row-major); B is K x N ("row") or N x K ("col", i.e. B^T is
stored); C is M x N; fp16 or bf16 in, fp32 accumulate. One TMA producer warp
feeds a multi-versioned shared-memory pipeline; two consumer warpgroups issue
wgmma into a register accumulator and write C, directly from registers or
through shared memory and a TMA store. Its hand-written WSSchedule is the
seed that ws-tune varies; the contract is in ws_tuner/kernel.py.

``consumers``: "cooperative" is one consumer role of two warpgroups sharing
each block_M x block_N tile; "pingpong" is CUTLASS's
KernelTmaWarpSpecializedPingpong: two consumer roles of one warpgroup, each
with a block_M x block_N tile, accumulator and shared-memory pipeline of its
own (two roles cannot share a pipeline, so A and B are duplicated), taking
turns over whole K loops through a named barrier: consumer 1 runs its K loop
while consumer 0 writes its tile, so one's epilogue overlaps the other's
MMAs. A block covers two tiles stacked along M (the persistent kernel walks
such pairs, each consumer its half of each); the producer loads consumer 0's
tile, then consumer 1's, the order of the turns.

``mma="async"`` keeps one wgmma group in flight, as CUTLASS's
warp-specialized kernels do: issue the wgmma of k-block k, wait until the
one of k-1 is done, then free k-1's stage. A pipeline's wait and release
share one stage, and an async wgmma still reads its stage after the release
that follows its issue, so a second pipeline over a 4-byte token carries
the late release: the producer refills a stage only once it holds that
stage's token too, and the consumer frees the token one stage behind, after
the wait that retires the wgmma. In ping-pong each consumer has a token
pipeline of its own beside its A/B pipeline, and passes the turn on only
after its K loop's last wait<0>: the tile it hands over is complete. The
plain program (what tilelang's own lowerings build from it) does not know
this protocol: only the sync form is a fair input to them.

With ``epilogue="smem"`` the epilogue is two ops, registers -> shared
("stage_out") and a TMA store to global ("store_out"): in the persistent
kernel the schedule space may run the store in a warp of its own, so that it
overlaps the next tile's main loop.

    ws-tune examples/gemm.py --shape M=4096,N=4096,K=4096
"""

import tilelang.language as T

PROBLEM = {"M": None, "N": None, "K": None, "dtype": "float16", "b_layout": "row"}
CHOICES = {"dtype": ["float16", "bfloat16"], "b_layout": ["row", "col"]}
PARAMS = {
    "block_M": [64, 128, 192, 256],
    "block_N": [128, 256],
    "block_K": [64, 128],
    "swizzle": [0, 8],  # threadblock rasterization panel; 0 is row-major order
    "epilogue": ["direct", "smem"],  # C from registers, or staged in shared memory + TMA store
    "persistent": [False, True],  # one block per tile, or PERSISTENT_BLOCKS blocks walking the tiles
    "mma": ["sync", "async"],  # T.gemm (wgmma + wait<0>), or one wgmma group kept in flight
    "consumers": ["cooperative", "pingpong"],  # two warpgroups on one tile, or one each on its own tile, taking turns
    "split": ["square", "rows"],  # how the MMA spreads a cooperative tile over the warpgroups (see WARP_POLICY)
}
# The async form's stage protocol and the ping-pong turns live in the seed
# schedule alone: tilelang's own lowerings are built as baselines from the sync
# cooperative form only.
SCHEDULED_ONLY = {"mma": ["async"], "consumers": ["pingpong"]}
OUTPUTS = [2]
TOLERANCE = 1e-2
SEED_STAGES = 3
# Blocks of the persistent variant: one per SM of an H100/H200 SXM (132). The
# kernel is correct for any count; it is a grid size, not a device query, so
# that kernels build the same on a machine without a GPU.
PERSISTENT_BLOCKS = 132
SMEM_LIMIT = 227 * 1024
CONSUMER_NREG, PRODUCER_NREG = 232, 40  # 2 x 128 x 232 + 128 x 40 = 64,512 of the 64K-register pool
# Ping-pong: the named barriers of consumer 0's and consumer 1's turns
# (tilelang's own lowering uses the low ids), each shared by the two consumer
# warpgroups: the 128 threads of one arrive, the 128 of the other wait.
TURN_BARRIERS = (14, 15)
TURN_THREADS = 256
TOKEN_BYTES = 4  # the async form's token: one int32 per stage
# The async form frees a stage's token one k-block late: with one stage the producer
# would wait for a token that the consumer frees only after the next k-block's data,
# which the producer has yet to load (MaterializeWSSchedule reports the deadlock).
ASYNC_MIN_STAGES = 2
# ``split``: tilelang's warp partition of T.gemm / T.wgmma_gemm. "square" (its
# default) gives each of two warpgroups half of a 128x256 tile's columns, as two
# m64n128 wgmmas per k-step that each read the whole A slice; "rows" gives each
# its own 64 rows, one m64n256 wgmma that reads A once (CUTLASS's cooperative
# split): a sixth less shared memory read per k-step at the same tile. The plain
# program takes it too, so tilelang's own lowerings are built at both values.
WARP_POLICY = {"square": T.GemmWarpPolicy.Square, "rows": T.GemmWarpPolicy.FullRow}
REGISTER_OVERHEAD = 32  # per consumer thread beyond the accumulator (addresses, descriptors, loop state)


def _consumer_roles(params):
    return ["Consumer0", "Consumer1"] if params.get("consumers") == "pingpong" else ["Consumer"]


def check(problem, params, schedule):
    """Refuses tiles that do not divide the problem or split over the consumer
    warps, async schedules that break the token protocol, and ping-pong tiles
    that do not fit one warpgroup's registers or the SM's shared memory."""
    for dim in ("M", "N", "K"):
        block = params[f"block_{dim}"]
        if problem[dim] % block:
            return f"{dim}={problem[dim]} is not a multiple of block_{dim}={block}"
    if params.get("consumers") == "pingpong":
        if params.get("split") == "rows":
            return "split=rows spreads a cooperative tile; a ping-pong consumer is one warpgroup"
        return _pingpong_reason(problem, params, schedule)
    if schedule is not None:
        # T.gemm spreads the tile over the consumer's warps: m_warp (a multiple
        # of 4 for wgmma) times n_warp warps, each owning 16k rows and 8k columns.
        warps = max(role.warps for role in schedule.roles)
        bm, bn = params["block_M"], params["block_N"]
        splits = [warps] if params.get("split") == "rows" else range(4, warps + 1, 4)  # rows: every warp along M
        if not any(warps % m == 0 and bm % (16 * m) == 0 and bn % (8 * (warps // m)) == 0 for m in splits):
            return f"a {bm}x{bn} tile cannot be split over {warps} consumer warps"
        if params.get("mma") == "async":
            return _token_reason(schedule)
    return None


def _pingpong_reason(problem, params, schedule):
    """Ping-pong: two tiles per block, one warpgroup and pipelines of its own per consumer."""
    bm, bn, bk = params["block_M"], params["block_N"], params["block_K"]
    if problem["M"] % (2 * bm):
        return f"M={problem['M']} is not a multiple of 2 x block_M={2 * bm} (a ping-pong block covers two tiles along M)"
    # One warpgroup holds a whole fp32 accumulator: past the budget it spills (TILELANG-WS.md: about 5x slower).
    need = bm * bn // 128 + REGISTER_OVERHEAD
    budget = CONSUMER_NREG
    if schedule is not None:
        consumers = [r for r in schedule.roles if r.name in _consumer_roles(params)]
        if len(consumers) != 2:
            return "the schedule lacks the kernel's consumer roles"
        for role in consumers:
            if role.warps != 4:
                return f"a ping-pong turn is one warpgroup per consumer (a named barrier of {TURN_THREADS} threads); {role.name} has {role.warps} warps"
            budget = min(budget, role.max_nreg or min(255, 65536 // (32 * schedule.num_warps)))
    if need > budget:
        return f"a {bm}x{bn} fp32 accumulator in one warpgroup needs about {need} registers per thread, more than {budget}"
    # Shared memory at the schedule's depths; without one, at the fewest stages the
    # form needs (the seed takes as many as fit).
    fewest = _min_stages(params)
    depths = {b: p.depth for p in schedule.pipelines for b in p.buffers} if schedule is not None else {}
    itemsize = 2  # fp16 and bf16
    smem = sum(itemsize * (bm * bk * depths.get(f"A_shared{c}", fewest) + bk * bn * depths.get(f"B_shared{c}", fewest)) for c in (0, 1))
    if params.get("mma") == "async":
        smem += sum(TOKEN_BYTES * depths.get(f"token{c}", fewest) for c in (0, 1))
    if params["epilogue"] == "smem":
        smem += 2 * itemsize * bm * bn  # C_shared0, C_shared1
    if smem > SMEM_LIMIT:
        return f"{smem // 1024} KB of shared memory > {SMEM_LIMIT // 1024} KB"
    if params.get("mma") == "async" and schedule is not None:
        return _token_reason(schedule, 0) or _token_reason(schedule, 1)
    return None


def _min_stages(params):
    return ASYNC_MIN_STAGES if params.get("mma") == "async" else 1


def _pingpong_stages(params):
    """The ping-pong seed's depth: SEED_STAGES, or as many as fit (two consumers' pipelines share the SM)."""
    bm, bn, bk = params["block_M"], params["block_N"], params["block_K"]
    c_bytes = 2 * 2 * bm * bn if params["epilogue"] == "smem" else 0
    token = TOKEN_BYTES if params.get("mma") == "async" else 0
    fit = (SMEM_LIMIT - c_bytes) // (2 * (2 * (bm * bk + bk * bn) + token))
    return max(_min_stages(params), min(SEED_STAGES, fit))


def _token_reason(schedule, p=""):
    """The async protocol of one consumer (``p``: "" for the cooperative one, 0 or 1
    for a ping-pong one, the suffix of its buffers and K loop): its token in a
    pipeline of its own, waited for one stage after its A and B."""
    token, who = (("the token", "the consumer") if p == "" else (f"token{p}", f"Consumer{p}"))
    if any(f"token{p}" in q.buffers and len(q.buffers) > 1 for q in schedule.pipelines):
        return f"mma=async needs {token} in a pipeline of its own"
    stages = schedule.consumer_stages(f"loop_k{p}")
    if {stages.get(f"A_shared{p}"), stages.get(f"B_shared{p}")} != {stages.get(f"token{p}", 0) - 1}:
        return f"mma=async: {who} must free {token} one stage after A and B (it retires the wgmma that reads them)"
    if any(f"token{p}" in q.buffers and q.depth < ASYNC_MIN_STAGES for q in schedule.pipelines):
        return f"mma=async needs {token} in {ASYNC_MIN_STAGES} stages or more (freed one k-block late, one stage deadlocks)"
    return None


def kernel(problem, *, block_M, block_N, block_K, swizzle, epilogue, persistent, mma="sync", consumers="cooperative", split="square", stages=None, consumer_warps=8):
    M, N, K = problem["M"], problem["N"], problem["K"]
    dtype, accum = problem["dtype"], "float32"
    b_col = problem["b_layout"] == "col"
    b_shape = (N, K) if b_col else (K, N)
    b_tile = (block_N, block_K) if b_col else (block_K, block_N)
    smem_epilogue = epilogue == "smem"
    k_blocks = T.ceildiv(K, block_K)
    asynchronous = mma == "async"
    pingpong = consumers == "pingpong"
    policy = WARP_POLICY[split]
    params = {"block_M": block_M, "block_N": block_N, "block_K": block_K, "epilogue": epilogue, "mma": mma}
    if stages is None:
        stages = _pingpong_stages(params) if pingpong else SEED_STAGES
    pair_count = -(-M // (2 * block_M)) * -(-N // block_N)  # tile pairs of the ping-pong kernel

    def k_loop(A_shared, B_shared, token, p=""):
        """One consumer's K loop: its consumer and producer bodies and its pipelines,
        op and pipeline names suffixed with ``p`` as in ``tile``.

        Async: the consumer releases "smem" as soon as the wgmma is issued, but
        the producer may refill a stage only once it also holds the "token"
        of that stage, which the consumer releases one stage late, after the
        wait that retires the wgmma reading it (CUTLASS's order).
        """
        W, R = T.WSSync.consumer_wait, T.WSSync.consumer_release
        A, C = T.WSSync.producer_acquire, T.WSSync.producer_commit
        smem, tok = f"smem{p}", f"token{p}"
        pipelines = [T.WSPipeline(smem, [A_shared, B_shared], depth=stages)]
        if asynchronous:
            consumer = [W(smem, 0), f"mma{p}", R(smem, 0), W(tok, 1), f"retire{p}", R(tok, 1)]
            producer = [A(tok, 0), f"token{p}", C(tok, 0), A(smem, 0), f"load_A{p}", f"load_B{p}", C(smem, 0)]
            pipelines.append(T.WSPipeline(tok, [token], depth=stages))
        else:
            consumer = [W(smem, 0), f"mma{p}", R(smem, 0)]
            producer = [A(smem, 0), f"load_A{p}", f"load_B{p}", C(smem, 0)]
        return consumer, producer, pipelines

    def schedule(A_shared, B_shared, token):
        """The seed: one TMA producer warp after the consumer warpgroups, one pipeline (two when async)."""
        consumer, producer, pipelines = k_loop(A_shared, B_shared, token)
        loop_k = T.WSScope("loop_k", {"Consumer": consumer, "Producer": producer})
        store = ["stage_out", "store_out"] if smem_epilogue else ["store"]
        if persistent:  # each role walks the tiles itself; the producer runs ahead into the next tile
            scopes = [
                loop_k,
                T.WSScope("loop_tiles", {"Consumer": ["tile", "clear", "loop_k", *store, "next"], "Producer": ["tile", "loop_k", "next"]}),
                T.WSScope(T.WSScope.ROOT, {"Consumer": ["first", "loop_tiles"], "Producer": ["first", "loop_tiles"]}),
            ]
        else:
            scopes = [loop_k, T.WSScope(T.WSScope.ROOT, {"Consumer": ["clear", "loop_k", *store], "Producer": ["loop_k"]})]
        return T.WSSchedule(
            num_warps=consumer_warps + 4,
            roles=[
                T.WSRole("Consumer", warps_lo=0, warps_hi=consumer_warps, max_nreg=CONSUMER_NREG),
                T.WSRole("Producer", warps_lo=consumer_warps, warps_hi=consumer_warps + 1, max_nreg=PRODUCER_NREG),
            ],
            pipelines=pipelines,
            scopes=scopes,
        )

    def pingpong_schedule(buffers):
        """The ping-pong seed: consumer 0's K loop, then consumer 1's while consumer 0 writes its tile.

        ``buffers``: each consumer's (A_shared, B_shared, token). Each consumer
        waits for and frees stages of its own pipelines; the producer fills
        consumer 0's, then consumer 1's, the order of the turns. A consumer
        waits for its turn before its K loop and passes it on right after
        (async: after the loop's last wait<0>, its tile complete). One
        block per tile pair: consumer 0 takes the first turn without waiting and
        consumer 1 has none to pass on. Persistent: consumer 1 hands consumer 0
        its first turn ("start1") and each later one but the last, and the
        producer runs on into the next pair.
        """
        scopes, root, pipelines = [], {}, []
        for p, (A_shared, B_shared, token) in enumerate(buffers):
            consumer, producer, own = k_loop(A_shared, B_shared, token, p)
            scopes.append(T.WSScope(f"loop_k{p}", {f"Consumer{p}": consumer, "Producer": producer}))
            pipelines += own
            store = [f"stage_out{p}", f"store_out{p}"] if smem_epilogue else [f"store{p}"]
            turn = [f"turn{p}"] if persistent or p == 1 else []
            give = [f"pass{p}"] if persistent or p == 0 else []
            root[f"Consumer{p}"] = [f"clear{p}", *turn, f"loop_k{p}", *give, *store]
        root["Producer"] = ["loop_k0", "loop_k1"]
        if persistent:  # each role walks the tile pairs itself
            tile_bodies = {role: ["tile", *body, "next"] for role, body in root.items()}
            start = {role: ["first", *(["start1"] if role == "Consumer1" else []), "loop_tiles"] for role in tile_bodies}
            scopes += [T.WSScope("loop_tiles", tile_bodies), T.WSScope(T.WSScope.ROOT, start)]
        else:
            scopes.append(T.WSScope(T.WSScope.ROOT, root))
        group = consumer_warps // 2
        return T.WSSchedule(
            num_warps=consumer_warps + 4,
            roles=[
                T.WSRole("Consumer0", warps_lo=0, warps_hi=group, max_nreg=CONSUMER_NREG),
                T.WSRole("Consumer1", warps_lo=group, warps_hi=consumer_warps, max_nreg=CONSUMER_NREG),
                T.WSRole("Producer", warps_lo=consumer_warps, warps_hi=consumer_warps + 1, max_nreg=PRODUCER_NREG),
            ],
            pipelines=pipelines,
            scopes=scopes,
        )

    # An index expression is a Python helper, not an argument of the macro: an
    # expression argument would be bound, a statement of its own to be placed in every role.
    def first_row(bm, p):
        """First row of the tile: block row bm, or tile 2 bm + p of a ping-pong block's pair."""
        return bm * block_M if p == "" else (2 * bm + p) * block_M

    def tile(A, B, C, A_shared, B_shared, C_local, C_shared, token, bm, bn, p="", pairs=None):
        """One output tile: the pipelined K loop, then the epilogue. ``p`` suffixes
        the op ids: "" for the cooperative consumer, 0 or 1 for a ping-pong one;
        ``pairs`` is the persistent ping-pong kernel's tile-pair scheduler."""
        with T.ws_op(f"clear{p}"):
            T.clear(C_local)
        if p == 1 or (p == 0 and persistent):
            with T.ws_op(f"turn{p}"):  # wait for this consumer's turn at the tensor cores
                T.sync_threads(TURN_BARRIERS[p], TURN_THREADS)
        for k in T.Pipelined(k_blocks, num_stages=stages, annotations={T.WSID: f"loop_k{p}"}):
            T.copy(A[first_row(bm, p), k * block_K], A_shared, annotations={T.WSID: f"load_A{p}"})
            if b_col:
                T.copy(B[bn * block_N, k * block_K], B_shared, annotations={T.WSID: f"load_B{p}"})
            else:
                T.copy(B[k * block_K, bn * block_N], B_shared, annotations={T.WSID: f"load_B{p}"})
            if asynchronous:
                with T.ws_op(f"token{p}"):
                    token[0] = k
                T.wgmma_gemm(A_shared, B_shared, C_local, transpose_B=b_col, policy=policy, annotations={T.WSID: f"mma{p}"})
                # Retires the wgmma of k-block k. It reads the token (which holds k), so
                # the schedule runs it at the token's stage: after the next wgmma has
                # been issued. The last k-block has no next one: it waits for all. The
                # guards are on k, which the unrolled stages fold away; on the token's
                # value they would be data-dependent, and ptxas would then serialize
                # every wgmma (C7514).
                with T.ws_op(f"retire{p}"):
                    T.evaluate(token[0])
                    if k < k_blocks - 1:
                        T.wait_wgmma(1)
                    if k == k_blocks - 1:
                        T.wait_wgmma(0)
            else:
                T.gemm(A_shared, B_shared, C_local, transpose_B=b_col, policy=policy, annotations={T.WSID: f"mma{p}"})
        if p == 0:
            with T.ws_op("pass0"):  # consumer 0's MMAs are done: consumer 1's turn, under this epilogue
                T.named_barrier_arrive(TURN_BARRIERS[1], TURN_THREADS)
        if p == 1 and persistent:
            with T.ws_op("pass1"):  # consumer 0's turn in the block's next pair, if it has one: none is left over
                if pairs.linear_idx + PERSISTENT_BLOCKS < pair_count:
                    T.named_barrier_arrive(TURN_BARRIERS[0], TURN_THREADS)
        if smem_epilogue:  # two ops: the space may give the TMA store a role of its own
            T.copy(C_local, C_shared, annotations={T.WSID: f"stage_out{p}"})
            T.copy(C_shared, C[first_row(bm, p), bn * block_N], annotations={T.WSID: f"store_out{p}"})
        else:
            T.copy(C_local, C[first_row(bm, p), bn * block_N], annotations={T.WSID: f"store{p}"})

    tile = T.macro(tile)

    rows_per_block = 2 * block_M if pingpong else block_M  # ping-pong: a pair of tiles, stacked along M
    # One block per tile (pair), or PERSISTENT_BLOCKS blocks walking them.
    grid = (PERSISTENT_BLOCKS,) if persistent else (T.ceildiv(N, block_N), T.ceildiv(M, rows_per_block))

    @T.prim_func
    def gemm(A: T.Tensor((M, K), dtype), B: T.Tensor(b_shape, dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(*grid, threads=consumer_warps * 32) as launch:
            # Buffers take the names of the variables they are bound to: each consumer's their own.
            if pingpong:
                A_shared0 = T.alloc_shared((block_M, block_K), dtype)
                B_shared0 = T.alloc_shared(b_tile, dtype)
                C_local0 = T.alloc_fragment((block_M, block_N), accum)
                C_shared0 = T.alloc_shared((block_M, block_N), dtype)
                A_shared1 = T.alloc_shared((block_M, block_K), dtype)
                B_shared1 = T.alloc_shared(b_tile, dtype)
                C_local1 = T.alloc_fragment((block_M, block_N), accum)
                C_shared1 = T.alloc_shared((block_M, block_N), dtype)
                token0 = T.alloc_shared((1,), "int32") if asynchronous else None
                token1 = T.alloc_shared((1,), "int32") if asynchronous else None
            else:
                A_shared = T.alloc_shared((block_M, block_K), dtype)
                B_shared = T.alloc_shared(b_tile, dtype)
                C_local = T.alloc_fragment((block_M, block_N), accum)
                C_shared = T.alloc_shared((block_M, block_N), dtype)
                token = T.alloc_shared((1,), "int32") if asynchronous else None
            if persistent:  # ping-pong: consumer p writes tile 2 m + p of pair (m, n)
                tiles = T.PersistentTileScheduler(
                    T.ceildiv(M, rows_per_block), T.ceildiv(N, block_N), num_workers=PERSISTENT_BLOCKS,
                    swizzle_size=max(swizzle, 1), column_major=False, name="pairs" if pingpong else "tiles",
                )  # fmt: skip
            else:
                T.use_swizzle(panel_size=swizzle, enable=swizzle > 0)
            if pingpong:
                T.annotate_ws_schedule(pingpong_schedule([(A_shared0, B_shared0, token0), (A_shared1, B_shared1, token1)]))
            else:
                T.annotate_ws_schedule(schedule(A_shared, B_shared, token))
            if persistent:
                with T.ws_op("first"):
                    tiles.init(launch)
                if pingpong:
                    with T.ws_op("start1"):  # consumer 0's first turn, if the block has a pair at all
                        if tiles.valid():
                            T.named_barrier_arrive(TURN_BARRIERS[0], TURN_THREADS)
                with T.ws_op("loop_tiles"):
                    while tiles.valid():
                        with T.ws_op("tile"):
                            bm = tiles.m_idx
                            bn = tiles.n_idx
                        if pingpong:
                            tile(A, B, C, A_shared0, B_shared0, C_local0, C_shared0, token0, bm, bn, 0, tiles)
                            tile(A, B, C, A_shared1, B_shared1, C_local1, C_shared1, token1, bm, bn, 1, tiles)
                        else:
                            tile(A, B, C, A_shared, B_shared, C_local, C_shared, token, bm, bn)
                        with T.ws_op("next"):
                            tiles.next_tile()
            elif pingpong:
                tile(A, B, C, A_shared0, B_shared0, C_local0, C_shared0, token0, launch[1], launch[0], 0)
                tile(A, B, C, A_shared1, B_shared1, C_local1, C_shared1, token1, launch[1], launch[0], 1)
            else:
                tile(A, B, C, A_shared, B_shared, C_local, C_shared, token, launch[1], launch[0])

    return gemm


def inputs(problem, device):
    import torch

    dtype = getattr(torch, problem["dtype"])
    M, N, K = problem["M"], problem["N"], problem["K"]
    a = torch.randn(M, K, device=device, dtype=dtype)
    b = torch.randn(*((N, K) if problem["b_layout"] == "col" else (K, N)), device=device, dtype=dtype)
    c = torch.empty(M, N, device=device, dtype=dtype)
    return [a, b, c]


def reference(problem, args):
    a, b, _ = args
    return [a @ (b.T if problem["b_layout"] == "col" else b)]


def flops(problem):
    return 2.0 * problem["M"] * problem["N"] * problem["K"]


def vendors(problem):
    """cuBLAS: torch.matmul, which is also the reference."""
    return {"cublas": lambda args: reference(problem, args)}
