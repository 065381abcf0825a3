"""A plain pipelined GEMM whose epilogue stages C through shared memory. It
has no WS schedule: tilelang's role_based scheduler seeds it with a role
chain, Load -> Worker -> Store (Worker consumes A/B and produces C_s).
Schedule-space tests only (the verifier)."""

import tilelang.language as T
from _gemm import flops, inputs, reference  # noqa: F401 - the contract, shared

PROBLEM = {"M": None, "N": None, "K": None}
PARAMS = {"block_M": [128], "block_N": [128, 256], "block_K": [64]}


def kernel(problem, *, block_M, block_N, block_K):
    M, N, K = problem["M"], problem["N"], problem["K"]

    @T.prim_func
    def gemm(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"), C: T.Tensor((M, N), "float16")):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=256) as (bx, by):
            A_s = T.alloc_shared((block_M, block_K), "float16")
            B_s = T.alloc_shared((block_K, block_N), "float16")
            C_l = T.alloc_fragment((block_M, block_N), "float32")
            C_s = T.alloc_shared((block_M, block_N), "float16")
            T.clear(C_l)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=3):
                T.copy(A[by * block_M, k * block_K], A_s)
                T.copy(B[k * block_K, bx * block_N], B_s)
                T.gemm(A_s, B_s, C_l)
            T.copy(C_l, C_s)
            T.copy(C_s, C[by * block_M, bx * block_N])

    return gemm
