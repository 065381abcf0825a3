"""gqa_fwd_pipelined: FlashAttention forward for grouped-query attention (BSHD, fp16), as
tilelang's examples/flash_attention/example_gqa_fwd_bshd_wgmma_pipelined.py writes it: the
same computation as ``gqa_fwd.py`` (one block per (query block, query head, batch) streams K
and V of KV head ``by // groups``, online softmax in fp32 fragments, O through shared memory),
written with four ``T.macro``s (MMA0, Softmax, Rescale, MMA1) and a key loop whose
``T.Pipelined`` carries the author's own software-pipeline plan:

    order=[-1, 0, 3, 1, -1, 2], stage=[-1, 0, 0, 1, -1, 1],
    group=[[0], [1, 2], [3..10], [11], [12], [13]]

over the loop body's 14 statements (K copy | clear/mask + Q K^T | softmax's 8 | rescale |
V copy | P V): the softmax of block k overlaps the P V of block k-1 (stage 1).

What a schedule tuner sees: a plain kernel (no ``T.annotate_ws_schedule`` seed; tilelang's
role_based scheduler seeds it), one pipelined key loop with two loads and two chained MMAs,
Q loaded once before the loop and O stored after it; plus the order/stage/group annotations.

Departures from the example:
- PARAMS are the example's get_configs (one point: block 128 x 128, 2 stages, 256 threads);
- ``is_causal`` is a bool problem argument (``--shape ...,is_causal=1``), dim 64 or 128
  (as gqa_fwd.py), fp16 only (the example hardcodes it);
- ``check`` refuses what the example gets wrong silently: a partial last key block when not
  causal (its keys past seq_len are not masked), and, causal, a block_N that is not a
  multiple of block_M (a key block with every key of a row masked makes its max -inf and the
  softmax NaN: the example comments out its Check_inf);
- the pipeline plan is written one entry per statement (ORDER/STAGE below): this tilelang's
  T.Pipelined has no ``group`` and refuses the two copies' shared order -1. Warp-specialized
  lowerings (the seed, [default], [role_based], every candidate) strip order/stage; only
  [no_ws] follows them;
- the example's ``out_idx=[3]`` becomes OUTPUTS = [3]; the reference is the example's
  ref_program in fp32.

    ws-tune tests/data/gqa_fwd_pipelined.py --shape batch=1,heads=32,seq_len=4096,groups=8 --budget 16
"""

import tilelang.language as T

PROBLEM = {"batch": None, "heads": None, "seq_len": None, "dim": 128, "groups": 16, "is_causal": False}
CHOICES = {"dim": [64, 128]}
# the example's get_configs
PARAMS = {"block_M": [128], "block_N": [128], "num_stages": [2], "threads": [256]}
OUTPUTS = [3]
TOLERANCE = 2e-2
# The example's plan, order=[-1, 0, 3, 1, -1, 2], stage=[-1, 0, 0, 1, -1, 1] over
# group=[[0], [1, 2], [3..10], [11], [12], [13]], one entry per statement: this tilelang's
# T.Pipelined takes no ``group`` (order/stage count statements) and refuses two statements of
# one order (the two -1 copies: "Two statements in the software pipeline cannot have the same
# order"), so the copies, which the example leaves to the producer (-1), are issued first at
# stage 0. Loop body: 0 K copy, 1 clear, 2 Q K^T, 3-10 softmax, 11 rescale, 12 V copy, 13 P V.
# Per iteration k: K(k), V(k), clear, Q K^T(k), rescale(k-1), P V(k-1), softmax(k).
ORDER = [0, 2, 3, 6, 7, 8, 9, 10, 11, 12, 13, 4, 1, 5]
STAGE = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1]


def check(problem, params, schedule):
    if problem["heads"] % problem["groups"]:
        return f"heads={problem['heads']} is not a multiple of groups={problem['groups']}"
    if not problem["is_causal"] and problem["seq_len"] % params["block_N"]:
        return f"seq_len={problem['seq_len']} is not a multiple of block_N={params['block_N']} (the example masks no key past seq_len)"
    if problem["is_causal"] and params["block_N"] % params["block_M"]:
        return f"causal with block_N={params['block_N']} not a multiple of block_M={params['block_M']}: a fully masked key block makes NaN (no Check_inf)"
    return None


