"""fp8_gemm: y = x @ W^T with fp8 operands (e4m3 or e5m2), fp32 accumulation and a
16-bit output, written from `ws-tune new`'s template as a new user would (tilelang's
examples/gemm_fp8); the vendor is cuBLASLt's fp8 GEMM (torch._scaled_mm, unit scales).

    ws-tune tests/data/fp8_gemm.py --shape M=4096,N=4096,K=4096 --budget 16
"""

import tilelang.language as T

# Problem arguments (--shape): None means the user must give it; a default's type is the argument's type.
PROBLEM = {"M": None, "N": None, "K": None, "dtype": "float8_e4m3fn", "out_dtype": "bfloat16"}
# Allowed values of some problem arguments.
CHOICES = {"dtype": ["float8_e4m3fn", "float8_e5m2"], "out_dtype": ["float16", "bfloat16"]}
# Tunable kernel parameters and the values to try; the schedule space is crossed with their product.
PARAMS = {"block_M": [64, 128], "block_N": [128, 256], "block_K": [64, 128], "num_stages": [2, 3, 4]}
OUTPUTS = [2]  # which of inputs()'s tensors the kernel writes
TOLERANCE = 1e-2  # largest relative error that counts as correct


def check(problem, params, schedule):
    """Why these parameters cannot serve this problem (a one-line reason), or None.
    Asked before anything is built, so a refusal costs nothing."""
    for dim, block in (("M", "block_M"), ("N", "block_N"), ("K", "block_K")):
        if problem[dim] % params[block]:
            return f"{dim}={problem[dim]} is not a multiple of {block}={params[block]}"
    return None


def kernel(problem, *, block_M, block_N, block_K, num_stages):
    """The TileLang PrimFunc for one problem and one point of PARAMS."""
    M, N, K, dtype, out = problem["M"], problem["N"], problem["K"], problem["dtype"], problem["out_dtype"]

    @T.prim_func
    def linear(X: T.Tensor((M, K), dtype), W: T.Tensor((N, K), dtype), Y: T.Tensor((M, N), out)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=256) as (bx, by):
            X_s = T.alloc_shared((block_M, block_K), dtype)
            W_s = T.alloc_shared((block_N, block_K), dtype)
            acc = T.alloc_fragment((block_M, block_N), "float32")
            T.clear(acc)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                T.copy(X[by * block_M, k * block_K], X_s)
                T.copy(W[bx * block_N, k * block_K], W_s)
                T.gemm(X_s, W_s, acc, transpose_B=True)
            T.copy(acc, Y[by * block_M, bx * block_N])

    return linear


def inputs(problem, device):
    """Every argument of the kernel, outputs included, on ``device``: fresh random inputs."""
    import torch

    M, N, K = problem["M"], problem["N"], problem["K"]
    dtype = getattr(torch, problem["dtype"])
    return [torch.randn(M, K, device=device).to(dtype), torch.randn(N, K, device=device).to(dtype),
            torch.empty(M, N, device=device, dtype=getattr(torch, problem["out_dtype"]))]  # fmt: skip


def reference(problem, args):
    """The expected outputs (one per OUTPUTS entry), computed another way."""
    x, w, _ = args
    return [(x.float() @ w.float().T)]


def flops(problem):
    """Floating-point operations of one call (for TFLOP/s)."""
    return 2.0 * problem["M"] * problem["N"] * problem["K"]


def vendors(problem):
    """Optional: vendor libraries timed beside the kernel as baselines (here cuBLAS through torch)."""
    import torch

    one = torch.ones((), device="cuda")
    out = getattr(torch, problem["out_dtype"])
    return {"cublaslt": lambda args: [torch._scaled_mm(args[0], args[1].T, scale_a=one, scale_b=one, out_dtype=out)]}
