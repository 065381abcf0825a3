"""grouped_gemm: a mixture-of-experts GEMM, as tilelang's examples/grouped_gemm: G groups
of rows of A (the tokens routed to each expert) each times its own B[g]. A block finds
its group among the groups' padded offsets, loads rows from the group's start and masks
the rows past its end. Group sizes are known when the kernel is built (a problem
argument spreads them: skew=1 makes every other group half as large, not a multiple
of the block).

    ws-tune tests/data/grouped_gemm.py --shape G=8,M=1024,N=4096,K=4096 --budget 16
"""

import tilelang.language as T

PROBLEM = {"G": None, "M": None, "N": None, "K": None, "skew": 0, "dtype": "float16"}
CHOICES = {"skew": [0, 1], "dtype": ["float16", "bfloat16"]}
PARAMS = {"block_M": [64, 128], "block_N": [128, 256], "block_K": [64], "num_stages": [2, 3, 4]}
OUTPUTS = [2]
TOLERANCE = 1e-2


def group_sizes(problem):
    """Rows of each group: M each, or alternately M/2 and 3M/2 (skew=1)."""
    M, G = problem["M"], problem["G"]
    if not problem["skew"]:
        return [M] * G
    return [M // 2 + (i % 2) * M for i in range(G)]


def check(problem, params, schedule):
    if problem["N"] % params["block_N"] or problem["K"] % params["block_K"]:
        return "N or K is not a multiple of its block"
    return None


def kernel(problem, *, block_M, block_N, block_K, num_stages):
    N, K, dtype = problem["N"], problem["K"], problem["dtype"]
    sizes = group_sizes(problem)
    G, rows = len(sizes), sum(sizes)
    m_blocks = sum((s + block_M - 1) // block_M for s in sizes)

    @T.prim_func
    def gmm(A: T.Tensor((rows, K), dtype), B: T.Tensor((G, K, N), dtype), C: T.Tensor((rows, N), dtype),
            group_rows: T.Tensor((G,), "int32"), group_starts: T.Tensor((G,), "int32")):  # fmt: skip
        with T.Kernel(m_blocks, T.ceildiv(N, block_N), threads=256) as (bx, by):
            A_s = T.alloc_shared((block_M, block_K), dtype)
            B_s = T.alloc_shared((block_K, block_N), dtype)
            acc = T.alloc_fragment((block_M, block_N), "float32")
            padded = T.alloc_var("int32")  # the group's first row, counted in whole blocks
            group = T.alloc_var("int32")
            first = T.alloc_var("int32")  # this block's first row of A and C
            size = T.alloc_var("int32")  # rows of the group from there on
            padded = 0
            group = 0
            first = 0
            size = 0
            for g in T.serial(G):
                if bx * block_M >= padded:
                    group = g
                    first = group_starts[g] + bx * block_M - padded
                    size = group_rows[g] + padded - bx * block_M
                padded = padded + T.ceildiv(group_rows[g], block_M) * block_M
            T.clear(acc)
            for k in T.Pipelined(K // block_K, num_stages=num_stages):
                T.copy(A[first : first + block_M, k * block_K : (k + 1) * block_K], A_s)
                T.copy(B[group, k * block_K : (k + 1) * block_K, by * block_N : (by + 1) * block_N], B_s)
                T.gemm(A_s, B_s, acc)
            for i, j in T.Parallel(block_M, block_N):
                if i < size:
                    C[first + i, by * block_N + j] = acc[i, j]

    return gmm


def inputs(problem, device):
    import torch

    sizes = group_sizes(problem)
    rows, N, K = sum(sizes), problem["N"], problem["K"]
    dtype = getattr(torch, problem["dtype"])
    return [torch.randn(rows, K, device=device, dtype=dtype), torch.randn(problem["G"], K, N, device=device, dtype=dtype),
            torch.empty(rows, N, device=device, dtype=dtype), torch.tensor(sizes, device=device, dtype=torch.int32),
            torch.tensor([sum(sizes[:g]) for g in range(len(sizes))], device=device, dtype=torch.int32)]  # fmt: skip


def reference(problem, args):
    import torch

    a, b = args[:2]
    parts = torch.split(a.float(), group_sizes(problem))
    return [torch.cat([part @ b[g].float() for g, part in enumerate(parts)])]


def flops(problem):
    return 2.0 * sum(group_sizes(problem)) * problem["N"] * problem["K"]


def vendors(problem):
    import torch

    sizes = group_sizes(problem)
    return {"torch.mm per group": lambda args: [torch.cat([p @ args[1][g] for g, p in enumerate(torch.split(args[0], sizes))])]}
