"""sink_attn_bwd: the backward pass of causal attention with a learned sink per head and an
optional sliding window (BHSD), as tilelang's
examples/attention_sink/example_mha_sink_bwd_bhsd.py writes it (gpt-oss). The example's four
backward kernels are the four launches of one function, in its order:

1. preprocess: Delta = rowsum(O * dO), 32x32 fragments, into a global scratch;
2. the main backward: one block per (head, block of keys) keeps K and V in shared memory and
   walks the queries from the causal start to the window's end, five MMAs per step (S^T,
   dP^T, dV += P^T dO, dK += dS^T Q, dQ = dS K); dQ is added into an fp32 accumulator with
   tile atomics, in the example's ``make_dq_layout`` order (the 8x8 MMA fragment's: a
   global-buffer layout annotation);
3. postprocess: dQ's accumulator, read through that layout, cast to dQ;
4. dsink: each query's share of its head's sink gradient, -exp2(sink log2e - lse) Delta.

The sink enters the backward only through the forward's log-sum-exp (sink included), which
comes in as an input, with the forward's output O, computed with torch in float32 (the
example's forward kernel is tests/data/sink_attn.py).

Departures from the example:
- the block sizes, depth and threads of the main kernel are parameters (the example fixes
  block_M=128, block_N=32, num_stages=2, threads=256 on sm_90: one point of PARAMS);
- ``window`` 0 stands for the example's ``window_size=None`` (causal attention);
- the dsink kernel's per-query output is returned as is; the example's ``.sum(0).sum(1)``
  over batch and queries, which gives the sinks' gradient, is left to the caller;
- dQ's fp32 accumulator is an output (RESET_TO_ZERO, the example's ``torch.zeros``), so its
  reference is dQ in make_dq_layout's order; Delta is a ``T.alloc_global`` scratch;
- the example's ``TL_ENABLE_FAST_MATH`` pass config is not set (a kernel file gives none);
- seq_len must be a multiple of 128 and of both blocks (the example's kernels guard
  nothing: its ceildiv grids assume whole blocks).

    ws-tune tests/data/sink_attn_bwd.py --shape batch=1,heads=32,seq_len=4096 --budget 16
"""

import tilelang.language as T

PROBLEM = {"batch": None, "heads": None, "seq_len": None, "dim": 128, "window": 0, "dtype": "float16"}
CHOICES = {"dim": [64, 128], "window": [0, 128, 512, 1024], "dtype": ["float16", "bfloat16"]}
PARAMS = {"block_M": [64, 128], "block_N": [32, 64], "num_stages": [1, 2], "threads": [128, 256]}
OUTPUTS = [7, 8, 9, 10, 11]  # dQ's accumulator, dQ, dK, dV, dsinks
RESET_TO_ZERO = [7]  # dQ's accumulator: every key block adds its share
TOLERANCE = 2e-2
LOG2E = 1.44269504


def check(problem, params, schedule):
    for block in ("block_M", "block_N"):
        if problem["seq_len"] % params[block]:
            return f"seq_len={problem['seq_len']} is not a multiple of {block}={params[block]}"
    if problem["seq_len"] % 128:
        return f"seq_len={problem['seq_len']} is not a multiple of 128 (the dsink kernel's block)"
    if problem["window"] % params["block_N"]:
        return f"window={problem['window']} is not a multiple of block_N={params['block_N']}"
    if params["threads"] == 256 and params["block_M"] == 64:
        return "two warpgroups need block_M=128"
    return None


