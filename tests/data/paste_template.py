"""A GEMM with the example's buffer names and op ids, and a hole where a test
pastes the T.annotate_ws_schedule(...) source that ws-tune rendered."""

import tilelang.language as T

PROBLEM = {"M": None, "N": None, "K": None}
PARAMS = {"block_M": [128], "block_N": [256], "block_K": [64]}


def kernel(problem, *, block_M, block_N, block_K, **_ignored):
    M, N, K = problem["M"], problem["N"], problem["K"]

    @T.prim_func
    def gemm(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"), C: T.Tensor((M, N), "float16")):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=256) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K), "float16")
            B_shared = T.alloc_shared((block_K, block_N), "float16")
            C_local = T.alloc_fragment((block_M, block_N), "float32")
            # PASTE HERE
            with T.ws_op("clear"):
                T.clear(C_local)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=3, annotations={T.WSID: "loop_k"}):
                T.copy(A[by * block_M, k * block_K], A_shared, annotations={T.WSID: "load_A"})
                T.copy(B[k * block_K, bx * block_N], B_shared, annotations={T.WSID: "load_B"})
                T.gemm(A_shared, B_shared, C_local, annotations={T.WSID: "mma"})
            with T.ws_op("store"):
                T.copy(C_local, C[by * block_M, bx * block_N])

    return gemm


def inputs(problem, device):
    raise NotImplementedError("compile-only test kernel")


def reference(problem, args):
    raise NotImplementedError("compile-only test kernel")


def flops(problem):
    return 2.0 * problem["M"] * problem["N"] * problem["K"]
