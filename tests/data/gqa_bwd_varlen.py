"""gqa_bwd_varlen: FlashAttention's backward pass for grouped-query attention over sequences
of different lengths packed without padding (THD, fp16, a 192-wide Q/K head and a 128-wide V
head), as tilelang's examples/flash_attention/example_gqa_bwd_tma_reduce_varlen.py writes it
(its ``flashattn_bwd_atomic_add``): one block per (query head, block of keys, sequence) reads
its sequence's bounds from cu_seqlens_q and cu_seqlens_k, keeps its group's K and V rows in
shared memory (rows past the sequence's end are the next sequence's, or past the tensor's
end, and masked) and walks the sequence's queries, five MMAs per step (S^T, dP^T,
dV += P^T dO, dK += dS^T Q, dQ = dS K). Every gradient is reduced in fp32 global memory by TMA
reductions (``T.atomic_add(..., use_tma=True)``) from a shared tile: dQ's in the loop, one per
step, and dK's and dV's after it, where the ``groups`` query heads of a KV head add into the
same rows. Tiles that run past a sequence's end add zeros into the next sequence's rows (its
P and dS are masked to 0 there). The grid's second extent is the longest sequence's blocks,
so a block past its own sequence's end adds zeros.

The forward's log-sum-exp and the preprocessing kernel's row sums Delta = rowsum(O * dO),
both (batch, heads, seq_len) and 0 at the padding positions as the example's kernels write
them, come in as inputs, computed with torch; the postprocessing kernel (a cast of the fp32
gradients to fp16) is left out.

The lengths are drawn from the problem as the example's ``generate_random_padding_mask(...,
mode="random")`` draws them (each between max(1, seq_len - 20) and seq_len), with a fixed
seed, so that the kernel's tensor sizes and ``inputs`` agree; the keys' lengths are the
queries' (the example's training case: ``seqlens_k = seqlens_q``).

Departures from the example:
- PARAMS cross the example's configuration (block_M=128, block_N=32, 256 threads, 2 stages)
  with smaller tiles, fewer threads and one stage;
- the ``TL_ENABLE_FAST_MATH`` pass config is not set (the kernel already uses ``T.exp2``);
- fp16 only; the reference is autograd through the example's ref_program, a sequence at a
  time, in fp32.

    ws-tune tests/data/gqa_bwd_varlen.py --shape batch=8,heads=32,seq_len=1024 --budget 16
"""

import functools
import random

import tilelang.language as T

PROBLEM = {"batch": None, "heads": None, "seq_len": None, "groups": 16, "dim_qk": 192, "dim_v": 128, "causal": 0}
CHOICES = {"dim_qk": [64, 128, 192], "dim_v": [64, 128], "causal": [0, 1]}
PARAMS = {"block_M": [64, 128], "block_N": [32, 64], "num_stages": [1, 2], "threads": [128, 256]}
OUTPUTS = [8, 9, 10]  # dQ, dK, dV
RESET_TO_ZERO = [8, 9, 10]  # dQ: every key block adds its share; dK, dV: every query head of the group
TOLERANCE = 2e-2
LOG2E = 1.44269504


@functools.lru_cache(maxsize=None)
def _lengths(batch, seq_len):
    """The sequences' lengths: the example's mode="random"."""
    rng = random.Random(0)
    return tuple(rng.randint(max(1, seq_len - 20), seq_len) for _ in range(batch))


def _lens(problem):
    return _lengths(problem["batch"], problem["seq_len"])


def check(problem, params, schedule):
    if problem["heads"] % problem["groups"]:
        return f"heads={problem['heads']} is not a multiple of groups={problem['groups']}"
    return None


