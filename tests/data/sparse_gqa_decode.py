"""sparse_gqa_decode: block-sparse flash decoding for grouped-query attention over a KV cache
of varied lengths, as tilelang's
examples/blocksparse_attention/example_tilelang_sparse_gqa_decode_varlen_indice.py writes it:
one query token per sequence; each (sequence, KV head) names the key blocks it attends to in
an index list (sorted in descending order, -1 for padding); the list is cut into `num_split`
parts, each attended by its own block, whose loop reads the next index from global memory
and skips a padding one; only the first block of a part is masked by the sequence's cache
length. A second kernel in the same function combines the parts by their log-sum-exp.
The example's pass config, fast math, is kept as PASS_CONFIGS.

    ws-tune tests/data/sparse_gqa_decode.py --shape batch=8,max_cache_seqlen=8192 --budget 16

Departures from the example (for the kernel-file contract):
- `num_split` (the example's T.dynamic, set by the sizes of the glse and Output_partial
  arguments it makes from a heuristic's split count) is a PARAM, and glse and
  Output_partial are `T.alloc_global` scratch: `inputs` is made once per problem and
  shared by every candidate. max_cache_seqlen and max_selected_blocks stay T.dynamic.
- the example's `out_idx=[-1]` output is the last argument (OUTPUTS); block_N is the
  problem's block_size, as the example passes it; block_H (64), num_stages (2) and
  threads (128), fixed in its call, are BLOCK_H and PARAMS. role_based seeds the kernel at
  num_stages=1 only (at 2, K_shared, written under the `i_s >= 0` guard, would be
  versioned): the example's own num_stages=2 gets tilelang's lowerings as baselines.
- the inputs are drawn as its main() draws them (cache lengths in [1, max_cache_seqlen),
  distinct valid blocks, sorted descending), with fixed seeds, but the -1 padding is spread
  among the blocks after the first rather than left at the tail, so that loads are skipped
  mid-loop; max_selected_blocks is ceil(max_cache_seqlen * (1 - sparse_ratio) / block_size),
  as there.
"""

import math
import random

import tilelang
import tilelang.language as T

PROBLEM = {"batch": None, "heads": 32, "heads_kv": 8, "max_cache_seqlen": None, "dim": 128, "dim_v": 128,
           "sparse_ratio": 0.8, "block_size": 32}  # fmt: skip
CHOICES = {"dim": [64, 128], "dim_v": [64, 128], "block_size": [32, 64]}
PARAMS = {"num_split": [1, 2, 4, 8], "num_stages": [1, 2], "threads": [128]}
PASS_CONFIGS = {tilelang.PassConfigKey.TL_ENABLE_FAST_MATH: True}
OUTPUTS = [5]
TOLERANCE = 2e-2
BLOCK_H = 64  # MMA rows per block, as the example's SparseFlashAttn sets it


def _selected(problem):
    return math.ceil(problem["max_cache_seqlen"] * (1 - problem["sparse_ratio"]) / problem["block_size"])


def _cache_seqlens(problem):
    """Each sequence's cache length, drawn as the example's main() draws them (fixed seed)."""
    rng = random.Random(0)
    return [rng.randrange(1, problem["max_cache_seqlen"]) for _ in range(problem["batch"])]


