"""dynamic_gemm: C = A @ B^T compiled once for any number of rows (M is symbolic, as in
tilelang's examples/dynamic_shape: a serving GEMM whose batch changes per call); the
problem's M only sizes the tensors it is timed on.

    ws-tune tests/data/dynamic_gemm.py --shape M=4096,N=4096,K=4096 --budget 16
"""

import tilelang.language as T

PROBLEM = {"M": None, "N": None, "K": None, "dtype": "float16"}
CHOICES = {"dtype": ["float16", "bfloat16"]}
PARAMS = {"block_M": [64, 128], "block_N": [128, 256], "block_K": [64], "num_stages": [2, 3, 4]}
OUTPUTS = [2]
TOLERANCE = 1e-2


def check(problem, params, schedule):
    if problem["N"] % params["block_N"] or problem["K"] % params["block_K"]:
        return "N or K is not a multiple of its block"
    return None


def kernel(problem, *, block_M, block_N, block_K, num_stages):
    N, K, dtype = problem["N"], problem["K"], problem["dtype"]
    M = T.dynamic("m")

    @T.prim_func
    def gemm(A: T.Tensor((M, K), dtype), B: T.Tensor((N, K), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=256) as (bx, by):
            A_s = T.alloc_shared((block_M, block_K), dtype)
            B_s = T.alloc_shared((block_N, block_K), dtype)
            acc = T.alloc_fragment((block_M, block_N), "float32")
            T.clear(acc)
            for k in T.Pipelined(K // block_K, num_stages=num_stages):
                T.copy(A[by * block_M, k * block_K], A_s)
                T.copy(B[bx * block_N, k * block_K], B_s)
                T.gemm(A_s, B_s, acc, transpose_B=True)
            T.copy(acc, C[by * block_M, bx * block_N])

    return gemm


def inputs(problem, device):
    import torch

    M, N, K = problem["M"], problem["N"], problem["K"]
    dtype = getattr(torch, problem["dtype"])
    return [torch.randn(M, K, device=device, dtype=dtype), torch.randn(N, K, device=device, dtype=dtype),
            torch.empty(M, N, device=device, dtype=dtype)]  # fmt: skip


def reference(problem, args):
    a, b, _ = args
    return [a.float() @ b.float().T]


def flops(problem):
    return 2.0 * problem["M"] * problem["N"] * problem["K"]


def vendors(problem):
    return {"cublas": lambda args: [args[0] @ args[1].T]}
