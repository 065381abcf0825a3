"""indexer_topk: DeepSeek sparse attention's indexer top-k with its softmax (bf16), as
tilelang's examples/dsa_sparse_finetune/indexer_topk_reducesum.py writes it: one block per
query token scores the keys of its own sequence up to itself (causal) in block_K tiles: an
MMA of the key tile against the token's index-query heads (pre-scaled by dim^-0.5 in
shared memory), rectified, weighted per head and summed over heads. Each tile's scores are
written into the second half of a 2 * topk shared buffer of (index, score) pairs, and a
bitonic sort of the whole buffer (serial passes, a barrier between them) runs whenever
that half is full, so the first half keeps the best topk so far; a last sort after the key
loop, then the softmax of the topk best scores (ReduceSum) and their key indices
(TopkIndices, -1 past the token) are stored.

What a schedule tuner sees: a plain kernel (no seed of its own; tilelang's role_based
scheduler seeds it). The key loop is a T.Pipelined at num_stages=0 whose trip count depends
on the token (bx, through TokenIndices); its key tile is filled by a T.Parallel copy with a
bounds guard (no T.copy, so no TMA: a cp.async or a plain gather), one MMA into a small
fragment (block_K x heads, too small for a warpgroup), a reduction, stores into the sort
buffer and, under a condition, the sort's serial passes over shared memory. The
index-query tile and the weights are loaded once before the loop (the query tile then
rescaled in place); the last sort, the softmax and both stores come after.

Departures from the example:
- PARAMS are the example's arguments block_K (its default 32) and num_threads (its default
  128, here ``threads``); the example asserts num_stages == 0, so stages are not a
  parameter (the loop is written with num_stages=0, as the example runs it); ``check``
  keeps its asserts (topk a power of two and a multiple of block_K; CHOICES its heads <= 64,
  a multiple of 8) and its test's (every sequence at least topk tokens long), and refuses a
  block_K x heads accumulator that T.gemm cannot split over the warps (block_K=16 at heads=8:
  tilelang's "No valid warp partition");
- the example's pass configs (TL_DISABLE_THREAD_STORAGE_SYNC, TL_DISABLE_WARP_SPECIALIZED)
  are not set: a kernel file gives none. So its hand-placed T.sync_threads (19 of them, which
  stand in for the storage-sync pass it turns off) are left out: tilelang's sync pass places
  the block's barriers (one before each bitonic pass among them), and role_based refuses a
  kernel with hand-written syncs (``ws-tune space`` on the example as written: ``seed: ...
  cannot schedule hand-written synchronization ... (tirx.tvm_storage_sync)``, no space);
- the example's symbolic seq_len and batch_plus_one are concrete: ``seq_len`` tokens in
  ``batch`` sequences of equal length (Offsets and TokenIndices as the example's
  prepare_token_indices makes them);
- the reference is fp32 and rescales the index queries in bf16 as the kernel does (the
  example's ref_index_score rounds the per-head logits to bf16 and scales after the sum);
- what is compared: ReduceSum (the softmax of the topk best scores, best first, which is
  defined whatever order equal scores take) and TopkIndices up to ties: ``reference`` reads
  the kernel's indices from ``args`` (it is called after the launch) and expects, at each
  rank, the kernel's own index wherever it is a valid, not repeated key whose score is the
  reference's score at that rank (within TIE), else the reference's; the indices must then
  match exactly (TOLERANCE 0: two indices swapped are 0.6% off in norm, under 1e-2).

    ws-tune tests/data/indexer_topk.py --shape seq_len=8192,topk=2048 --budget 16
"""

import math

import tilelang.language as T

PROBLEM = {"seq_len": None, "heads": 64, "dim": 128, "topk": 64, "batch": 1}
CHOICES = {"heads": [8, 16, 32, 64], "dim": [64, 128]}
PARAMS = {"block_K": [16, 32, 64, 128], "threads": [128, 256]}
OUTPUTS = [3, 4]
TOLERANCE = [0, 1e-2]  # TopkIndices exactly (up to ties, above), ReduceSum within 1%
TIE = 1e-3  # scores closer than this (relative to the row's largest) are a tie


