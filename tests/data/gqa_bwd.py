"""gqa_bwd: FlashAttention's backward pass for grouped-query attention (BSHD, fp16, a
192-wide Q/K head and a 128-wide V head), as tilelang's
examples/flash_attention/example_gqa_bwd_tma_reduce.py writes it (its
``flashattn_bwd_atomic_add``): one block per (query head, block of keys) keeps that head's
group's K and V in shared memory and walks the queries, five MMAs per step (S^T, dP^T,
dV += P^T dO, dK += dS^T Q, dQ = dS K). Every gradient is reduced in fp32 global memory by
TMA reductions (``T.atomic_add(..., use_tma=True)``, ``cp.reduce.async.bulk``) from a
shared tile: dQ's in the loop, one per step, and dK's and dV's after it, where the
``groups`` query heads of a KV head add into the same rows. The forward's log-sum-exp and
the preprocessing kernel's row sums Delta = rowsum(O * dO) come in as inputs, computed with
torch; the postprocessing kernel, which only casts the fp32 gradients to fp16, is left out.

New here for a schedule tuner, beside flash_bwd.py (MHA, dQ by per-element atomics from
registers, dK and dV stored): the atomics are tile-region TMA reductions whose source is a
shared tile a fragment was copied into just before (fragment -> shared -> TMA), one inside
the pipelined loop and two in the epilogue; every output is atomically accumulated
(RESET_TO_ZERO has all three); K's and V's head is ``bx // groups``, so ``groups`` blocks
share a KV head; the two head sizes differ, so the per-step operands and the fp32 dK/dV
tiles are uneven (192 vs 128 columns), and the fp32 staging tiles are large (up to 160 KB
after the loop, live only there).

    ws-tune tests/data/gqa_bwd.py --shape batch=8,heads=32,seq_len=1024 --budget 16
"""

import tilelang.language as T

PROBLEM = {"batch": None, "heads": None, "seq_len": None, "groups": 16, "dim_qk": 192, "dim_v": 128, "causal": 0}
CHOICES = {"dim_qk": [64, 128, 192], "dim_v": [64, 128], "causal": [0, 1]}
# the example's tile sizes and depth; its 256 threads are two warpgroups over block_M=128
PARAMS = {"block_M": [64, 128], "block_N": [32, 64], "num_stages": [1, 2]}
OUTPUTS = [6, 7, 8]
RESET_TO_ZERO = [6, 7, 8]  # dQ: every key block adds its share; dK, dV: every query head of the group
TOLERANCE = 2e-2
LOG2E = 1.44269504


def check(problem, params, schedule):
    for block in ("block_M", "block_N"):
        if problem["seq_len"] % params[block]:
            return f"seq_len={problem['seq_len']} is not a multiple of {block}={params[block]}"
    if problem["heads"] % problem["groups"]:
        return f"heads={problem['heads']} is not a multiple of groups={problem['groups']}"
    return None


