"""gqa_decode: flash decoding for grouped-query attention as tilelang's
examples/flash_decoding writes it: one query token per sequence, the KV sequence cut
into `num_split` parts, each part attended by its own block (its partial output and
log-sum-exp written to global scratch), then a second kernel in the same function
combines the parts. The query heads of one KV group share the block's MMA rows.

    ws-tune tests/data/gqa_decode.py --shape batch=64,seqlen_kv=8192 --budget 16
"""

import tilelang.language as T

PROBLEM = {"batch": None, "heads": 32, "groups": 8, "seqlen_kv": None, "dim": 128}
PARAMS = {"block_N": [64, 128], "num_split": [1, 2, 4, 8], "num_stages": [1, 2, 3]}
OUTPUTS = [3]
TOLERANCE = 2e-2
BLOCK_H = 64  # MMA rows per block; only heads // groups of them are real queries


def check(problem, params, schedule):
    if problem["heads"] % problem["groups"]:
        return f"heads={problem['heads']} is not a multiple of groups={problem['groups']}"
    part = problem["seqlen_kv"] // params["num_split"]
    if problem["seqlen_kv"] % params["num_split"] or part % params["block_N"]:
        return f"seqlen_kv={problem['seqlen_kv']} does not cut into {params['num_split']} parts of whole {params['block_N']}-key blocks"
    return None


def kernel(problem, *, block_N, num_split, num_stages):
    batch, heads, groups, seqlen_kv, dim = (problem[k] for k in ("batch", "heads", "groups", "seqlen_kv", "dim"))
    scale = (1.0 / dim) ** 0.5 * 1.44269504  # log2(e)
    valid_h = min(BLOCK_H, heads // groups)
    part = seqlen_kv // num_split
    dtype, acc = "float16", "float32"

    @T.prim_func
    def gqa_decode(Q: T.Tensor((batch, heads, dim), dtype), K: T.Tensor((batch, seqlen_kv, groups, dim), dtype),
                   V: T.Tensor((batch, seqlen_kv, groups, dim), dtype), Output: T.Tensor((batch, heads, dim), dtype)):  # fmt: skip
        glse = T.alloc_global((batch, heads, num_split), acc)
        partial = T.alloc_global((batch, heads, num_split, dim), dtype)
        with T.Kernel(batch, heads // valid_h, num_split, threads=128) as (bid, hid, sid):
            Q_shared = T.alloc_shared((BLOCK_H, dim), dtype)
            K_shared = T.alloc_shared((block_N, dim), dtype)
            V_shared = T.alloc_shared((block_N, dim), dtype)
            O_shared = T.alloc_shared((valid_h, dim), dtype)
            acc_s = T.alloc_fragment((BLOCK_H, block_N), acc)
            acc_s_cast = T.alloc_fragment((BLOCK_H, block_N), dtype)
            acc_o = T.alloc_fragment((BLOCK_H, dim), acc)
            m = T.alloc_fragment((BLOCK_H,), acc)
            m_prev = T.alloc_fragment((BLOCK_H,), acc)
            alpha = T.alloc_fragment((BLOCK_H,), acc)
            row_sum = T.alloc_fragment((BLOCK_H,), acc)
            logsum = T.alloc_fragment((BLOCK_H,), acc)
            kv_head = hid // ((heads // groups) // valid_h)

            T.copy(Q[bid, hid * valid_h : hid * valid_h + BLOCK_H, :], Q_shared)
            T.fill(acc_o, 0)
            T.fill(logsum, 0)
            T.fill(m, -T.infinity(acc))
            for k in T.Pipelined(part // block_N, num_stages=num_stages):
                T.copy(K[bid, part * sid + k * block_N : part * sid + (k + 1) * block_N, kv_head, :], K_shared)
                T.clear(acc_s)
                T.gemm(Q_shared, K_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                T.copy(m, m_prev)
                T.reduce_max(acc_s, m, dim=1, clear=False)
                for i in T.Parallel(BLOCK_H):
                    alpha[i] = T.exp2(m_prev[i] * scale - m[i] * scale)
                for i, j in T.Parallel(BLOCK_H, block_N):
                    acc_s[i, j] = T.exp2(acc_s[i, j] * scale - m[i] * scale)
                T.reduce_sum(acc_s, row_sum, dim=1)
                for i in T.Parallel(BLOCK_H):
                    logsum[i] = logsum[i] * alpha[i] + row_sum[i]
                T.copy(acc_s, acc_s_cast)
                for i, j in T.Parallel(BLOCK_H, dim):
                    acc_o[i, j] *= alpha[i]
                T.copy(V[bid, part * sid + k * block_N : part * sid + (k + 1) * block_N, kv_head, :], V_shared)
                T.gemm(acc_s_cast, V_shared, acc_o, policy=T.GemmWarpPolicy.FullRow)
            for i, j in T.Parallel(BLOCK_H, dim):
                acc_o[i, j] /= logsum[i]
            for i in T.Parallel(BLOCK_H):
                logsum[i] = T.log2(logsum[i]) + m[i] * scale
            for i in T.Parallel(BLOCK_H):
                if i < valid_h:
                    glse[bid, hid * valid_h + i, sid] = logsum[i]
            T.copy(acc_o[:valid_h, :], O_shared)
            T.copy(O_shared, partial[bid, hid * valid_h : (hid + 1) * valid_h, sid, :])

        with T.Kernel(heads, batch, threads=128) as (h, b):
            o = T.alloc_fragment((dim,), acc)
            lse_max = T.alloc_var(acc)
            lse_sum = T.alloc_var(acc)
            T.clear(o)
            lse_max = -T.infinity(acc)
            lse_sum = 0.0
            for s in T.serial(num_split):
                lse_max = T.max(lse_max, glse[b, h, s])
            for s in T.serial(num_split):
                lse_sum += T.exp2(glse[b, h, s] - lse_max)
            for s in T.serial(num_split):
                for i in T.Parallel(dim):
                    o[i] += partial[b, h, s, i] * T.exp2(glse[b, h, s] - lse_max) / lse_sum
            for i in T.Parallel(dim):
                Output[b, h, i] = o[i]

    return gqa_decode


def inputs(problem, device):
    import torch

    batch, heads, groups, seqlen_kv, dim = (problem[k] for k in ("batch", "heads", "groups", "seqlen_kv", "dim"))
    q = torch.randn(batch, heads, dim, device=device, dtype=torch.float16)
    k = torch.randn(batch, seqlen_kv, groups, dim, device=device, dtype=torch.float16)
    v = torch.randn(batch, seqlen_kv, groups, dim, device=device, dtype=torch.float16)
    return [q, k, v, torch.empty(batch, heads, dim, device=device, dtype=torch.float16)]


def _sdpa(args):
    import torch.nn.functional as F

    q, k, v, _ = args
    # (B, H, 1, D) against (B, G, S, D): each KV head serves heads // groups query heads
    out = F.scaled_dot_product_attention(q.unsqueeze(2), k.transpose(1, 2), v.transpose(1, 2), enable_gqa=True)
    return [out.squeeze(2)]


def reference(problem, args):
    q, k, v, out = args
    return _sdpa([q.float(), k.float(), v.float(), out])


def flops(problem):
    return 4.0 * problem["batch"] * problem["heads"] * problem["seqlen_kv"] * problem["dim"]


def vendors(problem):
    return {"sdpa": _sdpa}
