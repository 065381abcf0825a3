"""FlashAttention forward (Hopper), O = softmax(Q K^T / sqrt(D)) V, as a ws-tune kernel file.

Q, K, V and O are B x S x H x D ("BSHD"), fp16 or bf16, D in {64, 128},
optionally causal; softmax is online, in fp32 register fragments. One TMA
producer warp loads a block_M-row tile of Q once, then K and V block by
block through two pipelines; the consumers compute S = Q K^T, the online
softmax, and O += P V, and write O through shared memory with a TMA store.

The source is the plain program (what tilelang's own lowerings build); the
seed schedule reorders it as FlashAttention-3 does (``order="shifted"``): S
of block k, then the P V product of block k-1 (V consumed one stage behind
K), then the softmax of block k, then the rescale of O.

Kernel-side variants (PARAMS):
- ``mma``: "sync" is T.gemm (on Hopper a wgmma and its wait<0>); "async" is
  T.wgmma_gemm with separate T.wait_wgmma ops, so that the P V product of
  block k-1 runs under the softmax of block k; V's stage is released only
  after the wait that retires the wgmma reading it. (Only the seed's order
  makes the async waits right: the plain program is not a fair input to
  tilelang's own lowerings in this form.)
- ``persistent``: False launches one block per (query block, head, batch)
  tile; True launches PERSISTENT_BLOCKS blocks that walk the tiles, as
  examples/gemm.py's persistent form does: every role walks them itself, Q is
  loaded once per tile, the K/V pipelines run on across tiles, and the
  producer runs into the next tile (Q, then K and V) while the consumers
  store O. Tiles are numbered in launch order (query block fastest, causal
  ones longest first) and dealt out round by round, in reverse every other
  round, so that under causal masking each block's sum of work stays within
  a tile of the others' (dealing the same way every round leaves the block
  that draws the longest tiles 8-12% behind at B=4, H=16), while the blocks
  at work at one time share a few heads' K and V in L2.
- ``q_buffers`` (persistent only): the seed's Q pipeline depth. With 2 the
  producer loads the next tile's Q (and then K and V) while the consumers
  still work on this one. In the async form the loop's last step frees its V
  stage right after issuing the last P V product, so the P V op then retires
  that product itself (a wait guarded on the last block, at V's stage; under
  causal masking the extent depends on the tile, so the guard stays a test
  on every step) before the stage is freed; with one
  Q buffer (freed after the drain) the producer cannot get there first, and
  that op is left as it was. (H200 run 11: no faster, alone or with store.)
- ``exp``: "exp2" is exp2f, which tilelang compiles without --use_fast_math
  to ex2.approx.f32: ptxas wraps its MUFU.EX2 in a range test and two
  predicated multiplies, for denormal results. "ftz" is ex2.approx.ftz.f32
  (inline PTX, as exp2f is under --use_fast_math): the MUFU.EX2 alone,
  where the softmax's instruction issue is what the consumers wait on;
  probabilities below 2^-126 become 0. The plain program differs in this
  one function, so tilelang's own lowerings are built at both values.
  (H200 run 11: 0-3% faster; every winner used it.) "poly" moves part of
  the score tile's exponentials off the MUFU (16 per clock per SM, against
  128 FMAs), as FlashAttention-4 does: the columns c with
  (c // 8) % POLY_GROUPS == POLY_GROUPS - 1 (one in four) take 2^x =
  2^floor(x) * p(x - floor(x)), p a degree-3 minimax polynomial (relative
  error 8.6e-5, under fp16's half ulp of 4.9e-4), its integer part added
  into the float's exponent bits; the rest, and alpha, stay on ex2.approx.ftz.
  A thread's column groups c // 8 are its own register indices on the wgmma
  accumulator layout (see reduce), so the unrolled loop has the choice made
  per register at compile time.
- ``reduce``: the softmax's row max and row sum. "row" reduces each row's
  block_N scores with T.reduce_max / T.reduce_sum: per thread two sequential
  chains of block_N / 4, then a 4-lane shuffle all-reduce of both, every
  step. "lane" first reduces a (rows, block_N / 8, 8) view of the scores over
  its middle axis, into (rows, 8) partials: on the wgmma accumulator layout
  column c of a row is held by lane (c % 8) / 2 of its four, so this stays in
  the thread, as four chains of block_N / 32. The max is then all-reduced
  (it is needed at once); the sum is kept as per-thread partials of l, each
  rescaled by alpha, and all-reduced once, in the epilogue, as
  FlashAttention-3 does. Both are plain tile programs (on another layout
  "lane" is still right, only not cheaper), so tilelang's own lowerings are
  built at both values. (H200 run 12: +1% to +7.5% in the async form, -5% to
  +2% in the sync form; 7 of 8 winners used it.)
- ``store`` (persistent only): "consumer" is the consumers writing O through
  shared memory with a TMA store, and waiting for it, before the next tile;
  "role" splits that into registers -> shared on the consumers and the TMA
  store in a warp of its own ("Storer", beside the producer warp), over a
  pipeline of O, so that the consumers go straight on to the next tile.
  (H200 run 11: 2-4% slower than "consumer" with one Q buffer.)
- ``consumers``: "cooperative" is one consumer role of block_M / 64
  warpgroups sharing each K/V tile; "pingpong" is two consumer roles of one
  warpgroup, each with its own block_M / 2 rows, its own Q/K/V buffers and
  pipelines (two roles cannot share a pipeline), taking turns at the tensor
  cores through two named barriers so that the softmax of one overlaps the
  MMAs of the other, as FlashAttention-3's warp scheduler barriers do.
  "alternating" is the cooperative role whose warpgroups take such turns
  among themselves, round robin, over the shared K/V tile (what
  FlashAttention-3 itself does): each issues its MMAs of a step, then hands
  the turn to the next, and runs its softmax under theirs. The turn is a
  named barrier per warpgroup (ALTERNATING_BARRIERS), found from the
  thread's warpgroup index, so it holds wherever the role's warps are.
  (H200 run 15: 0.5-4% slower than cooperative in the async form. There
  the warpgroups already overlap the tensor pipe 82% busy, and the turns
  add instructions.)
- ``order`` (sync only): the seed's order of a step. "shifted" is
  FlashAttention-3's above; "plain" keeps the program's, S, softmax, then
  P V of the same block (V at K's stage). The shifted order keeps S of block
  k and P of block k-1 live together: three consumer warpgroups (block_M
  192) at D=128 cannot hold that in their 160 registers and spill (H200 run
  19: 390-410 TFLOP/s), while the plain order fits, as tilelang's own
  lowering of it does (592 there, its best D=128 kernel). The program is the
  same at both values, only the seed differs.

check() also refuses schedules that break this data flow, which
MaterializeWSSchedule's verifier does not track.

    ws-tune examples/attention.py --shape B=4,H=16,S=4096,D=128,causal=0
"""

