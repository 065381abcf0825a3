"""bias_silu_gemm: y = silu(x @ W^T + b), a linear layer with its bias and activation
fused into the GEMM's epilogue (an elementwise T.Parallel loop after the K loop that
also reads global memory), written from `ws-tune new`'s template."""

import tilelang.language as T

PROBLEM = {"M": None, "N": None, "K": None, "dtype": "float16"}
CHOICES = {"dtype": ["float16", "bfloat16"]}
PARAMS = {"block_M": [128], "block_N": [128, 256], "block_K": [64], "num_stages": [2, 3, 4]}
OUTPUTS = [3]
TOLERANCE = 1e-2


def check(problem, params, schedule):
    for dim, block in (("M", "block_M"), ("N", "block_N"), ("K", "block_K")):
        if problem[dim] % params[block]:
            return f"{dim}={problem[dim]} is not a multiple of {block}={params[block]}"
    return None


def kernel(problem, *, block_M, block_N, block_K, num_stages):
    M, N, K, dtype = problem["M"], problem["N"], problem["K"], problem["dtype"]

    @T.prim_func
    def linear(X: T.Tensor((M, K), dtype), W: T.Tensor((N, K), dtype), bias: T.Tensor((N,), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=256) as (bx, by):
            X_s = T.alloc_shared((block_M, block_K), dtype)
            W_s = T.alloc_shared((block_N, block_K), dtype)
            acc = T.alloc_fragment((block_M, block_N), "float32")
            T.clear(acc)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                T.copy(X[by * block_M, k * block_K], X_s)
                T.copy(W[bx * block_N, k * block_K], W_s)
                T.gemm(X_s, W_s, acc, transpose_B=True)
            for i, j in T.Parallel(block_M, block_N):
                z = acc[i, j] + bias[bx * block_N + j]
                acc[i, j] = z / (1.0 + T.exp(-z))
            T.copy(acc, Y[by * block_M, bx * block_N])

    return linear


def inputs(problem, device):
    import torch

    M, N, K = problem["M"], problem["N"], problem["K"]
    dtype = getattr(torch, problem["dtype"])
    return [torch.randn(M, K, device=device, dtype=dtype) / K**0.25, torch.randn(N, K, device=device, dtype=dtype) / K**0.25,
            torch.randn(N, device=device, dtype=dtype), torch.empty(M, N, device=device, dtype=dtype)]  # fmt: skip


def reference(problem, args):
    import torch.nn.functional as F

    x, w, b, _ = args
    return [F.silu(F.linear(x.float(), w.float(), b.float()))]


def flops(problem):
    return 2.0 * problem["M"] * problem["N"] * problem["K"]


def vendors(problem):
    import torch.nn.functional as F

    return {"cublas": lambda args: [F.silu(F.linear(args[0], args[1], args[2]))]}
