"""gqa_fwd: FlashAttention forward for grouped-query attention (BSHD, fp16), as tilelang's
examples/flash_attention/example_gqa_fwd_bshd.py writes it: one block per (query block,
query head, batch) streams K and V of its group's KV head (``by // groups``: ``groups``
query heads share one KV head, ``heads // groups`` KV heads in all), online softmax in
fp32 fragments, O through shared memory. The mask is written into S before Q K^T
accumulates onto it: causal, or (not causal) the keys past seq_len of a partial last block.

What a schedule tuner sees: a plain kernel (no seed of its own; tilelang's role_based
scheduler seeds it), one pipelined key loop with two loads (K before the first MMA, V
before the second, as the example orders them), two chained MMAs (S = Q K^T, whose
accumulator reaches P @ V's register operand through acc_s_cast), Q loaded once before the
loop and O stored after it. Causal masking makes the loop's trip count depend on bx. The
GQA part changes only which KV head a block reads: several blocks read the same K/V tiles.

Departures from the example:
- PARAMS are the example's autotune axes (block sizes 64/128/256, threads 128/256/512,
  num_stages 2/3); ``check`` keeps its get_configs filter (each of threads // 32 warps gets
  a multiple of 16 rows of block_M and of block_N; 2 * 2 B * dim * (block_M + block_N) at
  most 100 KB), with the problem's dim where get_configs always uses its default 128;
- the example's ``TL_ENABLE_FAST_MATH`` pass config is not set (a kernel file returns the
  PrimFunc only);
- ``is_causal`` is a bool problem argument (``--shape ...,is_causal=1``), ``dim`` is
  64 or 128, fp16 only (the example hardcodes it);
- the reference is fp32 (the example's ref_program, in fp32: repeat_interleave of K and V,
  an explicit softmax); torch SDPA with enable_gqa is timed as a vendor.

    ws-tune tests/data/gqa_fwd.py --shape batch=1,heads=32,seq_len=4096,groups=8 --budget 16
"""

import tilelang.language as T

PROBLEM = {"batch": None, "heads": None, "seq_len": None, "dim": 128, "groups": 16, "is_causal": False}
CHOICES = {"dim": [64, 128]}
# the example's FlashAttentionTuneSpace, crossed; check() keeps get_configs' filter
PARAMS = {"block_M": [64, 128, 256], "block_N": [64, 128, 256], "num_stages": [2, 3], "threads": [128, 256, 512]}
OUTPUTS = [3]
TOLERANCE = 2e-2
LOG2E = 1.44269504
WARP_ALIGNMENT = 16  # FlashAttentionTuneSpace.warp_alignment
MAX_SHARED_MEM = 100 * 1024  # FlashAttentionTuneSpace.max_shared_mem