import math

import tilelang.language as T

PROBLEM = {"B": None, "H": None, "S": None, "D": 128, "dtype": "float16", "causal": 0}
CHOICES = {"D": [64, 128], "dtype": ["float16", "bfloat16"], "causal": [0, 1]}
PARAMS = {
    "block_M": [64, 128, 192],  # query rows per block (all consumers together)
    "block_N": [64, 128],  # key rows per step of the K/V loop
    "stages": [1, 2],  # K/V buffer versions of the seed (and of tilelang's own lowerings)
    "mma": ["sync", "async"],
    "consumers": ["cooperative", "alternating", "pingpong"],
    "persistent": [False, True],  # one block per tile, or PERSISTENT_BLOCKS blocks walking the tiles
    "q_buffers": [1, 2],  # persistent: the seed's Q pipeline depth (2: the next tile's Q loads under this one)
    "store": ["consumer", "role"],  # persistent: who writes O to global memory (see the module docstring)
    "exp": ["exp2", "ftz", "poly"],  # the softmax's exponential: exp2f, ex2.approx.ftz (one MUFU.EX2, no denormal path), or ftz with 1/4 on the FMA pipe
    "reduce": ["row", "lane"],  # the softmax's row max and sum: whole rows each step, or per-lane partials first (sum deferred)
    "order": ["shifted", "plain"],  # sync: the seed's step, P V one block behind (FlashAttention-3) or the program's own
}
# Async waits and ping-pong turns are right only in the seed's order (tilelang's
# own lowerings of them deadlock or fail to build): baselines use the rest. The
# persistent form is right in the plain order too: role_based builds it, the
# default lowering fails to ("ProducerConsumerWS: failed to replace pipeline
# loop"), which costs a baseline its build only. order="plain" is the same program
# as "shifted" (only the seed differs): its baselines are those built there.
SCHEDULED_ONLY = {"mma": ["async"], "consumers": ["alternating", "pingpong"], "order": ["plain"]}
OUTPUTS = [3]
TOLERANCE = 1e-2
ROWS_PER_WARPGROUP = 64  # one wgmma covers 64 rows; the softmax keeps each row inside one warp
SMEM_LIMIT = 227 * 1024
# Named barriers of the ping-pong turns (tilelang's own lowering uses the low
# ids), each shared by the two consumer warpgroups.
TURN_BARRIERS = (14, 15)
TURN_THREADS = 256
# consumers="alternating": warpgroup g of the role waits at ALTERNATING_BARRIERS[g] (up to three).
ALTERNATING_BARRIERS = (13, 14, 15)
LOG2E = 1.4426950408889634
# Blocks of the persistent variant: one per SM of an H100/H200 SXM (132), as in
# examples/gemm.py; a grid size, not a device query, so that kernels build the
# same on a machine without a GPU. The kernel is correct for any count.
PERSISTENT_BLOCKS = 132
# exp="ftz": the exponential as the one PTX instruction exp2f becomes under --use_fast_math.
EX2_FTZ = "ws_tune_ex2_ftz"
EX2_FTZ_SOURCE = f"""
__device__ __forceinline__ float {EX2_FTZ}(float x) {{
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}}
"""
# exp="poly": 2^x on the FMA pipe for the score columns c with (c // 8) % POLY_GROUPS ==
# POLY_GROUPS - 1. EX2_POLY_COEFFS are p(f) ~ 2^f on [0, 1], p(0) = 1, minimax in relative
# error (weighted Remez, rounded to fp32): at most 8.6e-5 (tests/engine/test_example_kernels.py
# emulates the function below). Adding 1.5 * 2^23 rounding down leaves floor(x) in the low
# mantissa bits (ulp 1 there); shifted left by 23 they are floor(x) in the exponent field
# (two's complement: the higher bits fall off), added to p's. x is clamped at -127 so that
# -inf (masked keys) gives 0; scores are max-subtracted, x <= 0, and x in (-127, -126) gives
# a denormal below 2^-126 rather than 2^x: nothing next to the row's maximum, which is 1.
POLY_GROUPS = 4
EX2_POLY = "ws_tune_ex2_poly"
EX2_POLY_COEFFS = (1.0, 0.6951167583465576, 0.22764499485492706, 0.07706703990697861)
EX2_POLY_SOURCE = f"""
__device__ __forceinline__ float {EX2_POLY}(float x) {{
  const float round_shift = 12582912.0f;  // 1.5 * 2^23
  x = fmaxf(x, -127.0f);
  float shifted = __fadd_rd(x, round_shift);  // round_shift + floor(x), exactly
  float f = x - (shifted - round_shift);  // in [0, 1), exactly
  float p = fmaf(fmaf(fmaf({EX2_POLY_COEFFS[3]!r}f, f, {EX2_POLY_COEFFS[2]!r}f), f, {EX2_POLY_COEFFS[1]!r}f), f, {EX2_POLY_COEFFS[0]!r}f);
  return __int_as_float(__float_as_int(p) + (__float_as_int(shifted) << 23));
}}
"""
# reduce="lane": a row's block_N scores seen as (block_N // LANE_COLUMNS, LANE_COLUMNS); on
# the Hopper wgmma (and mma.sync) accumulator layout, column c of a row is held by lane
# (c % 8) // 2 of that row's four, so reducing over c // 8 stays inside one thread.
LANE_COLUMNS = 8
REGISTER_OVERHEAD = 32  # per consumer thread beyond the fragments (indices, descriptors, row state)


