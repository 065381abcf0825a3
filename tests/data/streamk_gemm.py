"""streamk_gemm: C (fp32) = A @ B^T by stream-K, as tilelang's examples/gemm_streamk writes
it: one block per SM walks a contiguous range of the K-iterations of all tiles (a while
loop over the tiles its range touches, a pipelined loop of a dynamic trip count for each,
partial tiles added into C by atomics), then the tiles left over, a whole wave at a time,
in a second pipelined loop under a serial loop. C must start at zero (RESET_TO_ZERO).

    ws-tune tests/data/streamk_gemm.py --shape M=4096,N=4096,K=4096 --budget 8
"""

import tilelang.language as T

PROBLEM = {"M": None, "N": None, "K": None, "sms": 132}
PARAMS = {"block_M": [128], "block_N": [128, 256], "block_K": [64], "num_stages": [2, 3, 4], "threads": [128, 256]}
OUTPUTS = [2]
RESET_TO_ZERO = [2]  # partial tiles are added by atomics
TOLERANCE = 1e-2


def check(problem, params, schedule):
    for dim, block in (("M", "block_M"), ("N", "block_N"), ("K", "block_K")):
        if problem[dim] % params[block]:
            return f"{dim}={problem[dim]} is not a multiple of {block}={params[block]}"
    return None


def _plan(M, N, K, sms, block_M, block_N, block_K):
    """The example's split: the stream-K tiles (the last partial wave, one more wave when
    there are several) are shared out by K-iterations; the rest go a tile per block."""
    tiles = (M // block_M) * (N // block_N)
    streamk_tiles = tiles % sms
    if tiles - streamk_tiles > sms:
        streamk_tiles += sms
    streamk_iters = streamk_tiles * (K // block_K)
    return streamk_tiles, streamk_iters // sms, streamk_iters % sms, (tiles - streamk_tiles) // sms


def kernel(problem, *, block_M, block_N, block_K, num_stages, threads):
    M, N, K, sms = problem["M"], problem["N"], problem["K"], problem["sms"]
    iters_per_tile, tiles_n = K // block_K, N // block_N
    streamk_tiles, full_iters, partial_iters, waves = _plan(M, N, K, sms, block_M, block_N, block_K)

    @T.prim_func
    def streamk(A: T.Tensor((M, K), "float16"), B: T.Tensor((N, K), "float16"), C: T.Tensor((M, N), "float32")):
        with T.Kernel(sms, threads=threads) as pid:
            A_shared = T.alloc_shared((block_M, block_K), "float16")
            B_shared = T.alloc_shared((block_N, block_K), "float16")
            A_full = T.alloc_shared((block_M, block_K), "float16")
            B_full = T.alloc_shared((block_N, block_K), "float16")
            C_local = T.alloc_fragment((block_M, block_N), "float32")
            start_iter = T.alloc_fragment((1,), "int32", "local")
            end_iter = T.alloc_fragment((1,), "int32", "local")

            start_iter[0] = pid * full_iters + T.min(pid, partial_iters)
            last_iter = (pid + 1) * full_iters + T.min(pid + 1, partial_iters)
            while start_iter[0] < last_iter:
                end_iter[0] = T.min(start_iter[0] + (iters_per_tile - (start_iter[0] % iters_per_tile)), last_iter)
                tile_id = start_iter[0] // iters_per_tile
                remain_iters = start_iter[0] % iters_per_tile
                pid_m = tile_id // tiles_n
                pid_n = tile_id % tiles_n
                T.clear(C_local)
                for k in T.Pipelined(end_iter[0] - start_iter[0], num_stages=num_stages):
                    T.copy(A[pid_m * block_M, (k + remain_iters) * block_K], A_shared)
                    T.copy(B[pid_n * block_N, (k + remain_iters) * block_K], B_shared)
                    T.gemm(A_shared, B_shared, C_local, transpose_B=True)
                # a tile's first block writes it whole; the others add their K-ranges
                if remain_iters == 0 and end_iter[0] % iters_per_tile == 0:
                    T.copy(C_local, C[pid_m * block_M, pid_n * block_N])
                else:
                    for i, j in T.Parallel(block_M, block_N):
                        T.atomic_add(C[pid_m * block_M + i, pid_n * block_N + j], C_local[i, j])
                start_iter[0] = end_iter[0]

            for p in T.serial(waves):
                tile_id = pid + streamk_tiles + p * sms
                pid_m = tile_id // tiles_n
                pid_n = tile_id % tiles_n
                T.clear(C_local)
                for k in T.Pipelined(iters_per_tile, num_stages=num_stages):
                    T.copy(A[pid_m * block_M, k * block_K], A_full)
                    T.copy(B[pid_n * block_N, k * block_K], B_full)
                    T.gemm(A_full, B_full, C_local, transpose_B=True)
                T.copy(C_local, C[pid_m * block_M, pid_n * block_N])

    return streamk


def inputs(problem, device):
    import torch

    M, N, K = problem["M"], problem["N"], problem["K"]
    return [torch.rand(M, K, device=device, dtype=torch.float16) * 2 - 1, torch.rand(N, K, device=device, dtype=torch.float16) * 2 - 1,
            torch.zeros(M, N, device=device, dtype=torch.float32)]  # fmt: skip


def reference(problem, args):
    a, b, _ = args
    return [a.float() @ b.float().T]


def flops(problem):
    return 2.0 * problem["M"] * problem["N"] * problem["K"]


def vendors(problem):
    import torch

    return {"cublas": lambda args: [torch.matmul(args[0], args[1].T).float()]}
