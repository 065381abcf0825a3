"""gemm_intrinsics: C = A @ B^T (A M x K, B N x K) with the MMA written by hand, as tilelang's
examples/gemm/example_gemm_intrinsics.py writes it: each K-step copies an A and a B tile to
shared memory by element-wise T.Parallel loops (no T.copy) into tiles with the example's
512-bit swizzle (T.annotate_layout), then, per 16-wide (32 for int8) slice of the step,
every warp loads its fragments with ldmatrix and issues mma.sync through tilelang's
TensorCoreIntrinEmitter macros (ldmatrix_a, ldmatrix_b, mma; thread-indexed inside);
after the loop the accumulator is written to a shared tile in the MMA's 16 x 16 blocked
layout with the emitter's stmatrix and copied to C by an element-wise loop. fp16 in,
fp16 out, fp32 accumulation (the example's main()); int8 in, int32 out is its other case.

    ws-tune tests/data/gemm_intrinsics.py --shape M=4096,N=4096,K=4096 --budget 16

Departures from the example (for the kernel-file contract):
- a @T.prim_func with C as the last argument (OUTPUTS), instead of the eager
  @tilelang.jit form with T.const("M, N, K") and T.empty.
- the example's debug config (2 x 2 warps of 64 x 64, chunk 32, 2 stages) is a point
  of PARAMS: block_row_warps, block_col_warps, warp_row_tiles, warp_col_tiles, chunk and
  num_stages (its `stage`). The block's threads follow from the warps, as there.
- in_dtype and out_dtype are problem arguments with the example's asserted choices;
  accum_dtype is int32 for int8 and float32 otherwise, as its two callers pass it.
- `load` is a parameter: "parallel" is the example's element-wise copy loops; "copy" is a
  T.copy twin of them (a TMA load). role_based puts element-wise loads on the Worker warps
  (no producer to hand a tile to), so only the twin has a seed and a schedule space; the
  example's own loops get tilelang's lowerings as baselines.
- check() refuses sizes that are not multiples of the block (the example's K loop runs
  K // block_K and its stores are unguarded), and the T.copy twin where a tile row is not
  512 bits: the example leaves such tiles unswizzled, a TMA load does not keep that layout,
  and every TMA lowering of it computed garbage on an H100 (tilelang's default and
  role_based too; benchmarks/results/h200-run43, call 5).
"""

import tilelang.language as T
from tilelang.cuda.intrinsics import get_swizzle_layout

PROBLEM = {
    "M": None,
    "N": None,
    "K": None,
    "in_dtype": "float16",
    "out_dtype": "float16",
}
CHOICES = {
    "in_dtype": ["float16", "int8"],
    "out_dtype": ["float16", "float32", "int32"],
}
PARAMS = {
    "block_row_warps": [2, 4],
    "block_col_warps": [2],
    "warp_row_tiles": [32, 64],
    "warp_col_tiles": [64],
    "chunk": [32, 64],
    "num_stages": [2, 3],
    "load": ["parallel", "copy"],
}
OUTPUTS = [2]
TOLERANCE = 1e-2

WARP_SIZE = 32


def _accum(problem):
    return "int32" if problem["in_dtype"] == "int8" else "float32"


def _micro_k(problem):
    return 32 if problem["out_dtype"] == "int32" else 16


def check(problem, params, schedule):
    in_dtype, out_dtype = problem["in_dtype"], problem["out_dtype"]
    if (in_dtype == "int8") != (out_dtype == "int32"):
        return f"in_dtype={in_dtype} with out_dtype={out_dtype}: int8 goes with int32 and float16 with float16 or float32"
    block_M = params["block_row_warps"] * params["warp_row_tiles"]
    block_N = params["block_col_warps"] * params["warp_col_tiles"]
    block_K = params["chunk"]
    for name, size, block in (
        ("M", problem["M"], block_M),
        ("N", problem["N"], block_N),
        ("K", problem["K"], block_K),
    ):
        if size % block:
            return f"{name}={size} is not a multiple of the block's {block}"
    if block_K % _micro_k(problem):
        return f"chunk={block_K} is not a multiple of the MMA's k={_micro_k(problem)}"
    if params["load"] == "copy" and block_K * {"float16": 16, "int8": 8}[in_dtype] != 512:
        # Its tiles are then unswizzled (_swizzle): the TMA load does not keep that layout, which
        # ldmatrix reads, and every TMA lowering (tilelang's default and role_based too) computed
        # garbage on an H100 (benchmarks/results/h200-run43, call 5); cp.async (no_ws) did not.
        return f"load=copy with chunk={block_K}: only 512-bit rows keep the layout ldmatrix reads under a TMA load"
    return None


def _swizzle(shared_buf, dtype):
    """The example's make_swizzle_layout: the 512-bit swizzle where a row is 512 bits."""
    shape = shared_buf.shape
    bits = {"float16": 16, "int8": 8}[dtype]
    if shape[-1] * bits != 512:
        return T.Layout(shape, lambda *args: args)
    return T.Layout(
        shape, lambda i, j: list(get_swizzle_layout(i, j, shape[-1], dtype))
    )


