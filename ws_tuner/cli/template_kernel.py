"""NAME: y = x @ W^T (a linear layer's GEMM), a ws-tune kernel file.

Written by `ws-tune new`; docs/kernel-files.md walks through it and
ws_tuner/kernel.py holds the whole contract. Tune it:

    ws-tune space FILE --shape M=4096,N=4096,K=4096          # what will be searched
    ws-tune FILE --shape M=4096,N=4096,K=4096 --budget 40     # search, build, time, store
    ws-tune best FILE --shape M=4096,N=4096,K=4096            # the winner, as T.WSSchedule code

The kernel below is plain TileLang (no schedule): ws-tune seeds the search
with tilelang's role_based warp specialization of it. Replace the body with
your computation; keep the names.
"""

import tilelang.language as T

# Problem arguments (--shape): None means the user must give it; a default's type is the argument's type.
PROBLEM = {"M": None, "N": None, "K": None, "dtype": "float16"}
# Allowed values of some problem arguments.
CHOICES = {"dtype": ["float16", "bfloat16"]}
# Tunable kernel parameters and the values to try; the schedule space is crossed with their product.
PARAMS = {"block_M": [64, 128], "block_N": [128, 256], "block_K": [64], "num_stages": [2, 3, 4]}
OUTPUTS = [2]  # which of inputs()'s tensors the kernel writes
TOLERANCE = 1e-2  # largest relative error that counts as correct
# Optional: tilelang pass configs for every build (what an example gives @tilelang.jit(pass_configs=...)).
# PASS_CONFIGS = {"tl.enable_fast_math": True}


def check(problem, params, schedule):
    """Why these parameters cannot serve this problem (a one-line reason), or None.
    Asked before anything is built, so a refusal costs nothing."""
    for dim, block in (("M", "block_M"), ("N", "block_N"), ("K", "block_K")):
        if problem[dim] % params[block]:
            return f"{dim}={problem[dim]} is not a multiple of {block}={params[block]}"
    return None


def kernel(problem, *, block_M, block_N, block_K, num_stages):
    """The TileLang PrimFunc for one problem and one point of PARAMS."""
    M, N, K, dtype = problem["M"], problem["N"], problem["K"], problem["dtype"]

    @T.prim_func
    def linear(X: T.Tensor((M, K), dtype), W: T.Tensor((N, K), dtype), Y: T.Tensor((M, N), dtype)):
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
    return [torch.randn(M, K, device=device, dtype=dtype), torch.randn(N, K, device=device, dtype=dtype),
            torch.empty(M, N, device=device, dtype=dtype)]  # fmt: skip


def reference(problem, args):
    """The expected outputs (one per OUTPUTS entry), computed another way."""
    x, w, _ = args
    return [x @ w.T]


def flops(problem):
    """Floating-point operations of one call (for TFLOP/s)."""
    return 2.0 * problem["M"] * problem["N"] * problem["K"]


# Optional, for a memory-bound kernel: the bytes one call must move at least, for GB/s.
# def bytes_moved(problem):
#     return 2.0 * (problem["M"] * problem["K"] + problem["K"] * problem["N"] + problem["M"] * problem["N"])


def vendors(problem):
    """Optional: vendor libraries timed beside the kernel as baselines (here cuBLAS through torch)."""
    import torch.nn.functional as F

    return {"cublas": lambda args: [F.linear(args[0], args[1])]}