def kernel(problem, *, block_M, block_N, num_stages, threads):
    batch, heads, seq_len, dim, groups, is_causal = (problem[k] for k in ("batch", "heads", "seq_len", "dim", "groups", "is_causal"))
    scale = (1.0 / dim) ** 0.5 * 1.44269504  # log2(e)
    head_kv = heads // groups
    q_shape = [batch, seq_len, heads, dim]
    kv_shape = [batch, seq_len, head_kv, dim]
    dtype = "float16"
    accum_dtype = "float"

    @T.macro
    def MMA0(
        K: T.Tensor(kv_shape, dtype),
        Q_shared: T.SharedBuffer([block_M, dim], dtype),
        K_shared: T.SharedBuffer([block_N, dim], dtype),
        acc_s: T.FragmentBuffer([block_M, block_N], accum_dtype),
        k: T.int32,
        bx: T.int32,
        by: T.int32,
        bz: T.int32,
    ):
        T.copy(K[bz, k * block_N : (k + 1) * block_N, by // groups, :], K_shared)
        if is_causal:
            for i, j in T.Parallel(block_M, block_N):
                acc_s[i, j] = T.if_then_else(bx * block_M + i >= k * block_N + j, 0, -T.infinity(acc_s.dtype))
        else:
            T.clear(acc_s)
        T.gemm(Q_shared, K_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)

    @T.macro
    def MMA1(
        V: T.Tensor(kv_shape, dtype),
        V_shared: T.SharedBuffer([block_M, dim], dtype),
        acc_s_cast: T.FragmentBuffer([block_M, block_N], dtype),
        acc_o: T.FragmentBuffer([block_M, dim], accum_dtype),
        k: T.int32,
        by: T.int32,
        bz: T.int32,
    ):
        T.copy(V[bz, k * block_N : (k + 1) * block_N, by // groups, :], V_shared)
        T.gemm(acc_s_cast, V_shared, acc_o, policy=T.GemmWarpPolicy.FullRow)

    @T.macro
    def Softmax(
        acc_s: T.FragmentBuffer([block_M, block_N], accum_dtype),
        acc_s_cast: T.FragmentBuffer([block_M, block_N], dtype),
        scores_max: T.FragmentBuffer([block_M], accum_dtype),
        scores_max_prev: T.FragmentBuffer([block_M], accum_dtype),
        scores_scale: T.FragmentBuffer([block_M], accum_dtype),
        scores_sum: T.FragmentBuffer([block_M], accum_dtype),
        logsum: T.FragmentBuffer([block_M], accum_dtype),
    ):
        T.copy(scores_max, scores_max_prev)
        T.fill(scores_max, -T.infinity(accum_dtype))
        T.reduce_max(acc_s, scores_max, dim=1, clear=False)
        for i in T.Parallel(block_M):
            scores_scale[i] = T.exp2(scores_max_prev[i] * scale - scores_max[i] * scale)
        for i, j in T.Parallel(block_M, block_N):
            acc_s[i, j] = T.exp2(acc_s[i, j] * scale - scores_max[i] * scale)
        T.reduce_sum(acc_s, scores_sum, dim=1)
        for i in T.Parallel(block_M):
            logsum[i] = logsum[i] * scores_scale[i] + scores_sum[i]
        T.copy(acc_s, acc_s_cast)

    @T.macro
    def Rescale(
        acc_o: T.FragmentBuffer([block_M, dim], accum_dtype),
        scores_scale: T.FragmentBuffer([block_M], accum_dtype),
    ):
        for i, j in T.Parallel(block_M, dim):
            acc_o[i, j] *= scores_scale[i]

    @T.prim_func
    def main(
        Q: T.Tensor(q_shape, dtype),
        K: T.Tensor(kv_shape, dtype),
        V: T.Tensor(kv_shape, dtype),
        Output: T.Tensor(q_shape, dtype),
    ):
        with T.Kernel(T.ceildiv(seq_len, block_M), heads, batch, threads=threads) as (bx, by, bz):
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

            T.copy(Q[bz, bx * block_M : (bx + 1) * block_M, by, :], Q_shared)
            T.fill(acc_o, 0)
            T.fill(logsum, 0)
            T.fill(scores_max, -T.infinity(accum_dtype))

            loop_range = T.min(T.ceildiv(seq_len, block_N), T.ceildiv((bx + 1) * block_M, block_N)) if is_causal else T.ceildiv(seq_len, block_N)

            for k in T.Pipelined(
                loop_range,
                num_stages=num_stages,
                order=ORDER,
                stage=STAGE,
            ):
                MMA0(K, Q_shared, K_shared, acc_s, k, bx, by, bz)
                Softmax(acc_s, acc_s_cast, scores_max, scores_max_prev, scores_scale, scores_sum, logsum)
                Rescale(acc_o, scores_scale)
                MMA1(V, V_shared, acc_s_cast, acc_o, k, by, bz)
            for i, j in T.Parallel(block_M, dim):
                acc_o[i, j] /= logsum[i]
            T.copy(acc_o, O_shared)
            T.copy(O_shared, Output[bz, bx * block_M : (bx + 1) * block_M, by, :])

    return main


def inputs(problem, device):
    import torch

    batch, heads, seq_len, dim, groups = (problem[k] for k in ("batch", "heads", "seq_len", "dim", "groups"))
    q_shape = (batch, seq_len, heads, dim)
    kv_shape = (batch, seq_len, heads // groups, dim)
    q, k, v = (torch.randn(s, device=device, dtype=torch.float16) for s in (q_shape, kv_shape, kv_shape))
    return [q, k, v, torch.empty(q_shape, device=device, dtype=torch.float16)]


def reference(problem, args):
    """The example's ref_program, in fp32: query head h reads KV head h // groups."""
    import torch

    groups = problem["groups"]
    q, k, v = (t.float() for t in args[:3])
    k, v = k.repeat_interleave(groups, dim=2), v.repeat_interleave(groups, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / q.shape[-1] ** 0.5
    if problem["is_causal"]:
        seq_len = q.shape[1]
        scores = scores.masked_fill(torch.ones(seq_len, seq_len, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return [torch.einsum("bhqk,bkhd->bqhd", scores.softmax(dim=-1), v)]


def flops(problem):
    # the example's count: two MMAs of batch * heads * seq_len^2 * dim products, half when causal
    total = 4.0 * problem["batch"] * problem["heads"] * problem["seq_len"] ** 2 * problem["dim"]
    return total / 2 if problem["is_causal"] else total


def bytes_moved(problem):
    # Q and O once each, K and V once each (heads // groups KV heads), fp16
    b, h, s, d, g = (problem[k] for k in ("batch", "heads", "seq_len", "dim", "groups"))
    return 2 * b * s * d * (2 * h + 2 * (h // g))
