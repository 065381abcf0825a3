"""A FlashAttention forward kernel (BSHD) with a hand-written seed, as a new
user would write one: a TMA producer warp, one consumer role of two
warpgroups, Q loaded once in a root-scope pipeline, K and V in their own
pipelines, V's wait/release one stage behind K's in the consumer.

``mma="async"`` issues both GEMMs with ``T.wgmma_gemm`` and retires them with
one ``T.wait_wgmma(0)`` op, so that QK of block k and PV of block k-1 are in
flight together; ``mma="sync"`` uses ``T.gemm`` (wgmma + wait).

Schedule-space tests use it: CPU-only (the verifier), no GPU checks.
"""

import tilelang.language as T

PROBLEM = {"B": 1, "H": 2, "S": None, "D": 64, "causal": 0}
CHOICES = {"D": [64, 128], "causal": [0, 1]}
PARAMS = {"block_N": [64, 128], "mma": ["sync", "async"]}
BLOCK_M = 128
TOLERANCE = 2e-2


def check(problem, params, schedule):
    if problem["S"] % BLOCK_M or problem["S"] % params["block_N"]:
        return f"S={problem['S']} is not a multiple of the blocks"
    return None


def kernel(problem, *, block_N, mma):
    B, H, S, D, causal = problem["B"], problem["H"], problem["S"], problem["D"], problem["causal"]
    shape = (B, S, H, D)
    dtype, accum = "float16", "float32"
    scale = (1.0 / D) ** 0.5 * 1.44269504  # log2(e): softmax through exp2
    blocks = S // block_N

    def schedule(Q_shared, K_shared, V_shared):
        if mma == "async":
            consumer = [
                T.WSSync.consumer_wait("k", stage=0), "qk",
                T.WSSync.consumer_wait("v", stage=1), "pv",
                "mma_wait",
                T.WSSync.consumer_release("k", stage=0),
                T.WSSync.consumer_release("v", stage=1),
                "softmax",
            ]  # fmt: skip
        else:
            consumer = [
                T.WSSync.consumer_wait("k", stage=0), "qk", T.WSSync.consumer_release("k", stage=0),
                T.WSSync.consumer_wait("v", stage=1), "pv", T.WSSync.consumer_release("v", stage=1),
                "softmax",
            ]  # fmt: skip
        root_consumer = [T.WSSync.consumer_wait("q", stage=0), "init", "loop_kv", T.WSSync.consumer_release("q", stage=0)]
        if mma == "async":
            root_consumer.append("last_wait")
        return T.WSSchedule(
            num_warps=12,
            roles=[
                T.WSRole("producer", warps_lo=0, warps_hi=1, max_nreg=24),
                T.WSRole("consumer", warps_lo=4, warps_hi=12, max_nreg=240),
            ],
            pipelines=[
                T.WSPipeline("q", [Q_shared], depth=1),
                T.WSPipeline("k", [K_shared], depth=2),
                T.WSPipeline("v", [V_shared], depth=2),
            ],
            scopes=[
                T.WSScope(
                    "loop_kv",
                    {
                        "producer": [
                            T.WSSync.producer_acquire("k", stage=0), "load_k", T.WSSync.producer_commit("k", stage=0),
                            T.WSSync.producer_acquire("v", stage=0), "load_v", T.WSSync.producer_commit("v", stage=0),
                        ],
                        "consumer": consumer,
                    },
                ),  # fmt: skip
                T.WSScope(
                    T.WSScope.ROOT,
                    {
                        "producer": [T.WSSync.producer_acquire("q", stage=0), "load_q", T.WSSync.producer_commit("q", stage=0), "loop_kv"],
                        "consumer": root_consumer + ["normalize", "store"],
                    },
                ),
            ],
        )

    gemm = T.wgmma_gemm if mma == "async" else T.gemm

    @T.prim_func
    def flash_fwd(Q: T.Tensor(shape, dtype), K: T.Tensor(shape, dtype), V: T.Tensor(shape, dtype), O: T.Tensor(shape, dtype)):
        with T.Kernel(S // BLOCK_M, H, B, threads=256) as (bx, by, bz):
            Q_shared = T.alloc_shared((BLOCK_M, D), dtype)
            K_shared = T.alloc_shared((block_N, D), dtype)
            V_shared = T.alloc_shared((block_N, D), dtype)
            acc_s = T.alloc_fragment((BLOCK_M, block_N), accum)
            acc_p = T.alloc_fragment((BLOCK_M, block_N), dtype)
            acc_o = T.alloc_fragment((BLOCK_M, D), accum)
            m_prev = T.alloc_fragment((BLOCK_M,), accum)
            m_new = T.alloc_fragment((BLOCK_M,), accum)
            rescale = T.alloc_fragment((BLOCK_M,), accum)
            row_sum = T.alloc_fragment((BLOCK_M,), accum)
            l_sum = T.alloc_fragment((BLOCK_M,), accum)
            T.annotate_ws_schedule(schedule(Q_shared, K_shared, V_shared))

            T.copy(Q[bz, bx * BLOCK_M : (bx + 1) * BLOCK_M, by, :], Q_shared, annotations={T.WSID: "load_q"})
            with T.ws_op("init"):
                T.fill(acc_o, 0)
                T.fill(l_sum, 0)
                T.fill(m_new, -T.infinity(accum))
            for k in T.Pipelined(blocks, num_stages=2, annotations={T.WSID: "loop_kv"}):
                T.copy(K[bz, k * block_N : (k + 1) * block_N, by, :], K_shared, annotations={T.WSID: "load_k"})
                T.copy(V[bz, k * block_N : (k + 1) * block_N, by, :], V_shared, annotations={T.WSID: "load_v"})
                gemm(Q_shared, K_shared, acc_s, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow,
                     annotations={T.WSID: "qk"})  # fmt: skip
                if mma == "async":
                    with T.ws_op("mma_wait"):
                        T.wait_wgmma(0)
                with T.ws_op("softmax"):
                    if causal:
                        for i, j in T.Parallel(BLOCK_M, block_N):
                            acc_s[i, j] = T.if_then_else(bx * BLOCK_M + i >= k * block_N + j, acc_s[i, j], -T.infinity(accum))
                    T.copy(m_new, m_prev)
                    T.reduce_max(acc_s, m_new, dim=1, clear=False)
                    for i in T.Parallel(BLOCK_M):
                        rescale[i] = T.exp2(m_prev[i] * scale - m_new[i] * scale)
                    for i, j in T.Parallel(BLOCK_M, block_N):
                        acc_s[i, j] = T.exp2(acc_s[i, j] * scale - m_new[i] * scale)
                    T.reduce_sum(acc_s, row_sum, dim=1)
                    for i in T.Parallel(BLOCK_M):
                        l_sum[i] = l_sum[i] * rescale[i] + row_sum[i]
                    for i, j in T.Parallel(BLOCK_M, D):
                        acc_o[i, j] *= rescale[i]
                    T.copy(acc_s, acc_p)
                gemm(acc_p, V_shared, acc_o, policy=T.GemmWarpPolicy.FullRow, annotations={T.WSID: "pv"})
            if mma == "async":
                with T.ws_op("last_wait"):
                    T.wait_wgmma(0)
            with T.ws_op("normalize"):
                for i, j in T.Parallel(BLOCK_M, D):
                    acc_o[i, j] /= l_sum[i]
            T.copy(acc_o, O[bz, bx * BLOCK_M : (bx + 1) * BLOCK_M, by, :], annotations={T.WSID: "store"})

    return flash_fwd


def inputs(problem, device):
    import torch

    shape = (problem["B"], problem["S"], problem["H"], problem["D"])
    return [torch.randn(shape, device=device, dtype=torch.float16) for _ in range(3)] + [torch.empty(shape, device=device, dtype=torch.float16)]


def reference(problem, args):
    import torch

    q, k, v, _ = (a.transpose(1, 2) for a in args)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=bool(problem["causal"]))
    return [out.transpose(1, 2)]


def flops(problem):
    return 4.0 * problem["B"] * problem["H"] * problem["S"] ** 2 * problem["D"] / (2 if problem["causal"] else 1)
