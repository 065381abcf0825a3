"""rmsnorm: y = x / sqrt(mean(x^2) + eps) * w over the rows of x, in two pipelined passes
over column blocks (sum of squares, then scale), as tilelang's examples/norm splits a
row too long for registers. A memory-bound kernel without MMAs.

    ws-tune tests/data/rmsnorm.py --shape M=8192,N=8192 --budget 8
"""

import tilelang.language as T

PROBLEM = {"M": None, "N": None, "dtype": "float16"}
CHOICES = {"dtype": ["float16", "bfloat16"]}
PARAMS = {"blk_m": [1, 2, 4, 8], "blk_k": [512, 1024, 2048], "num_stages": [1, 2, 3], "threads": [128, 256]}
OUTPUTS = [2]
TOLERANCE = 1e-2
EPS = 1e-6


def check(problem, params, schedule):
    if problem["M"] % params["blk_m"] or problem["N"] % params["blk_k"]:
        return "M or N is not a multiple of its block"
    return None


def kernel(problem, *, blk_m, blk_k, num_stages, threads):
    M, N, dtype = problem["M"], problem["N"], problem["dtype"]
    steps = N // blk_k

    @T.prim_func
    def rmsnorm(X: T.Tensor((M, N), dtype), W: T.Tensor((N,), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(M // blk_m, threads=threads) as bx:
            x_s = T.alloc_shared((blk_m, blk_k), dtype)
            w_s = T.alloc_shared((blk_k,), dtype)
            sq = T.alloc_fragment((blk_m, blk_k), "float32")
            rs = T.alloc_fragment((blk_m,), "float32")
            y = T.alloc_fragment((blk_m, blk_k), dtype)
            T.clear(sq)
            for k in T.Pipelined(steps, num_stages=num_stages):
                T.copy(X[bx * blk_m, k * blk_k], x_s)
                for i, j in T.Parallel(blk_m, blk_k):
                    sq[i, j] += T.cast(x_s[i, j], "float32") * T.cast(x_s[i, j], "float32")
            T.reduce_sum(sq, rs, dim=1)
            for i in T.Parallel(blk_m):
                rs[i] = T.rsqrt(rs[i] / N + EPS)
            for k in T.Pipelined(steps, num_stages=num_stages):
                T.copy(X[bx * blk_m, k * blk_k], x_s)
                T.copy(W[k * blk_k], w_s)
                for i, j in T.Parallel(blk_m, blk_k):
                    y[i, j] = T.cast(T.cast(x_s[i, j], "float32") * rs[i] * T.cast(w_s[j], "float32"), dtype)
                T.copy(y, Y[bx * blk_m, k * blk_k])

    return rmsnorm


def inputs(problem, device):
    import torch

    M, N = problem["M"], problem["N"]
    dtype = getattr(torch, problem["dtype"])
    return [torch.randn(M, N, device=device, dtype=dtype), torch.rand(N, device=device, dtype=dtype) + 0.5,
            torch.empty(M, N, device=device, dtype=dtype)]  # fmt: skip


def reference(problem, args):
    import torch

    x, w, _ = args
    return [torch.nn.functional.rms_norm(x.float(), (x.shape[1],), w.float(), EPS)]


def flops(problem):
    return 4.0 * problem["M"] * problem["N"]


def bytes_moved(problem):
    # x read once, the weight once, y written once
    M, N = problem["M"], problem["N"]
    return 2.0 * (2 * M * N + N)


def vendors(problem):
    import torch

    return {"torch rms_norm": lambda args: [torch.nn.functional.rms_norm(args[0], (args[0].shape[1],), args[1], EPS)]}
