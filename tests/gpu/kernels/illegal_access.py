"""A kernel that stores through a wild pointer (address 0x1000, never mapped):
an illegal memory access. A wild pointer, because tilelang guards indexed
stores into declared tensors."""

import tilelang.language as T
from _common import PARAMS, PROBLEM, flops, inputs, reference  # noqa: F401


def kernel(problem, *, threads):
    n = problem["N"]

    @T.prim_func
    def illegal(A: T.Tensor((n,), "float32"), C: T.Tensor((n,), "float32")):
        with T.Kernel(T.ceildiv(n, threads), threads=threads) as bx:
            wild = T.make_tensor_from_addr(T.uint64(4096), (n,), "float32")
            for i in T.Parallel(threads):
                wild[bx * threads + i] = A[bx * threads + i] * 2
                C[bx * threads + i] = A[bx * threads + i] * 2

    return illegal
