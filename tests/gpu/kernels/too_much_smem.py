"""A kernel that asks for 240 KB of shared memory: it compiles, but cannot launch on sm_90 (227 KB)."""

import tilelang.language as T
from _common import PARAMS, PROBLEM, flops, inputs, reference  # noqa: F401

SMEM_FLOATS = 240 * 1024 // 4


def kernel(problem, *, threads):
    n = problem["N"]

    @T.prim_func
    def big(A: T.Tensor((n,), "float32"), C: T.Tensor((n,), "float32")):
        with T.Kernel(1, threads=threads):
            S = T.alloc_shared((SMEM_FLOATS,), "float32")
            for i in T.Parallel(SMEM_FLOATS):
                S[i] = A[i % n] * 2
            for i in T.Parallel(n):
                C[i] = S[i]

    return big
