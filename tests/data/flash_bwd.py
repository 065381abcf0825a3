"""flash_bwd: FlashAttention's backward pass (BSHD, fp16) as tilelang's
examples/flash_attention/example_mha_bwd_bshd.py writes it: one block per (head, block of
keys) keeps K and V in shared memory and walks the queries, five MMAs per step (S^T, dP^T,
dV += P^T dO, dK += dS^T Q, dQ = dS K), dQ added into global memory with atomics. The
forward's log-sum-exp and the row sums Delta = rowsum(O * dO) come in as inputs, as the
example's preprocessing kernel makes them.

    ws-tune tests/data/flash_bwd.py --shape batch=4,heads=16,seq_len=4096 --budget 16
"""

import tilelang.language as T

PROBLEM = {"batch": None, "heads": None, "seq_len": None, "dim": 64, "causal": 0}
CHOICES = {"dim": [64, 128], "causal": [0, 1]}
PARAMS = {"block_M": [64, 128], "block_N": [32, 64], "num_stages": [1, 2], "threads": [128, 256]}
OUTPUTS = [6, 7, 8]
RESET_TO_ZERO = [6]  # dQ: every key block adds its share
TOLERANCE = 2e-2
LOG2E = 1.44269504


def check(problem, params, schedule):
    for block in ("block_M", "block_N"):
        if problem["seq_len"] % params[block]:
            return f"seq_len={problem['seq_len']} is not a multiple of {block}={params[block]}"
    if params["threads"] == 256 and params["block_M"] == 64:
        return "two warpgroups need block_M=128"
    return None


def kernel(problem, *, block_M, block_N, num_stages, threads):
    batch, heads, seq_len, dim, causal = (problem[k] for k in ("batch", "heads", "seq_len", "dim", "causal"))
    sm_scale = (1.0 / dim) ** 0.5
    scale = sm_scale * LOG2E
    shape = (batch, seq_len, heads, dim)
    dtype, acc = "float16", "float32"

    @T.prim_func
    def flash_bwd(Q: T.Tensor(shape, dtype), K: T.Tensor(shape, dtype), V: T.Tensor(shape, dtype),
                  dO: T.Tensor(shape, dtype), lse: T.Tensor((batch, heads, seq_len), acc),
                  Delta: T.Tensor((batch, heads, seq_len), acc), dQ: T.Tensor(shape, acc),
                  dK: T.Tensor(shape, dtype), dV: T.Tensor(shape, dtype)):  # fmt: skip
        with T.Kernel(heads, seq_len // block_M, batch, threads=threads) as (bx, by, bz):
            K_shared = T.alloc_shared((block_M, dim), dtype)
            V_shared = T.alloc_shared((block_M, dim), dtype)
            q = T.alloc_shared((block_N, dim), dtype)
            do = T.alloc_shared((block_N, dim), dtype)
            lse_shared = T.alloc_shared((block_N,), acc)
            delta = T.alloc_shared((block_N,), acc)
            dsT_shared = T.alloc_shared((block_M, block_N), dtype)
            qkT = T.alloc_fragment((block_M, block_N), acc)
            dsT = T.alloc_fragment((block_M, block_N), acc)
            qkT_cast = T.alloc_fragment((block_M, block_N), dtype)
            dsT_cast = T.alloc_fragment((block_M, block_N), dtype)
            dv = T.alloc_fragment((block_M, dim), acc)
            dk = T.alloc_fragment((block_M, dim), acc)
            dq = T.alloc_fragment((block_N, dim), acc)
            dv_shared = T.alloc_shared((block_M, dim), dtype)
            dk_shared = T.alloc_shared((block_M, dim), dtype)

            T.copy(K[bz, by * block_M : (by + 1) * block_M, bx, :], K_shared)
            T.copy(V[bz, by * block_M : (by + 1) * block_M, bx, :], V_shared)
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
                for i, j in T.Parallel(block_N, dim):
                    T.atomic_add(dQ[bz, k * block_N + i, bx, j], dq[i, j])
            T.copy(dv, dv_shared)
            T.copy(dk, dk_shared)
            T.copy(dv_shared, dV[bz, by * block_M : (by + 1) * block_M, bx, :])
            T.copy(dk_shared, dK[bz, by * block_M : (by + 1) * block_M, bx, :])

    return flash_bwd


def _forward(problem, q, k, v):
    """The forward's output and log-sum-exp (base 2, of the scaled scores), in fp32."""
    import torch

    dim, causal = problem["dim"], problem["causal"]
    s = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) * dim**-0.5
    if causal:
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    o = torch.einsum("bhqk,bkhd->bqhd", torch.softmax(s, dim=-1), v.float())
    return o, lse * LOG2E


def inputs(problem, device):
    import torch

    batch, heads, seq_len, dim = (problem[k] for k in ("batch", "heads", "seq_len", "dim"))
    q, k, v, do = (torch.randn(batch, seq_len, heads, dim, device=device, dtype=torch.float16) for _ in range(4))
    o, lse = _forward(problem, q, k, v)
    delta = (o * do.float()).sum(-1).transpose(1, 2).contiguous()
    dq = torch.zeros(batch, seq_len, heads, dim, device=device, dtype=torch.float32)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    return [q, k, v, do, lse.contiguous(), delta, dq, dk, dv]


def reference(problem, args):
    import torch

    q, k, v, do = (t.float().requires_grad_() for t in args[:4])
    o, _ = _forward(problem, q, k, v)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
    return [dq, dk, dv]


def flops(problem):
    # five MMAs of batch * heads * seq_len^2 * dim each; half the pairs are masked when causal
    work = 5 * 2.0 * problem["batch"] * problem["heads"] * problem["seq_len"] ** 2 * problem["dim"]
    return work / 2 if problem["causal"] else work
