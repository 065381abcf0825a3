"""kda_chunk_o: Kimi Delta Attention's chunked output (BSHD, bf16 in and out, fp32 gates), as
tilelang's examples/kda/chunk_o.py writes it (FLA's chunk_gla_fwd_o_gk with use_exp2). Per
chunk of the sequence, head and tile of the value dimension,
o = (scale * q * exp2(g)) @ h + tril(A) @ v, where g is the chunk's cumulative per-channel
log2-decay, h the state at the chunk's start and A the chunk's intra-chunk attention. Each
key-dimension step copies tiles of q, g (fp32) and h to shared memory, scales q in place and
gates it into a second shared tile element-wise, and adds its MMA with h into the fp32
accumulator; after the loop, v and A are copied in, A is masked to its lower triangle in
shared memory, and tril(A) @ v is added to the same accumulator.

    ws-tune tests/data/kda_chunk_o.py --shape B=1,S=8192,H=64 --budget 16
"""

import tilelang.language as T

PROBLEM = {"B": None, "S": None, "H": None, "DK": 128, "DV": 128, "chunk_size": 64, "dtype": "bfloat16"}
CHOICES = {"chunk_size": [64, 128], "dtype": ["bfloat16", "float16"]}
# the example's autotuner space (block_S is the chunk: the example asserts chunk_size == block_S)
PARAMS = {"block_DK": [32, 64, 128], "block_DV": [32, 64, 128], "num_stages": [0, 1, 2, 3, 4], "threads": [128, 256]}
TOLERANCE = 2e-2


def check(problem, params, schedule):
    if problem["S"] % problem["chunk_size"]:
        return f"S={problem['S']} is not a multiple of chunk_size={problem['chunk_size']}"
    for dim, block in (("DK", "block_DK"), ("DV", "block_DV")):
        if problem[dim] % params[block]:
            return f"{dim}={problem[dim]} is not a multiple of {block}={params[block]}"
    return None