def kernel(
    problem,
    *,
    block_row_warps,
    block_col_warps,
    warp_row_tiles,
    warp_col_tiles,
    chunk,
    num_stages,
    load,
):
    from tilelang.cuda.intrinsics.macro.mma_macro_generator import (
        TensorCoreIntrinEmitter,
    )

    M, N, K = problem["M"], problem["N"], problem["K"]
    in_dtype, out_dtype, accum_dtype = (
        problem["in_dtype"],
        problem["out_dtype"],
        _accum(problem),
    )

    micro_size_x = micro_size_y = 16
    micro_size_k = _micro_k(problem)
    shared_scope = "shared.dyn"

    block_M = block_row_warps * warp_row_tiles
    block_N = block_col_warps * warp_col_tiles
    block_K = chunk

    A_shared_shape = (block_M, block_K)
    B_shared_shape = (block_N, block_K)
    C_shared_shape = (
        block_M // micro_size_x,
        block_N // micro_size_y,
        micro_size_x,
        micro_size_y,
    )

    threads = WARP_SIZE * (block_row_warps * block_col_warps)
    local_size_a = (micro_size_x * micro_size_k) // WARP_SIZE
    local_size_b = (micro_size_y * micro_size_k) // WARP_SIZE
    local_size_c = (micro_size_x * micro_size_y) // WARP_SIZE
    warp_rows = warp_row_tiles // micro_size_x
    warp_cols = warp_col_tiles // micro_size_y

    mma_emitter = TensorCoreIntrinEmitter(
        a_dtype=in_dtype,
        b_dtype=in_dtype,
        accum_dtype=accum_dtype,
        a_transposed=False,
        b_transposed=True,
        block_row_warps=block_row_warps,
        block_col_warps=block_col_warps,
        warp_row_tiles=warp_row_tiles,
        warp_col_tiles=warp_col_tiles,
        chunk=chunk,
    )

    @T.prim_func
    def gemm_intrinsics(
        A: T.Tensor((M, K), in_dtype),
        B: T.Tensor((N, K), in_dtype),
        C: T.Tensor((M, N), out_dtype),
    ):
        with T.Kernel(
            T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads
        ) as (bx, by):
            A_shared = T.alloc_shared(A_shared_shape, in_dtype, scope=shared_scope)
            B_shared = T.alloc_shared(B_shared_shape, in_dtype, scope=shared_scope)
            C_shared = T.alloc_shared(C_shared_shape, out_dtype, scope=shared_scope)
            A_local = T.alloc_local((warp_rows * local_size_a), in_dtype)
            B_local = T.alloc_local((warp_cols * local_size_b), in_dtype)
            C_local = T.alloc_local((warp_rows * warp_cols * local_size_c), accum_dtype)

            T.annotate_layout(
                {
                    A_shared: _swizzle(A_shared, in_dtype),
                    B_shared: _swizzle(B_shared, in_dtype),
                }
            )

            # Improve L2 Cache
            T.use_swizzle(panel_size=10)

            T.clear(C_local)

            for ko in T.Pipelined((K // block_K), num_stages=num_stages):
                if load == "parallel":
                    # Load A into shared memory
                    for i, k in T.Parallel(block_M, block_K):
                        A_shared[i, k] = A[by * block_M + i, ko * block_K + k]

                    # Load B into shared memory
                    for j, k in T.Parallel(block_N, block_K):
                        B_shared[j, k] = B[bx * block_N + j, ko * block_K + k]
                else:
                    T.copy(A[by * block_M, ko * block_K], A_shared)
                    T.copy(B[bx * block_N, ko * block_K], B_shared)

                for ki in T.serial(0, (block_K // micro_size_k)):
                    # Load A into fragment
                    mma_emitter.ldmatrix_a(A_local, A_shared, ki)

                    # Load B into fragment
                    mma_emitter.ldmatrix_b(B_local, B_shared, ki)

                    # Perform Matrix Multiplication
                    mma_emitter.mma(A_local, B_local, C_local)

            # Perform STMatrix
            mma_emitter.stmatrix(C_local, C_shared)

            # Store shared into global
            for i, j in T.Parallel(block_M, block_N):
                C[by * block_M + i, bx * block_N + j] = C_shared[
                    i // micro_size_x,
                    j // micro_size_y,
                    i % micro_size_x,
                    j % micro_size_y,
                ]

    return gemm_intrinsics


def _torch_dtype(torch, name):
    return {
        "float16": torch.float16,
        "float32": torch.float32,
        "int8": torch.int8,
        "int32": torch.int32,
    }[name]


def inputs(problem, device):
    import torch

    M, N, K = problem["M"], problem["N"], problem["K"]
    if problem["in_dtype"] == "int8":
        g = torch.Generator().manual_seed(0)
        A = torch.randint(-8, 8, (M, K), dtype=torch.int8, generator=g).to(device)
        B = torch.randint(-8, 8, (N, K), dtype=torch.int8, generator=g).to(device)
    else:
        A = torch.randn(M, K, device=device, dtype=torch.float16)
        B = torch.randn(N, K, device=device, dtype=torch.float16)
    C = torch.empty(
        M, N, device=device, dtype=_torch_dtype(torch, problem["out_dtype"])
    )
    return [A, B, C]


def reference(problem, args):
    import torch

    A, B = args[0], args[1]
    out = _torch_dtype(torch, problem["out_dtype"])
    # int8 values in [-8, 8): every partial sum is an integer below 2^24, exact in fp32
    return [(A.float() @ B.float().T).to(out)]


def flops(problem):
    return 2.0 * problem["M"] * problem["N"] * problem["K"]


def bytes_moved(problem):
    elem = {"float16": 2, "float32": 4, "int8": 1, "int32": 4}
    M, N, K = problem["M"], problem["N"], problem["K"]
    return (M * K + N * K) * elem[problem["in_dtype"]] + M * N * elem[
        problem["out_dtype"]
    ]