def _valid_blocks(problem):
    """Valid (non-padding) index slots of each sequence: its blocks, at most max_selected_blocks."""
    return [min(_selected(problem), -(-n // problem["block_size"])) for n in _cache_seqlens(problem)]


def check(problem, params, schedule):
    heads, heads_kv = problem["heads"], problem["heads_kv"]
    if heads % heads_kv:
        return f"heads={heads} is not a multiple of heads_kv={heads_kv}"
    if heads // heads_kv > BLOCK_H and (heads // heads_kv) % BLOCK_H:
        return f"{heads // heads_kv} query heads per KV head do not cut into blocks of {BLOCK_H}"
    if problem["max_cache_seqlen"] % problem["block_size"]:
        return f"max_cache_seqlen={problem['max_cache_seqlen']} is not a multiple of block_size={problem['block_size']}"
    if not 0 <= problem["sparse_ratio"] < 1:
        return f"sparse_ratio={problem['sparse_ratio']} is not in [0, 1)"
    return None


def kernel(problem, *, num_split, num_stages, threads):
    batch, heads, heads_kv, dim, dim_v = (problem[k] for k in ("batch", "heads", "heads_kv", "dim", "dim_v"))
    block_N, block_H = problem["block_size"], BLOCK_H
    scale = (1.0 / dim) ** 0.5 * 1.44269504  # log2(e)
    dtype = T.float16
    accum_dtype = T.float32
    kv_group_num = heads // heads_kv

    max_cache_seqlen = T.dynamic("max_cache_seqlen")
    max_selected_blocks = T.dynamic("max_selected_blocks")

    shape_q = [batch, heads, dim]
    shape_k = [batch, max_cache_seqlen, heads_kv, dim]
    shape_v = [batch, max_cache_seqlen, heads_kv, dim_v]
    shape_indices = [batch, heads_kv, max_selected_blocks]
    shape_o = [batch, heads, dim_v]
    part_shape = [batch, heads, num_split, dim_v]
    valid_block_H = min(block_H, kv_group_num)

    @T.prim_func
    def main(
        Q: T.Tensor(shape_q, dtype),
        K: T.Tensor(shape_k, dtype),
        V: T.Tensor(shape_v, dtype),
        block_indices: T.Tensor(shape_indices, T.int32),
        cache_seqlens: T.Tensor([batch], T.int32),
        Output: T.Tensor(shape_o, dtype),
    ):
        glse = T.alloc_global([batch, heads, num_split], accum_dtype)
        Output_partial = T.alloc_global(part_shape, accum_dtype)
        with T.Kernel(batch, heads // valid_block_H, num_split, threads=threads) as (bx, by, bz):
            Q_shared = T.alloc_shared([block_H, dim], dtype)
            K_shared = T.alloc_shared([block_N, dim], dtype)
            V_shared = T.alloc_shared([block_N, dim_v], dtype)
            acc_s = T.alloc_fragment([block_H, block_N], accum_dtype)
            acc_s_cast = T.alloc_fragment([block_H, block_N], dtype)
            acc_o = T.alloc_fragment([block_H, dim_v], accum_dtype)

            scores_max = T.alloc_fragment([block_H], accum_dtype)
            scores_max_prev = T.alloc_fragment([block_H], accum_dtype)
            scores_scale = T.alloc_fragment([block_H], accum_dtype)
            scores_sum = T.alloc_fragment([block_H], accum_dtype)
            logsum = T.alloc_fragment([block_H], accum_dtype)
            has_valid_block = T.alloc_var(T.bool)

            bid = bx
            hid = by
            sid = bz
            cur_kv_head = hid // (kv_group_num // valid_block_H)

            T.copy(Q[bid, hid * valid_block_H : hid * valid_block_H + block_H, :], Q_shared)
            T.fill(acc_o, 0)
            T.fill(logsum, 0)
            T.fill(scores_max, -T.infinity(accum_dtype))

            num_blocks = max_selected_blocks
            blocks_per_split = T.floordiv(num_blocks, num_split)
            remaining_blocks = T.floormod(num_blocks, num_split)
            loop_range = blocks_per_split + T.if_then_else(sid < remaining_blocks, 1, 0)
            start = blocks_per_split * sid + T.min(sid, remaining_blocks)
            has_valid_block = False

            for k in T.Pipelined(loop_range, num_stages=num_stages):
                i_s = block_indices[bid, cur_kv_head, start + k]
                if i_s >= 0:
                    has_valid_block = True
                    T.copy(K[bid, i_s * block_N : (i_s + 1) * block_N, cur_kv_head, :], K_shared)
                    T.clear(acc_s)
                    T.gemm(Q_shared, K_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                    if k == 0:  # assume block_indices is sorted in reverse order, otherwise, remove this if condition
                        for i, j in T.Parallel(block_H, block_N):
                            acc_s[i, j] = T.if_then_else(i_s * block_N + j >= cache_seqlens[bid], -T.infinity(accum_dtype), acc_s[i, j])
                    T.copy(scores_max, scores_max_prev)
                    T.fill(scores_max, -T.infinity(accum_dtype))
                    T.reduce_max(acc_s, scores_max, dim=1, clear=False)
                    for i in T.Parallel(block_H):
                        scores_max[i] = T.max(scores_max[i], scores_max_prev[i])
                        scores_scale[i] = T.exp2(scores_max_prev[i] * scale - scores_max[i] * scale)
                    for i, j in T.Parallel(block_H, block_N):
                        acc_s[i, j] = T.exp2(acc_s[i, j] * scale - scores_max[i] * scale)
                    T.reduce_sum(acc_s, scores_sum, dim=1)
                    for i in T.Parallel(block_H):
                        logsum[i] = logsum[i] * scores_scale[i] + scores_sum[i]
                    T.copy(acc_s, acc_s_cast)
                    for i, j in T.Parallel(block_H, dim_v):
                        acc_o[i, j] *= scores_scale[i]
                    T.copy(V[bid, i_s * block_N : (i_s + 1) * block_N, cur_kv_head, :], V_shared)
                    T.gemm(acc_s_cast, V_shared, acc_o, policy=T.GemmWarpPolicy.FullRow)
            if has_valid_block:
                for i, j in T.Parallel(block_H, dim_v):
                    acc_o[i, j] /= logsum[i]
                for i in T.Parallel(block_H):
                    logsum[i] = T.log2(logsum[i]) + scores_max[i] * scale

            # TODO(lei): Support T.Parallel(valid_block_H)
            for i in T.Parallel(block_H):
                if i < valid_block_H:
                    glse[bid, hid * valid_block_H + i, sid] = logsum[i]
            for i, j in T.Parallel(block_H, dim_v):
                if i < valid_block_H:
                    Output_partial[bid, hid * valid_block_H + i, sid, j] = acc_o[i, j]

        # combine
        with T.Kernel(heads, batch, threads=128) as (by, bz):
            po_local = T.alloc_fragment([dim_v], accum_dtype)
            o_accum_local = T.alloc_fragment([dim_v], accum_dtype)
            lse_local_split = T.alloc_var(accum_dtype)
            lse_logsum_local = T.alloc_var(accum_dtype)
            lse_max_local = T.alloc_var(accum_dtype)
            scale_local = T.alloc_var(accum_dtype)
            max_split = T.alloc_var(T.int32)

            T.clear(lse_logsum_local)
            T.clear(o_accum_local)
            lse_max_local = -T.infinity(accum_dtype)
            for k in T.serial(num_split):
                lse_local_split = glse[bz, by, k]
                if lse_local_split != 0:
                    max_split = k
                    lse_max_local = T.max(lse_max_local, glse[bz, by, k])

            for k in T.Pipelined(num_split, num_stages=1):
                if k <= max_split:
                    lse_local_split = glse[bz, by, k]
                    lse_logsum_local += T.exp2(lse_local_split - lse_max_local)
            lse_logsum_local = T.log2(lse_logsum_local) + lse_max_local
            for k in T.serial(num_split):
                if k <= max_split:
                    for i in T.Parallel(dim_v):
                        po_local[i] = Output_partial[bz, by, k, i]
                    lse_local_split = glse[bz, by, k]
                    scale_local = T.exp2(lse_local_split - lse_logsum_local)
                    for i in T.Parallel(dim_v):
                        o_accum_local[i] += po_local[i] * scale_local
            for i in T.Parallel(dim_v):
                Output[bz, by, i] = o_accum_local[i]

    return main


def inputs(problem, device):
    import torch

    batch, heads, heads_kv, seqlen, dim, dim_v, bs = (
        problem[k] for k in ("batch", "heads", "heads_kv", "max_cache_seqlen", "dim", "dim_v", "block_size"))  # fmt: skip
    selected = _selected(problem)
    q = torch.randn(batch, heads, dim, device=device, dtype=torch.float16)
    k = torch.randn(batch, seqlen, heads_kv, dim, device=device, dtype=torch.float16)
    v = torch.randn(batch, seqlen, heads_kv, dim_v, device=device, dtype=torch.float16)
    seqlens = _cache_seqlens(problem)
    # distinct valid blocks per (sequence, KV head), sorted descending, -1 padded (main()'s draw)
    gen = torch.Generator().manual_seed(0)
    idx = torch.full((batch, heads_kv, selected), -1, dtype=torch.int32)
    for b, n in enumerate(seqlens):
        valid = -(-n // bs)
        for h in range(heads_kv):
            chosen = torch.randperm(valid, generator=gen, dtype=torch.int32)[:selected]
            idx[b, h, : len(chosen)] = chosen
    idx = idx.sort(dim=-1, descending=True).values
    # The padding spread among the blocks after the first (main() leaves it all at the tail): the
    # kernel allows it (only its first block reaches past the cache length), and it skips loads
    # mid-loop, where a pipeline stage a skipped load leaves behind would show.
    for row in idx.view(-1, selected):
        valid = row[row >= 0].clone()
        if 1 < len(valid) < selected:
            slots = 1 + torch.randperm(selected - 1, generator=gen)[: len(valid) - 1].sort().values
            row.fill_(-1)
            row[0], row[slots] = valid[0], valid[1:]
    cache_seqlens = torch.tensor(seqlens, dtype=torch.int32)
    out = torch.empty(batch, heads, dim_v, device=device, dtype=torch.float16)
    return [q, k, v, idx.to(device), cache_seqlens.to(device), out]


def reference(problem, args):
    import torch

    q, k, v, idx, cache_seqlens, _ = args
    bs = problem["block_size"]
    batch, heads, dim = q.shape
    seqlen, heads_kv = k.shape[1], k.shape[2]
    groups = heads // heads_kv
    # keys a (sequence, KV head) attends to: its selected blocks, below its cache length
    blocks = torch.zeros(batch, heads_kv, seqlen // bs + 1, dtype=torch.bool, device=q.device)
    blocks.scatter_(2, torch.where(idx >= 0, idx, seqlen // bs).long(), True)
    keep = blocks[..., : seqlen // bs].repeat_interleave(bs, dim=-1)  # B, Hkv, S
    keep &= torch.arange(seqlen, device=q.device) < cache_seqlens[:, None, None]
    qg = q.float().view(batch, heads_kv, groups, dim)
    s = torch.einsum("bhgd,bshd->bhgs", qg, k.float()) * dim**-0.5
    s = s.masked_fill(~keep[:, :, None, :], float("-inf"))
    out = torch.einsum("bhgs,bshd->bhgd", s.softmax(-1), v.float())
    return [out.reshape(batch, heads, -1)]


def flops(problem):
    keys = sum(_valid_blocks(problem)) * problem["block_size"] * problem["heads_kv"]  # keys read, over sequences and KV heads
    return 2.0 * keys * (problem["heads"] // problem["heads_kv"]) * (problem["dim"] + problem["dim_v"])


def bytes_moved(problem):
    batch, heads, heads_kv, dim, dim_v = (problem[k] for k in ("batch", "heads", "heads_kv", "dim", "dim_v"))
    keys = sum(_valid_blocks(problem)) * problem["block_size"] * heads_kv
    return 2.0 * (keys * (dim + dim_v) + batch * heads * (dim + dim_v)) + 4.0 * (batch * heads_kv * _selected(problem) + batch)
