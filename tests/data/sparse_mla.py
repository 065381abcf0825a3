"""sparse_mla: DeepSeek-V3.2's sparse MLA forward (bf16, one KV group) as tilelang's
examples/deepseek_v32/sparse_mla_fwd.py writes it: each query attends to topk key positions
named by an index tensor, gathered into shared memory element by element (no TMA); the keys
carry a 64-wide rotary tail and the values are the keys' first dim columns. Index slots
past a query's causal end hold seq_kv - 1 and are masked. Outputs: O and its log2-sum-exp.

    ws-tune tests/data/sparse_mla.py --shape batch=1,seq=4096,seq_kv=8192,heads=128,topk=2048 --budget 16
"""

import tilelang.language as T

PROBLEM = {"batch": None, "seq": None, "seq_kv": None, "heads": 128, "topk": 2048, "dim": 512, "tail": 64}
CHOICES = {"heads": [64, 128], "dim": [256, 512], "tail": [64]}
PARAMS = {"block_I": [32, 64], "num_stages": [1, 2], "threads": [256]}
OUTPUTS = [3, 4]
TOLERANCE = 2e-2
LOG2E = 1.44269504
HEADS_PER_BLOCK = 64


def check(problem, params, schedule):
    if problem["seq_kv"] <= problem["seq"]:
        return f"seq_kv={problem['seq_kv']} must exceed seq={problem['seq']} (the masked index slots point past every query)"
    if problem["topk"] % params["block_I"] or problem["heads"] % HEADS_PER_BLOCK:
        return "topk is not a multiple of block_I, or heads of 64"
    return None


