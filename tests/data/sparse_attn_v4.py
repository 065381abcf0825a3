"""sparse_attn_v4: DeepSeek-V4-style MQA sparse attention forward (BSHD, one shared KV head
whose rows are both keys and values) with a learned attention sink per head, as tilelang's
examples/deepseek_v4/sparse_attn_fwd_sm90.py writes it: each query attends to topk key
positions named by an index tensor, gathered into shared memory element by element (no
TMA) inside a T.Pipelined loop; an index slot of -1 is padding, masked through a bool
fragment (idx >= 0) written into S before Q K^T accumulates onto it; the sink's exp is
added to the row sums after the loop. 64 heads per block, replicated over the heads.

    ws-tune tests/data/sparse_attn_v4.py --shape batch=1,seq=1024,seq_kv=4096,heads=64,topk=512 --budget 16
"""

import tilelang.language as T

PROBLEM = {"batch": None, "seq": None, "seq_kv": None, "heads": 128, "topk": 1024, "dim": 512, "dtype": "bfloat16"}
CHOICES = {"dim": [64, 128, 256, 512], "dtype": ["bfloat16", "float16"]}
PARAMS = {"block_N": [32, 64, 128], "num_stages": [1, 2], "threads": [128, 256]}
OUTPUTS = [3]  # Output; the sinks come after it
TOLERANCE = 2e-2
LOG2E = 1.44269504
HEADS_PER_BLOCK = 64


def check(problem, params, schedule):
    if problem["topk"] % params["block_N"]:
        return f"topk={problem['topk']} is not a multiple of block_N={params['block_N']} (the example asserts it)"
    if problem["heads"] % HEADS_PER_BLOCK:
        return f"heads={problem['heads']} is not a multiple of {HEADS_PER_BLOCK} (each block takes 64 heads)"
    # Q, KV, P and O's tiles, 2 bytes each: at dim=512 a 128-key block does not launch (274 KB)
    tiles = (2 * HEADS_PER_BLOCK * problem["dim"] + params["block_N"] * problem["dim"] + HEADS_PER_BLOCK * params["block_N"]) * 2
    if tiles > 227 * 1024:
        return f"block_N={params['block_N']} at dim={problem['dim']}: {tiles // 1024} KB of shared tiles, more than a block has (227 KB)"
    return None


