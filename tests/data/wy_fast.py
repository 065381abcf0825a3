"""wy_fast: Gated DeltaNet's WY recomputation (bf16), as tilelang's
examples/gdn/example_wy_fast.py writes it: per chunk of 64 tokens, U = A (V * beta) and
W = A (K * beta * exp(g)). Two pipelined loops one after the other (over V's and then K's
column tiles), each scaling its tile in shared memory into an MMA operand and writing its
product back through shared memory on every trip; beta and exp(g) are staged once, element
by element, before them.

    ws-tune tests/data/wy_fast.py --shape B=1,S=32768,H=32 --budget 16
"""

import tilelang
import tilelang.language as T

PROBLEM = {"B": None, "S": None, "H": None, "DK": 128, "DV": 128}
CHOICES = {"DK": [64, 128], "DV": [64, 128]}
PARAMS = {"block_DK": [32, 64], "block_DV": [32, 64], "num_stages": [1, 2, 3], "threads": [128, 256]}
OUTPUTS = [5, 6]
TOLERANCE = 2e-2
CHUNK = 64


def check(problem, params, schedule):
    if problem["S"] % CHUNK:
        return f"S={problem['S']} is not a multiple of the chunk ({CHUNK})"
    if problem["DK"] % params["block_DK"] or problem["DV"] % params["block_DV"]:
        return "DK or DV is not a multiple of its block"
    return None


def kernel(problem, *, block_DK, block_DV, num_stages, threads):
    B, S, H, DK, DV = (problem[k] for k in ("B", "S", "H", "DK", "DV"))
    dtype, accum = "bfloat16", "float32"

    @T.prim_func
    def wy_fast(K: T.Tensor((B, S, H, DK), dtype), V: T.Tensor((B, S, H, DV), dtype), Beta: T.Tensor((B, S, H), dtype),
                G: T.Tensor((B, S, H), accum), A: T.Tensor((B, S, H, CHUNK), dtype),
                W: T.Tensor((B, S, H, DK), dtype), U: T.Tensor((B, S, H, DV), dtype)):  # fmt: skip
        with T.Kernel(S // CHUNK, B * H, threads=threads) as (bs, bbh):
            bb, bh = bbh // H, bbh % H
            Beta_shared = T.alloc_shared((CHUNK,), dtype)
            G_shared = T.alloc_shared((CHUNK,), accum)
            K_shared = T.alloc_shared((CHUNK, block_DK), dtype)
            V_shared = T.alloc_shared((CHUNK, block_DV), dtype)
            A_shared = T.alloc_shared((CHUNK, CHUNK), dtype)
            W_fragment = T.alloc_fragment((CHUNK, block_DK), accum)
            U_fragment = T.alloc_fragment((CHUNK, block_DV), accum)
            W_shared = T.alloc_shared((CHUNK, block_DK), dtype)
            U_shared = T.alloc_shared((CHUNK, block_DV), dtype)
            W_Beta_shared = T.alloc_shared((CHUNK, block_DK), dtype)
            U_Beta_shared = T.alloc_shared((CHUNK, block_DV), dtype)
            T.annotate_layout({K_shared: tilelang.layout.make_swizzled_layout(K_shared), V_shared: tilelang.layout.make_swizzled_layout(V_shared)})

            for i_s in T.Parallel(CHUNK):
                Beta_shared[i_s] = Beta[bb, bs * CHUNK + i_s, bh]
                G_shared[i_s] = T.exp(G[bb, bs * CHUNK + i_s, bh])
            T.copy(A[bb, bs * CHUNK : (bs + 1) * CHUNK, bh, :], A_shared)
            for i_v in T.Pipelined(DV // block_DV, num_stages=num_stages):
                T.copy(V[bb, bs * CHUNK : (bs + 1) * CHUNK, bh, i_v * block_DV : (i_v + 1) * block_DV], V_shared)
                for i_s, i_v2 in T.Parallel(CHUNK, block_DV):
                    U_Beta_shared[i_s, i_v2] = V_shared[i_s, i_v2] * Beta_shared[i_s]
                T.gemm(A_shared, U_Beta_shared, U_fragment, clear_accum=True)
                T.copy(U_fragment, U_shared)  # through shared memory: fewer, wider stores
                T.copy(U_shared, U[bb, bs * CHUNK : (bs + 1) * CHUNK, bh, i_v * block_DV : (i_v + 1) * block_DV])
            for i_k in T.Pipelined(DK // block_DK, num_stages=num_stages):
                T.copy(K[bb, bs * CHUNK : (bs + 1) * CHUNK, bh, i_k * block_DK : (i_k + 1) * block_DK], K_shared)
                for i_s, i_k2 in T.Parallel(CHUNK, block_DK):
                    W_Beta_shared[i_s, i_k2] = K_shared[i_s, i_k2] * Beta_shared[i_s] * G_shared[i_s]
                T.gemm(A_shared, W_Beta_shared, W_fragment, clear_accum=True)
                T.copy(W_fragment, W_shared)
                T.copy(W_shared, W[bb, bs * CHUNK : (bs + 1) * CHUNK, bh, i_k * block_DK : (i_k + 1) * block_DK])

    return wy_fast


def inputs(problem, device):
    import torch

    B, S, H, DK, DV = (problem[k] for k in ("B", "S", "H", "DK", "DV"))
    k = torch.randn(B, S, H, DK, device=device, dtype=torch.bfloat16)
    v = torch.randn(B, S, H, DV, device=device, dtype=torch.bfloat16)
    beta = torch.rand(B, S, H, device=device, dtype=torch.bfloat16)
    g = -torch.rand(B, S, H, device=device)  # a decaying gate: exp(g) in (e^-1, 1]
    a = (torch.randn(B, S, H, CHUNK, device=device) / CHUNK**0.5).to(torch.bfloat16)
    return [k, v, beta, g, a, torch.empty_like(k), torch.empty_like(v)]


def reference(problem, args):
    k, v, beta, g, a, _, _ = args
    B, S, H = problem["B"], problem["S"], problem["H"]

    def chunks(x):  # (B, S, H, D) -> (B, H, chunks, CHUNK, D)
        return x.float().view(B, S // CHUNK, CHUNK, H, -1).permute(0, 3, 1, 2, 4)

    def tokens(x):  # the inverse
        return x.permute(0, 2, 3, 1, 4).reshape(B, S, H, -1).to(k.dtype)

    scale = beta.float().unsqueeze(-1)
    u = chunks(a) @ chunks(v * scale)
    w = chunks(a) @ chunks(k * scale * g.exp().unsqueeze(-1))
    return [tokens(w), tokens(u)]


def flops(problem):
    return 2.0 * problem["B"] * problem["S"] * problem["H"] * CHUNK * (problem["DK"] + problem["DV"])
