"""A kernel that runs fine and computes the wrong thing (3*A where the reference says 2*A)."""

import tilelang.language as T
from _common import PARAMS, PROBLEM, flops, inputs, reference  # noqa: F401


def kernel(problem, *, threads):
    n = problem["N"]

    @T.prim_func
    def wrong(A: T.Tensor((n,), "float32"), C: T.Tensor((n,), "float32")):
        with T.Kernel(T.ceildiv(n, threads), threads=threads) as bx:
            for i in T.Parallel(threads):
                C[bx * threads + i] = A[bx * threads + i] * 3

    return wrong
