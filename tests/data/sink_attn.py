"""sink_attn: causal attention with a learned sink per head and an optional sliding window
(BHSD, fp16), as tilelang's examples/attention_sink/example_mha_sink_fwd_bhsd.py writes it
(gpt-oss): the mask is written into S before Q K^T accumulates onto it, the key loop runs
from a window start that depends on the block to the causal end, and the sink's exp is
added to the row sums after the loop. Queries are the last seq_q of seq_kv positions.

    ws-tune tests/data/sink_attn.py --shape batch=4,heads=32,seq_q=4096,seq_kv=4096,window=128 --budget 16
"""

import tilelang.language as T

PROBLEM = {"batch": None, "heads": None, "seq_q": None, "seq_kv": None, "dim": 128, "window": 0}
CHOICES = {"dim": [64, 128], "window": [0, 128, 512, 1024]}  # window 0: full causal attention
PARAMS = {"block_M": [64, 128], "block_N": [64, 128], "num_stages": [1, 2], "threads": [128, 256]}
OUTPUTS = [3]  # Output; the sinks come after it
TOLERANCE = 2e-2
LOG2E = 1.44269504


def check(problem, params, schedule):
    if problem["seq_kv"] < problem["seq_q"]:
        return f"seq_kv={problem['seq_kv']} is shorter than seq_q={problem['seq_q']}"
    if problem["seq_q"] % params["block_M"] or problem["seq_kv"] % params["block_N"]:
        return "seq_q or seq_kv is not a multiple of its block"
    if problem["window"] % params["block_N"]:
        return f"window={problem['window']} is not a multiple of block_N={params['block_N']}"
    return None


