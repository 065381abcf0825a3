"""online_softmax: y = softmax(x) over the rows of x in two pipelined passes over column
blocks, as tilelang's examples/online_softmax writes it: the first pass keeps a running
log-sum-exp (base 2) of the row from each block's max and sum of exponentials, the second
reloads each block and writes exp2(x * log2(e) - lse). Memory-bound; no MMA.

New for a schedule tuner: both loops copy their x block from global memory straight into
registers (a fragment, no shared tile), so nothing in either loop is a shared-memory load a
producer warp could take over; the row's state (lse) is carried from the first loop into
the second in registers.

    ws-tune tests/data/online_softmax.py --shape M=8192,N=8192 --budget 16
"""

import tilelang.language as T

PROBLEM = {"M": None, "N": None}
PARAMS = {"block_M": [1, 2, 4], "block_N": [1024, 4096, 8192]}
THREADS = 128  # as the example
TOLERANCE = 1e-2
LOG2E = 1.44269504


def check(problem, params, schedule):
    for dim, block in (("M", "block_M"), ("N", "block_N")):
        if problem[dim] % params[block]:
            return f"{dim}={problem[dim]} is not a multiple of {block}={params[block]}"
    return None


def kernel(problem, *, block_M, block_N):
    M, N = problem["M"], problem["N"]
    dtype, accum_dtype = "float16", "float32"
    scale = LOG2E

    @T.prim_func
    def online_softmax(X: T.Tensor((M, N), dtype), Y: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(M, block_M), threads=THREADS) as i_m:
            x = T.alloc_fragment((block_M, block_N), dtype)
            y = T.alloc_fragment((block_M, block_N), dtype)
            lse = T.alloc_fragment((block_M,), accum_dtype)
            max_x = T.alloc_fragment((block_M,), dtype)
            exp_x = T.alloc_fragment((block_M, block_N), accum_dtype)
            sum_exp_x = T.alloc_fragment((block_M,), accum_dtype)
            T.fill(lse, -T.infinity(accum_dtype))

            for i_n in T.Pipelined(T.ceildiv(N, block_N)):
                T.copy(X[i_m * block_M, i_n * block_N], x)
                T.reduce_max(x, max_x, dim=1, clear=True)
                for i, j in T.Parallel(block_M, block_N):
                    exp_x[i, j] = T.exp2(x[i, j] * scale - max_x[i] * scale)
                T.reduce_sum(exp_x, sum_exp_x, dim=1, clear=True)
                for i in T.Parallel(block_M):
                    lse[i] = max_x[i] * scale + T.log2(T.exp2(lse[i] - max_x[i] * scale) + sum_exp_x[i])

            for i_n in T.Pipelined(T.ceildiv(N, block_N)):
                T.copy(X[i_m * block_M, i_n * block_N], x)
                for i, j in T.Parallel(block_M, block_N):
                    y[i, j] = T.exp2(x[i, j] * scale - lse[i])
                T.copy(y, Y[i_m * block_M, i_n * block_N])

    return online_softmax


def inputs(problem, device):
    import torch

    M, N = problem["M"], problem["N"]
    return [torch.randn(M, N, device=device, dtype=torch.float16), torch.empty(M, N, device=device, dtype=torch.float16)]


def reference(problem, args):
    return [args[0].float().softmax(dim=1)]


def flops(problem):
    # per element: max, scale, subtract, exp2, sum (first pass); scale, subtract, exp2 (second)
    return 8.0 * problem["M"] * problem["N"]


def vendors(problem):
    return {"torch softmax": lambda args: [args[0].softmax(dim=1)]}
