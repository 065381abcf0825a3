"""mla_decode: DeepSeek's multi-head latent attention for decoding, as tilelang's
examples/deepseek_mla writes it: one query token per sequence, 128 query heads over one
latent KV head of 512 values plus a 64-value rotary part. The latent tile is both the
keys (S = Q KV^T + Q_pe K_pe^T, two MMAs into one accumulator) and the values
(O += P KV, P staged in shared memory); each block takes 64 heads of one sequence.

    ws-tune tests/data/mla_decode.py --shape batch=132,seqlen_kv=8192 --budget 16
"""

import tilelang.language as T

PROBLEM = {"batch": None, "heads": 128, "seqlen_kv": None, "dim": 512, "pe_dim": 64}
# out="q": the output tile goes out through Q's shared buffer (Q is dead after the loop), as
# tilelang's default lowering arranges on its own; warp-specialized schedules lowered by
# MaterializeWSSchedule get no shared-memory reuse across roles, and 2 stages of the
# latent tile fit only this way (64 KB less).
PARAMS = {"block_N": [32, 64], "num_stages": [1, 2], "threads": [256], "out": ["own", "q"]}
OUTPUTS = [4]
TOLERANCE = 2e-2
BLOCK_H = 64


def check(problem, params, schedule):
    if problem["heads"] % BLOCK_H:
        return f"heads={problem['heads']} is not a multiple of {BLOCK_H}"
    if problem["seqlen_kv"] % params["block_N"]:
        return f"seqlen_kv={problem['seqlen_kv']} is not a multiple of block_N={params['block_N']}"
    return None


def kernel(problem, *, block_N, num_stages, threads, out="own"):
    batch, heads, seqlen_kv, dim, pe_dim = (problem[k] for k in ("batch", "heads", "seqlen_kv", "dim", "pe_dim"))
    scale = (dim + pe_dim) ** -0.5 * 1.44269504  # log2(e)
    dtype, acc = "float16", "float32"

    @T.prim_func
    def mla_decode(Q: T.Tensor((batch, heads, dim), dtype), Q_pe: T.Tensor((batch, heads, pe_dim), dtype),
                   KV: T.Tensor((batch, seqlen_kv, 1, dim), dtype), K_pe: T.Tensor((batch, seqlen_kv, 1, pe_dim), dtype),
                   Output: T.Tensor((batch, heads, dim), dtype)):  # fmt: skip
        with T.Kernel(heads // BLOCK_H, batch, threads=threads) as (hid, bid):
            Q_shared = T.alloc_shared((BLOCK_H, dim), dtype)
            Q_pe_shared = T.alloc_shared((BLOCK_H, pe_dim), dtype)
            KV_shared = T.alloc_shared((block_N, dim), dtype)
            K_pe_shared = T.alloc_shared((block_N, pe_dim), dtype)
            S_shared = T.alloc_shared((BLOCK_H, block_N), dtype)
            O_shared = Q_shared if out == "q" else T.alloc_shared((BLOCK_H, dim), dtype)
            acc_s = T.alloc_fragment((BLOCK_H, block_N), acc)
            acc_o = T.alloc_fragment((BLOCK_H, dim), acc)
            m = T.alloc_fragment((BLOCK_H,), acc)
            m_prev = T.alloc_fragment((BLOCK_H,), acc)
            alpha = T.alloc_fragment((BLOCK_H,), acc)
            row_sum = T.alloc_fragment((BLOCK_H,), acc)
            logsum = T.alloc_fragment((BLOCK_H,), acc)

            T.copy(Q[bid, hid * BLOCK_H : (hid + 1) * BLOCK_H, :], Q_shared)
            T.copy(Q_pe[bid, hid * BLOCK_H : (hid + 1) * BLOCK_H, :], Q_pe_shared)
            T.fill(acc_o, 0)
            T.fill(logsum, 0)
            T.fill(m, -T.infinity(acc))
            for k in T.Pipelined(seqlen_kv // block_N, num_stages=num_stages):
                T.copy(KV[bid, k * block_N : (k + 1) * block_N, 0, :], KV_shared)
                T.copy(K_pe[bid, k * block_N : (k + 1) * block_N, 0, :], K_pe_shared)
                T.gemm(Q_shared, KV_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullCol, clear_accum=True)
                T.gemm(Q_pe_shared, K_pe_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullCol)
                T.copy(m, m_prev)
                T.reduce_max(acc_s, m, dim=1, clear=False)
                for i in T.Parallel(BLOCK_H):
                    alpha[i] = T.exp2(m_prev[i] * scale - m[i] * scale)
                for i, j in T.Parallel(BLOCK_H, block_N):
                    acc_s[i, j] = T.exp2(acc_s[i, j] * scale - m[i] * scale)
                T.reduce_sum(acc_s, row_sum, dim=1)
                T.copy(acc_s, S_shared)
                for i in T.Parallel(BLOCK_H):
                    logsum[i] = logsum[i] * alpha[i] + row_sum[i]
                for i, j in T.Parallel(BLOCK_H, dim):
                    acc_o[i, j] *= alpha[i]
                T.gemm(S_shared, KV_shared, acc_o, policy=T.GemmWarpPolicy.FullCol)
            for i, j in T.Parallel(BLOCK_H, dim):
                acc_o[i, j] /= logsum[i]
            T.copy(acc_o, O_shared)
            T.copy(O_shared, Output[bid, hid * BLOCK_H : (hid + 1) * BLOCK_H, :])

    return mla_decode


def inputs(problem, device):
    import torch

    batch, heads, seqlen_kv, dim, pe_dim = (problem[k] for k in ("batch", "heads", "seqlen_kv", "dim", "pe_dim"))
    rand = lambda *shape: torch.randn(*shape, device=device, dtype=torch.float16)  # noqa: E731
    return [rand(batch, heads, dim), rand(batch, heads, pe_dim), rand(batch, seqlen_kv, 1, dim), rand(batch, seqlen_kv, 1, pe_dim),
            torch.empty(batch, heads, dim, device=device, dtype=torch.float16)]  # fmt: skip


def _attend(args, dtype):
    """Softmax((q . kv + q_pe . k_pe) / sqrt(dim + pe_dim)) @ kv, with batched MMAs (every
    head reads the one latent head: a broadcast view, never copied per head)."""
    import torch

    q, q_pe, kv, k_pe, _ = (a.to(dtype) for a in args)
    kv, k_pe = kv[:, :, 0], k_pe[:, :, 0]  # (B, S, D), (B, S, P)
    scores = (q @ kv.transpose(1, 2) + q_pe @ k_pe.transpose(1, 2)) * (q.shape[-1] + q_pe.shape[-1]) ** -0.5
    return [(torch.softmax(scores.float(), dim=-1).to(dtype) @ kv)]


def reference(problem, args):
    import torch

    return _attend(args, torch.float32)


def flops(problem):
    b, h, s, d, p = (problem[k] for k in ("batch", "heads", "seqlen_kv", "dim", "pe_dim"))
    return 2.0 * b * h * s * (d + p) + 2.0 * b * h * s * d


def vendors(problem):
    import torch

    return {"sdpa": lambda args: _attend(args, torch.float16)}
