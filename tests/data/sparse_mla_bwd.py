"""sparse_mla_bwd: DeepSeek-V3.2's sparse MLA backward (bf16, one KV group) as tilelang's
examples/deepseek_v32/sparse_mla_bwd.py writes it (its ``bwd``, the main kernel): one block per
(query, batch, block of up to 64 heads) keeps the query's Q rows (dim + a 64-wide rotary tail) and
dO rows in shared memory and walks the query's topk index slots block_size at a time. Each
step gathers the selected key rows element by element (no TMA) into shared memory, recomputes
P = exp2(S * scale - LSE) from two MMAs (main and tail; slots past the query masked to 0), then
dP = dO K^T, dS = P (dP - Delta) * sm_scale, and runs five more MMAs with the heads as the long
side: dQ += dS K (main and tail, in registers across the loop), dKV = dS^T Q + P^T dO (main,
rows over the block's slots) and dKV_tail = dS^T Q_tail. The block's dKV rows go through a
shared tile, half the rows at a time, into the fp32 dKV with 4-wide float atomics at the
gathered key positions (several queries select the same key); dQ is stored once at the end.
The values are the keys' first dim columns, so dKV holds the gradient of both uses.

What a schedule tuner sees: eight MMAs a step, all from shared operands (two of them fed by
the P and dS tiles the consumers write to shared memory themselves); fp32 accumulators of
heads x dim (dQ, live across the loop) and block_size x dim (dKV) per block, about 232 registers a
thread over two consumer warpgroups at dim 512, so one warpgroup spills; element-wise gathers
(KV_shared, KV_tail_shared) and a shared-staged atomic epilogue inside the loop. role_based's
seed gives Q/dO's loads a Load warp and dQ's store a Store warp and keeps the whole loop,
gathers included, in the consumers, so no seed pipeline crosses the loop: the space varies
the role layout and register budgets, and moving the gathers (a pipeline of the gathered keys)
or the dKV atomics (pipelines of the dKV staging tiles) to roles of their own. At dim 512 and
64 heads the gathered keys' pipeline does not fit beside Q, dO and dQ in 227 KB, nor does
block_size=64 at all (296 KB); the example's no-WS kernel is tilelang's no_ws baseline.

Departures from the example:
- only the main kernel is ported. The example's ``preprocess`` (Delta = rowsum(O * dO)) is
  computed by ``inputs`` in float32 with torch, as is the forward's base-2 log-sum-exp (the
  example takes it from sparse_mla_fwd); its ``postprocess`` (a cast of the fp32 dKV to
  bf16) is left out: the output dKV is the fp32 tensor the kernel accumulates into;
- the example's ``T.const``/``T.empty`` jit signature becomes a plain prim_func over
  (Q, KV, dO, Indices, Lse, Delta, dQ, dKV), dQ an argument rather than a returned tensor;
- kv_group = 1 (the example's test: HKV=1) and heads a power of two from 16 (the example pads
  heads to a power of two and reads past Q's heads otherwise); sm_scale and is_causal are the
  example's defaults ((dim + tail)^-0.5, causal);
- ``threads`` is a parameter (the example picks 256 at 64-head blocks, else 128);
- the example's pass configs (TL_DISABLE_WARP_SPECIALIZED, aggressive shared memory merge)
  are not set: a kernel file gives none;
- index slots past a query's causal end hold seq_kv - 1 (the example's test fills them with
  seq_kv, one past the end of KV, which the kernel still gathers and adds zeros to), so
  seq_kv must exceed seq; queries draw from the positions at or before them (the example's
  test: strictly before, except query 0), as tests/data/sparse_mla.py does.

    ws-tune tests/data/sparse_mla_bwd.py --shape batch=1,seq=4096,seq_kv=8192,heads=64,topk=2048 --budget 16
"""

import tilelang.language as T

PROBLEM = {"batch": None, "seq": None, "seq_kv": None, "heads": 64, "topk": 2048, "dim": 512, "tail": 64}
CHOICES = {"heads": [16, 32, 64, 128], "dim": [256, 512], "tail": [64]}
PARAMS = {"block_size": [32, 64], "num_stages": [0, 1, 2], "threads": [128, 256]}
OUTPUTS = [6, 7]  # dQ, dKV
RESET_TO_ZERO = [7]  # dKV: every query that selected a key adds its share
TOLERANCE = 2e-2
LOG2E = 1.44269504
SPLIT_STORE = 2