def check(problem, params, schedule):
    topk, seq_len, batch = problem["topk"], problem["seq_len"], problem["batch"]
    if topk & (topk - 1):
        return f"topk={topk} is not a power of two (the example's assert)"
    if topk % params["block_K"]:
        return f"topk={topk} is not a multiple of block_K={params['block_K']} (the example's assert)"
    if seq_len % batch or seq_len // batch < topk:
        return f"seq_len={seq_len} is not {batch} sequences of at least topk={topk} tokens"
    warps, heads = params["threads"] // 32, problem["heads"]
    if not any(warps % m == 0 and params["block_K"] % (16 * m) == 0 and heads % (8 * (warps // m)) == 0 for m in range(1, warps + 1)):
        return f"T.gemm's {params['block_K']}x{heads} accumulator cannot be split over {warps} warps (16 rows x 8 columns each)"
    return None


def kernel(problem, *, block_K, threads):
    seq_len, heads, dim, topk, batch = (problem[k] for k in ("seq_len", "heads", "dim", "topk", "batch"))
    num_threads = threads
    BF16, FP32, INT32 = T.bfloat16, T.float32, T.int32
    dtype = BF16
    num_stages = 0
    batch_plus_one = batch + 1

    index_q_shape = [seq_len, heads, dim]
    weights_shape = [seq_len, heads]
    index_k_shape = [seq_len, dim]
    topk_indices_shape = [seq_len, topk]
    offsets_shape = [batch_plus_one]
    token_indices_shape = [seq_len, 2]

    N = 2 * topk
    num_iters = int(round(math.log2(N)))
    sm_scale = dim**-0.5

    @T.macro
    def bitonic_sort(
        topk_index_shared: T.SharedBuffer([N], dtype=INT32),
        topk_value_shared: T.SharedBuffer([N], dtype=FP32),
    ):
        for i1 in T.serial(num_iters):
            for i2 in T.serial(i1 + 1):
                for i in T.Parallel(N):
                    ascending = (i & (1 << (i1 + 1))) != 0
                    j = i ^ (1 << (i1 - i2))
                    if i < j and (
                        (ascending and topk_value_shared[i] > topk_value_shared[j])
                        or (not ascending and topk_value_shared[i] < topk_value_shared[j])
                    ):
                        val = topk_value_shared[i]
                        topk_value_shared[i] = topk_value_shared[j]
                        topk_value_shared[j] = val
                        idx = topk_index_shared[i]
                        topk_index_shared[i] = topk_index_shared[j]
                        topk_index_shared[j] = idx

    @T.prim_func
    def tl_indexer_topk_reducesum_kernel(
        IndexQ: T.Tensor(index_q_shape, dtype),
        Weights: T.Tensor(weights_shape, dtype),
        IndexK: T.Tensor(index_k_shape, dtype),
        TopkIndices: T.Tensor(topk_indices_shape, INT32),
        ReduceSum: T.Tensor(topk_indices_shape, FP32),
        Offsets: T.Tensor(offsets_shape, INT32),
        TokenIndices: T.Tensor(token_indices_shape, INT32),
    ):
        with T.Kernel(seq_len, threads=num_threads) as (bx):
            i_b, i_t = TokenIndices[bx, 0], TokenIndices[bx, 1]
            bos, eos = Offsets[i_b], Offsets[i_b + 1]
            num_blocks = T.ceildiv(i_t + 1, block_K)

            topk_index_shared = T.alloc_shared([N], dtype=INT32)
            topk_value_shared = T.alloc_shared([N], dtype=FP32)

            T.fill(topk_index_shared, -1)
            T.fill(topk_value_shared, float("-inf"))

            index_q_shared = T.alloc_shared([heads, dim], dtype=dtype)
            T.copy(IndexQ[bos + i_t, :, :], index_q_shared)

            weights_frag = T.alloc_shared([heads], dtype=dtype)
            T.copy(Weights[bos + i_t, :], weights_frag)

            for i, j in T.Parallel(heads, dim):
                index_q_shared[i, j] = index_q_shared[i, j] * sm_scale

            for bk_i in T.Pipelined(num_blocks, num_stages=num_stages):
                k_st = bk_i * block_K
                k_ed = T.min((bk_i + 1) * block_K, eos - bos)

                index_k_shared = T.alloc_shared([block_K, dim], dtype=dtype)
                for i, j in T.Parallel(block_K, dim):
                    index_k_shared[i, j] = T.if_then_else(k_st + i < k_ed, IndexK[bos + k_st + i, j], 0)

                logits = T.alloc_fragment((block_K, heads), FP32)
                T.gemm(
                    index_k_shared,
                    index_q_shared,
                    logits,
                    transpose_A=False,
                    transpose_B=True,
                    clear_accum=True,
                )

                for i, j in T.Parallel(block_K, heads):
                    logits[i, j] = T.max(logits[i, j], 0) * weights_frag[j]

                logits_sum = T.alloc_fragment(block_K, FP32)
                T.reduce_sum(logits, logits_sum, dim=1)

                offset = T.alloc_var(INT32)
                if k_st >= topk:
                    offset = topk + (k_st % topk)
                else:
                    offset = k_st
                for i in T.Parallel(block_K):
                    if k_st + i > i_t:
                        logits_sum[i] = float("-inf")
                    j = offset + i
                    topk_index_shared[j] = k_st + i
                    topk_value_shared[j] = logits_sum[i]

                if k_ed > topk and k_ed % topk == 0:
                    bitonic_sort(topk_index_shared, topk_value_shared)

            bitonic_sort(topk_index_shared, topk_value_shared)

            logits_max_frag = T.alloc_fragment([1], dtype=FP32)
            logits_frag = T.alloc_fragment([topk], dtype=FP32)
            reducesum_shared = T.alloc_shared([topk], dtype=FP32)

            T.copy(topk_value_shared[:topk], logits_frag)

            T.reduce_max(logits_frag, logits_max_frag, dim=-1)

            for i in T.Parallel(topk):
                logits_frag[i] = T.exp(logits_frag[i] - logits_max_frag[0])

            lse_frag = T.alloc_fragment([1], dtype=FP32)
            T.reduce_sum(logits_frag, lse_frag)

            for i in T.Parallel(topk):
                reducesum_shared[i] = logits_frag[i] / lse_frag[0]

            for i in T.Parallel(topk):
                if topk_index_shared[i] > i_t:
                    topk_index_shared[i] = -1

            T.copy(topk_index_shared[:topk], TopkIndices[bos + i_t, :])
            T.copy(reducesum_shared[:topk], ReduceSum[bos + i_t, :])

    return tl_indexer_topk_reducesum_kernel


def inputs(problem, device):
    import torch

    seq_len, heads, dim, topk, batch = (problem[k] for k in ("seq_len", "heads", "dim", "topk", "batch"))
    q = torch.randn(seq_len, heads, dim, device=device).bfloat16()
    weights = torch.randn(seq_len, heads, device=device).bfloat16()
    k = torch.randn(seq_len, dim, device=device).bfloat16()
    offsets = torch.arange(0, seq_len + 1, seq_len // batch, device=device, dtype=torch.int32)
    positions = torch.arange(seq_len, device=device, dtype=torch.int32)
    token_indices = torch.stack([positions // (seq_len // batch), positions % (seq_len // batch)], 1).to(torch.int32)
    topk_indices = torch.zeros(seq_len, topk, device=device, dtype=torch.int32)
    topk_score = torch.zeros(seq_len, topk, device=device, dtype=torch.float32)
    return [q, weights, k, topk_indices, topk_score, offsets, token_indices]


def _scores(problem, args, rows):
    """fp32 scores of the tokens ``rows`` (one sequence's) against that sequence's keys, -inf past each token."""
    import torch

    q, weights, k = args[0], args[1], args[2]
    length = problem["seq_len"] // problem["batch"]
    bos = rows[0] // length * length
    qs = (q[rows].float() * problem["dim"] ** -0.5).bfloat16().float()  # the kernel rescales Q in bf16
    keys = k[bos : bos + length].float()
    logits = (torch.einsum("shd,kd->shk", qs, keys).clamp(min=0) * weights[rows].float()[:, :, None]).sum(dim=1)
    causal = torch.arange(length, device=q.device)[None, :] <= (rows - bos)[:, None]
    return logits.masked_fill(~causal, float("-inf"))


def reference(problem, args):
    """The top-k scores' softmax, best first, and their indices; at each rank the kernel's own
    index (read from args[3]) where it is a distinct valid key of the reference's score there."""
    import torch

    topk, seq_len = problem["topk"], problem["seq_len"]
    length = seq_len // problem["batch"]
    got = args[3]
    out_idx, out_score = [], []
    for rows in torch.arange(seq_len, device=got.device).split(min(256, length)):
        logits = _scores(problem, args, rows)
        values, indices = torch.topk(logits, k=topk, dim=-1)
        out_score.append(torch.softmax(values, dim=-1))
        finite = torch.isfinite(values)
        indices = torch.where(finite, indices, -1).to(torch.int32)
        mine = got[rows].long()
        valid = (mine >= 0) & (mine < logits.shape[1])
        at = torch.gather(logits, 1, mine.clamp(0, logits.shape[1] - 1))
        sorted_mine = mine.sort(dim=1).values
        repeated = torch.zeros_like(valid)
        repeated.scatter_(1, mine.sort(dim=1).indices[:, 1:], (sorted_mine[:, 1:] == sorted_mine[:, :-1]) & (sorted_mine[:, 1:] >= 0))
        tie = TIE * values[:, :1].abs().clamp_min(1e-30)
        same = valid & ~repeated & finite & ((at - values).abs() <= tie)
        same |= (mine == -1) & ~finite
        out_idx.append(torch.where(same, mine.to(torch.int32), indices))
    return [torch.cat(out_idx), torch.cat(out_score)]


def flops(problem):
    """The MMA over each token's causal keys (about half its sequence), as the example's kernel does."""
    return 2.0 * problem["heads"] * problem["dim"] * problem["seq_len"] * (problem["seq_len"] / problem["batch"]) / 2