def kernel(problem, *, block_M, block_N, num_stages, threads):
    batch, heads, N_CTX, groups = (problem[k] for k in ("batch", "heads", "seq_len", "groups"))
    dim_qk, dim_v, is_causal = problem["dim_qk"], problem["dim_v"], problem["causal"]
    lengths = _lens(problem)
    total_q = total_kv = sum(lengths)
    max_seq_len = max(lengths)

    sm_scale = (1.0 / dim_qk) ** 0.5
    scale = (1.0 / dim_qk) ** 0.5 * 1.44269504  # log2(e)
    head_kv = heads // groups
    q_shape = [total_q, heads, dim_qk]
    k_shape = [total_kv, head_kv, dim_qk]
    v_shape = [total_kv, head_kv, dim_v]
    do_shape = [total_q, heads, dim_v]
    dtype = T.float16
    accum_dtype = T.float32

    @T.prim_func
    def flash_bwd(
        Q: T.Tensor(q_shape, dtype),  # type: ignore
        K: T.Tensor(k_shape, dtype),  # type: ignore
        V: T.Tensor(v_shape, dtype),  # type: ignore
        dO: T.Tensor(do_shape, dtype),  # type: ignore
        lse: T.Tensor([batch, heads, N_CTX], accum_dtype),  # type: ignore
        Delta: T.Tensor([batch, heads, N_CTX], accum_dtype),  # type: ignore
        cu_seqlens_q: T.Tensor([batch + 1], T.int32),  # type: ignore
        cu_seqlens_k: T.Tensor([batch + 1], T.int32),  # type: ignore
        dQ: T.Tensor(q_shape, accum_dtype),  # type: ignore
        dK: T.Tensor(k_shape, accum_dtype),  # type: ignore
        dV: T.Tensor(v_shape, accum_dtype),  # type: ignore
    ):
        with T.Kernel(heads, T.ceildiv(max_seq_len, block_M), batch, threads=threads) as (bx, by, bz):
            K_shared = T.alloc_shared([block_M, dim_qk], dtype)
            dsT_shared = T.alloc_shared([block_M, block_N], dtype)
            q = T.alloc_shared([block_N, dim_qk], dtype)
            V_shared = T.alloc_shared([block_M, dim_v], dtype)
            qkT = T.alloc_fragment([block_M, block_N], accum_dtype)
            dsT = T.alloc_fragment([block_M, block_N], accum_dtype)
            qkT_cast = T.alloc_fragment([block_M, block_N], dtype)
            dsT_cast = T.alloc_fragment([block_M, block_N], dtype)
            lse_shared = T.alloc_shared([block_N], accum_dtype)
            delta = T.alloc_shared([block_N], accum_dtype)
            do = T.alloc_shared([block_N, dim_v], dtype)
            dv = T.alloc_fragment([block_M, dim_v], accum_dtype)
            dk = T.alloc_fragment([block_M, dim_qk], accum_dtype)
            dq = T.alloc_fragment([block_N, dim_qk], accum_dtype)
            dv_shared = T.alloc_shared([block_M, dim_v], accum_dtype)
            dk_shared = T.alloc_shared([block_M, dim_qk], accum_dtype)
            dq_shared = T.alloc_shared([block_N, dim_qk], accum_dtype)

            q_start_idx = cu_seqlens_q[bz]
            k_start_idx = cu_seqlens_k[bz]
            q_end_idx = cu_seqlens_q[bz + 1]
            k_end_idx = cu_seqlens_k[bz + 1]
            q_current_seqlen = q_end_idx - q_start_idx
            k_current_seqlen = k_end_idx - k_start_idx

            T.copy(K[k_start_idx + by * block_M : k_start_idx + (by + 1) * block_M, bx // groups, :], K_shared)
            T.copy(V[k_start_idx + by * block_M : k_start_idx + (by + 1) * block_M, bx // groups, :], V_shared)

            T.clear(dv)
            T.clear(dk)

            loop_st = T.min(T.floordiv(by * block_M, block_N), T.floordiv(q_current_seqlen, block_N)) if is_causal else 0
            loop_ed = T.ceildiv(q_current_seqlen, block_N)

            for k_base in T.Pipelined(loop_st, loop_ed, num_stages=num_stages):
                T.copy(Q[q_start_idx + k_base * block_N : q_start_idx + (k_base + 1) * block_N, bx, :], q)
                T.clear(qkT)
                T.gemm(K_shared, q, qkT, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                T.copy(lse[bz, bx, k_base * block_N : (k_base + 1) * block_N], lse_shared)

                for i, j in T.Parallel(block_M, block_N):
                    qkT[i, j] = T.exp2(qkT[i, j] * scale - lse_shared[j])
                if is_causal:
                    for i, j in T.Parallel(block_M, block_N):
                        qkT[i, j] = T.if_then_else(
                            (by * block_M + i <= k_base * block_N + j)
                            and (by * block_M + i < k_current_seqlen and k_base * block_N + j < q_current_seqlen),
                            qkT[i, j],
                            0,
                        )
                else:
                    for i, j in T.Parallel(block_M, block_N):
                        qkT[i, j] = T.if_then_else(
                            by * block_M + i < k_current_seqlen and k_base * block_N + j < q_current_seqlen, qkT[i, j], 0
                        )

                T.copy(dO[q_start_idx + k_base * block_N : q_start_idx + (k_base + 1) * block_N, bx, :], do)
                T.clear(dsT)
                # dsT: (block_kv, block_q)
                T.gemm(V_shared, do, dsT, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                T.copy(qkT, qkT_cast)
                T.gemm(qkT_cast, do, dv, policy=T.GemmWarpPolicy.FullRow)

                T.copy(Delta[bz, bx, k_base * block_N : (k_base + 1) * block_N], delta)
                for i, j in T.Parallel(block_M, block_N):
                    dsT_cast[i, j] = qkT[i, j] * (dsT[i, j] - delta[j]) * sm_scale
                T.gemm(dsT_cast, q, dk, policy=T.GemmWarpPolicy.FullRow)

                T.copy(dsT_cast, dsT_shared)
                T.clear(dq)
                T.gemm(dsT_shared, K_shared, dq, transpose_A=True)
                T.copy(dq, dq_shared)
                T.atomic_add(
                    dQ[q_start_idx + k_base * block_N : q_start_idx + k_base * block_N + block_N, bx, :],
                    dq_shared,
                    memory_order="relaxed",
                    use_tma=True,
                )

            T.copy(dv, dv_shared)
            T.atomic_add(
                dV[k_start_idx + by * block_M : k_start_idx + by * block_M + block_M, bx // groups, :],
                dv_shared,
                memory_order="relaxed",
                use_tma=True,
            )
            T.copy(dk, dk_shared)
            T.atomic_add(
                dK[k_start_idx + by * block_M : k_start_idx + by * block_M + block_M, bx // groups, :],
                dk_shared,
                memory_order="relaxed",
                use_tma=True,
            )

    return flash_bwd


def _forward(problem, q, k, v):
    """One sequence's forward, (len, heads, d) each: the output and the log-sum-exp (base 2,
    of the scaled scores, as the example's forward writes lse), in fp32; each KV head serves
    ``groups`` consecutive query heads; causal is top-left aligned (keys' lengths are the
    queries')."""
    import torch

    groups = problem["groups"]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    s = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * problem["dim_qk"] ** -0.5
    if problem["causal"]:
        s = s.masked_fill(torch.ones_like(s, dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)  # (heads, len)
    o = torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), v.float())
    return o, lse * LOG2E


def inputs(problem, device):
    import torch

    batch, heads, seq_len, groups = (problem[k] for k in ("batch", "heads", "seq_len", "groups"))
    dim_qk, dim_v = problem["dim_qk"], problem["dim_v"]
    head_kv = heads // groups
    lengths = _lens(problem)
    total = sum(lengths)

    def randn(*shape):
        return torch.randn(*shape, device=device, dtype=torch.float16)

    q, k = randn(total, heads, dim_qk), randn(total, head_kv, dim_qk)
    v, do = randn(total, head_kv, dim_v), randn(total, heads, dim_v)
    # the forward's lse and the preprocessing kernel's Delta, 0 past each sequence's end
    lse = torch.zeros(batch, heads, seq_len, device=device, dtype=torch.float32)
    delta = torch.zeros(batch, heads, seq_len, device=device, dtype=torch.float32)
    start = 0
    for b, n in enumerate(lengths):
        part = slice(start, start + n)
        o, lse_b = _forward(problem, q[part], k[part], v[part])
        lse[b, :, :n] = lse_b
        delta[b, :, :n] = (o.half().float() * do[part].float()).sum(-1).transpose(0, 1)  # O is fp16 in the example
        start += n
    cu_seqlens = torch.tensor([0, *lengths], device=device, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    dq = torch.zeros(total, heads, dim_qk, device=device, dtype=torch.float32)
    dk = torch.zeros(total, head_kv, dim_qk, device=device, dtype=torch.float32)
    dv = torch.zeros(total, head_kv, dim_v, device=device, dtype=torch.float32)
    return [q, k, v, do, lse, delta, cu_seqlens, cu_seqlens.clone(), dq, dk, dv]


def reference(problem, args):
    import torch

    q, k, v, do = args[:4]
    dq, dk, dv = (torch.empty(t.shape, device=t.device, dtype=torch.float32) for t in args[8:11])
    start = 0
    for n in _lens(problem):  # a sequence at a time
        part = slice(start, start + n)
        qs, ks, vs = (t[part].float().requires_grad_() for t in (q, k, v))
        o, _ = _forward(problem, qs, ks, vs)
        dq[part], dk[part], dv[part] = torch.autograd.grad(o, (qs, ks, vs), do[part].float())
        start += n
    return [dq, dk, dv]


def flops(problem):
    # three MMAs over dim_qk (S^T, dK, dQ) and two over dim_v (dP^T, dV), each of
    # heads * len^2 products per sequence; half the pairs are masked when causal
    pairs = 2.0 * problem["heads"] * sum(n * n for n in _lens(problem))
    work = pairs * (3 * problem["dim_qk"] + 2 * problem["dim_v"])
    return work / 2 if problem["causal"] else work