def kernel(problem, *, block_N, num_stages, threads):
    batch, heads, seq_len, seq_len_kv, dim, topk = (problem[k] for k in ("batch", "heads", "seq", "seq_kv", "dim", "topk"))
    dtype, accum_dtype = problem["dtype"], "float32"
    sm_scale = (1.0 / dim) ** 0.5
    scale = sm_scale * LOG2E
    q_shape = [batch, seq_len, heads, dim]
    kv_shape = [batch, seq_len_kv, dim]
    idx_shape = [batch, seq_len, topk]
    o_shape = [batch, seq_len, heads, dim]
    BI = block_N
    NI = T.ceildiv(topk, BI)
    H_per_block = HEADS_PER_BLOCK
    REPLICATE_H = heads // H_per_block

    @T.prim_func
    def sparse_attn_v4(Q: T.Tensor(q_shape, dtype), KV: T.Tensor(kv_shape, dtype), TopkIndices: T.Tensor(idx_shape, "int32"),
                       Output: T.Tensor(o_shape, dtype), Sinks: T.Tensor([heads], dtype)):  # fmt: skip
        with T.Kernel(REPLICATE_H, seq_len, batch, threads=threads) as (h_block, seq_idx, by):
            h_start = h_block * H_per_block

            Q_shared = T.alloc_shared([H_per_block, dim], dtype)
            KV_shared = T.alloc_shared([BI, dim], dtype)
            S_shared = T.alloc_shared([H_per_block, BI], dtype)
            Sinks_shared = T.alloc_shared([H_per_block], dtype)

            acc_s = T.alloc_fragment([H_per_block, BI], accum_dtype)
            acc_o = T.alloc_fragment([H_per_block, dim], accum_dtype)
            acc_o_shared = T.alloc_shared([H_per_block, dim], dtype)
            scores_max = T.alloc_fragment([H_per_block], accum_dtype)
            scores_max_prev = T.alloc_fragment([H_per_block], accum_dtype)
            scores_scale = T.alloc_fragment([H_per_block], accum_dtype)
            scores_sum = T.alloc_fragment([H_per_block], accum_dtype)
            logsum = T.alloc_fragment([H_per_block], accum_dtype)
            mask = T.alloc_fragment([BI], "bool")

            T.copy(Q[by, seq_idx, h_start : h_start + H_per_block, :], Q_shared)
            T.copy(Sinks[h_start : h_start + H_per_block], Sinks_shared)
            T.fill(acc_o, 0)
            T.fill(logsum, 0)
            T.fill(scores_max, -(2**30))  # avoid -inf - inf to cause nan

            for i_i in T.Pipelined(NI, num_stages=num_stages):
                # valid mask: skip padding indices (-1)
                for bi_i in T.Parallel(BI):
                    idx = TopkIndices[by, seq_idx, i_i * BI + bi_i]
                    mask[bi_i] = idx >= 0
                # gather the KV block by the indices
                for bi_i, d_i in T.Parallel(BI, dim):
                    idx = TopkIndices[by, seq_idx, i_i * BI + bi_i]
                    KV_shared[bi_i, d_i] = KV[by, idx, d_i]
                # scores start from the mask
                for h_i, bi_i in T.Parallel(H_per_block, BI):
                    acc_s[h_i, bi_i] = T.if_then_else(mask[bi_i], 0, -T.infinity(acc_s.dtype))
                T.gemm(Q_shared, KV_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                # online softmax with exp2
                T.copy(scores_max, scores_max_prev)
                T.reduce_max(acc_s, scores_max, dim=1, clear=False)
                for h_i in T.Parallel(H_per_block):
                    scores_max[h_i] = T.max(scores_max[h_i], scores_max_prev[h_i])
                for h_i in T.Parallel(H_per_block):
                    scores_scale[h_i] = T.exp2(scores_max_prev[h_i] * scale - scores_max[h_i] * scale)
                for h_i, bi_i in T.Parallel(H_per_block, BI):
                    acc_s[h_i, bi_i] = T.exp2(acc_s[h_i, bi_i] * scale - scores_max[h_i] * scale)
                T.reduce_sum(acc_s, scores_sum, dim=1)
                # rescale acc_o by the correction factor
                for h_i, d_i in T.Parallel(H_per_block, dim):
                    acc_o[h_i, d_i] *= scores_scale[h_i]
                # accumulate P @ V
                T.copy(acc_s, S_shared)
                T.gemm(S_shared, KV_shared, acc_o, policy=T.GemmWarpPolicy.FullRow)
                for h_i in T.Parallel(H_per_block):
                    logsum[h_i] = logsum[h_i] * scores_scale[h_i] + scores_sum[h_i]

            # attention sink (per head)
            for h_i in T.Parallel(H_per_block):
                logsum[h_i] += T.exp2(Sinks_shared[h_i] * LOG2E - scores_max[h_i] * scale)
            for h_i, d_i in T.Parallel(H_per_block, dim):
                acc_o[h_i, d_i] /= logsum[h_i]
            T.copy(acc_o, acc_o_shared)
            T.copy(acc_o_shared, Output[by, seq_idx, h_start : h_start + H_per_block, :])

    return sparse_attn_v4


def inputs(problem, device):
    import torch

    batch, seq, seq_kv, heads, topk, dim = (problem[k] for k in ("batch", "seq", "seq_kv", "heads", "topk", "dim"))
    dtype = getattr(torch, problem["dtype"])
    q = torch.randn(batch, seq, heads, dim, device=device, dtype=dtype)
    kv = torch.randn(batch, seq_kv, dim, device=device, dtype=dtype)
    sinks = torch.randn(heads, device=device, dtype=dtype)
    # indices drawn as the example draws them, then a query-dependent tail of -1 padding:
    # every query keeps at least one valid slot, some keep all, some lose whole blocks
    indices = torch.randint(0, seq_kv, (batch, seq, topk), device=device, dtype=torch.int32)
    valid = torch.randint(1, topk + 1, (batch, seq, 1), device=device)
    valid[:, ::4] = topk
    indices = indices.masked_fill(torch.arange(topk, device=device) >= valid, -1)
    return [q, kv, indices, torch.empty(batch, seq, heads, dim, device=device, dtype=dtype), sinks]


def reference(problem, args):
    import torch

    q, kv, indices, sinks = args[0], args[1], args[2].long(), args[4]
    batch, seq, heads, dim = q.shape
    topk = indices.shape[-1]
    valid = indices >= 0
    # the example's torch_sparse_attention, with the padding slots masked out of the softmax
    kv_expanded = kv[:, None, :, :].expand(batch, seq, -1, dim)
    gathered = torch.gather(kv_expanded, 2, indices.clamp(min=0)[:, :, :, None].expand(batch, seq, topk, dim))
    scores = torch.einsum("bmhd,bmtd->bmht", q.float(), gathered.float()) / dim**0.5
    scores = scores.masked_fill(~valid[:, :, None, :], float("-inf"))
    sink = sinks.float()[None, None, :, None].expand(batch, seq, heads, 1)
    attn = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)
    return [torch.einsum("bmht,bmtd->bmhd", attn[..., :-1], gathered.float())]


def flops(problem):
    # the example's count: every index slot is computed, padding or not
    return 4.0 * problem["batch"] * problem["seq"] * problem["heads"] * problem["topk"] * problem["dim"]