def check(problem, params, schedule):
    if problem["heads"] % problem["groups"]:
        return f"heads={problem['heads']} is not a multiple of groups={problem['groups']}"
    warps = params["threads"] // 32
    for block in ("block_M", "block_N"):
        if (params[block] // warps) % WARP_ALIGNMENT:
            return f"{block}={params[block]} over {warps} warps is not a multiple of {WARP_ALIGNMENT} rows per warp (the example's get_configs)"
    shared = 2 * 2 * problem["dim"] * (params["block_M"] + params["block_N"])
    if shared > MAX_SHARED_MEM:
        return f"{shared // 1024} KB of Q/K tiles (x2) > the example's {MAX_SHARED_MEM // 1024} KB"
    return None


def kernel(problem, *, block_M, block_N, num_stages, threads):
    batch, heads, seq_len, dim, groups, is_causal = (problem[k] for k in ("batch", "heads", "seq_len", "dim", "groups", "is_causal"))
    scale = (1.0 / dim) ** 0.5 * LOG2E
    head_kv = heads // groups
    q_shape = [batch, seq_len, heads, dim]
    kv_shape = [batch, seq_len, head_kv, dim]
    dtype = T.float16
    accum_dtype = T.float32

    @T.prim_func
    def gqa_fwd(Q: T.Tensor(q_shape, dtype), K: T.Tensor(kv_shape, dtype), V: T.Tensor(kv_shape, dtype),
                Output: T.Tensor(q_shape, dtype)):  # fmt: skip
        with T.Kernel(T.ceildiv(seq_len, block_M), heads, batch, threads=threads) as (bx, by, bz):
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

            T.copy(Q[bz, bx * block_M : (bx + 1) * block_M, by, :], Q_shared)
            T.fill(acc_o, 0)
            T.fill(logsum, 0)
            T.fill(scores_max, -T.infinity(accum_dtype))

            loop_range = (
                T.min(T.ceildiv(seq_len, block_N), T.ceildiv((bx + 1) * block_M, block_N)) if is_causal else T.ceildiv(seq_len, block_N)
            )

            for k in T.Pipelined(loop_range, num_stages=num_stages):
                T.copy(K[bz, k * block_N : (k + 1) * block_N, by // groups, :], K_shared)
                if is_causal:
                    for i, j in T.Parallel(block_M, block_N):
                        acc_s[i, j] = T.if_then_else(bx * block_M + i >= k * block_N + j, 0, -T.infinity(acc_s.dtype))
                else:
                    for i, j in T.Parallel(block_M, block_N):
                        acc_s[i, j] = T.if_then_else(k * block_N + j >= seq_len, -T.infinity(acc_s.dtype), 0)
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

                T.copy(V[bz, k * block_N : (k + 1) * block_N, by // groups, :], V_shared)
                T.gemm(acc_s_cast, V_shared, acc_o, policy=T.GemmWarpPolicy.FullRow)

            for i, j in T.Parallel(block_M, dim):
                acc_o[i, j] /= logsum[i]
            T.copy(acc_o, O_shared)
            T.copy(O_shared, Output[bz, bx * block_M : (bx + 1) * block_M, by, :])

    return gqa_fwd


def inputs(problem, device):
    import torch

    batch, heads, seq_len, dim, groups = (problem[k] for k in ("batch", "heads", "seq_len", "dim", "groups"))
    q_shape = (batch, seq_len, heads, dim)
    kv_shape = (batch, seq_len, heads // groups, dim)
    q, k, v = (torch.randn(s, device=device, dtype=torch.float16) for s in (q_shape, kv_shape, kv_shape))
    return [q, k, v, torch.empty(q_shape, device=device, dtype=torch.float16)]


def reference(problem, args):
    """The example's ref_program, in fp32: query head h reads KV head h // groups."""
    import torch

    groups = problem["groups"]
    q, k, v = (t.float() for t in args[:3])
    k, v = k.repeat_interleave(groups, dim=2), v.repeat_interleave(groups, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / q.shape[-1] ** 0.5
    if problem["is_causal"]:
        seq_len = q.shape[1]
        scores = scores.masked_fill(torch.ones(seq_len, seq_len, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return [torch.einsum("bhqk,bkhd->bqhd", scores.softmax(dim=-1), v)]


def vendors(problem):
    """torch SDPA with enable_gqa (its query head h reads KV head h // (heads // head_kv)),
    one entry per backend; a backend that cannot run this problem raises."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def backend(which):
        def run(args):
            q, k, v = (t.transpose(1, 2) for t in args[:3])  # views: SDPA takes B x H x S x D
            with sdpa_kernel(which):
                out = F.scaled_dot_product_attention(q, k, v, is_causal=bool(problem["is_causal"]), enable_gqa=True)
            return [out.transpose(1, 2)]

        return run

    return {
        "sdpa_flash": backend(SDPBackend.FLASH_ATTENTION),
        "sdpa_efficient": backend(SDPBackend.EFFICIENT_ATTENTION),
        "sdpa_cudnn": backend(SDPBackend.CUDNN_ATTENTION),
    }


def flops(problem):
    # the example's count: two MMAs of batch * heads * seq_len^2 * dim products, half when causal
    total = 4.0 * problem["batch"] * problem["heads"] * problem["seq_len"] ** 2 * problem["dim"]
    return total / 2 if problem["is_causal"] else total
