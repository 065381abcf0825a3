"""varlen_attn: FlashAttention forward over sequences of different lengths packed without
padding, as tilelang's examples/flash_attention/example_mha_fwd_varlen.py writes it: each
block reads its sequence's bounds from cu_seqlens (scalars bound at the top, which set the
key loop's trip count and the masks), loads tiles that may run past the sequence's end
(masked), and writes only the rows inside it, element by element from shared memory.

The lengths are drawn from the problem (a fixed seed, between half of max_seqlen and
max_seqlen), so that the kernel's tensor sizes and ``inputs`` agree.

    ws-tune tests/data/varlen_attn.py --shape batch=8,heads=16,max_seqlen=4096 --budget 16
"""

import random

import tilelang.language as T

PROBLEM = {"batch": None, "heads": None, "max_seqlen": None, "dim": 128, "causal": 0}
CHOICES = {"dim": [64, 128], "causal": [0, 1]}
PARAMS = {"block_M": [64, 128], "block_N": [64, 128], "num_stages": [1, 2], "threads": [128, 256]}
TOLERANCE = 2e-2
LOG2E = 1.44269504


def _lengths(problem):
    rng = random.Random(0)
    return [rng.randint(problem["max_seqlen"] // 2, problem["max_seqlen"]) for _ in range(problem["batch"])]


def kernel(problem, *, block_M, block_N, num_stages, threads):
    batch, heads, max_seqlen, dim, causal = (problem[k] for k in ("batch", "heads", "max_seqlen", "dim", "causal"))
    total = sum(_lengths(problem))
    scale = (1.0 / dim) ** 0.5 * LOG2E
    shape = (total, heads, dim)
    dtype, accum = "float16", "float32"

    @T.prim_func
    def varlen_attn(Q: T.Tensor(shape, dtype), K: T.Tensor(shape, dtype), V: T.Tensor(shape, dtype),
                    cu_seqlens: T.Tensor((batch + 1,), "int32"), Output: T.Tensor(shape, dtype)):  # fmt: skip
        with T.Kernel(T.ceildiv(max_seqlen, block_M), heads, batch, threads=threads) as (bx, by, bz):
            Q_shared = T.alloc_shared((block_M, dim), dtype)
            K_shared = T.alloc_shared((block_N, dim), dtype)
            V_shared = T.alloc_shared((block_N, dim), dtype)
            O_shared = T.alloc_shared((block_M, dim), dtype)
            acc_s = T.alloc_fragment((block_M, block_N), accum)
            acc_s_cast = T.alloc_fragment((block_M, block_N), dtype)
            acc_o = T.alloc_fragment((block_M, dim), accum)
            m = T.alloc_fragment((block_M,), accum)
            m_prev = T.alloc_fragment((block_M,), accum)
            alpha = T.alloc_fragment((block_M,), accum)
            row_sum = T.alloc_fragment((block_M,), accum)
            logsum = T.alloc_fragment((block_M,), accum)
            start = cu_seqlens[bz]
            seqlen = cu_seqlens[bz + 1] - start
            # Queries and keys of one sequence: causal blocks stop at the diagonal.
            loop_range = T.min(T.ceildiv((bx + 1) * block_M, block_N), T.ceildiv(seqlen, block_N)) if causal else T.ceildiv(seqlen, block_N)

            T.copy(Q[start + bx * block_M : start + (bx + 1) * block_M, by, :], Q_shared)  # rows past the end are masked
            T.fill(acc_o, 0)
            T.fill(logsum, 0)
            T.fill(m, -T.infinity(accum))
            for k in T.Pipelined(loop_range, num_stages=num_stages):
                T.copy(K[start + k * block_N : start + (k + 1) * block_N, by, :], K_shared)
                for i, j in T.Parallel(block_M, block_N):
                    outside = bx * block_M + i >= seqlen or k * block_N + j >= seqlen
                    acc_s[i, j] = T.if_then_else(outside or (causal and bx * block_M + i < k * block_N + j), -1e9, 0)
                T.gemm(Q_shared, K_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                T.copy(m, m_prev)
                T.reduce_max(acc_s, m, dim=1, clear=False)
                for i in T.Parallel(block_M):
                    alpha[i] = T.exp2(m_prev[i] * scale - m[i] * scale)
                for i, j in T.Parallel(block_M, block_N):
                    acc_s[i, j] = T.exp2(acc_s[i, j] * scale - m[i] * scale)
                T.reduce_sum(acc_s, row_sum, dim=1)
                for i in T.Parallel(block_M):
                    logsum[i] = logsum[i] * alpha[i] + row_sum[i]
                T.copy(acc_s, acc_s_cast)
                for i, j in T.Parallel(block_M, dim):
                    acc_o[i, j] *= alpha[i]
                T.copy(V[start + k * block_N : start + (k + 1) * block_N, by, :], V_shared)
                T.gemm(acc_s_cast, V_shared, acc_o, policy=T.GemmWarpPolicy.FullRow)
            for i, j in T.Parallel(block_M, dim):
                acc_o[i, j] /= logsum[i]
            T.copy(acc_o, O_shared)
            for i, d in T.Parallel(block_M, dim):
                if bx * block_M + i < seqlen:
                    Output[start + bx * block_M + i, by, d] = O_shared[i, d]

    return varlen_attn


def inputs(problem, device):
    import torch

    lengths = _lengths(problem)
    shape = (sum(lengths), problem["heads"], problem["dim"])
    q, k, v = (torch.randn(shape, device=device, dtype=torch.float16) for _ in range(3))
    cu_seqlens = torch.tensor([0, *lengths], device=device, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    return [q, k, v, cu_seqlens, torch.empty(shape, device=device, dtype=torch.float16)]


def reference(problem, args):
    import torch.nn.functional as F

    q, k, v, cu_seqlens, out = args
    result = out.new_empty(out.shape)
    bounds = cu_seqlens.tolist()
    for start, end in zip(bounds, bounds[1:]):  # a sequence at a time, heads as the batch
        part = [t[start:end].transpose(0, 1) for t in (q, k, v)]
        result[start:end] = F.scaled_dot_product_attention(*part, is_causal=bool(problem["causal"])).transpose(0, 1)
    return [result]


def flops(problem):
    per_sequence = sum(n * n for n in _lengths(problem)) * problem["heads"] * problem["dim"] * 4.0
    return per_sequence / 2 if problem["causal"] else per_sequence
