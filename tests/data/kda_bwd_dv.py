"""kda_bwd_dv: Kimi Delta Attention's backward through the intra-chunk output term (the local dv,
BSHD), as tilelang's examples/kda/chunk_bwd_dv.py writes it (FLA's chunk_bwd_dv_local with A
given). One block per chunk and head. The chunk's attention matrix A (chunk x chunk) is copied
into a shared tile and masked to its lower triangle (i >= j) in place; a loop over value-dimension
tiles then copies a chunk x block_DV tile of dO into shared memory, computes dv = A^T dO with one
MMA (A transposed) into a cleared fp32 fragment, writes the fragment to a shared tile and stores
that tile to dv.

For a schedule tuner: a prologue of one load and an element-wise rewrite of the loaded shared
tile (the loop's A operand, read-only inside the loop), then one pipelined loop with one load,
one MMA with A transposed and a fragment -> shared -> global store per trip; no state carried
between trips (the accumulator is cleared by every MMA). With the example's dtypes the shared
A tile is fp32 (do_dtype, though A is bfloat16) and dO is fp32, so the MMA is tf32.

Departures from the example: none in the kernel (A's shared tile is in do_dtype, as written).
The example's TL_ENABLE_FAST_MATH pass config is not set (a kernel file gives none). The
example's q and k, which the kernel never reads (FLA's function takes them only for their
shapes), are not arguments, nor is DK a problem argument. The example's autotune space is kept
whole (block_DV 32/64/128, threads 32/64/128, num_stages 0-4). Inputs as the example's
(A and dO N(0, 1)).

    ws-tune tests/data/kda_bwd_dv.py --shape B=1,S=8192,H=64 --budget 16
"""

import tilelang.language as T

PROBLEM = {"B": None, "S": None, "H": None, "DV": 128, "chunk_size": 64,
           "input_dtype": "bfloat16", "do_dtype": "float32", "output_dtype": "bfloat16"}  # fmt: skip
CHOICES = {"chunk_size": [64], "input_dtype": ["bfloat16", "float16", "float32"],
           "do_dtype": ["float32", "bfloat16", "float16"], "output_dtype": ["bfloat16", "float16", "float32"]}  # fmt: skip
# the example's autotuner space (get_configs): block_DV, threads, num_stages
PARAMS = {
    "block_DV": [32, 64, 128],
    "num_stages": [0, 1, 2, 3, 4],
    "threads": [32, 64, 128],
}
OUTPUTS = [2]  # dv
TOLERANCE = 2e-2


def check(problem, params, schedule):
    if problem["S"] % problem["chunk_size"]:
        return (
            f"S={problem['S']} is not a multiple of chunk_size={problem['chunk_size']}"
        )
    if problem["DV"] % params["block_DV"]:
        return f"DV={problem['DV']} is not a multiple of block_DV={params['block_DV']}"
    return None


def kernel(problem, *, block_DV, num_stages, threads):
    B, S, H, DV, chunk_size = (problem[k] for k in ("B", "S", "H", "DV", "chunk_size"))
    input_dtype, do_dtype, output_dtype = (
        problem[k] for k in ("input_dtype", "do_dtype", "output_dtype")
    )

    block_S = BS = chunk_size
    DO_shape = (B, S, H, DV)
    A_shape = (B, S, H, BS)

    @T.prim_func
    def kda_bwd_dv(
        DO: T.Tensor(DO_shape, dtype=do_dtype),
        A: T.Tensor(A_shape, dtype=input_dtype),
        dv: T.Tensor(DO_shape, dtype=output_dtype),
    ):
        with T.Kernel(T.ceildiv(S, block_S), B * H, threads=threads) as (bs, bbh):
            bb, bh = bbh // H, bbh % H

            A_shared = T.alloc_shared((BS, BS), dtype=do_dtype)
            DO_shared = T.alloc_shared((BS, block_DV), dtype=do_dtype)
            dv_fragment = T.alloc_fragment((BS, block_DV), dtype=T.float32)
            dv_shared = T.alloc_shared((BS, block_DV), dtype=output_dtype)

            T.copy(A[bb, bs * BS : (bs + 1) * BS, bh, :], A_shared)
            for i_s1, i_s2 in T.Parallel(BS, BS):
                A_shared[i_s1, i_s2] = T.if_then_else(
                    i_s1 >= i_s2, A_shared[i_s1, i_s2], 0.0
                )
            for i_v in T.Pipelined(T.ceildiv(DV, block_DV), num_stages=num_stages):
                T.copy(
                    DO[
                        bb,
                        bs * BS : (bs + 1) * BS,
                        bh,
                        i_v * block_DV : (i_v + 1) * block_DV,
                    ],
                    DO_shared,
                )
                T.gemm(
                    A_shared, DO_shared, dv_fragment, transpose_A=True, clear_accum=True
                )  # transpose_A: A^T
                T.copy(dv_fragment, dv_shared)
                T.copy(
                    dv_shared,
                    dv[
                        bb,
                        bs * BS : (bs + 1) * BS,
                        bh,
                        i_v * block_DV : (i_v + 1) * block_DV,
                    ],
                )

    return kda_bwd_dv


def inputs(problem, device):
    import torch

    B, S, H, DV, chunk = (problem[k] for k in ("B", "S", "H", "DV", "chunk_size"))
    do = torch.randn(B, S, H, DV, device=device).to(getattr(torch, problem["do_dtype"]))
    a = torch.randn(B, S, H, chunk, device=device).to(
        getattr(torch, problem["input_dtype"])
    )
    dv = torch.empty(
        B, S, H, DV, device=device, dtype=getattr(torch, problem["output_dtype"])
    )
    return [do, a, dv]


def reference(problem, args):
    import torch

    do, a = args[0].float(), args[1].float()
    B, S, H, DV = do.shape
    chunk = problem["chunk_size"]
    NC = S // chunk
    # the kernel rounds A to do_dtype in its shared tile
    a = a.to(getattr(torch, problem["do_dtype"])).float()
    a = a.reshape(B, NC, chunk, H, chunk).permute(0, 1, 3, 2, 4)  # B, NC, H, i, j
    a = a.tril()  # keep i >= j
    doc = do.reshape(B, NC, chunk, H, DV).permute(0, 1, 3, 2, 4)  # B, NC, H, chunk, DV
    dv = a.transpose(-1, -2) @ doc  # A^T dO per chunk
    return [dv.permute(0, 1, 3, 2, 4).reshape(B, S, H, DV)]


def flops(problem):
    # one chunk x chunk x DV MMA per chunk, per batch and head
    return (
        2.0
        * problem["B"]
        * problem["S"]
        * problem["H"]
        * problem["chunk_size"]
        * problem["DV"]
    )


def bytes_moved(problem):
    B, S, H, DV, chunk = (problem[k] for k in ("B", "S", "H", "DV", "chunk_size"))
    size = {"float32": 4, "bfloat16": 2, "float16": 2}
    per_token = (
        DV * size[problem["do_dtype"]]
        + chunk * size[problem["input_dtype"]]
        + DV * size[problem["output_dtype"]]
    )
    return float(B * S * H * per_token)
