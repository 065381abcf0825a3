"""C = A @ B for one K block: A and B are loaded once, in a root-scope
pipeline. No pipeline synchronizes a loop, so the schedule space can vary
only warp ranges and register budgets; it says so. Schedule-space tests only."""

import tilelang.language as T

PROBLEM = {"M": None, "N": None}
PARAMS = {"block_M": [128], "block_N": [128]}
BLOCK_K = 64


def kernel(problem, *, block_M, block_N):
    M, N, K = problem["M"], problem["N"], BLOCK_K

    def schedule(A_s, B_s):
        return T.WSSchedule(
            num_warps=12,
            roles=[T.WSRole("mma", warps_lo=0, warps_hi=8, max_nreg=232), T.WSRole("tma", warps_lo=8, warps_hi=9, max_nreg=40)],
            pipelines=[T.WSPipeline("ab", [A_s, B_s], depth=1)],
            scopes=[T.WSScope(T.WSScope.ROOT, {
                "mma": ["clear", T.WSSync.consumer_wait("ab"), "gemm", T.WSSync.consumer_release("ab"), "store"],
                "tma": [T.WSSync.producer_acquire("ab"), "load_a", "load_b", T.WSSync.producer_commit("ab")],
            })],
        )  # fmt: skip

    @T.prim_func
    def gemm(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"), C: T.Tensor((M, N), "float16")):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=256) as (bx, by):
            A_s = T.alloc_shared((block_M, K), "float16")
            B_s = T.alloc_shared((K, block_N), "float16")
            C_l = T.alloc_fragment((block_M, block_N), "float32")
            T.annotate_ws_schedule(schedule(A_s, B_s))
            with T.ws_op("clear"):
                T.clear(C_l)
            T.copy(A[by * block_M, 0], A_s, annotations={T.WSID: "load_a"})
            T.copy(B[0, bx * block_N], B_s, annotations={T.WSID: "load_b"})
            T.gemm(A_s, B_s, C_l, annotations={T.WSID: "gemm"})
            T.copy(C_l, C[by * block_M, bx * block_N], annotations={T.WSID: "store"})

    return gemm


def inputs(problem, device):
    import torch

    M, N = problem["M"], problem["N"]
    return [torch.randn(M, BLOCK_K, device=device, dtype=torch.float16), torch.randn(BLOCK_K, N, device=device, dtype=torch.float16),
            torch.empty(M, N, device=device, dtype=torch.float16)]  # fmt: skip


def reference(problem, args):
    return [args[0] @ args[1]]


def flops(problem):
    return 2.0 * problem["M"] * problem["N"] * BLOCK_K
