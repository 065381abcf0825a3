"""A kernel file written as a new user would, from `ws-tune new`'s template: the
gate/up half of a SwiGLU MLP, Y = silu(X @ W1^T) * (X @ W2^T), plain TileLang (no
schedule: ws-tune seeds it from tilelang's role_based scheduler). Two accumulators
fed by three shared buffers, and an elementwise epilogue that joins them."""

import tilelang.language as T

PROBLEM = {"M": None, "N": None, "K": None, "dtype": "float16"}
CHOICES = {"dtype": ["float16", "bfloat16"]}
PARAMS = {"block_M": [64, 128], "block_N": [64, 128], "block_K": [64], "num_stages": [2, 3]}
OUTPUTS = [3]
TOLERANCE = 2e-2


def check(problem, params, schedule):
    for dim, block in (("M", "block_M"), ("N", "block_N"), ("K", "block_K")):
        if problem[dim] % params[block]:
            return f"{dim}={problem[dim]} is not a multiple of {block}={params[block]}"
    return None


def kernel(problem, *, block_M, block_N, block_K, num_stages):
    M, N, K, dtype = problem["M"], problem["N"], problem["K"], problem["dtype"]

    @T.prim_func
    def dual_gemm(X: T.Tensor((M, K), dtype), W1: T.Tensor((N, K), dtype), W2: T.Tensor((N, K), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=256) as (bx, by):
            X_s = T.alloc_shared((block_M, block_K), dtype)
            W1_s = T.alloc_shared((block_N, block_K), dtype)
            W2_s = T.alloc_shared((block_N, block_K), dtype)
            g = T.alloc_fragment((block_M, block_N), "float32")
            u = T.alloc_fragment((block_M, block_N), "float32")
            T.clear(g)
            T.clear(u)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                T.copy(X[by * block_M, k * block_K], X_s)
                T.copy(W1[bx * block_N, k * block_K], W1_s)
                T.copy(W2[bx * block_N, k * block_K], W2_s)
                T.gemm(X_s, W1_s, g, transpose_B=True)
                T.gemm(X_s, W2_s, u, transpose_B=True)
            for i, j in T.Parallel(block_M, block_N):
                g[i, j] = g[i, j] / (1.0 + T.exp(-g[i, j])) * u[i, j]
            T.copy(g, Y[by * block_M, bx * block_N])

    return dual_gemm


def inputs(problem, device):
    import torch

    M, N, K = problem["M"], problem["N"], problem["K"]
    dtype = getattr(torch, problem["dtype"])
    return [torch.randn(M, K, device=device, dtype=dtype) / 8, torch.randn(N, K, device=device, dtype=dtype) / 8,
            torch.randn(N, K, device=device, dtype=dtype) / 8, torch.empty(M, N, device=device, dtype=dtype)]


def reference(problem, args):
    import torch.nn.functional as F

    x, w1, w2, _ = args
    return [F.silu(x.float() @ w1.float().T) * (x.float() @ w2.float().T)]


def flops(problem):
    return 4.0 * problem["M"] * problem["N"] * problem["K"]


def vendors(problem):
    import torch.nn.functional as F

    return {"torch": lambda args: [F.silu(args[0] @ args[1].T) * (args[0] @ args[2].T)]}
