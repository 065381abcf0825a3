"""splitk_gemm: C (fp32) = A @ B, K split over split_k blocks that add their partial
products into C with atomics, as tilelang's examples/gemm_splitk does: C must start at
zero (RESET_TO_ZERO). tilelang's role_based scheduler skips kernels with atomics; ws-tune
seeds it through stand-ins (compiler.prepare), the atomics in the MMA's role.

    ws-tune tests/data/splitk_gemm.py --shape M=4096,N=4096,K=8192 --budget 8
"""

import tilelang.language as T

PROBLEM = {"M": None, "N": None, "K": None, "dtype": "float16"}
CHOICES = {"dtype": ["float16", "bfloat16"]}
PARAMS = {"block_M": [64, 128], "block_N": [128, 256], "block_K": [64], "num_stages": [2, 3, 4], "split_k": [2, 4]}
OUTPUTS = [2]
RESET_TO_ZERO = [2]  # the blocks add into C
TOLERANCE = 1e-2


def check(problem, params, schedule):
    if problem["M"] % params["block_M"] or problem["N"] % params["block_N"]:
        return "M or N is not a multiple of the block"
    if problem["K"] % (params["split_k"] * params["block_K"]):
        return "K is not a multiple of split_k * block_K"
    return None


def kernel(problem, *, block_M, block_N, block_K, num_stages, split_k):
    M, N, K, dtype = problem["M"], problem["N"], problem["K"], problem["dtype"]
    part = K // split_k

    @T.prim_func
    def splitk(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), split_k, threads=256) as (bx, by, bz):
            A_s = T.alloc_shared((block_M, block_K), dtype)
            B_s = T.alloc_shared((block_K, block_N), dtype)
            acc = T.alloc_fragment((block_M, block_N), "float32")
            T.clear(acc)
            for k in T.Pipelined(part // block_K, num_stages=num_stages):
                T.copy(A[by * block_M, bz * part + k * block_K], A_s)
                T.copy(B[bz * part + k * block_K, bx * block_N], B_s)
                T.gemm(A_s, B_s, acc)
            for i, j in T.Parallel(block_M, block_N):
                T.atomic_add(C[by * block_M + i, bx * block_N + j], acc[i, j])

    return splitk


def inputs(problem, device):
    import torch

    M, N, K = problem["M"], problem["N"], problem["K"]
    dtype = getattr(torch, problem["dtype"])
    return [torch.randn(M, K, device=device, dtype=dtype), torch.randn(K, N, device=device, dtype=dtype),
            torch.zeros(M, N, device=device, dtype=torch.float32)]  # fmt: skip


def reference(problem, args):
    a, b, _ = args
    return [a.float() @ b.float()]


def flops(problem):
    return 2.0 * problem["M"] * problem["N"] * problem["K"]


def vendors(problem):
    import torch

    return {"cublas": lambda args: [torch.matmul(args[0], args[1]).float()]}
