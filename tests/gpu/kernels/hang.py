"""A kernel that never finishes: it spins on a condition that random inputs never meet."""

import tilelang.language as T
from _common import PARAMS, PROBLEM, flops, inputs, reference  # noqa: F401


def kernel(problem, *, threads):
    n = problem["N"]

    @T.prim_func
    def hang(A: T.Tensor((n,), "float32"), C: T.Tensor((n,), "float32")):
        with T.Kernel(T.ceildiv(n, threads), threads=threads) as bx:
            acc = T.alloc_var("float32")
            acc = A[0]
            while acc < 1e30:  # randn never reaches this: the loop is endless
                acc = acc * 0.5 + A[0]
            for i in T.Parallel(threads):
                C[bx * threads + i] = acc

    return hang