def _consumer_roles(params):
    return ["Consumer0", "Consumer1"] if params["consumers"] == "pingpong" else ["Consumer"]


def check(problem, params, schedule):
    """Refuses tiles that do not divide the problem or fit the SM, and schedules
    that break the kernel's data flow (which the verifier does not track)."""
    D = problem["D"]
    bm, bn = params["block_M"], params["block_N"]
    pingpong = params["consumers"] == "pingpong"
    rows = bm // 2 if pingpong else bm  # rows of one consumer role
    if rows % ROWS_PER_WARPGROUP:
        return f"a consumer role's {rows} rows are not whole warpgroup MMAs of {ROWS_PER_WARPGROUP}"
    groups = rows // ROWS_PER_WARPGROUP
    alternating = params["consumers"] == "alternating"
    if alternating and not 2 <= groups <= len(ALTERNATING_BARRIERS):
        return f"alternating turns need 2 to {len(ALTERNATING_BARRIERS)} consumer warpgroups, not {groups}"
    itemsize = 2
    copies = 2 if pingpong else 1  # ping-pong duplicates every buffer
    q_buffers = params.get("q_buffers", 1)
    store_role = params.get("store", "consumer") == "role"
    plain = params.get("order", "shifted") == "plain"
    if plain and params["mma"] == "async":
        return "order=plain is the sync form: the async waits retire S of a block under the P V product of the one before, issued after it"
    if not params.get("persistent") and (q_buffers > 1 or store_role):
        return "q_buffers > 1 and store=role only serve a persistent kernel (one tile per block has nothing to overlap)"
    smem = copies * itemsize * D * (q_buffers * rows + 2 * bn * params["stages"] + rows)  # Q, K, V, O
    if smem > SMEM_LIMIT:
        return f"{smem // 1024} KB of shared memory > {SMEM_LIMIT // 1024} KB"
    if schedule is not None:
        stages = schedule.consumer_stages("loop_k")
        for p in range(len(_consumer_roles(params))):
            if any({f"K_{p}", f"V_{p}"} <= set(pipe.buffers) for pipe in schedule.pipelines):
                return f"K_{p} and V_{p} share a pipeline: the P V product of a block would wait for the next K"
            # Shifted: S of block k, then P V of block k-1; plain: P V of block k. Right only so.
            if f"K_{p}" in stages and stages.get(f"V_{p}") != stages[f"K_{p}"] + (0 if plain else 1):
                where = f"at K_{p}'s stage (order=plain: P V of the same block)" if plain else f"one stage after K_{p} (P V of the previous block)"
                return f"V_{p} must be consumed {where}"
            # The loop's last step frees its V stage right after issuing the async P V
            # product (the drain's wait comes after the loop). A single Q buffer, freed
            # after the drain, keeps a persistent producer from loading the next tile's
            # V into that stage first; with two the producer runs ahead and does (run 10
            # measured 14x the error: 4e-3 against 3e-4, under the tolerance).
            q_depth = max((pipe.depth for pipe in schedule.pipelines if f"Q_{p}" in pipe.buffers), default=1)
            # q_buffers=2 has the P V op retire the last product itself, before its stage is freed.
            if params.get("persistent") and params["mma"] == "async" and q_depth > 1 and q_buffers < 2:
                return f"a persistent async kernel needs Q_{p} in one buffer, not {q_depth} (or q_buffers=2): the next tile's V would overwrite a stage the last P V product still reads"
        if store_role:
            # stage_out reads this tile's O accumulator, which the next tile's init clears:
            # its span of the O pipeline must be at Q's stage, in the same tile.
            tile_stages = {i.pipeline: i.stage for s in schedule.scopes if s.id == "loop_tiles" for r, body in s.bodies
                           if r in _consumer_roles(params) for i in body if hasattr(i, "pipeline")}  # fmt: skip
            for p in range(len(_consumer_roles(params))):
                if tile_stages.get(f"o{p}", 0) != tile_stages.get(f"q{p}", 0):
                    return f"stage_out{p} must stay in its own tile: o{p} at stage {tile_stages.get(f'o{p}', 0)}, q{p} at {tile_stages.get(f'q{p}', 0)}"
        consumers = [r for r in schedule.roles if r.name in _consumer_roles(params)]
        if len(consumers) != len(_consumer_roles(params)):
            return "the schedule lacks the kernel's consumer roles"
        for role in consumers:
            # FullRow: whole warpgroups, 16 rows (or a multiple) per warp.
            if role.warps % 4 or rows % (16 * role.warps):
                return f"{rows} rows cannot be split over {role.warps} warps of role {role.name}"
            if pingpong and role.warps != 4:
                return f"a ping-pong turn is one warpgroup per consumer (named barriers of {TURN_THREADS} threads); {role.name} has {role.warps} warps"
            if alternating and role.warps != 4 * groups:
                return f"alternating turns pass among the kernel's {groups} warpgroups; {role.name} has {role.warps} warps"
            # Registers per thread: the fp32 O and S accumulators and, in the shifted order,
            # the previous block's P (fp16) beside them (in the plain order P replaces S), plus
            # addresses and softmax state; past the budget they spill (several times slower).
            live_p = 0 if plain else rows * bn // 2
            need = (rows * D + rows * bn + live_p) // (32 * role.warps) + REGISTER_OVERHEAD
            budget = role.max_nreg or min(255, 65536 // (32 * schedule.num_warps))
            if need > budget:
                return f"role {role.name} needs about {need} registers per thread, more than its {budget}"
    return None


class Part:
    """The buffers of one consumer role. Read as attributes, they bind no new
    names in the kernel; and the schedule refers to buffers by name."""

    FIELDS = ("Q", "K", "V", "O", "S", "P", "acc", "m", "m_prev", "alpha", "row_sum", "l", "S_lanes", "lanes", "l_lanes")

    def __init__(self, index, *buffers):
        self.index = index
        for name, buf in zip(self.FIELDS, buffers, strict=True):
            setattr(self, name, buf)


def kernel(problem, *, block_M, block_N, stages, mma, consumers, persistent=False, q_buffers=1, store="consumer", exp="exp2", reduce="row", order="shifted"):
    B, H, S, D = problem["B"], problem["H"], problem["S"], problem["D"]
    dtype, accum = problem["dtype"], "float32"
    causal = bool(problem["causal"])
    asynchronous = mma == "async"
    pingpong = consumers == "pingpong"
    alternating = consumers == "alternating"
    rows = block_M // 2 if pingpong else block_M  # query rows of one consumer role
    groups = rows // ROWS_PER_WARPGROUP  # warpgroups of one consumer role
    consumer_warps = block_M // 16
    ftz = exp == "ftz"
    poly = exp == "poly"
    lanes = reduce == "lane"
    scale = LOG2E / math.sqrt(D)

    def exponential(x):
        return T.call_extern("float32", EX2_FTZ, x) if ftz or poly else T.exp2(x)

    def score_exponential(x, j):
        """The exponential of score column j: with exp="poly" one column group in POLY_GROUPS on the FMA pipe."""
        if not poly:
            return exponential(x)
        on_fma = (j // LANE_COLUMNS) % POLY_GROUPS == POLY_GROUPS - 1
        return T.if_then_else(on_fma, T.call_extern("float32", EX2_POLY, x), exponential(x))
    shape = (B, S, H, D)
    # Tails: TMA zero-fills the rows a load reads past S and drops those a store
    # writes there; keys past S are masked (causal masks them anyway).
    m_blocks = -(-S // block_M)
    n_blocks = -(-S // block_N)
    key_tail = S % block_N and not causal
    roles = _consumer_roles({"consumers": consumers})
    gemm = T.wgmma_gemm if asynchronous else T.gemm
    retire_last = asynchronous and persistent and q_buffers > 1  # the P V op retires the last block's product
    store_role = store == "role"

    # Index expressions are Python helpers, not bindings in the kernel: a
    # binding would be a statement of its own, to be placed in every role.
    def block_row(bx, p):
        """First query row of consumer p; causal blocks launch the last rows (the most work) first."""
        return ((m_blocks - 1 - bx) if causal else bx) * block_M + p * rows

    def loop_extent(bx):
        # Causal: key blocks up to the block's last row.
        return T.min(T.ceildiv(block_row(bx, 0) + block_M, block_N), n_blocks) if causal else n_blocks

    def group():
        """The thread's warpgroup within its role (roles are whole warpgroups; the index wraps wherever the role starts)."""
        return T.get_warp_group_idx() % groups

    def schedule(parts):
        """The seed: a TMA producer warp after the consumer warpgroups; Q once, K and V per step."""
        W, R = T.WSSync.consumer_wait, T.WSSync.consumer_release
        A, C = T.WSSync.producer_acquire, T.WSSync.producer_commit
        loop_bodies, root_bodies = {}, {}
        producer_loop, producer_root, storer_root = [], [], []
        for p, role in enumerate(roles):
            k, v, q = f"k{p}", f"v{p}", f"q{p}"  # this consumer's pipelines

            def ops(*names):
                return [f"{name}{p}" for name in names]

            turn, give = (ops("turn"), ops("pass")) if pingpong or alternating else ([], [])
            mask = ops("mask") if causal or key_tail else []
            # S of block k, then P V of block k-1 (V one stage behind K), so that the
            # softmax of block k overlaps that product; then O is rescaled.
            if asynchronous:  # each wgmma retired by a wait before its stage is freed
                body = [W(k, 0), *ops("qk"), W(v, 1), *ops("pv"), *give, *ops("wait_s"), R(k, 0), *mask,
                        *ops("softmax", "wait_o"), R(v, 1), *ops("rescale")]  # fmt: skip
            elif order == "plain":  # the program's own order
                body = [W(k, 0), *ops("qk"), R(k, 0), *give, *mask, *ops("softmax", "rescale"), W(v, 0), *ops("pv"), R(v, 0)]
            else:
                body = [W(k, 0), *ops("qk"), R(k, 0), W(v, 1), *ops("pv"), R(v, 1), *give, *mask, *ops("softmax", "rescale")]
            loop_bodies[role] = turn + body
            # Consumer 0 (warpgroup 0) takes the first turn, given by the last.
            start = ["start1"] if pingpong and p == 1 else ["start0"] if alternating else []
            drain = ops("drain") if asynchronous else []
            # Q is freed after the drain: a persistent producer loads the next
            # tile's K and V only once it holds Q again, so the last P V product
            # (whose V stage the loop's last step has released) is retired first.
            if store_role:  # registers -> shared here, the TMA store in the Storer warp
                o = f"o{p}"
                epilogue_ops = [A(o, 0), *ops("stage_out"), C(o, 0)]
                storer_root += [W(o, 0), *ops("store_out"), R(o, 0)]
            else:
                epilogue_ops = ops("store")
            root_bodies[role] = [W(q, 0), *ops("init"), *start, "loop_k", *drain, R(q, 0), *epilogue_ops]
            producer_root += [A(q, 0), *ops("load_q"), C(q, 0)]
            producer_loop += [A(k, 0), *ops("load_k"), C(k, 0), A(v, 0), *ops("load_v"), C(v, 0)]
        loop_bodies["Producer"] = producer_loop
        root_bodies["Producer"] = producer_root + ["loop_k"]
        if store_role:
            root_bodies["Storer"] = storer_root
        warps = consumer_warps // len(roles)
        nreg = 240 if consumer_warps <= 8 else 160  # the 64K-register pool, shared with the producer's warpgroup
        ws_roles = [T.WSRole(role, warps_lo=p * warps, warps_hi=(p + 1) * warps, max_nreg=nreg) for p, role in enumerate(roles)]
        ws_roles.append(T.WSRole("Producer", warps_lo=consumer_warps, warps_hi=consumer_warps + 1, max_nreg=24))
        if store_role:  # the producer's warpgroup, so the same register budget
            ws_roles.append(T.WSRole("Storer", warps_lo=consumer_warps + 1, warps_hi=consumer_warps + 2, max_nreg=24))
        pipelines = []
        for part in parts:
            p = part.index
            pipelines += [T.WSPipeline(f"q{p}", [part.Q], depth=q_buffers), T.WSPipeline(f"k{p}", [part.K], depth=stages),
                          T.WSPipeline(f"v{p}", [part.V], depth=stages)]  # fmt: skip
            if store_role:
                pipelines.append(T.WSPipeline(f"o{p}", [part.O], depth=1))
        scopes = [T.WSScope("loop_k", loop_bodies)]
        if persistent:  # each role walks the tiles itself; the producer runs ahead into the next tile
            tile_bodies = {role: ["tile", *body, "next"] for role, body in root_bodies.items()}
            scopes += [T.WSScope("loop_tiles", tile_bodies), T.WSScope(T.WSScope.ROOT, {role: ["first", "loop_tiles"] for role in tile_bodies})]
        else:
            scopes.append(T.WSScope(T.WSScope.ROOT, root_bodies))
        return T.WSSchedule(num_warps=consumer_warps + 4, roles=ws_roles, pipelines=pipelines, scopes=scopes)

    def alloc():
        return (
            T.alloc_shared((rows, D), dtype),  # Q
            T.alloc_shared((block_N, D), dtype),  # K
            T.alloc_shared((block_N, D), dtype),  # V
            T.alloc_shared((rows, D), dtype),  # O, staged for the TMA store
            T.alloc_fragment((rows, block_N), accum),  # S
            T.alloc_fragment((rows, block_N), dtype),  # P
            T.alloc_fragment((rows, D), accum),  # O accumulator
            T.alloc_fragment((rows,), accum),  # running max
            T.alloc_fragment((rows,), accum),  # previous max
            T.alloc_fragment((rows,), accum),  # rescale factor of O and l
            T.alloc_fragment((rows,), accum),  # row sums of P
            T.alloc_fragment((rows,), accum),  # running sum l
            T.alloc_fragment((rows, LANE_COLUMNS), accum),  # reduce="lane": a row's max or sum per column class
            T.alloc_fragment((rows, LANE_COLUMNS), accum),  # reduce="lane": the running sum per column class
        )

    @T.macro
    def prologue(Q, part, bx, by, bz):
        p = part.index
        T.copy(Q[bz, block_row(bx, p) : block_row(bx, p) + rows, by, :], part.Q, annotations={T.WSID: f"load_q{p}"})
        with T.ws_op(f"init{p}"):
            T.fill(part.acc, 0)
            if lanes:
                T.fill(part.l_lanes, 0)
            else:
                T.fill(part.l, 0)
            T.fill(part.m, -T.infinity(accum))

    @T.macro
    def step(K, V, part, k, bx, by, bz):
        """One K/V block for one consumer, in the plain program's order (what
        tilelang's own lowerings build); the schedule reorders it."""
        p = part.index
        T.copy(K[bz, k * block_N : (k + 1) * block_N, by, :], part.K, annotations={T.WSID: f"load_k{p}"})
        T.copy(V[bz, k * block_N : (k + 1) * block_N, by, :], part.V, annotations={T.WSID: f"load_v{p}"})
        if pingpong:
            with T.ws_op(f"turn{p}"):  # wait for this consumer's turn at the tensor cores
                T.sync_threads(TURN_BARRIERS[p], TURN_THREADS)
        elif alternating:
            with T.ws_op(f"turn{p}"):  # wait for this warpgroup's turn
                T.sync_threads(ALTERNATING_BARRIERS[0] + group(), TURN_THREADS)
        gemm(part.Q, part.K, part.S, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow, annotations={T.WSID: f"qk{p}"})
        if pingpong:
            with T.ws_op(f"pass{p}"):  # hand the turn over
                if p == 0:
                    T.named_barrier_arrive(TURN_BARRIERS[1], TURN_THREADS)
                else:  # consumer 0 took the first turn: none is left over at the end
                    if k < loop_extent(bx) - 1:
                        T.named_barrier_arrive(TURN_BARRIERS[0], TURN_THREADS)
        elif alternating:
            with T.ws_op(f"pass{p}"):  # to the next warpgroup, round robin; the last keeps its final turn
                if group() < groups - 1 or k < loop_extent(bx) - 1:
                    T.named_barrier_arrive(ALTERNATING_BARRIERS[0] + (group() + 1) % groups, TURN_THREADS)
        if asynchronous:
            # S of this block is done; the P V product issued after it may still run.
            with T.ws_op(f"wait_s{p}"):
                if k == 0:
                    T.wait_wgmma(0)
                if k > 0:
                    T.wait_wgmma(1)
        if causal:
            with T.ws_op(f"mask{p}"):
                if (k + 1) * block_N > block_row(bx, p):  # only blocks that reach past the diagonal
                    for i, j in T.Parallel(rows, block_N):
                        part.S[i, j] = T.if_then_else(block_row(bx, p) + i >= k * block_N + j, part.S[i, j], -T.infinity(accum))
        elif key_tail:
            with T.ws_op(f"mask{p}"):
                if k == n_blocks - 1:  # keys past S
                    for i, j in T.Parallel(rows, block_N):
                        part.S[i, j] = T.if_then_else(k * block_N + j < S, part.S[i, j], -T.infinity(accum))
        with T.ws_op(f"softmax{p}"):
            T.copy(part.m, part.m_prev)
            if lanes:  # chains of block_N // 32, not block_N // 4, and no cross-thread sum here
                T.reduce_max(part.S_lanes, part.lanes, dim=1)
                T.reduce_max(part.lanes, part.m, dim=1, clear=False)
            else:
                T.reduce_max(part.S, part.m, dim=1, clear=False)
            for i in T.Parallel(rows):
                part.alpha[i] = exponential(part.m_prev[i] * scale - part.m[i] * scale)
            for i, j in T.Parallel(rows, block_N):
                part.S[i, j] = score_exponential(part.S[i, j] * scale - part.m[i] * scale, j)
            if lanes:  # l stays split by column class until the epilogue
                T.reduce_sum(part.S_lanes, part.lanes, dim=1)
                for i, c in T.Parallel(rows, LANE_COLUMNS):
                    part.l_lanes[i, c] = part.l_lanes[i, c] * part.alpha[i] + part.lanes[i, c]
            else:
                T.reduce_sum(part.S, part.row_sum, dim=1)
                for i in T.Parallel(rows):
                    part.l[i] = part.l[i] * part.alpha[i] + part.row_sum[i]
        if asynchronous:
            with T.ws_op(f"wait_o{p}"):
                T.wait_wgmma(0)  # the P V product that reads P and accumulates O
        with T.ws_op(f"rescale{p}"):
            for i, j in T.Parallel(rows, D):
                part.acc[i, j] *= part.alpha[i]
            T.copy(part.S, part.P)
        if retire_last:
            # One op at V's stage: the last block's product is retired before the
            # schedule frees its V stage, which the producer may refill at once.
            with T.ws_op(f"pv{p}"):
                gemm(part.P, part.V, part.acc, policy=T.GemmWarpPolicy.FullRow)
                if k == loop_extent(bx) - 1:
                    T.wait_wgmma(0)
        else:
            gemm(part.P, part.V, part.acc, policy=T.GemmWarpPolicy.FullRow, annotations={T.WSID: f"pv{p}"})

    @T.macro
    def epilogue(Output, part, bx, by, bz):
        p = part.index
        if asynchronous:
            # The last P V product. In the seed its V stage is released before
            # this wait; harmless, as the producer loads nothing after it (or,
            # persistent, nothing before Q is freed, after this wait: check()).
            with T.ws_op(f"drain{p}"):
                T.wait_wgmma(0)
        if store_role:  # two ops: the TMA store runs in the Storer warp
            with T.ws_op(f"stage_out{p}"):
                if lanes:
                    T.reduce_sum(part.l_lanes, part.l, dim=1)
                for i, j in T.Parallel(rows, D):
                    part.acc[i, j] /= part.l[i]
                T.copy(part.acc, part.O)
            T.copy(part.O, Output[bz, block_row(bx, p) : block_row(bx, p) + rows, by, :], annotations={T.WSID: f"store_out{p}"})
        else:
            with T.ws_op(f"store{p}"):
                if lanes:
                    T.reduce_sum(part.l_lanes, part.l, dim=1)
                for i, j in T.Parallel(rows, D):
                    part.acc[i, j] /= part.l[i]
                T.copy(part.acc, part.O)
                T.copy(part.O, Output[bz, block_row(bx, p) : block_row(bx, p) + rows, by, :])

    @T.macro
    def tile(Q, K, V, Output, parts, bx, by, bz):
        """One tile: query block bx of head by, batch bz."""
        prologue(Q, parts[0], bx, by, bz)
        if pingpong:
            prologue(Q, parts[1], bx, by, bz)
            with T.ws_op("start1"):
                T.named_barrier_arrive(TURN_BARRIERS[0], TURN_THREADS)
        elif alternating:
            with T.ws_op("start0"):
                if group() == groups - 1:
                    T.named_barrier_arrive(ALTERNATING_BARRIERS[0], TURN_THREADS)
        for k in T.Pipelined(loop_extent(bx), num_stages=stages, annotations={T.WSID: "loop_k"}):
            step(K, V, parts[0], k, bx, by, bz)
            if pingpong:
                step(K, V, parts[1], k, bx, by, bz)
        epilogue(Output, parts[0], bx, by, bz)
        if pingpong:
            epilogue(Output, parts[1], bx, by, bz)

    tiles = m_blocks * H * B

    def tile_index(round_, block):
        """The tile a block takes in a round: dealt in reverse every other round (see the module docstring)."""
        return round_ * PERSISTENT_BLOCKS + T.if_then_else(round_ % 2 == 0, block, PERSISTENT_BLOCKS - 1 - block)

    grid = (PERSISTENT_BLOCKS,) if persistent else (m_blocks, H, B)  # blocks walking the tiles, or one per tile

    @T.prim_func
    def attention(
        Q: T.Tensor(shape, dtype),
        K: T.Tensor(shape, dtype),
        V: T.Tensor(shape, dtype),
        Output: T.Tensor(shape, dtype),
    ):
        with T.Kernel(*grid, threads=consumer_warps * 32) as launch:
            # Buffers take the names of the variables they are bound to (in the
            # prim_func itself, not a helper): each consumer's their own.
            Q_0, K_0, V_0, O_0, S_0, P_0, acc_0, m_0, m_prev_0, alpha_0, row_sum_0, l_0, lanes_0, l_lanes_0 = alloc()
            S_lanes_0 = T.reshape(S_0, (rows, block_N // LANE_COLUMNS, LANE_COLUMNS))  # column c = 8 (c // 8) + c % 8
            parts = [Part(0, Q_0, K_0, V_0, O_0, S_0, P_0, acc_0, m_0, m_prev_0, alpha_0, row_sum_0, l_0, S_lanes_0, lanes_0, l_lanes_0)]
            if pingpong:
                Q_1, K_1, V_1, O_1, S_1, P_1, acc_1, m_1, m_prev_1, alpha_1, row_sum_1, l_1, lanes_1, l_lanes_1 = alloc()
                S_lanes_1 = T.reshape(S_1, (rows, block_N // LANE_COLUMNS, LANE_COLUMNS))
                parts.append(Part(1, Q_1, K_1, V_1, O_1, S_1, P_1, acc_1, m_1, m_prev_1, alpha_1, row_sum_1, l_1, S_lanes_1, lanes_1, l_lanes_1))
            if persistent:
                round_ = T.alloc_var("int32")
            if ftz:
                T.import_source(EX2_FTZ_SOURCE)
            elif poly:  # both functions, in one import_source
                T.import_source(EX2_FTZ_SOURCE + EX2_POLY_SOURCE)
            T.annotate_ws_schedule(schedule(parts))
            if persistent:
                with T.ws_op("first"):
                    round_ = 0
                with T.ws_op("loop_tiles"):
                    while tile_index(round_, launch) < tiles:
                        with T.ws_op("tile"):  # launch order: query block fastest, then head, then batch
                            t = tile_index(round_, launch)
                            bx = t % m_blocks
                            by = t // m_blocks % H
                            bz = t // (m_blocks * H)
                        tile(Q, K, V, Output, parts, bx, by, bz)
                        with T.ws_op("next"):
                            round_ = round_ + 1
            else:
                tile(Q, K, V, Output, parts, *launch)

    return attention


def _bhsd(t):
    return t.transpose(1, 2)  # a view: SDPA takes B x H x S x D


def inputs(problem, device):
    import torch

    dtype = getattr(torch, problem["dtype"])
    shape = (problem["B"], problem["S"], problem["H"], problem["D"])
    q, k, v = (torch.randn(shape, device=device, dtype=dtype) for _ in range(3))
    return [q, k, v, torch.empty(shape, device=device, dtype=dtype)]


def reference(problem, args):
    import torch.nn.functional as F

    q, k, v = (_bhsd(t).float() for t in args[:3])
    out = F.scaled_dot_product_attention(q, k, v, is_causal=bool(problem["causal"]))
    return [_bhsd(out)]


def vendors(problem):
    """torch SDPA, one entry per backend; a backend that cannot run this problem raises."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def backend(which):
        def run(args):
            q, k, v = (_bhsd(t) for t in args[:3])
            with sdpa_kernel(which):
                return [_bhsd(F.scaled_dot_product_attention(q, k, v, is_causal=bool(problem["causal"])))]

        return run

    return {
        "sdpa_flash": backend(SDPBackend.FLASH_ATTENTION),
        "sdpa_efficient": backend(SDPBackend.EFFICIENT_ATTENTION),
        "sdpa_cudnn": backend(SDPBackend.CUDNN_ATTENTION),
    }


def flops(problem):
    full = 4.0 * problem["B"] * problem["H"] * problem["S"] * problem["S"] * problem["D"]
    return full / 2 if problem["causal"] else full