def kernel(problem, *, block_I, num_stages, threads):
    batch, seq, seq_kv, heads, topk, D, tail = (problem[k] for k in ("batch", "seq", "seq_kv", "heads", "topk", "dim", "tail"))
    scale = (1.0 / (D + tail)) ** 0.5 * LOG2E
    H = HEADS_PER_BLOCK
    replicas = heads // H
    dtype, accum = "bfloat16", "float32"

    @T.prim_func
    def sparse_mla(Q: T.Tensor((batch, seq, heads, D + tail), dtype), KV: T.Tensor((batch, seq_kv, 1, D + tail), dtype),
                   Indices: T.Tensor((batch, seq, 1, topk), "int32"), Output: T.Tensor((batch, seq, heads, D), dtype),
                   Lse: T.Tensor((batch, seq, heads), accum)):  # fmt: skip
        with T.Kernel(seq * replicas, batch, threads=threads) as (bx, by):
            Q_shared = T.alloc_shared((H, D + tail), dtype)
            KV_shared = T.alloc_shared((block_I, D), dtype)
            K_tail_shared = T.alloc_shared((block_I, tail), dtype)
            S_shared = T.alloc_shared((H, block_I), dtype)
            mask = T.alloc_fragment((block_I,), "bool")
            acc_o = T.alloc_fragment((H, D), accum)
            acc_s = T.alloc_fragment((H, block_I), accum)
            sumexp = T.alloc_fragment((H,), accum)
            sumexp_i = T.alloc_fragment((H,), accum)
            alpha = T.alloc_fragment((H,), accum)
            m_i = T.alloc_fragment((H,), accum)
            m_i_prev = T.alloc_fragment((H,), accum)

            T.fill(acc_o, 0)
            T.fill(sumexp, 0)
            T.fill(m_i, -(2**30))  # finite: -inf - -inf would be NaN
            s_i = bx // replicas
            h0 = (bx % replicas) * H
            T.copy(Q[by, s_i, h0 : h0 + H, :D], Q_shared[:, :D])
            T.copy(Q[by, s_i, h0 : h0 + H, D:], Q_shared[:, D:])
            for i_i in T.Pipelined(topk // block_I, num_stages=num_stages):
                for bi in T.Parallel(block_I):
                    mask[bi] = Indices[by, s_i, 0, i_i * block_I + bi] <= s_i
                for bi, d in T.Parallel(block_I, D):
                    KV_shared[bi, d] = KV[by, Indices[by, s_i, 0, i_i * block_I + bi], 0, d]
                for bi, d in T.Parallel(block_I, tail):
                    K_tail_shared[bi, d] = KV[by, Indices[by, s_i, 0, i_i * block_I + bi], 0, D + d]
                for h, bi in T.Parallel(H, block_I):
                    acc_s[h, bi] = T.if_then_else(mask[bi], 0, -T.infinity(accum))
                T.gemm(Q_shared[:, :D], KV_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                T.gemm(Q_shared[:, D:], K_tail_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                T.copy(m_i, m_i_prev)
                T.reduce_max(acc_s, m_i, dim=1, clear=False)
                for h in T.Parallel(H):
                    m_i[h] = T.max(m_i[h], m_i_prev[h])
                for h in T.Parallel(H):
                    alpha[h] = T.exp2((m_i_prev[h] - m_i[h]) * scale)
                for h, bi in T.Parallel(H, block_I):
                    acc_s[h, bi] = T.exp2(acc_s[h, bi] * scale - m_i[h] * scale)
                T.reduce_sum(acc_s, sumexp_i, dim=1)
                for h in T.Parallel(H):
                    sumexp[h] = sumexp[h] * alpha[h] + sumexp_i[h]
                for h, d in T.Parallel(H, D):
                    acc_o[h, d] = acc_o[h, d] * alpha[h]
                T.copy(acc_s, S_shared)
                T.gemm(S_shared, KV_shared, acc_o, policy=T.GemmWarpPolicy.FullRow)
            for h, d in T.Parallel(H, D):
                acc_o[h, d] /= sumexp[h]
            for h in T.Parallel(H):
                sumexp[h] = T.log2(sumexp[h]) + m_i[h] * scale
            T.copy(acc_o, Output[by, s_i, h0 : h0 + H, :])
            T.copy(sumexp, Lse[by, s_i, h0 : h0 + H])

    return sparse_mla


def inputs(problem, device):
    import torch

    batch, seq, seq_kv, heads, topk, width = (problem[k] for k in ("batch", "seq", "seq_kv", "heads", "topk", "dim"))
    width += problem["tail"]
    q = torch.randn(batch, seq, heads, width, device=device, dtype=torch.bfloat16)
    kv = torch.randn(batch, seq_kv, 1, width, device=device, dtype=torch.bfloat16)
    # each query draws up to topk distinct positions at or before it; the slots left over point past it
    draw = torch.rand(batch, seq, 1, seq_kv, device=device)
    late = torch.arange(seq_kv, device=device) > torch.arange(seq, device=device)[:, None, None]
    picked = draw.masked_fill(late, -1.0).topk(topk, dim=-1)
    indices = picked.indices.masked_fill(picked.values < 0, seq_kv - 1).to(torch.int32)
    return [q, kv, indices, torch.empty(batch, seq, heads, problem["dim"], device=device, dtype=torch.bfloat16),
            torch.empty(batch, seq, heads, device=device, dtype=torch.float32)]  # fmt: skip


def reference(problem, args):
    import torch

    q, kv, indices = args[0].float(), args[1].float(), args[2].long()
    seq, D = q.shape[1], problem["dim"]
    keys = kv[:, :, 0]  # (batch, seq_kv, width)
    gathered = keys[torch.arange(keys.shape[0], device=q.device)[:, None, None], indices[:, :, 0]]  # (batch, seq, topk, width)
    logits = torch.einsum("bshd,bskd->bshk", q, gathered) / q.shape[-1] ** 0.5
    late = indices[:, :, 0] > torch.arange(seq, device=q.device)[None, :, None]
    logits = logits.masked_fill(late[:, :, None, :], float("-inf"))
    out = torch.einsum("bshk,bskd->bshd", logits.softmax(-1), gathered[..., :D])
    return [out, torch.logsumexp(logits, -1) / torch.log(torch.tensor(2.0))]


def flops(problem):
    # every index slot is computed, masked or not
    b, s, h, k, D, tail = (problem[key] for key in ("batch", "seq", "heads", "topk", "dim", "tail"))
    return 2.0 * b * s * h * k * (D + tail + D)