def kernel(problem, *, block_DK, block_DV, num_stages, threads):
    B, S, H, DK, DV, BS = (problem[k] for k in ("B", "S", "H", "DK", "DV", "chunk_size"))
    block_S = BS
    scale = DK**-0.5
    input_dtype = output_dtype = problem["dtype"]
    accum_dtype, gate_dtype = "float32", "float32"

    @T.prim_func
    def kda_chunk_o(Q: T.Tensor((B, S, H, DK), input_dtype), V: T.Tensor((B, S, H, DV), input_dtype),
                    GK: T.Tensor((B, S, H, DK), gate_dtype), A: T.Tensor((B, S, H, BS), input_dtype),
                    HIDDEN: T.Tensor((B, S // BS, H, DK, DV), input_dtype), O: T.Tensor((B, S, H, DV), output_dtype)):  # fmt: skip
        with T.Kernel(T.ceildiv(DV, block_DV), T.ceildiv(S, block_S), B * H, threads=threads) as (bv, bs, bbh):
            bb, bh = bbh // H, bbh % H
            Q_shared = T.alloc_shared((block_S, block_DK), dtype=input_dtype)
            V_shared = T.alloc_shared((block_S, block_DV), dtype=input_dtype)
            HIDDEN_shared = T.alloc_shared((block_DK, block_DV), dtype=input_dtype)
            A_shared = T.alloc_shared((block_S, block_S), dtype=input_dtype)
            O_shared = T.alloc_shared((block_S, block_DV), dtype=output_dtype)
            O_fragment = T.alloc_fragment((block_S, block_DV), dtype=accum_dtype)
            GK_shared = T.alloc_shared((block_S, block_DK), dtype=gate_dtype)
            GQ_shared = T.alloc_shared((block_S, block_DK), dtype=input_dtype)

            T.clear(O_fragment)
            for i_k in T.Pipelined(T.ceildiv(DK, block_DK), num_stages=num_stages):
                T.copy(Q[bb, bs * block_S : (bs + 1) * block_S, bh, i_k * block_DK : (i_k + 1) * block_DK], Q_shared)
                T.copy(GK[bb, bs * block_S : (bs + 1) * block_S, bh, i_k * block_DK : (i_k + 1) * block_DK], GK_shared)
                T.copy(HIDDEN[bb, bs, bh, i_k * block_DK : (i_k + 1) * block_DK, bv * block_DV : (bv + 1) * block_DV], HIDDEN_shared)
                for i_s, i_k2 in T.Parallel(block_S, block_DK):
                    Q_shared[i_s, i_k2] = Q_shared[i_s, i_k2] * scale
                    GQ_shared[i_s, i_k2] = Q_shared[i_s, i_k2] * T.exp2(GK_shared[i_s, i_k2])
                T.gemm(GQ_shared, HIDDEN_shared, O_fragment)
            T.copy(V[bb, bs * block_S : (bs + 1) * block_S, bh, bv * block_DV : (bv + 1) * block_DV], V_shared)
            T.copy(A[bb, bs * block_S : (bs + 1) * block_S, bh, 0:block_S], A_shared)
            for i_s1, i_s2 in T.Parallel(block_S, block_S):
                A_shared[i_s1, i_s2] = T.if_then_else(i_s1 < i_s2, 0, A_shared[i_s1, i_s2])
            T.gemm(A_shared, V_shared, O_fragment)
            T.copy(O_fragment, O_shared)
            T.copy(O_shared, O[bb, bs * block_S : (bs + 1) * block_S, bh, bv * block_DV : (bv + 1) * block_DV])

    return kda_chunk_o


def inputs(problem, device):
    import torch

    B, S, H, DK, DV, BS = (problem[k] for k in ("B", "S", "H", "DK", "DV", "chunk_size"))
    dtype = getattr(torch, problem["dtype"])
    q = torch.randn(B, S, H, DK, device=device, dtype=dtype)
    v = torch.randn(B, S, H, DV, device=device, dtype=dtype)
    # per-channel log2-decays, small negative steps summed within each chunk (chunk_local_cumsum):
    # the gate exp2(g) stays in (0, 1], about 1/4 at a chunk's end
    steps = -torch.rand(B, S // BS, BS, H, DK, device=device) / 16
    g = steps.cumsum(2).reshape(B, S, H, DK).contiguous()
    # the intra-chunk attention: O(1/sqrt(chunk)) scores (the kernel keeps only its lower triangle)
    a = (torch.randn(B, S, H, BS, device=device) / BS**0.5).to(dtype)
    h = (torch.randn(B, S // BS, H, DK, DV, device=device) / 4).to(dtype)
    o = torch.empty(B, S, H, DV, device=device, dtype=dtype)
    return [q, v, g, a, h, o]


def reference(problem, args):
    import torch

    q, v, g, a, h = (t.float() for t in args[:5])
    B, S, H, DK = q.shape
    BS = problem["chunk_size"]
    n = S // BS
    qg = (q * DK**-0.5 * torch.exp2(g)).reshape(B, n, BS, H, DK)
    inter = torch.einsum("bnshk,bnhkv->bnshv", qg, h)
    causal = torch.ones(BS, BS, dtype=torch.bool, device=q.device).tril()
    a = a.reshape(B, n, BS, H, BS) * causal[:, None, :]  # a[b, n, s, h, t], kept where t <= s
    intra = torch.einsum("bnsht,bnthv->bnshv", a, v.reshape(B, n, BS, H, -1))
    return [(inter + intra).reshape(B, S, H, -1)]


def flops(problem):
    # per chunk, head and value column: (q * g) @ h over DK, tril(A) @ v over the chunk (the full square, as computed)
    B, S, H, DK, DV, BS = (problem[k] for k in ("B", "S", "H", "DK", "DV", "chunk_size"))
    return 2.0 * B * S * H * DV * (DK + BS)
