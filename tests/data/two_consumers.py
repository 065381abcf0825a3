"""A GEMM whose block is computed by two consumer roles, each with its own
pipelines (its half of A and its own copy of B), fed by one producer warp:
the shape of a ping-pong seed. Schedule-space tests only (the verifier)."""

import tilelang.language as T
from _gemm import flops, inputs, reference  # noqa: F401 - the contract, shared

PROBLEM = {"M": None, "N": None, "K": None}
PARAMS = {"block_M": [128, 256], "block_N": [128], "block_K": [64]}


def kernel(problem, *, block_M, block_N, block_K):
    M, N, K = problem["M"], problem["N"], problem["K"]
    half = block_M // 2

    def consumer(a, b, mma):
        return [T.WSSync.consumer_wait(a, stage=0), T.WSSync.consumer_wait(b, stage=0), mma,
                T.WSSync.consumer_release(a, stage=0), T.WSSync.consumer_release(b, stage=0)]  # fmt: skip

    def producer(*pairs):
        out = []
        for pipe, op in pairs:
            out += [T.WSSync.producer_acquire(pipe, stage=0), op, T.WSSync.producer_commit(pipe, stage=0)]
        return out

    def schedule(A0, B0, A1, B1):
        return T.WSSchedule(
            num_warps=12,
            roles=[
                T.WSRole("upper", warps_lo=0, warps_hi=4, max_nreg=232),
                T.WSRole("lower", warps_lo=4, warps_hi=8, max_nreg=232),
                T.WSRole("loader", warps_lo=8, warps_hi=9, max_nreg=40),
            ],
            pipelines=[
                T.WSPipeline("a_up", [A0], depth=3),
                T.WSPipeline("b_up", [B0], depth=3),
                T.WSPipeline("a_lo", [A1], depth=3),
                T.WSPipeline("b_lo", [B1], depth=3),
            ],
            scopes=[
                T.WSScope("loop_k", {
                    "upper": consumer("a_up", "b_up", "mma_up"),
                    "lower": consumer("a_lo", "b_lo", "mma_lo"),
                    "loader": producer(("a_up", "load_a_up"), ("b_up", "load_b_up"), ("a_lo", "load_a_lo"), ("b_lo", "load_b_lo")),
                }),
                T.WSScope(T.WSScope.ROOT, {
                    "upper": ["clear_up", "loop_k", "store_up"],
                    "lower": ["clear_lo", "loop_k", "store_lo"],
                    "loader": ["loop_k"],
                }),
            ],
        )  # fmt: skip

    @T.prim_func
    def gemm(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"), C: T.Tensor((M, N), "float16")):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=256) as (bx, by):
            A0 = T.alloc_shared((half, block_K), "float16")
            B0 = T.alloc_shared((block_K, block_N), "float16")
            A1 = T.alloc_shared((half, block_K), "float16")
            B1 = T.alloc_shared((block_K, block_N), "float16")
            C0 = T.alloc_fragment((half, block_N), "float32")
            C1 = T.alloc_fragment((half, block_N), "float32")
            T.annotate_ws_schedule(schedule(A0, B0, A1, B1))
            with T.ws_op("clear_up"):
                T.clear(C0)
            with T.ws_op("clear_lo"):
                T.clear(C1)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=3, annotations={T.WSID: "loop_k"}):
                T.copy(A[by * block_M, k * block_K], A0, annotations={T.WSID: "load_a_up"})
                T.copy(B[k * block_K, bx * block_N], B0, annotations={T.WSID: "load_b_up"})
                T.copy(A[by * block_M + half, k * block_K], A1, annotations={T.WSID: "load_a_lo"})
                T.copy(B[k * block_K, bx * block_N], B1, annotations={T.WSID: "load_b_lo"})
                T.gemm(A0, B0, C0, annotations={T.WSID: "mma_up"})
                T.gemm(A1, B1, C1, annotations={T.WSID: "mma_lo"})
            T.copy(C0, C[by * block_M, bx * block_N], annotations={T.WSID: "store_up"})
            T.copy(C1, C[by * block_M + half, bx * block_N], annotations={T.WSID: "store_lo"})

    return gemm