def make_dq_layout(dQ):
    # atomicAdd can not be vectorized, so we need to reorder dq to match the 8x8 gemm fragment
    return T.Layout(dQ.shape, lambda b, h, l, d: [b, h, l // 8, d // 8, (d % 2), 4 * (l % 8) + (d % 8) // 2])


def kernel(problem, *, block_M, block_N, num_stages, threads):
    batch, heads, seq_len, dim, window, dtype = (problem[k] for k in ("batch", "heads", "seq_len", "dim", "window", "dtype"))
    sm_scale = (1.0 / dim) ** 0.5
    scale = sm_scale * LOG2E
    shape = [batch, heads, seq_len, dim]
    accum_dtype = "float32"
    blk_prep, blk_post, blk_sink = 32, 64, 128

    @T.prim_func
    def sink_attn_bwd(Q: T.Tensor(shape, dtype), K: T.Tensor(shape, dtype), V: T.Tensor(shape, dtype),
                      O: T.Tensor(shape, dtype), dO: T.Tensor(shape, dtype),
                      lse: T.Tensor([batch, heads, seq_len], accum_dtype), Sinks: T.Tensor([heads], dtype),
                      dQ: T.Tensor(shape, accum_dtype), dQ_out: T.Tensor(shape, dtype),
                      dK: T.Tensor(shape, dtype), dV: T.Tensor(shape, dtype),
                      dsinks: T.Tensor([batch, heads, seq_len], accum_dtype)):  # fmt: skip
        Delta = T.alloc_global([batch, heads, seq_len], accum_dtype)

        # preprocess (flashattn_bwd_preprocess)
        with T.Kernel(heads, T.ceildiv(seq_len, blk_prep), batch) as (bx, by, bz):
            o = T.alloc_fragment([blk_prep, blk_prep], dtype)
            do = T.alloc_fragment([blk_prep, blk_prep], dtype)
            acc = T.alloc_fragment([blk_prep, blk_prep], accum_dtype)
            delta = T.alloc_fragment([blk_prep], accum_dtype)
            T.clear(acc)
            for k in range(T.ceildiv(dim, blk_prep)):
                T.copy(O[bz, bx, by * blk_prep : (by + 1) * blk_prep, k * blk_prep : (k + 1) * blk_prep], o)
                T.copy(dO[bz, bx, by * blk_prep : (by + 1) * blk_prep, k * blk_prep : (k + 1) * blk_prep], do)
                for i, j in T.Parallel(blk_prep, blk_prep):
                    acc[i, j] += o[i, j] * do[i, j]
            T.reduce_sum(acc, delta, 1)
            T.copy(delta, Delta[bz, bx, by * blk_prep : (by + 1) * blk_prep])

        # the main backward (flashattn_bwd)
        with T.Kernel(heads, T.ceildiv(seq_len, block_M), batch, threads=threads) as (bx, by, bz):
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
            dv_shared = T.alloc_shared([block_M, dim], dtype)
            dk_shared = T.alloc_shared([block_M, dim], dtype)

            T.annotate_layout({dQ: make_dq_layout(dQ)})
            T.copy(K[bz, bx, by * block_M : (by + 1) * block_M, :], K_shared)
            T.copy(V[bz, bx, by * block_M : (by + 1) * block_M, :], V_shared)
            T.clear(dv)
            T.clear(dk)

            loop_st = T.floordiv(by * block_M, block_N)
            loop_ed = T.min(T.ceildiv((by + 1) * block_M + window, block_N), T.ceildiv(seq_len, block_N)) if window else T.ceildiv(seq_len, block_N)
            for k in T.Pipelined(loop_st, loop_ed, num_stages=num_stages):
                T.copy(Q[bz, bx, k * block_N : (k + 1) * block_N, :], q)
                T.clear(qkT)
                T.gemm(K_shared, q, qkT, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                T.copy(lse[bz, bx, k * block_N : (k + 1) * block_N], lse_shared)
                for i, j in T.Parallel(block_M, block_N):
                    qkT[i, j] = T.exp2(qkT[i, j] * scale - lse_shared[j])
                for i, j in T.Parallel(block_M, block_N):
                    if window:
                        qkT[i, j] = T.if_then_else(
                            by * block_M + i <= k * block_N + j and by * block_M + i > k * block_N + j - window, qkT[i, j], 0
                        )
                    else:
                        qkT[i, j] = T.if_then_else(by * block_M + i <= k * block_N + j, qkT[i, j], 0)
                T.copy(dO[bz, bx, k * block_N : (k + 1) * block_N, :], dst=do)
                T.clear(dsT)
                T.gemm(V_shared, do, dsT, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                T.copy(qkT, qkT_cast)
                T.gemm(qkT_cast, B=do, C=dv, policy=T.GemmWarpPolicy.FullRow)

                T.copy(Delta[bz, bx, k * block_N : (k + 1) * block_N], delta)

                for i, j in T.Parallel(block_M, block_N):
                    dsT_cast[i, j] = qkT[i, j] * (dsT[i, j] - delta[j]) * sm_scale
                T.gemm(dsT_cast, q, dk, policy=T.GemmWarpPolicy.FullRow)

                T.copy(dsT_cast, dsT_shared)
                T.clear(dq)
                T.gemm(dsT_shared, K_shared, dq, transpose_A=True)
                T.atomic_add(dQ[bz, bx, k * block_N : (k + 1) * block_N, :], dq)

            T.copy(dv, dv_shared)
            T.copy(dk, dk_shared)
            T.copy(dv_shared, dV[bz, bx, by * block_M : (by + 1) * block_M, :])
            T.copy(dk_shared, dK[bz, bx, by * block_M : (by + 1) * block_M, :])

        # postprocess (flashattn_bwd_postprocess)
        with T.Kernel(T.ceildiv(seq_len, blk_post), heads, batch, threads=128) as (bx, by, bz):
            T.annotate_layout({dQ: make_dq_layout(dQ)})
            T.copy(dQ[bz, by, bx * blk_post : (bx + 1) * blk_post, :], dQ_out[bz, by, bx * blk_post : (bx + 1) * blk_post, :])

        # the sinks' gradient, per query (flashattn_bwd_dsink)
        with T.Kernel(heads, T.ceildiv(seq_len, blk_sink), batch, threads=128) as (bx, by, bz):
            lse_fragment = T.alloc_fragment([blk_sink], accum_dtype)
            delta_fragment = T.alloc_fragment([blk_sink], accum_dtype)
            dsink_fragment = T.alloc_fragment([blk_sink], accum_dtype)

            sink = Sinks[bx]
            T.copy(lse[bz, bx, by * blk_sink : (by + 1) * blk_sink], lse_fragment)
            T.copy(Delta[bz, bx, by * blk_sink : (by + 1) * blk_sink], delta_fragment)
            for i in T.Parallel(blk_sink):
                dsink_fragment[i] = -T.exp2(sink * LOG2E - lse_fragment[i]) * delta_fragment[i]
            T.copy(dsink_fragment, dsinks[bz, bx, by * blk_sink : (by + 1) * blk_sink])

    return sink_attn_bwd


def _torch_dtype(problem):
    import torch

    return {"float16": torch.float16, "bfloat16": torch.bfloat16}[problem["dtype"]]


def _forward(problem, q, k, v, sinks):
    """(O, lse): the attention output and the base-2 log-sum-exp of the scaled scores, the
    sink included, as the example's forward kernel gives them. ``sinks`` broadcasts over
    (batch, heads, queries, 1): one value per head, or one per query."""
    import torch

    seq_len, dim, window = q.shape[2], q.shape[3], problem["window"]
    logits = torch.einsum("bhqd,bhkd->bhqk", q, k) * dim**-0.5
    pos = torch.arange(seq_len, device=q.device)
    masked = pos[None, :] > pos[:, None]  # key after query
    if window:
        masked |= pos[None, :] <= pos[:, None] - window
    logits = logits.masked_fill(masked, float("-inf"))
    top = torch.maximum(logits.amax(-1, keepdim=True), sinks).detach()
    weights = torch.exp(logits - top)
    total = weights.sum(-1, keepdim=True) + torch.exp(sinks - top)
    o = torch.einsum("bhqk,bhkd->bhqd", weights / total, v)
    lse = (torch.log(total) + top).squeeze(-1) * LOG2E
    return o, lse


def inputs(problem, device):
    import torch

    batch, heads, seq_len, dim = (problem[k] for k in ("batch", "heads", "seq_len", "dim"))
    dt = _torch_dtype(problem)
    shape = (batch, heads, seq_len, dim)
    q, k, v, do = (torch.randn(shape, device=device, dtype=dt) for _ in range(4))
    sinks = torch.randn(heads, device=device, dtype=dt)
    o, lse = _forward(problem, q.float(), k.float(), v.float(), sinks.float().view(1, -1, 1, 1))
    dq_accum = torch.zeros(shape, device=device, dtype=torch.float32)
    dq, dk, dv = (torch.empty(shape, device=device, dtype=dt) for _ in range(3))
    dsinks = torch.empty(batch, heads, seq_len, device=device, dtype=torch.float32)
    return [q, k, v, o.to(dt), do, lse.contiguous(), sinks, dq_accum, dq, dk, dv, dsinks]


def dq_layout(dq):
    """``dq`` (batch, heads, seq_len, dim) stored in make_dq_layout's order, viewed with its shape."""
    b, h, s, d = dq.shape
    # (b, h, l//8, l%8, d//8, (d%8)//2, d%2) -> (b, h, l//8, d//8, d%2, l%8, (d%8)//2)
    return dq.reshape(b, h, s // 8, 8, d // 8, 4, 2).permute(0, 1, 2, 4, 6, 3, 5).reshape(b, h, s, d)


def reference(problem, args):
    import torch

    q, k, v, _, do, _, sinks = (a.float() for a in args[:7])
    batch, heads, seq_len, _ = q.shape
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    # one sink per query, all equal to its head's: its gradient is each query's share
    per_query = sinks.view(1, heads, 1, 1).expand(batch, heads, seq_len, 1).contiguous().requires_grad_()
    o, _ = _forward(problem, q, k, v, per_query)
    dq, dk, dv, dsink = torch.autograd.grad(o, (q, k, v, per_query), do)
    return [dq_layout(dq), dq, dk, dv, dsink.squeeze(-1)]


def flops(problem):
    # five MMAs over the (query, key) pairs the causal window keeps
    seq_len, window = problem["seq_len"], problem["window"]
    pairs = sum(min(q + 1, window or seq_len) for q in range(seq_len))
    return 5 * 2.0 * problem["batch"] * problem["heads"] * pairs * problem["dim"]
