"""A persistent GEMM (blocks walk the output tiles) whose epilogue is two
ops: registers -> shared memory ("stage_out"), then shared -> global
("store_out"). The seed keeps both in the consumer role; the space may move
"store_out" to a role of its own, so that it overlaps the next tile's main
loop. Schedule-space tests only (the verifier)."""

import tilelang.language as T
from _gemm import flops, inputs, reference  # noqa: F401 - the contract, shared

PROBLEM = {"M": None, "N": None, "K": None}
PARAMS = {"block_M": [128], "block_N": [128, 256], "block_K": [64]}
BLOCKS = 132


def kernel(problem, *, block_M, block_N, block_K):
    M, N, K = problem["M"], problem["N"], problem["K"]

    def schedule(A_shared, B_shared):
        return T.WSSchedule(
            num_warps=12,
            roles=[
                T.WSRole("Consumer", warps_lo=0, warps_hi=8, max_nreg=232),
                T.WSRole("Producer", warps_lo=8, warps_hi=9, max_nreg=40),
            ],
            pipelines=[T.WSPipeline("smem", [A_shared, B_shared], depth=3)],
            scopes=[
                T.WSScope("loop_k", {
                    "Consumer": [T.WSSync.consumer_wait("smem", stage=0), "mma", T.WSSync.consumer_release("smem", stage=0)],
                    "Producer": [T.WSSync.producer_acquire("smem", stage=0), "load_A", "load_B", T.WSSync.producer_commit("smem", stage=0)],
                }),
                T.WSScope("loop_tiles", {
                    "Consumer": ["tile", "clear", "loop_k", "stage_out", "store_out", "next"],
                    "Producer": ["tile", "loop_k", "next"],
                }),
                T.WSScope(T.WSScope.ROOT, {"Consumer": ["first", "loop_tiles"], "Producer": ["first", "loop_tiles"]}),
            ],
        )  # fmt: skip

    @T.prim_func
    def gemm(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"), C: T.Tensor((M, N), "float16")):
        with T.Kernel(BLOCKS, threads=256) as block_id:
            A_shared = T.alloc_shared((block_M, block_K), "float16")
            B_shared = T.alloc_shared((block_K, block_N), "float16")
            C_local = T.alloc_fragment((block_M, block_N), "float32")
            C_shared = T.alloc_shared((block_M, block_N), "float16")
            tiles = T.PersistentTileScheduler(T.ceildiv(M, block_M), T.ceildiv(N, block_N), num_workers=BLOCKS, name="tiles")
            T.annotate_ws_schedule(schedule(A_shared, B_shared))
            with T.ws_op("first"):
                tiles.init(block_id)
            with T.ws_op("loop_tiles"):
                while tiles.valid():
                    with T.ws_op("tile"):
                        bm = tiles.m_idx
                        bn = tiles.n_idx
                    with T.ws_op("clear"):
                        T.clear(C_local)
                    for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=3, annotations={T.WSID: "loop_k"}):
                        T.copy(A[bm * block_M, k * block_K], A_shared, annotations={T.WSID: "load_A"})
                        T.copy(B[k * block_K, bn * block_N], B_shared, annotations={T.WSID: "load_B"})
                        T.gemm(A_shared, B_shared, C_local, annotations={T.WSID: "mma"})
                    T.copy(C_local, C_shared, annotations={T.WSID: "stage_out"})
                    T.copy(C_shared, C[bm * block_M, bn * block_N], annotations={T.WSID: "store_out"})
                    with T.ws_op("next"):
                        tiles.next_tile()

    return gemm
