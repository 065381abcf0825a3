"""seer_attn: SeerAttention's block-sparse attention (BHSD, fp16), as tilelang's
examples/seer_attention/block_sparse_attn_tilelang.py writes it: an int8 mask per
(query block, key block), copied into a fragment once per query block; the key loop runs
over every key block, and its whole body, both loads included, runs under
`if block_mask[k] != 0`. Causal masks within a block by position, with the queries at the
end of the keys (past_len = seq_kv - seq_q, the example's qlen < klen case).

Departures from the example:
- block_M, block_N, num_stages and threads (fixed to 64, 64, 1, 128 there) are PARAMS, and
  the mask's block (its downsampling factor, BLOCK = 64 there) is the problem argument
  `block`. The kernel indexes the mask by query block bx and key block k, so only
  block_M == block_N == block serves a mask of that block: `check` says so for the rest.
- No TL_ENABLE_FAST_MATH pass config: a kernel file returns the PrimFunc only.
- The mask: the example's get_sparse_attn_mask_from_topk takes the top-k of random
  scores (key block 0 forced) and then keeps the lower triangle, so the count kept per row
  is random. Here, when causal, the blocks above the diagonal are excluded before the
  top-k, so that each query block keeps exactly min(topk, row + 1) key blocks (key block
  0 always), and flops() is exact; when not causal, the top-k is over all key blocks.
- The reference follows the kernel: a query block bx reads mask row bx. The example's
  own qlen < klen reference reads row (past_len + query) // BLOCK instead; its test
  cannot tell the two apart (top-1 of scores whose column 0 is 100: every row the same).

    ws-tune tests/data/seer_attn.py --shape batch=1,heads=32,seq_q=8192,seq_kv=8192,topk=16 --budget 16
"""

import tilelang.language as T

PROBLEM = {"batch": None, "heads": None, "seq_q": None, "seq_kv": None, "dim": 64, "block": 64, "topk": 8, "causal": 1}
CHOICES = {"dim": [64, 128], "block": [64, 128], "causal": [0, 1]}
PARAMS = {"block_M": [64, 128], "block_N": [64, 128], "num_stages": [1, 2], "threads": [128, 256]}
OUTPUTS = [4]
TOLERANCE = 2e-2
LOG2E = 1.44269504


def check(problem, params, schedule):
    block = problem["block"]
    if params["block_M"] != block or params["block_N"] != block:
        return f"block_M={params['block_M']}, block_N={params['block_N']}: the kernel indexes the mask by its own blocks, of {block}"
    if problem["seq_q"] % block or problem["seq_kv"] % block:
        return f"seq_q={problem['seq_q']}, seq_kv={problem['seq_kv']} are not multiples of block={block}"
    if problem["seq_q"] > problem["seq_kv"]:
        return f"seq_q={problem['seq_q']} > seq_kv={problem['seq_kv']}: query blocks past the mask's rows"
    if params["threads"] > 2 * params["block_M"]:
        return f"threads={params['threads']} split a {params['block_M']}-row block over too many warps (acc_s and acc_s_cast take conflicting layouts)"
    return None


