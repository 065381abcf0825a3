"""sink_gqa_varlen: grouped-query attention forward with a learned sink per head over
sequences of different lengths packed without padding (gpt-oss), as tilelang's
examples/attention_sink/example_gqa_sink_fwd_varlen.py writes it: one block per (query
block, query head, sequence) reads its sequence's query and key bounds from cu_seqlens_q and
cu_seqlens_k (queries right-aligned on the keys: ``offset = kv_len - q_len``), streams K and V
of its group's KV head (``head // groups``) from a window start to the causal end, writes the
mask (causal, sliding window, past either sequence's end) into S before Q K^T accumulates onto
it, adds the sink's exp to the row sums after the loop, and writes only the rows inside its
sequence, element by element from shared memory. The grid's first extent comes from the
scalar argument ``max_seqlen_q``.

The lengths are drawn from the problem as the example's ``generate_random_padding_mask(...,
mode="random")`` draws them (each between max(1, L - 20) and L, for L = q_seqlen and
k_seqlen), with a fixed seed, so that the kernel's tensor sizes and ``inputs`` agree. With
``is_causal``, a sequence whose keys are fewer than its queries has query rows that see no key
(the example writes 0 there).

Departures from the example:
- PARAMS cross the example's two configurations (the signature's 64/64/1/128 and main's
  128/128/2/256); ``check`` keeps its assert (the window a multiple of block_N);
- the ``TL_ENABLE_FAST_MATH`` pass config is not set (a kernel file returns the PrimFunc only);
- ``window`` 0 is the example's ``window_size=None``; fp16 only, dim 64 or 128;
- the reference is the example's ref_program, in fp32.

    ws-tune tests/data/sink_gqa_varlen.py --shape batch=8,heads=64,q_seqlen=2048,k_seqlen=2048,is_causal=1 --budget 16
"""

import functools
import random

import tilelang.language as T

PROBLEM = {"batch": None, "heads": None, "q_seqlen": None, "k_seqlen": None, "dim": 128, "groups": 16, "is_causal": False, "window": 0}
CHOICES = {"dim": [64, 128], "window": [0, 128, 256, 512, 1024]}  # window 0: no sliding window
PARAMS = {"block_M": [64, 128], "block_N": [64, 128], "num_stages": [1, 2], "threads": [128, 256]}
OUTPUTS = [7]  # Output_unpad
TOLERANCE = 2e-2
LOG2E = 1.44269504


@functools.lru_cache(maxsize=None)
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


