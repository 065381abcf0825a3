"""sink_gqa_bwd_varlen: the backward pass of grouped-query attention with a learned sink per
head over sequences of different lengths packed without padding (gpt-oss), as tilelang's
examples/attention_sink/example_gqa_sink_bwd_varlen.py writes its main kernel
(``flashattn_bwd``): one block per (query head, block of keys, sequence) reads its sequence's
query and key bounds from cu_seqlens_q and cu_seqlens_k (queries right-aligned on the keys:
``offset = kv_len - q_len``), keeps its group's K and V rows (KV head ``head // groups``) in
shared memory and walks the query blocks that can see them (from the causal start to the
window's end), five MMAs per step (S^T, dP^T, dV += P^T dO, dK += dS^T Q, dQ = dS K). dQ is
added with tile atomics into an fp32 accumulator stored in the example's ``make_dq_layout``
order ([head, token, dim]: a global-buffer layout annotation), dK and dV, which the
``groups`` query heads of a KV head share, are added from shared fp32 tiles after the loop.
Tiles that run past a sequence's end add zeros into the next sequence's rows (P and dS are
masked to 0 there).

The sink enters the backward only through the forward's log-sum-exp (sink included, base 2 of
the scaled scores, as the example's forward kernel writes lse); lse and the preprocessing
kernel's Delta = rowsum(O * dO) (O in the problem's dtype), both (batch, heads, q_seqlen) and 0
past each sequence's end, come in as inputs, computed with torch in fp32. The postprocessing
kernel (dQ's accumulator read through the layout and cast) and the dsink kernel
(-exp2(sink log2e - lse) Delta per query) are left out.

The lengths are drawn from the problem as the example's ``generate_random_padding_mask(...,
mode="random")`` draws them (each between max(1, L - 20) and L, for L = q_seqlen and
k_seqlen), with a fixed seed, so that the kernel's tensor sizes and ``inputs`` agree (the same
draw as tests/data/sink_gqa_varlen.py). With ``is_causal``, a sequence whose keys are fewer
than its queries has query rows that see no key: their gradients are 0.

Departures from the example:
- PARAMS cross the example's two configurations (sm_80's 64/32/1/128 and sm_90's
  128/32/2/256) with block_N 64;
- the grid's key-block extent is the longest key sequence's (the example passes
  ``max_seqlen_q``, which leaves key blocks unvisited where some key sequence is longer than
  every query sequence by more than a block's remainder);
- ``window`` 0 is the example's ``window_size=None``; ``check`` keeps its assert (the window a
  multiple of block_N);
- the ``TL_ENABLE_FAST_MATH`` pass config is not set (the kernel already uses ``T.exp2``);
- the reference is autograd through the example's ref_program (sinks in the softmax's
  denominator), a sequence at a time, in fp32.

    ws-tune tests/data/sink_gqa_bwd_varlen.py --budget 16
    ws-tune tests/data/sink_gqa_bwd_varlen.py --shape is_causal=1,window=128 --budget 16
"""

import functools
import random

import tilelang.language as T

PROBLEM = {"batch": 8, "heads": 64, "q_seqlen": 2048, "k_seqlen": 2048, "dim": 128, "groups": 16, "is_causal": False, "window": 0, "dtype": "float16"}
CHOICES = {"dim": [64, 128], "window": [0, 128, 256, 512, 1024], "dtype": ["float16", "bfloat16"]}  # window 0: none
PARAMS = {"block_M": [64, 128], "block_N": [32, 64], "num_stages": [1, 2], "threads": [128, 256]}
OUTPUTS = [8, 9, 10]  # dQ's accumulator (make_dq_layout's order), dK, dV
RESET_TO_ZERO = [8, 9, 10]  # dQ: every key block adds its share; dK, dV: every query head of the group
TOLERANCE = 2e-2
LOG2E = 1.44269504


@functools.cache
def _lengths(batch, q_seqlen, k_seqlen):
    """(query lengths, key lengths) of the sequences: the example's mode="random"."""
    rng = random.Random(0)
    q = [rng.randint(max(1, q_seqlen - 20), q_seqlen) for _ in range(batch)]
    k = [rng.randint(max(1, k_seqlen - 20), k_seqlen) for _ in range(batch)]
    return tuple(q), tuple(k)


def _lens(problem):
    return _lengths(problem["batch"], problem["q_seqlen"], problem["k_seqlen"])


def check(problem, params, schedule):
    if problem["heads"] % problem["groups"]:
        return f"heads={problem['heads']} is not a multiple of groups={problem['groups']}"
    if problem["window"] % params["block_N"]:
        return f"window={problem['window']} is not a multiple of block_N={params['block_N']} (the example asserts it)"
    return None


