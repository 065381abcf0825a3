"""A GEMM whose A rows are gathered by index, C = A[Idx] @ B (as a mixture of experts
gathers its tokens), with a hand-written seed: a producer warp gathers A's rows element
by element into shared memory (a T.Parallel loop: no TMA can load rows by index) and
loads B by TMA; one consumer role of two warpgroups. The space offers the seed's own
gather by cp.async (``async.gather_a``) and a producer of two warps.

Schedule-space tests (the verifier, compiles) and the GPU space test use it."""

import tilelang.language as T

PROBLEM = {"M": None, "N": None, "K": None, "rows": 8192}
PARAMS = {"block_N": [128, 256], "block_K": [64], "threads": [128, 256]}  # threads: tilelang's own lowerings (the schedule sets its own)
BLOCK_M = 128


def check(problem, params, schedule):
    if problem["M"] % BLOCK_M or problem["N"] % params["block_N"] or problem["K"] % params["block_K"]:
        return f"M, N and K must be multiples of {BLOCK_M}, block_N={params['block_N']} and block_K={params['block_K']}"
    return None


def kernel(problem, *, block_N, block_K, threads):
    M, N, K, rows = problem["M"], problem["N"], problem["K"], problem["rows"]
    dtype, accum = "float16", "float32"

    def schedule(A_shared, B_shared):
        return T.WSSchedule(
            num_warps=12,
            roles=[
                T.WSRole("producer", warps_lo=0, warps_hi=1, max_nreg=0),
                T.WSRole("consumer", warps_lo=4, warps_hi=12, max_nreg=0),
            ],
            pipelines=[T.WSPipeline("a", [A_shared], depth=2), T.WSPipeline("b", [B_shared], depth=2)],
            scopes=[
                T.WSScope(
                    "loop_k",
                    {
                        "producer": [
                            T.WSSync.producer_acquire("a", stage=0), "gather_a", T.WSSync.producer_commit("a", stage=0),
                            T.WSSync.producer_acquire("b", stage=0), "load_b", T.WSSync.producer_commit("b", stage=0),
                        ],
                        "consumer": [
                            T.WSSync.consumer_wait("a", stage=0), T.WSSync.consumer_wait("b", stage=0), "mma",
                            T.WSSync.consumer_release("a", stage=0), T.WSSync.consumer_release("b", stage=0),
                        ],
                    },
                ),  # fmt: skip
                T.WSScope(T.WSScope.ROOT, {"producer": ["loop_k"], "consumer": ["init", "loop_k", "store"]}),
            ],
        )

    @T.prim_func
    def gather_gemm(A: T.Tensor((rows, K), dtype), Idx: T.Tensor((M,), "int32"), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(N // block_N, M // BLOCK_M, threads=threads) as (bx, by):
            A_shared = T.alloc_shared((BLOCK_M, block_K), dtype)
            B_shared = T.alloc_shared((block_K, block_N), dtype)
            acc = T.alloc_fragment((BLOCK_M, block_N), accum)
            T.annotate_ws_schedule(schedule(A_shared, B_shared))

            with T.ws_op("init"):
                T.clear(acc)
            for k in T.Pipelined(K // block_K, num_stages=2, annotations={T.WSID: "loop_k"}):
                for i, j in T.Parallel(BLOCK_M, block_K, annotations={T.WSID: "gather_a"}):
                    A_shared[i, j] = A[Idx[by * BLOCK_M + i], k * block_K + j]
                T.copy(B[k * block_K, bx * block_N], B_shared, annotations={T.WSID: "load_b"})
                T.gemm(A_shared, B_shared, acc, policy=T.GemmWarpPolicy.FullRow, annotations={T.WSID: "mma"})
            T.copy(acc, C[by * BLOCK_M, bx * block_N], annotations={T.WSID: "store"})

    return gather_gemm


def inputs(problem, device):
    import torch

    M, N, K, rows = problem["M"], problem["N"], problem["K"], problem["rows"]
    return [torch.randn(rows, K, device=device, dtype=torch.float16), torch.randint(0, rows, (M,), device=device, dtype=torch.int32),
            torch.randn(K, N, device=device, dtype=torch.float16), torch.empty(M, N, device=device, dtype=torch.float16)]  # fmt: skip


def reference(problem, args):
    return [args[0][args[1].long()] @ args[2]]


def flops(problem):
    return 2.0 * problem["M"] * problem["N"] * problem["K"]
