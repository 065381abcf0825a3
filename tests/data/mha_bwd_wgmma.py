"""mha_bwd_wgmma: FlashAttention's backward pass (BSHD, fp16) as tilelang's
examples/flash_attention/example_mha_bwd_bshd_wgmma_pipelined.py writes it (removed from
tilelang's examples in ded6a9922, "Add Producer-Consumer Warp Specialization", March 2026;
ported from its parent): one block per (head, block of keys) keeps K and V in shared memory
and walks the queries, five MMAs per step (S^T, dP^T, dV += P^T dO, dK += dS^T Q,
dQ = dS K). The forward's log-sum-exp and the preprocessing kernel's row sums
Delta = rowsum(O * dO) come in as inputs, computed with torch.

New here beside flash_bwd.py (the same math as example_mha_bwd_bshd.py writes it, every
MMA synchronous, dQ by per-element atomics from registers): the MMAs are asynchronous
wgmmas retired by explicit waits, as the example's ``wg_wait`` arguments place them (tilelang
0.1.15's ``T.gemm`` has no ``wg_wait``: ``wg_wait=-1`` is ``T.wgmma_gemm``, ``wg_wait=1`` is
``T.wgmma_gemm`` then ``T.wait_wgmma(1)``): S^T and dP^T are issued together, S^T is
retired (``T.wait_wgmma(1)``) while dP^T runs under the softmax, dV is issued and left in
flight under dS, dK under dS's store to shared memory, dQ's is retired last; dQ goes
fragment -> shared tile -> one tile atomic add (no TMA) per step. Where dQ's MMA has fewer
than 64 rows (block_N=32, the example's choice at dim 128) no wgmma can take it and it is a
plain ``T.gemm``, as tilelang's ``T.gemm(wg_wait=1)`` fell back to an mma.sync there.
mma="async" is the example; mma="sync" the same program with every MMA a ``T.gemm`` and no
explicit wait, the only points with a schedule space (role_based seeds no kernel that
leaves an MMA in flight: at the async points ws-tune measures tilelang's lowerings only).

    ws-tune tests/data/mha_bwd_wgmma.py                      # the example's 8 x 32 heads x 1024, dim 64
    ws-tune tests/data/mha_bwd_wgmma.py --shape causal=1,dim=128 --budget 16
"""

import tilelang.language as T

# the example's main(): BATCH=8, H=32, N_CTX=1024, D_HEAD=64, causal=False
PROBLEM = {"batch": 8, "heads": 32, "seq_len": 1024, "dim": 64, "causal": 0}
CHOICES = {"dim": [64, 128], "causal": [0, 1]}
# the example's tiles first: block_M=128 (256 threads, one warpgroup per 64 key rows),
# block_N=128 at dim 64 (32 above), two stages, async wgmma. mma="sync" is the same program
# with every MMA a T.gemm (wgmma and its wait) and no explicit waits: tilelang's role_based
# scheduler seeds no kernel with an MMA left in flight, so only these points have a schedule
# space; the example's own (async) points are measured as tilelang's lowerings only.
PARAMS = {"block_M": [128, 64], "block_N": [128, 64, 32], "num_stages": [2, 1], "mma": ["async", "sync"]}
OUTPUTS = [6, 7, 8]
RESET_TO_ZERO = [6]  # dQ: every key block adds its share
TOLERANCE = 2e-2
LOG2E = 1.44269504


def check(problem, params, schedule):
    for block in ("block_M", "block_N"):
        if problem["seq_len"] % params[block]:
            return f"seq_len={problem['seq_len']} is not a multiple of {block}={params[block]}"
    return None


