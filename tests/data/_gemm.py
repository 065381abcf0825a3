"""The contract pieces the GEMM test kernels share: C = A @ B, fp16, row-major."""


def inputs(problem, device):
    import torch

    M, N, K = problem["M"], problem["N"], problem["K"]
    return [torch.randn(M, K, device=device, dtype=torch.float16), torch.randn(K, N, device=device, dtype=torch.float16),
            torch.empty(M, N, device=device, dtype=torch.float16)]  # fmt: skip


def reference(problem, args):
    return [args[0] @ args[1]]


def flops(problem):
    return 2.0 * problem["M"] * problem["N"] * problem["K"]