def kernel(problem, *, block_M, block_N, num_stages, threads):
    batch_size, heads, dim, groups, is_causal = (problem[k] for k in ("batch", "heads", "dim", "groups", "is_causal"))
    window_size = problem["window"] or None
    q_lens, k_lens = _lens(problem)
    UQ, UKV = sum(q_lens), sum(k_lens)

    if window_size is not None:
        assert window_size % block_N == 0, "window_size must be divisible by block_N"

    sm_scale = (1.0 / dim) ** 0.5
    scale = sm_scale * 1.44269504  # log2(e)

    head_kv = heads // groups
    q_shape = [UQ, heads, dim]
    kv_shape = [UKV, head_kv, dim]
    o_shape = [UQ, heads, dim]
    dtype = T.float16
    accum_dtype = T.float32

    @T.prim_func
    def main(
        Q_unpad: T.Tensor(q_shape, dtype),
        K_unpad: T.Tensor(kv_shape, dtype),
        V_unpad: T.Tensor(kv_shape, dtype),
        cu_seqlens_q: T.Tensor([batch_size + 1], T.int32),
        cu_seqlens_k: T.Tensor([batch_size + 1], T.int32),
        max_seqlen_q: T.int32,
        Sinks: T.Tensor([heads], dtype),
        Output_unpad: T.Tensor(o_shape, dtype),
    ):
        with T.Kernel(T.ceildiv(max_seqlen_q, block_M), heads, batch_size, threads=threads) as (bx, by, bz):
            Q_shared = T.alloc_shared([block_M, dim], dtype)
            K_shared = T.alloc_shared([block_N, dim], dtype)
            V_shared = T.alloc_shared([block_N, dim], dtype)
            O_shared = T.alloc_shared([block_M, dim], dtype)
            acc_s = T.alloc_fragment([block_M, block_N], accum_dtype)
            acc_s_cast = T.alloc_fragment([block_M, block_N], dtype)
            acc_o = T.alloc_fragment([block_M, dim], accum_dtype)
            scores_max = T.alloc_fragment([block_M], accum_dtype)
            scores_max_prev = T.alloc_fragment([block_M], accum_dtype)
            scores_scale = T.alloc_fragment([block_M], accum_dtype)
            scores_sum = T.alloc_fragment([block_M], accum_dtype)
            logsum = T.alloc_fragment([block_M], accum_dtype)
            sinks = T.alloc_fragment([block_M], dtype)

            batch_idx = bz
            head_idx = by
            kv_head_idx = head_idx // groups

            q_start_idx = cu_seqlens_q[batch_idx]
            kv_start_idx = cu_seqlens_k[batch_idx]
            q_end_idx = cu_seqlens_q[batch_idx + 1]
            k_end_idx = cu_seqlens_k[batch_idx + 1]

            q_current_seqlen = q_end_idx - q_start_idx
            kv_current_seqlen = k_end_idx - kv_start_idx

            T.copy(Q_unpad[q_start_idx + bx * block_M : q_start_idx + (bx + 1) * block_M, head_idx, :], Q_shared)

            T.fill(acc_o, 0)
            T.fill(logsum, 0)
            T.fill(scores_max, -T.infinity(accum_dtype))
            for i in T.Parallel(block_M):
                sinks[i] = Sinks[head_idx]

            offset = kv_current_seqlen - q_current_seqlen  # always align on the right
            max_visible_k_idx = offset + (bx + 1) * block_M

            # Determine loop range based on causal mask and sliding window
            if is_causal:
                if window_size is not None:
                    # Sliding window + causal: start from window boundary
                    start = T.max(0, (offset + bx * block_M - window_size + 1) // block_N)
                    end = T.min(T.ceildiv(max_visible_k_idx, block_N), T.ceildiv(kv_current_seqlen, block_N))
                else:
                    # Full causal attention
                    start = 0
                    end = T.min(T.ceildiv(max_visible_k_idx, block_N), T.ceildiv(kv_current_seqlen, block_N))
            else:
                if window_size is not None:
                    start = T.max(0, (offset + bx * block_M - window_size + 1) // block_N)
                    end = T.ceildiv(kv_current_seqlen, block_N)
                else:
                    start = 0
                    end = T.ceildiv(kv_current_seqlen, block_N)

            loop_range = end - start

            for k in T.Pipelined(loop_range, num_stages=num_stages):
                actual_k = k + start
                T.copy(K_unpad[kv_start_idx + actual_k * block_N : kv_start_idx + (actual_k + 1) * block_N, kv_head_idx, :], K_shared)

                # Build mask considering causal, sliding window, and padding
                if is_causal:
                    if window_size is not None:
                        for i, j in T.Parallel(block_M, block_N):
                            q_idx = bx * block_M + i + offset
                            k_idx = actual_k * block_N + j
                            # Causal + sliding window mask
                            acc_s[i, j] = T.if_then_else(
                                (q_idx < k_idx)  # causal: can't see future
                                or (q_idx >= k_idx + window_size)  # sliding window: too old
                                or (bx * block_M + i >= q_current_seqlen or actual_k * block_N + j >= kv_current_seqlen),
                                -T.infinity(acc_s.dtype),
                                0,
                            )
                    else:
                        for i, j in T.Parallel(block_M, block_N):
                            acc_s[i, j] = T.if_then_else(
                                (bx * block_M + i + offset < actual_k * block_N + j)
                                or (bx * block_M + i >= q_current_seqlen or actual_k * block_N + j >= kv_current_seqlen),
                                -T.infinity(acc_s.dtype),
                                0,
                            )
                else:
                    if window_size is not None:
                        for i, j in T.Parallel(block_M, block_N):
                            q_idx = bx * block_M + i + offset
                            k_idx = actual_k * block_N + j
                            acc_s[i, j] = T.if_then_else(
                                (q_idx >= k_idx + window_size)  # sliding window: too old
                                or (bx * block_M + i >= q_current_seqlen or actual_k * block_N + j >= kv_current_seqlen),
                                -T.infinity(acc_s.dtype),
                                0,
                            )
                    else:
                        for i, j in T.Parallel(block_M, block_N):
                            acc_s[i, j] = T.if_then_else(
                                (bx * block_M + i >= q_current_seqlen or actual_k * block_N + j >= kv_current_seqlen),
                                -T.infinity(acc_s.dtype),
                                0,
                            )

                T.gemm(Q_shared, K_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)

                T.copy(scores_max, scores_max_prev)
                T.fill(scores_max, -T.infinity(accum_dtype))
                T.reduce_max(acc_s, scores_max, dim=1, clear=False)
                for i in T.Parallel(block_M):
                    scores_max[i] = T.max(scores_max[i], scores_max_prev[i])

                # Check_inf for sliding window attention
                if window_size is not None:
                    for i in T.Parallel(block_M):
                        scores_max[i] = T.if_then_else(scores_max[i] == -T.infinity(accum_dtype), 0, scores_max[i])

                for i in T.Parallel(block_M):
                    scores_scale[i] = T.exp2(scores_max_prev[i] * scale - scores_max[i] * scale)
                for i, j in T.Parallel(block_M, block_N):
                    acc_s[i, j] = T.exp2(acc_s[i, j] * scale - scores_max[i] * scale)
                T.reduce_sum(acc_s, scores_sum, dim=1)
                for i in T.Parallel(block_M):
                    logsum[i] = logsum[i] * scores_scale[i] + scores_sum[i]
                T.copy(acc_s, acc_s_cast)

                for i, j in T.Parallel(block_M, dim):
                    acc_o[i, j] *= scores_scale[i]

                T.copy(V_unpad[kv_start_idx + actual_k * block_N : kv_start_idx + (actual_k + 1) * block_N, kv_head_idx, :], V_shared)

                T.gemm(acc_s_cast, V_shared, acc_o, policy=T.GemmWarpPolicy.FullRow)

            # Attention sink: add sink contribution to logsum
            for i in T.Parallel(block_M):
                logsum[i] += T.exp2(sinks[i] * 1.44269504 - scores_max[i] * scale)

            for i, j in T.Parallel(block_M, dim):
                # When sq > skv, some tokens can see nothing (for causal)
                acc_o[i, j] = 0 if is_causal and bx * block_M + i + offset < 0 else acc_o[i, j] / logsum[i]

            T.copy(acc_o, O_shared)
            for i, d in T.Parallel(block_M, dim):
                if bx * block_M + i < q_current_seqlen:
                    Output_unpad[q_start_idx + bx * block_M + i, head_idx, d] = O_shared[i, d]

    return main


def inputs(problem, device):
    import torch

    q_lens, k_lens = _lens(problem)
    heads, dim = problem["heads"], problem["dim"]
    head_kv = heads // problem["groups"]
    q = torch.randn(sum(q_lens), heads, dim, device=device, dtype=torch.float16)
    k = torch.randn(sum(k_lens), head_kv, dim, device=device, dtype=torch.float16)
    v = torch.randn(sum(k_lens), head_kv, dim, device=device, dtype=torch.float16)
    cu_seqlens_q = torch.tensor([0, *q_lens], device=device, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    cu_seqlens_k = torch.tensor([0, *k_lens], device=device, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    sinks = torch.randn(heads, device=device, dtype=torch.float16)
    out = torch.empty(sum(q_lens), heads, dim, device=device, dtype=torch.float16)
    return [q, k, v, cu_seqlens_q, cu_seqlens_k, max(q_lens), sinks, out]


def reference(problem, args):
    """The example's ref_program, in fp32: query head h reads KV head h // groups, queries
    right-aligned on the keys, the sink's exp added to the softmax's denominator."""
    import torch

    q_unpad, k_unpad, v_unpad, cu_seqlens_q, cu_seqlens_k, _, sinks, _ = args
    groups, is_causal, window = problem["groups"], problem["is_causal"], problem["window"] or None
    _, num_heads, head_dim = q_unpad.shape
    num_kv_heads = k_unpad.shape[1]
    sm_scale = 1.0 / head_dim**0.5
    output = torch.zeros(q_unpad.shape, device=q_unpad.device, dtype=torch.float32)
    sinks_expanded = sinks.view(num_kv_heads, groups, 1, 1).float()
    bq, bk = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for q_start, q_end, k_start, k_end in zip(bq, bq[1:], bk, bk[1:]):
        q_len, k_len = q_end - q_start, k_end - k_start
        if q_len == 0:
            continue
        q_seq = q_unpad[q_start:q_end].float().view(q_len, num_kv_heads, groups, head_dim)
        k_seq = k_unpad[k_start:k_end].float().unsqueeze(2)
        v_seq = v_unpad[k_start:k_end].float().unsqueeze(2)
        logits = torch.einsum("qhgd,khgd->hgqk", q_seq, k_seq) * sm_scale
        pos_keys = torch.arange(k_len, device=q_unpad.device)
        pos_queries = torch.arange(q_len, device=q_unpad.device) + (k_len - q_len)
        mask = torch.zeros(q_len, k_len, device=q_unpad.device)
        if is_causal:
            mask.masked_fill_(pos_keys[None, :] > pos_queries[:, None], float("-inf"))
        if window is not None:
            mask.masked_fill_(pos_keys[None, :] < pos_queries[:, None] - window + 1, float("-inf"))
        logits = logits + mask
        top = torch.maximum(sinks_expanded, logits.amax(dim=-1, keepdim=True))
        weights = torch.exp(logits - top)
        scores = weights / (weights.sum(dim=-1, keepdim=True) + torch.exp(sinks_expanded - top))
        output[q_start:q_end] = torch.einsum("hgqk,khgd->qhgd", scores, v_seq).reshape(q_len, num_heads, head_dim)
    return [output]


@functools.lru_cache(maxsize=None)
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
    # two MMAs over the pairs the mask keeps (the example counts padded lengths, halved when causal)
    pairs = _visible_pairs(*_lens(problem), bool(problem["is_causal"]), problem["window"])
    return 4.0 * problem["heads"] * problem["dim"] * pairs


def bytes_moved(problem):
    q_lens, k_lens = _lens(problem)
    heads, dim, batch = problem["heads"], problem["dim"], problem["batch"]
    head_kv = heads // problem["groups"]
    # Q and O, K and V (fp16), both cu_seqlens (int32), the sinks (fp16)
    return 2.0 * (2 * sum(q_lens) * heads * dim + 2 * sum(k_lens) * head_kv * dim + heads) + 4.0 * 2 * (batch + 1)
