"""conv2d: NHWC forward convolution as an implicit GEMM (im2col gathered into shared
memory by the producer), weights KH x KW x C x F; a kernel file written the way
tilelang's examples/convolution does it."""

import tilelang.language as T

PROBLEM = {"N": None, "C": None, "H": None, "W": None, "F": None, "K": 3, "S": 1, "P": 1, "dtype": "float16"}
CHOICES = {"dtype": ["float16", "bfloat16"], "K": [1, 3, 5]}
PARAMS = {"block_M": [64, 128], "block_N": [64, 128, 256], "block_K": [32, 64], "num_stages": [2, 3, 4]}
OUTPUTS = [2]
TOLERANCE = 1e-2


def _out_hw(p):
    oh = (p["H"] + 2 * p["P"] - (p["K"] - 1) - 1) // p["S"] + 1
    ow = (p["W"] + 2 * p["P"] - (p["K"] - 1) - 1) // p["S"] + 1
    return oh, ow


def check(problem, params, schedule):
    oh, ow = _out_hw(problem)
    if (problem["N"] * oh * ow) % params["block_M"]:
        return "output pixels are not a multiple of block_M"
    if problem["F"] % params["block_N"]:
        return "F is not a multiple of block_N"
    if (problem["K"] * problem["K"] * problem["C"]) % params["block_K"]:
        return "K*K*C is not a multiple of block_K"
    return None


def kernel(problem, *, block_M, block_N, block_K, num_stages):
    N, C, H, W, F, K, S, P, dtype = (problem[k] for k in ("N", "C", "H", "W", "F", "K", "S", "P", "dtype"))
    OH, OW = _out_hw(problem)

    @T.prim_func
    def conv(data: T.Tensor((N, H, W, C), dtype), weight: T.Tensor((K, K, C, F), dtype), out: T.Tensor((N, OH, OW, F), dtype)):
        with T.Kernel(T.ceildiv(F, block_N), T.ceildiv(N * OH * OW, block_M), threads=256) as (bx, by):
            data_shared = T.alloc_shared((block_M, block_K), dtype)
            weight_shared = T.alloc_shared((block_K, block_N), dtype)
            acc = T.alloc_fragment((block_M, block_N), "float32")
            out_shared = T.alloc_shared((block_M, block_N), dtype)
            weight_flat = T.Tensor((K * K * C, F), dtype, weight.data)
            out_flat = T.Tensor((N * OH * OW, F), dtype, out.data)
            T.clear(acc)
            for k in T.Pipelined(T.ceildiv(K * K * C, block_K), num_stages=num_stages):
                T.c2d_im2col(data, data_shared, by, k, K, S, 1, P)
                T.copy(weight_flat[k * block_K, bx * block_N], weight_shared)
                T.gemm(data_shared, weight_shared, acc)
            T.copy(acc, out_shared)
            T.copy(out_shared, out_flat[by * block_M, bx * block_N])

    return conv


def inputs(problem, device):
    import torch

    dtype = getattr(torch, problem["dtype"])
    N, C, H, W, F, K = (problem[k] for k in ("N", "C", "H", "W", "F", "K"))
    oh, ow = _out_hw(problem)
    return [torch.randn(N, H, W, C, device=device, dtype=dtype), torch.randn(K, K, C, F, device=device, dtype=dtype) / (K * K * C) ** 0.5,
            torch.empty(N, oh, ow, F, device=device, dtype=dtype)]  # fmt: skip


def reference(problem, args):
    import torch

    x, w, _ = args
    y = torch.nn.functional.conv2d(x.permute(0, 3, 1, 2), w.permute(3, 2, 0, 1), stride=problem["S"], padding=problem["P"])
    return [y.permute(0, 2, 3, 1)]


def flops(problem):
    oh, ow = _out_hw(problem)
    return 2.0 * problem["N"] * oh * ow * problem["F"] * problem["K"] ** 2 * problem["C"]


def vendors(problem):
    import torch

    def cudnn(args):
        x, w, _ = args
        y = torch.nn.functional.conv2d(x.permute(0, 3, 1, 2), w.permute(3, 2, 0, 1), stride=problem["S"], padding=problem["P"])
        return [y.permute(0, 2, 3, 1)]

    return {"cudnn": cudnn}