def kernel(problem, *, block_M, block_N, num_stages, mma):
    batch, heads, seq_len, dim, causal = (problem[k] for k in ("batch", "heads", "seq_len", "dim", "causal"))
    sm_scale = (1.0 / dim) ** 0.5
    scale = sm_scale * LOG2E
    shape = (batch, seq_len, heads, dim)
    threads = 2 * block_M  # one warpgroup per 64 key rows: the example's 256 at block_M=128
    dtype, acc = "float16", "float32"
    is_async = mma == "async"
    gemm = T.wgmma_gemm if is_async else T.gemm
    # dQ's MMA has block_N rows: a wgmma needs 64 (a plain T.gemm lowers to mma.sync below)
    dq_gemm = T.wgmma_gemm if is_async and block_N >= 64 else T.gemm

    @T.prim_func
    def mha_bwd(Q: T.Tensor(shape, dtype), K: T.Tensor(shape, dtype), V: T.Tensor(shape, dtype),
                dO: T.Tensor(shape, dtype), lse: T.Tensor((batch, heads, seq_len), acc),
                Delta: T.Tensor((batch, heads, seq_len), acc), dQ: T.Tensor(shape, acc),
                dK: T.Tensor(shape, dtype), dV: T.Tensor(shape, dtype)):  # fmt: skip
        with T.Kernel(heads, T.ceildiv(seq_len, block_M), batch, threads=threads) as (bx, by, bz):
            K_shared = T.alloc_shared((block_M, dim), dtype)
            dsT_shared = T.alloc_shared((block_M, block_N), dtype)
            q = T.alloc_shared((block_N, dim), dtype)
            V_shared = T.alloc_shared((block_M, dim), dtype)
            qkT = T.alloc_fragment((block_M, block_N), acc)
            dsT = T.alloc_fragment((block_M, block_N), acc)
            qkT_cast = T.alloc_fragment((block_M, block_N), dtype)
            dsT_cast = T.alloc_fragment((block_M, block_N), dtype)
            lse_shared = T.alloc_shared((block_N,), acc)
            delta = T.alloc_shared((block_N,), acc)
            do = T.alloc_shared((block_N, dim), dtype)
            dv = T.alloc_fragment((block_M, dim), acc)
            dk = T.alloc_fragment((block_M, dim), acc)
            dq = T.alloc_fragment((block_N, dim), acc)
            dv_shared = T.alloc_shared((block_M, dim), dtype)
            dk_shared = T.alloc_shared((block_M, dim), dtype)
            dq_shared = T.alloc_shared((block_N, dim), acc)

            T.copy(K[bz, by * block_M : (by + 1) * block_M, bx, :], K_shared)
            T.copy(V[bz, by * block_M : (by + 1) * block_M, bx, :], V_shared)
            T.clear(dv)
            T.clear(dk)
            loop_st = T.floordiv(by * block_M, block_N) if causal else 0
            loop_ed = T.ceildiv(seq_len, block_N)
            for k in T.Pipelined(loop_st, loop_ed, num_stages=num_stages):
                T.copy(Q[bz, k * block_N : (k + 1) * block_N, bx, :], q)
                T.clear(qkT)
                gemm(K_shared, q, qkT, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)  # the example's wg_wait=-1
                T.copy(dO[bz, k * block_N : (k + 1) * block_N, bx, :], do)
                T.clear(dsT)
                gemm(V_shared, do, dsT, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)  # the example's wg_wait=-1
                if is_async:
                    T.wait_wgmma(1)  # S^T done, dP^T in flight

                T.copy(lse[bz, bx, k * block_N : (k + 1) * block_N], lse_shared)
                for i, j in T.Parallel(block_M, block_N):
                    qkT[i, j] = T.exp2(qkT[i, j] * scale - lse_shared[j])
                if causal:
                    for i, j in T.Parallel(block_M, block_N):
                        qkT[i, j] = T.if_then_else(by * block_M + i <= k * block_N + j, qkT[i, j], 0)
                if is_async:
                    T.wait_wgmma(0)
                T.copy(qkT, qkT_cast)
                gemm(qkT_cast, do, dv, policy=T.GemmWarpPolicy.FullRow)  # the example's wg_wait=-1

                T.copy(Delta[bz, bx, k * block_N : (k + 1) * block_N], delta)
                for i, j in T.Parallel(block_M, block_N):
                    dsT_cast[i, j] = qkT[i, j] * (dsT[i, j] - delta[j]) * sm_scale
                gemm(dsT_cast, q, dk, policy=T.GemmWarpPolicy.FullRow)
                if is_async:
                    T.wait_wgmma(1)  # wg_wait=1: dV done, dK in flight

                T.copy(dsT_cast, dsT_shared)
                T.clear(dq)
                dq_gemm(dsT_shared, K_shared, dq, transpose_A=True)
                if is_async:
                    T.wait_wgmma(1)  # wg_wait=1: dK done
                    T.wait_wgmma(0)
                T.copy(dq, dq_shared)
                T.atomic_add(dQ[bz, k * block_N : (k + 1) * block_N, bx, :], dq_shared)
            T.copy(dv, dv_shared)
            T.copy(dk, dk_shared)
            T.copy(dv_shared, dV[bz, by * block_M : (by + 1) * block_M, bx, :])
            T.copy(dk_shared, dK[bz, by * block_M : (by + 1) * block_M, bx, :])

    return mha_bwd


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
    delta = (o * do.float()).sum(-1).transpose(1, 2).contiguous()  # the preprocessing kernel's Delta
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