def kernel(problem, *, block_M, block_N, num_stages, threads):
    batch, heads, seq_q, seq_kv, dim, causal = (problem[k] for k in ("batch", "heads", "seq_q", "seq_kv", "dim", "causal"))
    is_causal = bool(causal)
    downsample_len = -(-seq_kv // problem["block"])
    scale = (1.0 / dim) ** 0.5 * LOG2E
    q_shape = [batch, heads, seq_q, dim]
    kv_shape = [batch, heads, seq_kv, dim]
    block_mask_shape = [batch, heads, downsample_len, downsample_len]
    dtype, accum_dtype, block_mask_dtype = "float16", "float32", "int8"

    @T.prim_func
    def seer_attn(
        Q: T.Tensor(q_shape, dtype),
        K: T.Tensor(kv_shape, dtype),
        V: T.Tensor(kv_shape, dtype),
        BlockSparseMask: T.Tensor(block_mask_shape, block_mask_dtype),
        Output: T.Tensor(q_shape, dtype),
    ):
        with T.Kernel(T.ceildiv(seq_q, block_M), heads, batch, threads=threads) as (bx, by, bz):
            Q_shared = T.alloc_shared([block_M, dim], dtype)
            K_shared = T.alloc_shared([block_N, dim], dtype)
            V_shared = T.alloc_shared([block_N, dim], dtype)
            O_shared = T.alloc_shared([block_M, dim], dtype)
            acc_s = T.alloc_fragment([block_M, block_N], accum_dtype)
            acc_s_cast = T.alloc_fragment([block_M, block_N], dtype)
            acc_o = T.alloc_fragment([block_M, dim], accum_dtype)
            scores_max = T.alloc_fragment([block_M], accum_dtype)
            scores_max_prev = T.alloc_fragment([block_M], accum_dtype)
            scores_scale = T.alloc_fragment([block_M], accum_dtype)
            scores_sum = T.alloc_fragment([block_M], accum_dtype)
            logsum = T.alloc_fragment([block_M], accum_dtype)
            block_mask = T.alloc_fragment([downsample_len], block_mask_dtype)

            T.copy(Q[bz, by, bx * block_M : (bx + 1) * block_M, :], Q_shared)
            T.fill(acc_o, 0)
            T.fill(logsum, 0)
            T.fill(scores_max, -T.infinity(accum_dtype))

            T.copy(BlockSparseMask[bz, by, bx, :], block_mask)

            loop_range = T.ceildiv(seq_kv, block_N)

            for k in T.Pipelined(loop_range, num_stages=num_stages):
                if block_mask[k] != 0:
                    T.copy(K[bz, by, k * block_N : (k + 1) * block_N, :], K_shared)
                    if is_causal:
                        past_len = seq_kv - seq_q
                        for i, j in T.Parallel(block_M, block_N):
                            acc_s[i, j] = T.if_then_else(bx * block_M + i + past_len >= k * block_N + j, 0, -T.infinity(acc_s.dtype))
                    else:
                        T.clear(acc_s)
                    T.gemm(Q_shared, K_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)

                    T.copy(scores_max, scores_max_prev)
                    T.fill(scores_max, -T.infinity(accum_dtype))
                    T.reduce_max(acc_s, scores_max, dim=1, clear=False)
                    for i in T.Parallel(block_M):
                        scores_max[i] = T.max(scores_max[i], scores_max_prev[i])
                    for i in T.Parallel(block_M):
                        scores_scale[i] = T.exp2(scores_max_prev[i] * scale - scores_max[i] * scale)
                    for i, j in T.Parallel(block_M, block_N):
                        acc_s[i, j] = T.exp2(acc_s[i, j] * scale - scores_max[i] * scale)
                    T.reduce_sum(acc_s, scores_sum, dim=1)
                    for i in T.Parallel(block_M):
                        logsum[i] = logsum[i] * scores_scale[i] + scores_sum[i]
                    T.copy(acc_s, acc_s_cast)

                    for i, j in T.Parallel(block_M, dim):
                        acc_o[i, j] *= scores_scale[i]

                    T.copy(V[bz, by, k * block_N : (k + 1) * block_N, :], V_shared)
                    T.gemm(acc_s_cast, V_shared, acc_o, policy=T.GemmWarpPolicy.FullRow)

            for i, j in T.Parallel(block_M, dim):
                acc_o[i, j] /= logsum[i]

            T.copy(acc_o, O_shared)
            T.copy(O_shared, Output[bz, by, bx * block_M : (bx + 1) * block_M, :])

    return seer_attn


def _blocks(problem):
    return -(-problem["seq_kv"] // problem["block"])


def _mask(problem, device):
    """Top-k key blocks per query block (key block 0 always), as int8."""
    import torch

    n = _blocks(problem)
    scores = torch.rand(problem["batch"], problem["heads"], n, n, device=device)
    scores[..., 0] = 2.0  # every query block keeps key block 0, so no row is empty
    if problem["causal"]:
        scores = scores.masked_fill(torch.ones(n, n, device=device, dtype=torch.bool).triu(1), -1.0)
    picked = scores.topk(min(problem["topk"], n), dim=-1).indices
    mask = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, picked, True)
    return (mask & (scores >= 0)).to(torch.int8)


def inputs(problem, device):
    import torch

    b, h, dim = problem["batch"], problem["heads"], problem["dim"]
    q = torch.randn(b, h, problem["seq_q"], dim, device=device, dtype=torch.float16)
    k, v = (torch.randn(b, h, problem["seq_kv"], dim, device=device, dtype=torch.float16) for _ in range(2))
    return [q, k, v, _mask(problem, device), torch.empty_like(q)]


def reference(problem, args):
    import torch

    block, seq_q, seq_kv = problem["block"], problem["seq_q"], problem["seq_kv"]
    device = args[0].device
    rows = torch.arange(seq_q, device=device) // block  # the kernel's mask row: the query block
    cols = torch.arange(seq_kv, device=device) // block
    causal = None
    if problem["causal"]:
        causal = (torch.arange(seq_q, device=device)[:, None] + seq_kv - seq_q) >= torch.arange(seq_kv, device=device)[None, :]
    out = torch.empty_like(args[0], dtype=torch.float32)
    for b in range(args[0].shape[0]):  # one batch at a time: (heads, seq, seq) scores
        q, k, v = (a[b].float() for a in args[:3])
        keep = args[3][b].bool()[:, rows][:, :, cols]
        keep = keep & causal if causal is not None else keep
        logits = torch.einsum("hqd,hkd->hqk", q, k) / q.shape[-1] ** 0.5
        out[b] = torch.einsum("hqk,hkd->hqd", logits.masked_fill_(~keep, float("-inf")).softmax(-1), v)
    return [out]


def flops(problem):
    # the key blocks the kernel computes: topk per query block, fewer near the top when causal
    n, block = _blocks(problem), problem["block"]
    kept = sum(min(problem["topk"], q + 1 if problem["causal"] else n) for q in range(problem["seq_q"] // block))
    return 4.0 * problem["batch"] * problem["heads"] * kept * block * block * problem["dim"]
