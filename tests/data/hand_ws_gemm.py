"""hand_ws_gemm: a GEMM that specializes its warps by hand, as tilelang's
examples/warp_specialize/example_warp_specialize_gemm_copy_1_gemm_0.py writes it: warps
128-255 (``T.ws(1)``) load A and B by TMA, warps 0-127 (``T.ws(0)``) run the MMA, and the
two hand each other the tiles through barriers of their own. No T.WSSchedule describes it,
so there is nothing to vary: a tuning measures tilelang's lowerings of it and the vendor.

    ws-tune tests/data/hand_ws_gemm.py --shape M=4096,N=4096,K=4096 --budget 4
"""

import tilelang.language as T

PROBLEM = {"M": None, "N": None, "K": None}
PARAMS = {"block_M": [128], "block_N": [128], "block_K": [32, 64]}


def kernel(problem, *, block_M, block_N, block_K):
    M, N, K = problem["M"], problem["N"], problem["K"]
    dtype, accum_dtype = "float16", "float32"

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=256) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K), dtype)
            B_shared = T.alloc_shared((block_K, block_N), dtype)
            C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
            data_is_ready = T.alloc_barrier(arrive_count=128)
            compute_is_done = T.alloc_barrier(arrive_count=128)
            with T.ws(0):
                T.clear(C_local)
            for ko in T.Pipelined(T.ceildiv(K, block_K), num_stages=2):
                with T.ws(1):
                    T.barrier_wait(compute_is_done, (ko + 1) % 2)
                    T.tma_copy(A[by * block_M, ko * block_K], A_shared, barrier=data_is_ready)
                    T.tma_copy(B[ko * block_K, bx * block_N], B_shared, barrier=data_is_ready)
                    T.barrier_arrive(data_is_ready)
                with T.ws(0):
                    T.barrier_wait(data_is_ready, ko % 2)
                    T.gemm(A_shared, B_shared, C_local)
                    T.barrier_arrive(compute_is_done)
            with T.ws(0):
                T.copy(C_local, C[by * block_M, bx * block_N])

    return main


def inputs(problem, device):
    import torch

    a = torch.randn(problem["M"], problem["K"], device=device, dtype=torch.float16)
    b = torch.randn(problem["K"], problem["N"], device=device, dtype=torch.float16)
    return [a, b, torch.empty(problem["M"], problem["N"], device=device, dtype=torch.float16)]


def reference(problem, args):
    return [args[0] @ args[1]]


def flops(problem):
    return 2.0 * problem["M"] * problem["N"] * problem["K"]


def vendors(problem):
    return {"cublas": lambda args: [args[0] @ args[1]]}
