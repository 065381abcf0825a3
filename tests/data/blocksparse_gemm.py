"""blocksparse_gemm: C = A @ B over the (BM x BN x BK) blocks a boolean mask keeps, as
tilelang's examples/blocksparse_gemm: a pipelined loop whose loads and MMA run only
where BlockMask[by, bx, k] is set. The mask's blocks are the kernel's tiles, so they
are problem arguments; the kernel parameters are the pipeline's."""

import tilelang.language as T

PROBLEM = {"M": None, "N": None, "K": None, "BM": 128, "BN": 128, "BK": 64, "density": 50, "dtype": "float16"}
CHOICES = {"dtype": ["float16", "bfloat16"]}
PARAMS = {"num_stages": [1, 2, 3, 4], "threads": [256, 384]}
OUTPUTS = [3]
TOLERANCE = 1e-2


def check(problem, params, schedule):
    for dim, block in (("M", "BM"), ("N", "BN"), ("K", "BK")):
        if problem[dim] % problem[block]:
            return f"{dim} is not a multiple of {block}"
    return None


def kernel(problem, *, num_stages, threads):
    M, N, K, BM, BN, BK, dtype = (problem[k] for k in ("M", "N", "K", "BM", "BN", "BK", "dtype"))

    @T.prim_func
    def bsgemm(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), BlockMask: T.Tensor((M // BM, N // BN, K // BK), "bool"),
               C: T.Tensor((M, N), dtype)):  # fmt: skip
        with T.Kernel(T.ceildiv(N, BN), T.ceildiv(M, BM), threads=threads) as (bx, by):
            A_s = T.alloc_shared((BM, BK), dtype)
            B_s = T.alloc_shared((BK, BN), dtype)
            acc = T.alloc_fragment((BM, BN), "float32")
            C_s = T.alloc_shared((BM, BN), dtype)
            T.clear(acc)
            for k in T.Pipelined(K // BK, num_stages=num_stages):
                if BlockMask[by, bx, k]:
                    T.copy(A[by * BM, k * BK], A_s)
                    T.copy(B[k * BK, bx * BN], B_s)
                    T.gemm(A_s, B_s, acc)
            T.copy(acc, C_s)
            T.copy(C_s, C[by * BM, bx * BN])

    return bsgemm


def inputs(problem, device):
    import torch

    M, N, K, BM, BN, BK = (problem[k] for k in ("M", "N", "K", "BM", "BN", "BK"))
    dtype = getattr(torch, problem["dtype"])
    mask = torch.rand(M // BM, N // BN, K // BK, device=device) < problem["density"] / 100
    return [torch.randn(M, K, device=device, dtype=dtype), torch.randn(K, N, device=device, dtype=dtype), mask,
            torch.empty(M, N, device=device, dtype=dtype)]  # fmt: skip


def reference(problem, args):
    import torch

    a, b, mask, _ = args
    BM, BN, BK = problem["BM"], problem["BN"], problem["BK"]
    out = torch.zeros(a.shape[0], b.shape[1], device=a.device, dtype=torch.float32)
    for k in range(mask.shape[2]):
        keep = mask[:, :, k].repeat_interleave(BM, 0).repeat_interleave(BN, 1)
        out += (a[:, k * BK : (k + 1) * BK].float() @ b[k * BK : (k + 1) * BK].float()) * keep
    return [out]


def flops(problem):
    return 2.0 * problem["M"] * problem["N"] * problem["K"] * problem["density"] / 100
