"""w4a16_gemm: a weight-only quantized linear layer as tilelang's examples/dequantize_gemm
writes it for Hopper: fp16 activations A (M x K) times int4 weights B (N x K, two per
byte) with one fp16 scale per 128 values of K. Each K-step's packed tile is copied from
shared memory into registers, dequantized there and fed to the MMA as its register
operand, so the output is C^T (N x M), as in the example.

    ws-tune tests/data/w4a16_gemm.py --shape M=4096,N=4096,K=4096 --budget 16
"""

import tilelang.language as T

GROUP = 128  # one scale per 128 weights along K

PROBLEM = {"M": None, "N": None, "K": None}
PARAMS = {"block_M": [64, 128], "block_N": [64, 128], "block_K": [64, 128], "num_stages": [1, 2, 3], "threads": [128, 256]}
OUTPUTS = [3]
TOLERANCE = 2e-2


def check(problem, params, schedule):
    for dim, block in (("M", "block_M"), ("N", "block_N"), ("K", "block_K")):
        if problem[dim] % params[block]:
            return f"{dim}={problem[dim]} is not a multiple of {block}={params[block]}"
    if problem["K"] % GROUP:
        return f"K={problem['K']} is not a multiple of the scale group {GROUP}"
    if params["threads"] == 256 and params["block_N"] == 64:
        return "two warpgroups need block_N=128"
    return None


def _dequant(packed, pos, scale):
    # int4 in [-8, 7]: shift the nibble to the top of a byte, then arithmetic-shift it back
    nibble = (packed >> (pos.astype("uint8") * T.uint8(4))) & T.uint8(0xF)
    return T.reinterpret(nibble << T.uint8(4), "int8").astype("float16") * T.float16(1 / 16) * scale


def kernel(problem, *, block_M, block_N, block_K, num_stages, threads):
    M, N, K = problem["M"], problem["N"], problem["K"]

    @T.prim_func
    def w4a16(A: T.Tensor((M, K), "float16"), B: T.Tensor((N, K // 2), "uint8"),
              scales: T.Tensor((N, K // GROUP), "float16"), Ct: T.Tensor((N, M), "float16")):  # fmt: skip
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K), "float16")
            B_shared = T.alloc_shared((block_N, block_K // 2), "uint8")
            B_local = T.alloc_fragment((block_N, block_K // 2), "uint8")
            B_dequant = T.alloc_fragment((block_N, block_K), "float16")
            Ct_local = T.alloc_fragment((block_N, block_M), "float32")
            Ct_shared = T.alloc_shared((block_N, block_M), "float16")
            T.clear(Ct_local)
            for k in T.Pipelined(K // block_K, num_stages=num_stages):
                T.copy(A[by * block_M, k * block_K], A_shared)
                T.copy(B[bx * block_N, k * block_K // 2], B_shared)
                T.copy(B_shared, B_local)
                for i, j in T.Parallel(block_N, block_K):
                    B_dequant[i, j] = _dequant(B_local[i, j // 2], j % 2, scales[bx * block_N + i, (k * block_K + j) // GROUP])
                T.gemm(B_dequant, A_shared, Ct_local, transpose_B=True)
            T.copy(Ct_local, Ct_shared)
            T.copy(Ct_shared, Ct[bx * block_N, by * block_M])

    return w4a16


def _unpack(b):
    import torch

    nibbles = torch.stack((b & 0xF, b >> 4), dim=-1).reshape(b.shape[0], -1).to(torch.int8)
    return (nibbles << 4) >> 4


def inputs(problem, device):
    import torch

    M, N, K = problem["M"], problem["N"], problem["K"]
    a = torch.randn(M, K, device=device, dtype=torch.float16) / 4
    b = torch.randint(0, 256, (N, K // 2), device=device, dtype=torch.uint8)
    scales = (torch.rand(N, K // GROUP, device=device) / 8 + 1 / 32).to(torch.float16)
    return [a, b, scales, torch.empty(N, M, device=device, dtype=torch.float16)]


def reference(problem, args):
    a, b, scales, _ = args
    w = _unpack(b).float() * scales.float().repeat_interleave(GROUP, dim=1)
    return [(a.float() @ w.T).T]


def flops(problem):
    return 2.0 * problem["M"] * problem["N"] * problem["K"]


def vendors(problem):
    import torch

    def dequantize_then_cublas(args):
        a, b, scales, _ = args
        w = _unpack(b).to(torch.float16) * scales.repeat_interleave(GROUP, dim=1)
        return [(a @ w.T).T]

    return {"torch": dequantize_then_cublas}