def kernel(problem, *, block_M, block_N, num_stages, threads):
    batch, heads, seq_q, seq_kv, dim, window = (problem[k] for k in ("batch", "heads", "seq_q", "seq_kv", "dim", "window"))
    scale = (1.0 / dim) ** 0.5 * LOG2E
    past_len = seq_kv - seq_q
    q_shape, kv_shape = (batch, heads, seq_q, dim), (batch, heads, seq_kv, dim)
    dtype, accum = "float16", "float32"

    @T.prim_func
    def sink_attn(Q: T.Tensor(q_shape, dtype), K: T.Tensor(kv_shape, dtype), V: T.Tensor(kv_shape, dtype),
                  Output: T.Tensor(q_shape, dtype), Sinks: T.Tensor((heads,), dtype)):  # fmt: skip
        with T.Kernel(T.ceildiv(seq_q, block_M), heads, batch, threads=threads) as (bx, by, bz):
            Q_shared = T.alloc_shared((block_M, dim), dtype)
            K_shared = T.alloc_shared((block_N, dim), dtype)
            V_shared = T.alloc_shared((block_N, dim), dtype)
            O_shared = T.alloc_shared((block_M, dim), dtype)
            acc_s = T.alloc_fragment((block_M, block_N), accum)
            acc_s_cast = T.alloc_fragment((block_M, block_N), dtype)
            acc_o = T.alloc_fragment((block_M, dim), accum)
            scores_max = T.alloc_fragment((block_M,), accum)
            scores_max_prev = T.alloc_fragment((block_M,), accum)
            scores_scale = T.alloc_fragment((block_M,), accum)
            scores_sum = T.alloc_fragment((block_M,), accum)
            logsum = T.alloc_fragment((block_M,), accum)
            sinks = T.alloc_fragment((block_M,), dtype)

            T.copy(Q[bz, by, bx * block_M : (bx + 1) * block_M, :], Q_shared)
            T.fill(acc_o, 0)
            T.fill(logsum, 0)
            T.fill(scores_max, -T.infinity(accum))
            for i in T.Parallel(block_M):
                sinks[i] = Sinks[by]
            end = T.min(T.ceildiv(seq_kv, block_N), T.ceildiv((bx + 1) * block_M + past_len, block_N))
            start = T.max(0, (bx * block_M + past_len - window) // block_N) if window else 0
            for k in T.Pipelined(start, end, num_stages=num_stages):
                T.copy(K[bz, by, k * block_N : (k + 1) * block_N, :], K_shared)
                for i, j in T.Parallel(block_M, block_N):
                    q_idx = bx * block_M + i + past_len
                    k_idx = k * block_N + j
                    if window:
                        acc_s[i, j] = T.if_then_else(q_idx >= k_idx and q_idx < k_idx + window, 0, -T.infinity(accum))
                    else:
                        acc_s[i, j] = T.if_then_else(q_idx >= k_idx, 0, -T.infinity(accum))
                T.gemm(Q_shared, K_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                T.copy(scores_max, scores_max_prev)
                T.fill(scores_max, -T.infinity(accum))
                T.reduce_max(acc_s, scores_max, dim=1, clear=False)
                for i in T.Parallel(block_M):
                    scores_max[i] = T.max(scores_max[i], scores_max_prev[i])
                # a row the window has not reached yet is all -inf: keep its max finite
                for i in T.Parallel(block_M):
                    if window:
                        scores_max[i] = T.if_then_else(scores_max[i] == -T.infinity(accum), 0, scores_max[i])
                    scores_scale[i] = T.exp2(scores_max_prev[i] * scale - scores_max[i] * scale)
                for i, j in T.Parallel(block_M, block_N):
                    acc_s[i, j] = T.exp2(acc_s[i, j] * scale - scores_max[i] * scale)
                T.reduce_sum(acc_s, scores_sum, dim=1)
                for i in T.Parallel(block_M):
                    logsum[i] = logsum[i] * scores_scale[i] + scores_sum[i]
                T.copy(acc_s, acc_s_cast)
                for i, j in T.Parallel(block_M, dim):
                    acc_o[i, j] *= scores_scale[i]
                T.copy(V[bz, by, k * block_N : (k + 1) * block_N, :], V_shared)
                T.gemm(acc_s_cast, V_shared, acc_o, policy=T.GemmWarpPolicy.FullRow)
            for i in T.Parallel(block_M):
                logsum[i] += T.exp2(sinks[i] * LOG2E - scores_max[i] * scale)
            for i, j in T.Parallel(block_M, dim):
                acc_o[i, j] /= logsum[i]
            T.copy(acc_o, O_shared)
            T.copy(O_shared, Output[bz, by, bx * block_M : (bx + 1) * block_M, :])

    return sink_attn


def inputs(problem, device):
    import torch

    q_shape = (problem["batch"], problem["heads"], problem["seq_q"], problem["dim"])
    kv_shape = (problem["batch"], problem["heads"], problem["seq_kv"], problem["dim"])
    q, k, v = (torch.randn(s, device=device, dtype=torch.float16) for s in (q_shape, kv_shape, kv_shape))
    return [q, k, v, torch.empty(q_shape, device=device, dtype=torch.float16), torch.randn(problem["heads"], device=device, dtype=torch.float16)]


def reference(problem, args):
    import torch

    q, k, v, _, sinks = (a.float() for a in args)
    seq_q, seq_kv, window = q.shape[2], k.shape[2], problem["window"]
    logits = torch.einsum("bhqd,bhkd->bhqk", q, k) / q.shape[-1] ** 0.5
    pos_q = torch.arange(seq_q, device=q.device)[:, None] + (seq_kv - seq_q)
    pos_k = torch.arange(seq_kv, device=q.device)[None, :]
    masked = pos_k > pos_q
    if window:
        masked |= pos_k <= pos_q - window
    logits = logits.masked_fill(masked, float("-inf"))
    sink = sinks.view(1, -1, 1, 1)
    top = torch.maximum(logits.amax(-1, keepdim=True), sink)
    weights = torch.exp(logits - top)
    probs = weights / (weights.sum(-1, keepdim=True) + torch.exp(sink - top))
    return [torch.einsum("bhqk,bhkd->bhqd", probs, v)]


def flops(problem):
    # the causal (and windowed) half: every query sees at most window keys
    seq_q, seq_kv, dim, window = problem["seq_q"], problem["seq_kv"], problem["dim"], problem["window"]
    past = seq_kv - seq_q
    keys = sum(min(past + q + 1, window or seq_kv) for q in range(seq_q))
    return 4.0 * problem["batch"] * problem["heads"] * keys * dim
