"""blockscaled_fp8_gemm: DeepSeek-V3's fp8 GEMM as tilelang's examples/deepseek_deepgemm
writes it: A (1x128 scales per row and K-block) times B^T (128x128 block scales), each
K-block's fp8 product accumulated in a fragment, then promoted into an fp32 accumulator
with its scales (the "2xAcc" that keeps fp8's error from growing with K). The scales are
read from global memory inside the pipelined loop.

    ws-tune tests/data/blockscaled_fp8_gemm.py --shape M=4096,N=4096,K=4096 --budget 16
"""

import tilelang.language as T

GROUP = 128  # the scales' block: one scale per 128 values of K (and 128 rows of B)

PROBLEM = {"M": None, "N": None, "K": None, "out_dtype": "bfloat16"}
CHOICES = {"out_dtype": ["bfloat16", "float32"]}
PARAMS = {"block_M": [64, 128], "block_N": [64, 128], "num_stages": [2, 3, 4], "threads": [128, 256]}
OUTPUTS = [4]
TOLERANCE = 1e-2


def check(problem, params, schedule):
    if problem["K"] % GROUP:
        return f"K={problem['K']} is not a multiple of the scale group {GROUP}"
    for dim, block in (("M", "block_M"), ("N", "block_N")):
        if problem[dim] % params[block]:
            return f"{dim}={problem[dim]} is not a multiple of {block}={params[block]}"
    if params["threads"] == 256 and params["block_M"] == 64:
        return "two warpgroups need block_M=128"
    return None


def kernel(problem, *, block_M, block_N, num_stages, threads):
    M, N, K, out = problem["M"], problem["N"], problem["K"], problem["out_dtype"]
    fp8 = "float8_e4m3fn"

    @T.prim_func
    def gemm(A: T.Tensor((M, K), fp8), B: T.Tensor((N, K), fp8), scales_a: T.Tensor((M, K // GROUP), "float32"),
             scales_b: T.Tensor((T.ceildiv(N, GROUP), K // GROUP), "float32"), C: T.Tensor((M, N), out)):  # fmt: skip
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            A_shared = T.alloc_shared((block_M, GROUP), fp8)
            B_shared = T.alloc_shared((block_N, GROUP), fp8)
            C_shared = T.alloc_shared((block_M, block_N), out)
            C_local = T.alloc_fragment((block_M, block_N), "float32")
            C_accum = T.alloc_fragment((block_M, block_N), "float32")
            T.use_swizzle(panel_size=10)
            T.clear(C_local)
            T.clear(C_accum)
            for k in T.Pipelined(K // GROUP, num_stages=num_stages):
                T.copy(A[by * block_M, k * GROUP], A_shared)
                T.copy(B[bx * block_N, k * GROUP], B_shared)
                scale_b = scales_b[bx * block_N // GROUP, k]
                T.gemm(A_shared, B_shared, C_local, transpose_B=True)
                for i, j in T.Parallel(block_M, block_N):
                    C_accum[i, j] += C_local[i, j] * (scales_a[by * block_M + i, k] * scale_b)
                T.clear(C_local)
            T.copy(C_accum, C_shared)
            T.copy(C_shared, C[by * block_M, bx * block_N])

    return gemm


def inputs(problem, device):
    import torch

    M, N, K = problem["M"], problem["N"], problem["K"]
    a = torch.randn(M, K, device=device).to(torch.float8_e4m3fn)
    b = torch.randn(N, K, device=device).to(torch.float8_e4m3fn)
    sa = torch.rand(M, K // GROUP, device=device) + 0.5
    sb = torch.rand((N + GROUP - 1) // GROUP, K // GROUP, device=device) + 0.5
    return [a, b, sa, sb, torch.empty(M, N, device=device, dtype=getattr(torch, problem["out_dtype"]))]


def reference(problem, args):
    a, b, sa, sb, _ = args
    N = problem["N"]
    a = a.float() * sa.repeat_interleave(GROUP, dim=1)
    b = b.float() * sb.repeat_interleave(GROUP, dim=0)[:N].repeat_interleave(GROUP, dim=1)
    return [a @ b.T]


def flops(problem):
    return 2.0 * problem["M"] * problem["N"] * problem["K"]
