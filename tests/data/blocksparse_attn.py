"""blocksparse_attn: block-sparse attention (BHSD, fp16) as tilelang's
examples/blocksparse_attention/example_tilelang_block_sparse_attn.py writes it: a boolean
mask per (query block, key block) is copied into a fragment once, and the whole body of the
key loop, both loads included, runs under `if block_mask[k]`. Each query block keeps its
first key block and topk - 1 others drawn at random; causal keeps the lower triangle.
The mask is bool as in the example (tilelang 0.1.15's own lowerings fail to compile its
fragment copy at 128 key blocks or more: "Cannot convert type boolx16") or int8.

    ws-tune tests/data/blocksparse_attn.py --shape batch=4,heads=16,seq=4096,topk=16 --budget 16
"""

import tilelang.language as T

PROBLEM = {"batch": None, "heads": None, "seq": None, "dim": 128, "block": 64, "topk": 8, "causal": 1, "mask": "bool"}
CHOICES = {"dim": [64, 128], "block": [64, 128], "causal": [0, 1], "mask": ["bool", "int8"]}
PARAMS = {"num_stages": [1, 2], "threads": [128, 256]}
OUTPUTS = [4]
TOLERANCE = 2e-2
LOG2E = 1.44269504


def check(problem, params, schedule):
    if problem["seq"] % problem["block"]:
        return f"seq={problem['seq']} is not a multiple of block={problem['block']}"
    if params["threads"] > 2 * problem["block"]:
        return f"threads={params['threads']} split a {problem['block']}-row block over too many warps (acc_s and acc_s_cast take conflicting layouts)"
    return None


def kernel(problem, *, num_stages, threads):
    batch, heads, seq, dim, block, causal = (problem[k] for k in ("batch", "heads", "seq", "dim", "block", "causal"))
    blocks = seq // block
    scale = (1.0 / dim) ** 0.5 * LOG2E
    shape = (batch, heads, seq, dim)
    dtype, accum = "float16", "float32"

    @T.prim_func
    def blocksparse_attn(Q: T.Tensor(shape, dtype), K: T.Tensor(shape, dtype), V: T.Tensor(shape, dtype),
                         BlockMask: T.Tensor((batch, heads, blocks, blocks), problem["mask"]), Output: T.Tensor(shape, dtype)):  # fmt: skip
        with T.Kernel(blocks, heads, batch, threads=threads) as (bx, by, bz):
            Q_shared = T.alloc_shared((block, dim), dtype)
            K_shared = T.alloc_shared((block, dim), dtype)
            V_shared = T.alloc_shared((block, dim), dtype)
            O_shared = T.alloc_shared((block, dim), dtype)
            acc_s = T.alloc_fragment((block, block), accum)
            acc_s_cast = T.alloc_fragment((block, block), dtype)
            acc_o = T.alloc_fragment((block, dim), accum)
            scores_max = T.alloc_fragment((block,), accum)
            scores_max_prev = T.alloc_fragment((block,), accum)
            scores_scale = T.alloc_fragment((block,), accum)
            scores_sum = T.alloc_fragment((block,), accum)
            logsum = T.alloc_fragment((block,), accum)
            block_mask = T.alloc_fragment((blocks,), problem["mask"])

            T.copy(Q[bz, by, bx * block : (bx + 1) * block, :], Q_shared)
            T.fill(acc_o, 0)
            T.fill(logsum, 0)
            T.fill(scores_max, -T.infinity(accum))
            T.copy(BlockMask[bz, by, bx, :], block_mask)
            for k in T.Pipelined(bx + 1 if causal else blocks, num_stages=num_stages):
                if block_mask[k] != 0:
                    T.copy(K[bz, by, k * block : (k + 1) * block, :], K_shared)
                    if causal:
                        for i, j in T.Parallel(block, block):
                            acc_s[i, j] = T.if_then_else(bx * block + i >= k * block + j, 0, -T.infinity(accum))
                    else:
                        T.clear(acc_s)
                    T.gemm(Q_shared, K_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                    T.copy(scores_max, scores_max_prev)
                    T.fill(scores_max, -T.infinity(accum))
                    T.reduce_max(acc_s, scores_max, dim=1, clear=False)
                    for i in T.Parallel(block):
                        scores_max[i] = T.max(scores_max[i], scores_max_prev[i])
                    for i in T.Parallel(block):
                        scores_scale[i] = T.exp2(scores_max_prev[i] * scale - scores_max[i] * scale)
                    for i, j in T.Parallel(block, block):
                        acc_s[i, j] = T.exp2(acc_s[i, j] * scale - scores_max[i] * scale)
                    T.reduce_sum(acc_s, scores_sum, dim=1)
                    for i in T.Parallel(block):
                        logsum[i] = logsum[i] * scores_scale[i] + scores_sum[i]
                    T.copy(acc_s, acc_s_cast)
                    for i, j in T.Parallel(block, dim):
                        acc_o[i, j] *= scores_scale[i]
                    T.copy(V[bz, by, k * block : (k + 1) * block, :], V_shared)
                    T.gemm(acc_s_cast, V_shared, acc_o, policy=T.GemmWarpPolicy.FullRow)
            for i, j in T.Parallel(block, dim):
                acc_o[i, j] /= logsum[i]
            T.copy(acc_o, O_shared)
            T.copy(O_shared, Output[bz, by, bx * block : (bx + 1) * block, :])

    return blocksparse_attn


def _mask(problem, device):
    import torch

    batch, heads, blocks = problem["batch"], problem["heads"], problem["seq"] // problem["block"]
    scores = torch.rand(batch, heads, blocks, blocks, device=device)
    scores[..., 0] = 2.0  # every query block keeps key block 0, so no row is empty
    if problem["causal"]:
        scores = scores.masked_fill(torch.ones(blocks, blocks, device=device, dtype=torch.bool).triu(1), -1.0)
    picked = scores.topk(min(problem["topk"], blocks), dim=-1).indices
    mask = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, picked, True)
    return mask & (scores >= 0)


def inputs(problem, device):
    import torch

    shape = (problem["batch"], problem["heads"], problem["seq"], problem["dim"])
    q, k, v = (torch.randn(shape, device=device, dtype=torch.float16) for _ in range(3))
    return [q, k, v, _mask(problem, device).to(getattr(torch, problem["mask"])), torch.empty(shape, device=device, dtype=torch.float16)]


def reference(problem, args):
    import torch

    block, seq = problem["block"], problem["seq"]
    causal = torch.ones(seq, seq, device=args[0].device, dtype=torch.bool).tril() if problem["causal"] else None
    out = torch.empty_like(args[0], dtype=torch.float32)
    for b in range(args[0].shape[0]):  # one batch at a time: a (heads, seq, seq) score tensor is 4 GiB at 16 x 8192^2
        q, k, v = (a[b].float() for a in args[:3])
        keep = args[3][b].bool().repeat_interleave(block, dim=-2).repeat_interleave(block, dim=-1)
        keep = keep & causal if causal is not None else keep
        logits = torch.einsum("hqd,hkd->hqk", q, k) / q.shape[-1] ** 0.5
        out[b] = torch.einsum("hqk,hkd->hqd", logits.masked_fill_(~keep, float("-inf")).softmax(-1), v)
    return [out]


def flops(problem):
    # the kept blocks only: topk per query block, fewer near the top when causal
    blocks, block = problem["seq"] // problem["block"], problem["block"]
    kept = sum(min(problem["topk"], q + 1 if problem["causal"] else blocks) for q in range(blocks))
    return 4.0 * problem["batch"] * problem["heads"] * kept * block * block * problem["dim"]