def make_dq_layout(dQ):
    # Reorder dq for atomic add: [seq, head, dim] -> permuted layout
    return T.Layout(dQ.shape, lambda l, h, d: [h, l, d])


def kernel(problem, *, block_M, block_N, num_stages, threads):
    batch_size, heads, dim, groups, is_causal = (problem[k] for k in ("batch", "heads", "dim", "groups", "is_causal"))
    window_size = problem["window"] or None
    dtype = problem["dtype"]
    q_lens, k_lens = _lens(problem)
    UQ, UKV, N_CTX = sum(q_lens), sum(k_lens), problem["q_seqlen"]
    max_seq_len = max(k_lens)  # the key blocks: see the docstring

    if window_size is not None:
        assert window_size % block_N == 0, "window_size must be divisible by block_N"

    sm_scale = (1.0 / dim) ** 0.5
    scale = sm_scale * 1.44269504  # log2(e)

    head_kv = heads // groups
    q_shape = [UQ, heads, dim]
    kv_shape = [UKV, head_kv, dim]
    accum_dtype = T.float32

    @T.prim_func
    def flash_bwd(
        Q: T.Tensor(q_shape, dtype),
        K: T.Tensor(kv_shape, dtype),
        V: T.Tensor(kv_shape, dtype),
        dO: T.Tensor(q_shape, dtype),
        lse: T.Tensor([batch_size, heads, N_CTX], accum_dtype),
        Delta: T.Tensor([batch_size, heads, N_CTX], accum_dtype),
        cu_seqlens_q: T.Tensor([batch_size + 1], T.int32),
        cu_seqlens_k: T.Tensor([batch_size + 1], T.int32),
        dQ: T.Tensor(q_shape, accum_dtype),
        dK: T.Tensor(kv_shape, accum_dtype),
        dV: T.Tensor(kv_shape, accum_dtype),
    ):
        with T.Kernel(heads, T.ceildiv(max_seq_len, block_M), batch_size, threads=threads) as (bx, by, bz):
            K_shared = T.alloc_shared([block_M, dim], dtype)
            dsT_shared = T.alloc_shared([block_M, block_N], dtype)
            q = T.alloc_shared([block_N, dim], dtype)
            V_shared = T.alloc_shared([block_M, dim], dtype)
            qkT = T.alloc_fragment([block_M, block_N], accum_dtype)
            dsT = T.alloc_fragment([block_M, block_N], accum_dtype)
            qkT_cast = T.alloc_fragment([block_M, block_N], dtype)
            dsT_cast = T.alloc_fragment([block_M, block_N], dtype)
            lse_shared = T.alloc_shared([block_N], accum_dtype)
            delta = T.alloc_shared([block_N], accum_dtype)
            do = T.alloc_shared([block_N, dim], dtype)
            dv = T.alloc_fragment([block_M, dim], accum_dtype)
            dk = T.alloc_fragment([block_M, dim], accum_dtype)
            dq = T.alloc_fragment([block_N, dim], accum_dtype)
            dv_shared = T.alloc_shared([block_M, dim], accum_dtype)
            dk_shared = T.alloc_shared([block_M, dim], accum_dtype)

            q_start_idx = cu_seqlens_q[bz]
            kv_start_idx = cu_seqlens_k[bz]
            q_end_idx = cu_seqlens_q[bz + 1]
            k_end_idx = cu_seqlens_k[bz + 1]
            q_current_seqlen = q_end_idx - q_start_idx
            kv_current_seqlen = k_end_idx - kv_start_idx

            T.annotate_layout({dQ: make_dq_layout(dQ)})
            T.copy(K[kv_start_idx + by * block_M : kv_start_idx + (by + 1) * block_M, bx // groups, :], K_shared)
            T.copy(V[kv_start_idx + by * block_M : kv_start_idx + (by + 1) * block_M, bx // groups, :], V_shared)
            T.clear(dv)
            T.clear(dk)

            # KV at pos kv_pos is seen by Q at pos q_pos if kv_pos <= q_pos + offset
            offset = kv_current_seqlen - q_current_seqlen

            # loop_st: first Q block that can see this KV block
            loop_st = T.max(0, T.floordiv(by * block_M - offset, block_N)) if is_causal else 0
            loop_ed = (
                T.min(T.ceildiv((by + 1) * block_M - offset + window_size, block_N), T.ceildiv(q_current_seqlen, block_N))
                if window_size is not None
                else T.ceildiv(q_current_seqlen, block_N)
            )

            for k in T.Pipelined(loop_st, loop_ed, num_stages=num_stages):
                T.copy(Q[q_start_idx + k * block_N : q_start_idx + (k + 1) * block_N, bx, :], q)
                T.clear(qkT)
                T.gemm(K_shared, q, qkT, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                T.copy(lse[bz, bx, k * block_N : (k + 1) * block_N], lse_shared)
                for i, j in T.Parallel(block_M, block_N):
                    qkT[i, j] = T.exp2(qkT[i, j] * scale - lse_shared[j])
                if is_causal:
                    if window_size is not None:
                        for i, j in T.Parallel(block_M, block_N):
                            # causal: kv_pos <= q_pos + offset; window: kv_pos > q_pos + offset - window_size
                            qkT[i, j] = T.if_then_else(
                                (by * block_M + i <= k * block_N + j + offset)
                                and (by * block_M + i > k * block_N + j + offset - window_size)
                                and (by * block_M + i < kv_current_seqlen and k * block_N + j < q_current_seqlen),
                                qkT[i, j],
                                0,
                            )
                    else:
                        for i, j in T.Parallel(block_M, block_N):
                            qkT[i, j] = T.if_then_else(
                                (by * block_M + i <= k * block_N + j + offset)
                                and (by * block_M + i < kv_current_seqlen and k * block_N + j < q_current_seqlen),
                                qkT[i, j],
                                0,
                            )
                else:
                    if window_size is not None:
                        for i, j in T.Parallel(block_M, block_N):
                            qkT[i, j] = T.if_then_else(
                                (by * block_M + i > k * block_N + j + offset - window_size)
                                and (by * block_M + i < kv_current_seqlen and k * block_N + j < q_current_seqlen),
                                qkT[i, j],
                                0,
                            )
                    else:
                        for i, j in T.Parallel(block_M, block_N):
                            qkT[i, j] = T.if_then_else(
                                by * block_M + i < kv_current_seqlen and k * block_N + j < q_current_seqlen,
                                qkT[i, j],
                                0,
                            )

                T.copy(dO[q_start_idx + k * block_N : q_start_idx + (k + 1) * block_N, bx, :], dst=do)
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
                T.atomic_add(dQ[q_start_idx + k * block_N : q_start_idx + (k + 1) * block_N, bx, :], dq)

            T.copy(dv, dv_shared)
            T.atomic_add(dV[kv_start_idx + by * block_M : kv_start_idx + (by + 1) * block_M, bx // groups, :], dv_shared)
            T.copy(dk, dk_shared)
            T.atomic_add(dK[kv_start_idx + by * block_M : kv_start_idx + (by + 1) * block_M, bx // groups, :], dk_shared)

    return flash_bwd


def _torch_dtype(problem):
    import torch

    return {"float16": torch.float16, "bfloat16": torch.bfloat16}[problem["dtype"]]


def _forward(problem, q, k, v, sinks):
    """One sequence's forward, q (q_len, heads, dim), k and v (k_len, head_kv, dim), sinks
    (heads,), in fp32: the output (q_len, heads, dim) and the base-2 log-sum-exp of the scaled
    scores, sink included (heads, q_len), as the example's forward kernel writes lse. Query
    head h reads KV head h // groups; queries right-aligned on the keys."""
    import torch

    groups, is_causal, window = problem["groups"], problem["is_causal"], problem["window"]
    q_len, k_len = q.shape[0], k.shape[0]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    logits = torch.einsum("qhd,khd->hqk", q, k) * q.shape[-1] ** -0.5
    pos_keys = torch.arange(k_len, device=q.device)
    pos_queries = torch.arange(q_len, device=q.device) + (k_len - q_len)
    masked = torch.zeros(q_len, k_len, device=q.device, dtype=torch.bool)
    if is_causal:
        masked |= pos_keys[None, :] > pos_queries[:, None]
    if window:
        masked |= pos_keys[None, :] < pos_queries[:, None] - window + 1
    logits = logits.masked_fill(masked, float("-inf"))
    sinks = sinks.view(-1, 1, 1)
    top = torch.maximum(logits.amax(-1, keepdim=True), sinks).detach()
    weights = torch.exp(logits - top)
    total = weights.sum(-1, keepdim=True) + torch.exp(sinks - top)
    o = torch.einsum("hqk,khd->qhd", weights / total, v)
    return o, (torch.log(total) + top).squeeze(-1) * LOG2E


def _sinks(problem, device):
    """The sinks, one per query head: not a kernel argument (they reach the kernel through
    lse), so drawn with a fixed seed, on the CPU, for ``inputs`` and ``reference`` alike."""
    import torch

    gen = torch.Generator().manual_seed(0)
    return torch.randn(problem["heads"], generator=gen).to(device=device, dtype=_torch_dtype(problem))


def inputs(problem, device):
    import torch

    batch, heads, dim, N_CTX = problem["batch"], problem["heads"], problem["dim"], problem["q_seqlen"]
    head_kv = heads // problem["groups"]
    q_lens, k_lens = _lens(problem)
    UQ, UKV = sum(q_lens), sum(k_lens)
    dt = _torch_dtype(problem)

    def randn(*shape):
        return torch.randn(*shape, device=device, dtype=dt)

    q, k, v, do = randn(UQ, heads, dim), randn(UKV, head_kv, dim), randn(UKV, head_kv, dim), randn(UQ, heads, dim)
    sinks = _sinks(problem, device)
    # the forward's lse and the preprocessing kernel's Delta, 0 past each sequence's end
    lse = torch.zeros(batch, heads, N_CTX, device=device, dtype=torch.float32)
    delta = torch.zeros(batch, heads, N_CTX, device=device, dtype=torch.float32)
    qs = ks = 0
    for b, (n, m) in enumerate(zip(q_lens, k_lens)):
        o, lse_b = _forward(problem, q[qs : qs + n].float(), k[ks : ks + m].float(), v[ks : ks + m].float(), sinks.float())
        lse[b, :, :n] = lse_b
        delta[b, :, :n] = (o.to(dt).float() * do[qs : qs + n].float()).sum(-1).transpose(0, 1)  # O in dtype, as the forward writes it
        qs, ks = qs + n, ks + m
    cu_seqlens_q = torch.tensor([0, *q_lens], device=device, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    cu_seqlens_k = torch.tensor([0, *k_lens], device=device, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    dq = torch.zeros(UQ, heads, dim, device=device, dtype=torch.float32)
    dk = torch.zeros(UKV, head_kv, dim, device=device, dtype=torch.float32)
    dv = torch.zeros(UKV, head_kv, dim, device=device, dtype=torch.float32)
    return [q, k, v, do, lse, delta, cu_seqlens_q, cu_seqlens_k, dq, dk, dv]


def dq_layout(dq):
    """``dq`` (tokens, heads, dim) stored in make_dq_layout's order ([head, token, dim]), viewed with its shape."""
    return dq.transpose(0, 1).contiguous().view(dq.shape)


def reference(problem, args):
    """Autograd through the example's ref_program (in fp32), a sequence at a time."""
    import torch

    q, k, v, do, _, _, _, _, dq_acc, dk_acc, _ = args
    q_lens, k_lens = _lens(problem)
    sinks = _sinks(problem, q.device).float()
    dq = torch.empty(dq_acc.shape, device=q.device, dtype=torch.float32)
    dk = torch.empty(dk_acc.shape, device=q.device, dtype=torch.float32)
    dv = torch.empty(dk_acc.shape, device=q.device, dtype=torch.float32)
    qs = ks = 0
    for n, m in zip(q_lens, k_lens):
        qp, kp = slice(qs, qs + n), slice(ks, ks + m)
        q_b, k_b, v_b = (t.float().requires_grad_() for t in (q[qp], k[kp], v[kp]))
        o, _ = _forward(problem, q_b, k_b, v_b, sinks)
        dq[qp], dk[kp], dv[kp] = torch.autograd.grad(o, (q_b, k_b, v_b), do[qp].float())
        qs, ks = qs + n, ks + m
    return [dq_layout(dq), dk, dv]


@functools.cache
def _visible_pairs(q_lens, k_lens, is_causal, window):
    """(query, key) pairs the mask keeps, over every sequence."""
    total = 0
    for q_len, k_len in zip(q_lens, k_lens):
        for p in range(k_len - q_len, k_len):  # each query's position among the keys
            hi = min(p + 1, k_len) if is_causal else k_len
            lo = max(0, p - window + 1) if window else 0
            total += max(0, hi - lo)
    return total


def flops(problem):
    # five MMAs (S^T, dP^T, dV, dK, dQ) over the pairs the mask keeps, per query head
    pairs = _visible_pairs(*_lens(problem), bool(problem["is_causal"]), problem["window"])
    return 5 * 2.0 * problem["heads"] * problem["dim"] * pairs


def bytes_moved(problem):
    q_lens, k_lens = _lens(problem)
    heads, dim, batch = problem["heads"], problem["dim"], problem["batch"]
    head_kv = heads // problem["groups"]
    uq, ukv = sum(q_lens), sum(k_lens)
    # Q, dO, K, V in dtype; lse and Delta; both cu_seqlens; dQ, dK, dV in fp32
    return 2.0 * (2 * uq * heads * dim + 2 * ukv * head_kv * dim) + 4.0 * 2 * batch * heads * problem["q_seqlen"] + 4.0 * 2 * (batch + 1) + 4.0 * (uq * heads * dim + 2 * ukv * head_kv * dim)