def kernel(problem, *, block_M, block_N, num_stages):
    batch, heads, seq_len, groups = (problem[k] for k in ("batch", "heads", "seq_len", "groups"))
    dim_qk, dim_v, causal = problem["dim_qk"], problem["dim_v"], problem["causal"]
    sm_scale = (1.0 / dim_qk) ** 0.5
    scale = sm_scale * LOG2E
    head_kv = heads // groups
    q_shape = (batch, seq_len, heads, dim_qk)
    k_shape = (batch, seq_len, head_kv, dim_qk)
    v_shape = (batch, seq_len, head_kv, dim_v)
    threads = 2 * block_M  # one warpgroup per 64 key rows: the example's 256 at block_M=128
    dtype, acc = "float16", "float32"

    @T.prim_func
    def gqa_bwd(Q: T.Tensor(q_shape, dtype), K: T.Tensor(k_shape, dtype), V: T.Tensor(v_shape, dtype),
                dO: T.Tensor((batch, seq_len, heads, dim_v), dtype), lse: T.Tensor((batch, heads, seq_len), acc),
                Delta: T.Tensor((batch, heads, seq_len), acc), dQ: T.Tensor(q_shape, acc),
                dK: T.Tensor(k_shape, acc), dV: T.Tensor(v_shape, acc)):  # fmt: skip
        with T.Kernel(heads, seq_len // block_M, batch, threads=threads) as (bx, by, bz):
            K_shared = T.alloc_shared((block_M, dim_qk), dtype)
            dsT_shared = T.alloc_shared((block_M, block_N), dtype)
            q = T.alloc_shared((block_N, dim_qk), dtype)
            V_shared = T.alloc_shared((block_M, dim_v), dtype)
            qkT = T.alloc_fragment((block_M, block_N), acc)
            dsT = T.alloc_fragment((block_M, block_N), acc)
            qkT_cast = T.alloc_fragment((block_M, block_N), dtype)
            dsT_cast = T.alloc_fragment((block_M, block_N), dtype)
            lse_shared = T.alloc_shared((block_N,), acc)
            delta = T.alloc_shared((block_N,), acc)
            do = T.alloc_shared((block_N, dim_v), dtype)
            dv = T.alloc_fragment((block_M, dim_v), acc)
            dk = T.alloc_fragment((block_M, dim_qk), acc)
            dq = T.alloc_fragment((block_N, dim_qk), acc)
            dk_shared = T.alloc_shared((block_M, dim_qk), acc)
            dv_shared = T.alloc_shared((block_M, dim_v), acc)
            dq_shared = T.alloc_shared((block_N, dim_qk), acc)

            T.copy(K[bz, by * block_M : (by + 1) * block_M, bx // groups, :], K_shared)
            T.copy(V[bz, by * block_M : (by + 1) * block_M, bx // groups, :], V_shared)
            T.clear(dv)
            T.clear(dk)
            loop_st = T.floordiv(by * block_M, block_N) if causal else 0
            for k in T.Pipelined(loop_st, seq_len // block_N, num_stages=num_stages):
                T.copy(Q[bz, k * block_N : (k + 1) * block_N, bx, :], q)
                T.clear(qkT)
                T.gemm(K_shared, q, qkT, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                T.copy(lse[bz, bx, k * block_N : (k + 1) * block_N], lse_shared)
                for i, j in T.Parallel(block_M, block_N):
                    qkT[i, j] = T.exp2(qkT[i, j] * scale - lse_shared[j])
                if causal:
                    for i, j in T.Parallel(block_M, block_N):
                        qkT[i, j] = T.if_then_else(by * block_M + i <= k * block_N + j, qkT[i, j], 0)
                T.copy(dO[bz, k * block_N : (k + 1) * block_N, bx, :], do)
                T.clear(dsT)
                T.gemm(V_shared, do, dsT, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                T.copy(qkT, qkT_cast)
                T.gemm(qkT_cast, do, dv, policy=T.GemmWarpPolicy.FullRow)
                T.copy(Delta[bz, bx, k * block_N : (k + 1) * block_N], delta)
                for i, j in T.Parallel(block_M, block_N):
                    dsT_cast[i, j] = qkT[i, j] * (dsT[i, j] - delta[j]) * sm_scale
                T.gemm(dsT_cast, q, dk, policy=T.GemmWarpPolicy.FullRow)
                T.copy(dsT_cast, dsT_shared)
                T.clear(dq)
                T.gemm(dsT_shared, K_shared, dq, transpose_A=True)
                T.copy(dq, dq_shared)
                T.atomic_add(dQ[bz, k * block_N : (k + 1) * block_N, bx, :], dq_shared, use_tma=True)
            T.copy(dv, dv_shared)
            T.atomic_add(dV[bz, by * block_M : (by + 1) * block_M, bx // groups, :], dv_shared, use_tma=True)
            T.copy(dk, dk_shared)
            T.atomic_add(dK[bz, by * block_M : (by + 1) * block_M, bx // groups, :], dk_shared, use_tma=True)

    return gqa_bwd


def _forward(problem, q, k, v):
    """The forward's output and log-sum-exp (base 2, of the scaled scores), in fp32;
    each KV head serves ``groups`` consecutive query heads."""
    import torch

    groups, causal = problem["groups"], problem["causal"]
    k, v = k.repeat_interleave(groups, dim=2), v.repeat_interleave(groups, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) * problem["dim_qk"] ** -0.5
    if causal:
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    o = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, dim=-1), v.float())
    return o, lse * LOG2E


def inputs(problem, device):
    import torch

    batch, heads, seq_len, groups = (problem[k] for k in ("batch", "heads", "seq_len", "groups"))
    dim_qk, dim_v = problem["dim_qk"], problem["dim_v"]
    head_kv = heads // groups

    def randn(*shape):
        return torch.randn(*shape, device=device, dtype=torch.float16)

    q, k = randn(batch, seq_len, heads, dim_qk), randn(batch, seq_len, head_kv, dim_qk)
    v, do = randn(batch, seq_len, head_kv, dim_v), randn(batch, seq_len, heads, dim_v)
    o, lse = _forward(problem, q, k, v)
    delta = (o * do.float()).sum(-1).transpose(1, 2).contiguous()  # the preprocessing kernel's Delta
    dq = torch.zeros(batch, seq_len, heads, dim_qk, device=device, dtype=torch.float32)
    dk = torch.zeros(batch, seq_len, head_kv, dim_qk, device=device, dtype=torch.float32)
    dv = torch.zeros(batch, seq_len, head_kv, dim_v, device=device, dtype=torch.float32)
    return [q, k, v, do, lse.contiguous(), delta, dq, dk, dv]


def reference(problem, args):
    import torch

    q, k, v, do = (t.float().requires_grad_() for t in args[:4])
    o, _ = _forward(problem, q, k, v)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
    return [dq, dk, dv]


def flops(problem):
    # three MMAs over dim_qk (S^T, dK, dQ) and two over dim_v (dP^T, dV), each of
    # batch * heads * seq_len^2 products; half the pairs are masked when causal
    pairs = 2.0 * problem["batch"] * problem["heads"] * problem["seq_len"] ** 2
    work = pairs * (3 * problem["dim_qk"] + 2 * problem["dim_v"])
    return work / 2 if problem["causal"] else work
