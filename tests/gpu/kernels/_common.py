"""Shared contract pieces of the deliberately broken kernel files (tests of the GPU runner)."""

PROBLEM = {"N": 4096}
PARAMS = {"threads": [128]}


def inputs(problem, device):
    import torch

    n = problem["N"]
    return [torch.randn(n, device=device, dtype=torch.float32), torch.empty(n, device=device, dtype=torch.float32)]


def reference(problem, args):
    return [args[0] * 2]


def flops(problem):
    return float(problem["N"])
