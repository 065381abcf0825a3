"""block_sparse_mqa: the logits of DeepSeek sparse attention's block-sparse MQA indexer
(fp8), as tilelang's examples/dsa_hisa/block_sparse_mqa_fp8.py writes it: each query
token's heads share one fp8 key block, picked by an index tensor (topk blocks of
kv_block_size keys a query); the scores are scaled per key, rectified, weighted per head
and summed over heads, keys outside the query's [ks, ke) range set to -inf. The
pipelined loop walks one picked block's key tiles and sits inside a serial loop over the
picks: a pipeline in an inner scope, of two or four iterations, whose result is written to
global memory on every iteration.

The correctness gate's relative error is NaN where both sides hold -inf, so the inputs
keep every key in range (ks = 0, ke = seq_kv): the mask is built and compiled, not hit.

    ws-tune tests/data/block_sparse_mqa.py --shape seq=4096,seq_kv=8192 --budget 16
"""

import tilelang.language as T

PROBLEM = {"seq": None, "seq_kv": None, "heads": 64, "dim": 128, "kv_block_size": 128, "topk": 64}
CHOICES = {"heads": [32, 64], "dim": [64, 128], "kv_block_size": [64, 128, 256]}
PARAMS = {"block_N": [32, 64], "num_stages": [1, 2], "threads": [128, 256]}
TOLERANCE = 2e-2


def check(problem, params, schedule):
    if problem["kv_block_size"] % params["block_N"] or params["block_N"] > problem["kv_block_size"] // 2:
        return f"block_N={params['block_N']} does not cut a {problem['kv_block_size']}-key block into two tiles or more"
    if problem["seq_kv"] % problem["kv_block_size"] or problem["topk"] > problem["seq_kv"] // problem["kv_block_size"]:
        return f"seq_kv={problem['seq_kv']} does not hold topk={problem['topk']} whole blocks of {problem['kv_block_size']} keys"
    return None


def kernel(problem, *, block_N, num_stages, threads):
    seq, seq_kv, heads, dim, kv_block, topk = (problem[k] for k in ("seq", "seq_kv", "heads", "dim", "kv_block_size", "topk"))
    fp8, accum = "float8_e4m3", "float32"

    @T.prim_func
    def block_sparse_mqa(IndexQ: T.Tensor((seq * heads, dim), fp8), IndexK: T.Tensor((seq_kv, dim), fp8),
                         IndexKScale: T.Tensor((seq_kv,), accum), TopKBlockIndex: T.Tensor((seq, topk), "int64"),
                         Weights: T.Tensor((seq, heads), accum), CuSeqLenKS: T.Tensor((seq,), "int32"),
                         CuSeqLenKE: T.Tensor((seq,), "int32"), Logits: T.Tensor((seq, topk * kv_block), accum)):  # fmt: skip
        with T.Kernel(seq, threads=threads) as bx:
            index_q_shared = T.alloc_shared((heads, dim), fp8)
            index_k_shared = T.alloc_shared((block_N, dim), fp8)
            scale_shared = T.alloc_shared((block_N,), accum)
            s = T.alloc_fragment((block_N, heads), accum)
            logits = T.alloc_fragment((block_N,), accum)
            weights = T.alloc_fragment((heads,), accum)
            k_start = CuSeqLenKS[bx]
            k_end = CuSeqLenKE[bx]

            T.copy(IndexQ[bx * heads : (bx + 1) * heads, :], index_q_shared)
            T.copy(Weights[bx, :], weights)
            for n_i in T.serial(topk):
                block_s = T.cast(TopKBlockIndex[bx, n_i], "int32") * kv_block
                for b_i in T.Pipelined(kv_block // block_N, num_stages=num_stages):
                    key0 = block_s + b_i * block_N
                    T.copy(IndexK[key0 : key0 + block_N, :], index_k_shared)
                    for i in T.Parallel(block_N):
                        scale_shared[i] = IndexKScale[key0 + i]
                    T.gemm(index_k_shared, index_q_shared, s, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                    for i, h in T.Parallel(block_N, heads):
                        s[i, h] = T.max(s[i, h] * scale_shared[i], 0) * weights[h]
                    T.reduce_sum(s, logits, dim=1, clear=True)
                    for i in T.Parallel(block_N):
                        if key0 + i < k_start or key0 + i >= k_end:
                            logits[i] = -T.infinity(accum)
                    for i in T.Parallel(block_N):
                        Logits[bx, n_i * kv_block + b_i * block_N + i] = logits[i]

    return block_sparse_mqa


def inputs(problem, device):
    import torch

    seq, seq_kv, heads, dim, kv_block, topk = (problem[k] for k in ("seq", "seq_kv", "heads", "dim", "kv_block_size", "topk"))
    q = torch.randn(seq * heads, dim, device=device).to(torch.float8_e4m3fn)
    k = torch.randn(seq_kv, dim, device=device).to(torch.float8_e4m3fn)
    k_scale = 0.1 + 0.01 * torch.rand(seq_kv, device=device)
    blocks = torch.rand(seq, seq_kv // kv_block, device=device).argsort(dim=1)[:, :topk]  # distinct picks per query
    weights = torch.randn(seq, heads, device=device)
    ks = torch.zeros(seq, device=device, dtype=torch.int32)
    ke = torch.full((seq,), seq_kv, device=device, dtype=torch.int32)
    logits = torch.empty(seq, topk * kv_block, device=device)
    return [q, k, k_scale, blocks.to(torch.int64), weights, ks, ke, logits]


def reference(problem, args):
    import torch

    q, k, k_scale, blocks, weights, ks, ke, _ = args
    heads, kv_block = problem["heads"], problem["kv_block_size"]
    keys = (blocks[:, :, None] * kv_block + torch.arange(kv_block, device=q.device)).flatten(1)  # (seq, topk * kv_block)
    q, k = q.float(), k.float() * k_scale[:, None]  # fp8 tensors index poorly: widened first
    out = []
    for m in range(q.shape[0] // heads):  # a query at a time: the gathered keys of all of them do not fit
        scores = k[keys[m]] @ q[m * heads : (m + 1) * heads].T
        logit = (scores.clamp(min=0) * weights[m]).sum(dim=1)
        out.append(logit.masked_fill((keys[m] < ks[m]) | (keys[m] >= ke[m]), float("-inf")))
    return [torch.stack(out)]


def flops(problem):
    return 2.0 * problem["seq"] * problem["topk"] * problem["kv_block_size"] * problem["heads"] * problem["dim"]
