"""gemv: o = A @ x (fp16, fp32 accumulation) as tilelang's examples/gemv writes its
reducer variant: each block owns block_M rows, walks the columns in a pipelined loop whose
body allocates its own shared and register tiles, and accumulates into a reducer
(T.alloc_reducer) finalized after the loop. Memory-bound; no MMA.

    ws-tune tests/data/gemv.py --shape M=16384,N=16384 --budget 8
"""

import tilelang.language as T

PROBLEM = {"M": None, "N": None}
PARAMS = {"block_M": [64, 128], "block_N": [128, 256], "num_stages": [2, 3, 4], "threads": [128, 256]}
TOLERANCE = 2e-2


def check(problem, params, schedule):
    for dim, block in (("M", "block_M"), ("N", "block_N")):
        if problem[dim] % params[block]:
            return f"{dim}={problem[dim]} is not a multiple of {block}={params[block]}"
    return None


def kernel(problem, *, block_M, block_N, num_stages, threads):
    M, N = problem["M"], problem["N"]

    @T.prim_func
    def gemv(a: T.Tensor((M, N), "float16"), x: T.Tensor((N,), "float16"), o: T.Tensor((M,), "float16")):
        with T.Kernel(M // block_M, threads=threads) as i0_m:
            o_reducer = T.alloc_reducer(block_M, "float32", replication="all")
            T.clear(o_reducer)
            for i0_n in T.Pipelined(N // block_N, num_stages=num_stages):
                a_smem = T.alloc_shared((block_M, block_N), "float16")
                T.copy(a[i0_m * block_M, i0_n * block_N], a_smem)
                a_frag = T.alloc_fragment((block_M, block_N), "float16")
                T.copy(a_smem, a_frag)
                x_frag = T.alloc_fragment(block_N, "float16")
                T.copy(x[i0_n * block_N], x_frag)
                for i1_m, i1_n in T.Parallel(block_M, block_N):
                    o_reducer[i1_m] += a_frag[i1_m, i1_n] * x_frag[i1_n]
            T.finalize_reducer(o_reducer)
            T.copy(o_reducer, o[i0_m * block_M])

    return gemv


def inputs(problem, device):
    import torch

    a = torch.randn(problem["M"], problem["N"], device=device, dtype=torch.float16)
    x = torch.randn(problem["N"], device=device, dtype=torch.float16)
    return [a, x, torch.empty(problem["M"], device=device, dtype=torch.float16)]


def reference(problem, args):
    return [args[0].float() @ args[1].float()]


def flops(problem):
    return 2.0 * problem["M"] * problem["N"]


def vendors(problem):
    return {"cublas": lambda args: [args[0] @ args[1]]}
