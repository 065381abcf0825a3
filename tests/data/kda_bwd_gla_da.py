"""kda_bwd_gla_da: Kimi Delta Attention's backward through the intra-chunk scores (dA, BSHD),
as tilelang's examples/kda/chunk_bwd_gla_dA.py writes it (FLA's chunk_gla_bwd_dA). One block
per chunk and head. For each chunk of chunk_size tokens,

    dA[t, j] = scale * sum_v dO[t, v] * V[j, v]     for j <= t (both within the chunk), else 0

A loop over value-dimension tiles copies a chunk x block_DV tile of dO and of V into shared
memory and adds dO V^T (one MMA, B transposed) into an fp32 chunk x chunk fragment cleared
before the loop; after it the fragment is scaled and masked to its lower triangle in registers
and stored to dA straight from the fragment.

For a schedule tuner: one pipelined loop with two loads and one MMA a trip, its accumulator
carried across trips; an element-wise epilogue on the accumulator and a fragment -> global
store. With the example's dtypes (bf16 dO and V, fp32 dA) the MMA is bf16.

Departures from the example: none in the kernel (V's shared tile is in do_dtype, as written).
The example's TL_ENABLE_FAST_MATH pass config is not set (a kernel file gives none); its
out_idx output dA is an argument. DK, which the kernel never reads, is not a problem argument.
The example's autotune space is kept whole (block_DV 32/64/128, threads 32/64/128/256,
num_stages 0-4). Inputs as the example's (dO and V N(0, 1)), scale 1.0 as it runs.

    ws-tune tests/data/kda_bwd_gla_da.py --shape B=1,S=8192,H=64 --budget 16
"""

import tilelang.language as T

PROBLEM = {"B": None, "S": None, "H": None, "DV": 128, "chunk_size": 64, "scale": 1.0,
           "input_dtype": "bfloat16", "do_dtype": "bfloat16", "da_dtype": "float32"}  # fmt: skip
CHOICES = {"chunk_size": [64], "input_dtype": ["bfloat16", "float16", "float32"],
           "do_dtype": ["bfloat16", "float16", "float32"], "da_dtype": ["float32", "bfloat16", "float16"]}  # fmt: skip
# the example's autotuner space (get_configs): block_DV, threads, num_stages
PARAMS = {
    "block_DV": [32, 64, 128],
    "threads": [32, 64, 128, 256],
    "num_stages": [0, 1, 2, 3, 4],
}
OUTPUTS = [2]  # dA
TOLERANCE = 2e-2


def check(problem, params, schedule):
    if problem["S"] % problem["chunk_size"]:
        return f"S={problem['S']} is not a multiple of chunk_size={problem['chunk_size']}"
    if problem["DV"] % params["block_DV"]:
        return f"DV={problem['DV']} is not a multiple of block_DV={params['block_DV']}"
    return None


def kernel(problem, *, block_DV, threads, num_stages):
    B, S, H, DV, chunk_size, scale = (problem[k] for k in ("B", "S", "H", "DV", "chunk_size", "scale"))
    input_dtype, do_dtype, da_dtype = (problem[k] for k in ("input_dtype", "do_dtype", "da_dtype"))

    block_S = BS = chunk_size
    DO_shape = (B, S, H, DV)
    V_shape = (B, S, H, DV)
    dA_shape = (B, S, H, BS)

    @T.prim_func
    def kda_bwd_gla_da(
        DO: T.Tensor(DO_shape, dtype=do_dtype),
        V: T.Tensor(V_shape, dtype=input_dtype),
        dA: T.Tensor(dA_shape, dtype=da_dtype),
    ):
        with T.Kernel(T.ceildiv(S, block_S), B * H, threads=threads) as (bs, bbh):
            bb, bh = bbh // H, bbh % H
            do_shared = T.alloc_shared((block_S, block_DV), dtype=do_dtype)
            V_shared = T.alloc_shared((block_S, block_DV), dtype=do_dtype)
            dA_fragment = T.alloc_fragment((block_S, block_S), dtype=T.float32)

            T.clear(dA_fragment)
            for i_v in T.Pipelined(T.ceildiv(DV, block_DV), num_stages=num_stages):
                T.copy(DO[bb, bs * block_S : (bs + 1) * block_S, bh, i_v * block_DV : (i_v + 1) * block_DV], do_shared)
                T.copy(V[bb, bs * block_S : (bs + 1) * block_S, bh, i_v * block_DV : (i_v + 1) * block_DV], V_shared)
                T.gemm(do_shared, V_shared, dA_fragment, transpose_B=True)
            for i_s1, i_s2 in T.Parallel(block_S, block_S):
                dA_fragment[i_s1, i_s2] = T.if_then_else(i_s1 >= i_s2, dA_fragment[i_s1, i_s2] * scale, 0.0)  # lower triangle
            T.copy(dA_fragment, dA[bb, bs * block_S : (bs + 1) * block_S, bh, 0:block_S])

    return kda_bwd_gla_da


def inputs(problem, device):
    import torch

    B, S, H, DV, chunk = (problem[k] for k in ("B", "S", "H", "DV", "chunk_size"))
    do = torch.randn(B, S, H, DV, device=device).to(getattr(torch, problem["do_dtype"]))
    v = torch.randn(B, S, H, DV, device=device).to(getattr(torch, problem["input_dtype"]))
    da = torch.empty(B, S, H, chunk, device=device, dtype=getattr(torch, problem["da_dtype"]))
    return [do, v, da]


def reference(problem, args):
    import torch

    chunk, scale = problem["chunk_size"], problem["scale"]
    do = args[0].float()
    # the kernel rounds V to do_dtype in its shared tile
    v = args[1].to(getattr(torch, problem["do_dtype"])).float()
    B, S, H, DV = do.shape
    NC = S // chunk
    doc = do.reshape(B, NC, chunk, H, DV).permute(0, 1, 3, 2, 4)  # B, NC, H, t, DV
    vc = v.reshape(B, NC, chunk, H, DV).permute(0, 1, 3, 2, 4)  # B, NC, H, j, DV
    da = (scale * (doc @ vc.transpose(-1, -2))).tril()  # keep j <= t
    return [da.permute(0, 1, 3, 2, 4).reshape(B, S, H, chunk)]


def flops(problem):
    # one chunk x chunk x DV MMA per chunk, per batch and head (the masked half included)
    B, S, H, DV, chunk = (problem[k] for k in ("B", "S", "H", "DV", "chunk_size"))
    return 2.0 * B * S * H * chunk * DV


def bytes_moved(problem):
    # dO and V read once, dA written once
    B, S, H, DV, chunk = (problem[k] for k in ("B", "S", "H", "DV", "chunk_size"))
    size = {"float32": 4, "bfloat16": 2, "float16": 2}
    per_token = DV * size[problem["do_dtype"]] + DV * size[problem["input_dtype"]] + chunk * size[problem["da_dtype"]]
    return float(B * S * H * per_token)