def check(problem, params, schedule):
    if problem["seq_kv"] <= problem["seq"]:
        return f"seq_kv={problem['seq_kv']} must exceed seq={problem['seq']} (the masked index slots point past every query)"
    if problem["topk"] % params["block_size"]:
        return f"topk={problem['topk']} is not a multiple of block_size={params['block_size']}"
    if problem["topk"] > problem["seq_kv"]:
        return f"topk={problem['topk']} exceeds seq_kv={problem['seq_kv']}"
    return None


def kernel(problem, *, block_size, num_stages, threads):
    B, S, S_kv, H, topk, D, D_tail = (problem[k] for k in ("batch", "seq", "seq_kv", "heads", "topk", "dim", "tail"))
    kv_group = 1
    sm_scale = (D + D_tail) ** (-0.5)
    sm_scale_mul_reciprocal_log2 = sm_scale * LOG2E
    dtype, accum_dtype, indices_dtype = "bfloat16", "float32", "int32"

    H_kv = H // kv_group
    q_shape = [B, S, H, D + D_tail]
    k_shape = [B, S_kv, kv_group, D + D_tail]
    o_shape = [B, S, H, D]
    indices_shape = [B, S, kv_group, topk]
    delta_shape = [B, S, H]
    lse_shape = [B, S, H]

    padded_H = max(1 << (H_kv - 1).bit_length(), 16)
    block_H = min(64, padded_H)
    NH = padded_H // block_H
    BS = block_size
    NS = topk // block_size
    split_store = SPLIT_STORE

    @T.prim_func
    def sparse_mla_bwd(Q: T.Tensor(q_shape, dtype), KV: T.Tensor(k_shape, dtype), dO: T.Tensor(o_shape, dtype),
                       Indices: T.Tensor(indices_shape, indices_dtype), Lse: T.Tensor(lse_shape, accum_dtype),
                       Delta: T.Tensor(delta_shape, accum_dtype), dQ: T.Tensor(q_shape, dtype),
                       dKV: T.Tensor(k_shape, accum_dtype)):  # fmt: skip
        with T.Kernel(S, B, kv_group * NH, threads=threads) as (s_i, by, bz):
            Q_shared = T.alloc_shared([block_H, D + D_tail], dtype)
            KV_shared = T.alloc_shared([BS, D], dtype)
            KV_tail_shared = T.alloc_shared([BS, D_tail], dtype)
            dO_shared = T.alloc_shared([block_H, D], dtype)
            mask = T.alloc_fragment([BS], "bool")

            P_shared_cast = T.alloc_shared([block_H, BS], dtype)
            dP_shared_cast = T.alloc_shared([block_H, BS], dtype)
            dQ_shared = T.alloc_shared([block_H, D], dtype)
            dQ_tail_shared = T.alloc_shared([block_H, D_tail], dtype)

            acc_p = T.alloc_fragment([block_H, BS], accum_dtype)
            acc_dp = T.alloc_fragment([block_H, BS], accum_dtype)
            acc_dq = T.alloc_fragment([block_H, D], accum_dtype)
            acc_dq_tail = T.alloc_fragment([block_H, D_tail], accum_dtype)
            acc_dkv = T.alloc_fragment([BS, D], accum_dtype)
            acc_dkv_tail = T.alloc_fragment([BS, D_tail], accum_dtype)
            acc_dkv_shared = T.alloc_shared([BS // split_store, D], accum_dtype)
            acc_dkv_tail_shared = T.alloc_shared([BS // split_store, D_tail], accum_dtype)

            max_kv_i = s_i

            T.copy(Q[by, s_i, bz * block_H : (bz + 1) * block_H, :D], Q_shared[:, :D])
            T.copy(Q[by, s_i, bz * block_H : (bz + 1) * block_H, D:], Q_shared[:, D:])
            T.copy(dO[by, s_i, bz * block_H : (bz + 1) * block_H, :D], dO_shared)

            T.clear(acc_dq)
            T.clear(acc_dq_tail)

            # Process each block of indices
            for i_i in T.Pipelined(NS, num_stages=num_stages):
                # Check which indices are valid
                for bi_i in T.Parallel(BS):
                    mask[bi_i] = Indices[by, s_i, bz // NH, i_i * BS + bi_i] <= max_kv_i

                # Compute attention scores
                for h_i, bi_i in T.Parallel(block_H, BS):
                    acc_p[h_i, bi_i] = T.if_then_else(mask[bi_i], 0, -T.infinity(acc_p.dtype))

                # Load KV, V for this block of indices
                for bi_i, d_i in T.Parallel(BS, D):
                    KV_shared[bi_i, d_i] = KV[by, Indices[by, s_i, bz // NH, i_i * BS + bi_i], bz // NH, d_i]

                T.gemm(Q_shared[:, :D], KV_shared, acc_p, transpose_B=True, policy=T.GemmWarpPolicy.FullCol)

                for bi_i, d_i in T.Parallel(BS, D_tail):
                    KV_tail_shared[bi_i, d_i] = KV[by, Indices[by, s_i, bz // NH, i_i * BS + bi_i], bz // NH, D + d_i]
                T.gemm(Q_shared[:, D:], KV_tail_shared, acc_p, transpose_B=True, policy=T.GemmWarpPolicy.FullCol)

                for h_i, bi_i in T.Parallel(block_H, BS):
                    acc_p[h_i, bi_i] = T.exp2(acc_p[h_i, bi_i] * sm_scale_mul_reciprocal_log2 - Lse[by, s_i, bz * block_H + h_i])

                T.copy(acc_p, P_shared_cast)

                T.gemm(dO_shared, KV_shared, acc_dp, transpose_B=True, policy=T.GemmWarpPolicy.FullCol, clear_accum=True)

                for h_i, bi_i in T.Parallel(block_H, BS):
                    acc_dp[h_i, bi_i] = acc_p[h_i, bi_i] * (acc_dp[h_i, bi_i] - Delta[by, s_i, bz * block_H + h_i]) * sm_scale

                T.copy(acc_dp, dP_shared_cast)
                T.gemm(dP_shared_cast, KV_shared, acc_dq, policy=T.GemmWarpPolicy.FullCol)
                T.gemm(dP_shared_cast, KV_tail_shared, acc_dq_tail, policy=T.GemmWarpPolicy.FullCol)

                T.gemm(dP_shared_cast, Q_shared[:, :D], acc_dkv, transpose_A=True, policy=T.GemmWarpPolicy.FullCol, clear_accum=True)
                T.gemm(P_shared_cast, dO_shared, acc_dkv, transpose_A=True, policy=T.GemmWarpPolicy.FullCol)

                T.clear(acc_dkv_tail)
                T.gemm(dP_shared_cast, Q_shared[:, D:], acc_dkv_tail, transpose_A=True, policy=T.GemmWarpPolicy.FullCol)

                for s in range(split_store):
                    for bi_i, d_i in T.Parallel(BS, D):
                        if bi_i < BS // split_store:
                            acc_dkv_shared[bi_i, d_i] = acc_dkv[bi_i + s * (BS // split_store), d_i]

                    for bi_i, d_i in T.Parallel(BS, D_tail):
                        if bi_i < BS // split_store:
                            acc_dkv_tail_shared[bi_i, d_i] = acc_dkv_tail[bi_i + s * (BS // split_store), d_i]

                    for bi_i, d_i in T.Parallel(BS // split_store, D // 4):
                        T.atomic_addx4(
                            dKV[by, Indices[by, s_i, bz // NH, i_i * BS + bi_i + s * (BS // split_store)], bz // NH, d_i * 4],
                            acc_dkv_shared[bi_i, d_i * 4],
                        )

                    # Atomically update dKV, dKV_tail tensors
                    for bi_i, d_i in T.Parallel(BS // split_store, D_tail // 4):
                        T.atomic_addx4(
                            dKV[by, Indices[by, s_i, bz // NH, i_i * BS + bi_i + s * (BS // split_store)], bz // NH, D + d_i * 4],
                            acc_dkv_tail_shared[bi_i, d_i * 4],
                        )

            # Store the accumulated dQ
            T.copy(acc_dq, dQ_shared)
            T.copy(acc_dq_tail, dQ_tail_shared)

            T.copy(dQ_shared, dQ[by, s_i, bz * block_H : (bz + 1) * block_H, :D])
            T.copy(dQ_tail_shared, dQ[by, s_i, bz * block_H : (bz + 1) * block_H, D:])

    return sparse_mla_bwd


def _chunks(problem):
    """Query ranges whose gathered keys (chunk x topk x width fp32) stay near 256 MB."""
    seq, width = problem["seq"], problem["dim"] + problem["tail"]
    step = max(1, (1 << 26) // (problem["topk"] * width))
    return [(t, min(seq, t + step)) for t in range(0, seq, step)]


def _attend(problem, q, keys, idx, t0):
    """(out, logits) of queries t0.. of one batch element: q (c, heads, width), keys (seq_kv,
    width), idx (c, topk) long; logits scaled by (dim + tail)^-0.5, slots past the query -inf."""
    import torch

    gathered = keys[idx]  # (c, topk, width)
    logits = torch.einsum("chd,ckd->chk", q, gathered) * q.shape[-1] ** -0.5
    late = idx > torch.arange(t0, t0 + q.shape[0], device=q.device)[:, None]
    logits = logits.masked_fill(late[:, None, :], float("-inf"))
    return torch.einsum("chk,ckd->chd", logits.softmax(-1), gathered[..., : problem["dim"]]), logits


def inputs(problem, device):
    import torch

    batch, seq, seq_kv, heads, topk, D = (problem[k] for k in ("batch", "seq", "seq_kv", "heads", "topk", "dim"))
    width = D + problem["tail"]
    q = torch.randn(batch, seq, heads, width, device=device, dtype=torch.bfloat16)
    kv = torch.randn(batch, seq_kv, 1, width, device=device, dtype=torch.bfloat16)
    do = torch.randn(batch, seq, heads, D, device=device, dtype=torch.bfloat16)
    # each query draws up to topk distinct positions at or before it; the slots left over point past it
    draw = torch.rand(batch, seq, 1, seq_kv, device=device)
    late = torch.arange(seq_kv, device=device) > torch.arange(seq, device=device)[:, None, None]
    picked = draw.masked_fill(late, -1.0).topk(topk, dim=-1)
    indices = picked.indices.masked_fill(picked.values < 0, seq_kv - 1).to(torch.int32)
    # the forward's base-2 log-sum-exp and the preprocessing kernel's Delta = rowsum(O * dO), in fp32
    lse = torch.empty(batch, seq, heads, device=device, dtype=torch.float32)
    delta = torch.empty_like(lse)
    for b in range(batch):
        for t0, t1 in _chunks(problem):
            out, logits = _attend(problem, q[b, t0:t1].float(), kv[b, :, 0].float(), indices[b, t0:t1, 0].long(), t0)
            lse[b, t0:t1] = torch.logsumexp(logits, -1) * LOG2E
            delta[b, t0:t1] = (out.to(torch.bfloat16).float() * do[b, t0:t1].float()).sum(-1)
    dq = torch.empty_like(q)
    dkv = torch.zeros(batch, seq_kv, 1, width, device=device, dtype=torch.float32)
    return [q, kv, do, indices, lse, delta, dq, dkv]


def reference(problem, args):
    import torch

    q, kv, do, indices = args[0], args[1], args[2], args[3]
    dq = torch.empty(q.shape, device=q.device, dtype=torch.float32)
    dkv = torch.zeros(kv.shape, device=q.device, dtype=torch.float32)
    for b in range(q.shape[0]):
        keys = kv[b, :, 0].float().requires_grad_()
        for t0, t1 in _chunks(problem):
            qc = q[b, t0:t1].float().requires_grad_()
            out, _ = _attend(problem, qc, keys, indices[b, t0:t1, 0].long(), t0)
            gq, gk = torch.autograd.grad(out, (qc, keys), do[b, t0:t1].float())
            dq[b, t0:t1] = gq
            dkv[b, :, 0] += gk
    return [dq, dkv]


def flops(problem):
    # eight MMAs a step: S (dim, tail), dP (dim), dQ (dim, tail), dKV (dS^T Q: dim and tail; P^T dO: dim);
    # every index slot is computed, masked or not (the example's per_token_flop)
    b, s, h, k, D, tail = (problem[key] for key in ("batch", "seq", "heads", "topk", "dim", "tail"))
    return 2.0 * b * s * h * k * (3 * (D + tail) + 2 * D)
