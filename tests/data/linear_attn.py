"""linear_attn: chunked causal linear attention (BSHD, fp16 in, fp32 out) as tilelang's
examples/linear_attention/example_linear_attn_fwd.py writes it: each block walks the
sequence in chunks, carrying the running state h = sum K^T V across the loop in an fp32
fragment; per chunk, o = tril(Q K^T) V + Q h, added into O from shared memory with a
tile atomic (blocks over the key dimension add their parts), and the final state written
after the loop.

    ws-tune tests/data/linear_attn.py --shape B=8,S=4096,H=16 --budget 16
"""

import tilelang.language as T

PROBLEM = {"B": None, "S": None, "H": None, "DK": 128, "DV": 128}
PARAMS = {"BK": [64, 128], "BV": [64, 128], "num_stages": [1, 2], "threads": [128, 256]}
OUTPUTS = [3, 4]
RESET_TO_ZERO = [3]  # O: the key-dimension blocks add their parts
TOLERANCE = 2e-2
CHUNK = 64


def check(problem, params, schedule):
    if problem["S"] % CHUNK:
        return f"S={problem['S']} is not a multiple of the chunk {CHUNK}"
    for dim, block in (("DK", "BK"), ("DV", "BV")):
        if problem[dim] % params[block]:
            return f"{dim}={problem[dim]} is not a multiple of {block}={params[block]}"
    return None


def kernel(problem, *, BK, BV, num_stages, threads):
    B, S, H, DK, DV = (problem[k] for k in ("B", "S", "H", "DK", "DV"))
    scale = DK**-0.5
    dtype, acc = "float16", "float32"

    @T.prim_func
    def linear_attn(Q: T.Tensor((B, S, H, DK), dtype), K: T.Tensor((B, S, H, DK), dtype), V: T.Tensor((B, S, H, DV), dtype),
                    O: T.Tensor((B, S, H, DV), acc), final_state: T.Tensor((B, H, DK, DV), acc)):  # fmt: skip
        with T.Kernel(DV // BV, DK // BK, B * H, threads=threads) as (i_v, i_k, i_bh):
            i_b = i_bh // H
            i_h = i_bh % H
            q = T.alloc_shared((CHUNK, BK), dtype)
            k = T.alloc_shared((CHUNK, BK), dtype)
            v = T.alloc_shared((CHUNK, BV), dtype)
            h = T.alloc_fragment((BK, BV), acc)
            h_shared = T.alloc_shared((BK, BV), dtype)
            s = T.alloc_fragment((CHUNK, CHUNK), acc)
            s_shared = T.alloc_shared((CHUNK, CHUNK), dtype)
            o = T.alloc_fragment((CHUNK, BV), acc)
            o_shared = T.alloc_shared((CHUNK, BV), acc)

            T.clear(h)
            for i in T.Pipelined(S // CHUNK, num_stages=num_stages):
                for row, col in T.Parallel(CHUNK, BK):
                    q[row, col] = Q[i_b, i * CHUNK + row, i_h, i_k * BK + col] * scale
                T.copy(K[i_b, i * CHUNK : (i + 1) * CHUNK, i_h, i_k * BK : (i_k + 1) * BK], k)
                T.copy(V[i_b, i * CHUNK : (i + 1) * CHUNK, i_h, i_v * BV : (i_v + 1) * BV], v)
                T.gemm(q, k, s, clear_accum=True, transpose_B=True)
                for row, col in T.Parallel(CHUNK, CHUNK):
                    s_shared[row, col] = T.if_then_else(row >= col, s[row, col], 0)
                T.gemm(s_shared, v, o, clear_accum=True)
                T.copy(h, h_shared)
                T.gemm(k, v, h, transpose_A=True)
                T.gemm(q, h_shared, o)
                T.copy(o, o_shared)
                T.atomic_add(O[i_b, i * CHUNK : (i + 1) * CHUNK, i_h, i_v * BV : (i_v + 1) * BV], o_shared)
            T.copy(h, final_state[i_b, i_h, i_k * BK : (i_k + 1) * BK, i_v * BV : (i_v + 1) * BV])

    return linear_attn


def inputs(problem, device):
    import torch

    B, S, H, DK, DV = (problem[k] for k in ("B", "S", "H", "DK", "DV"))
    q, k = (torch.randn(B, S, H, DK, device=device, dtype=torch.float16) / 4 for _ in range(2))
    v = torch.randn(B, S, H, DV, device=device, dtype=torch.float16) / 4
    o = torch.zeros(B, S, H, DV, device=device, dtype=torch.float32)
    return [q, k, v, o, torch.empty(B, H, DK, DV, device=device, dtype=torch.float32)]


def reference(problem, args):
    import torch

    q, k, v = (t.float().transpose(1, 2) for t in args[:3])  # B, H, S, D
    q = q * problem["DK"] ** -0.5
    causal = torch.ones(q.shape[2], q.shape[2], dtype=torch.bool, device=q.device).tril()
    o = ((q @ k.transpose(-1, -2)) * causal) @ v
    return [o.transpose(1, 2), k.transpose(-1, -2) @ v]


def flops(problem):
    # per chunk: Q K^T, S V, K^T V and Q h, each 2 * CHUNK * D^2 (D = DK = DV)
    B, S, H, DK, DV = (problem[k] for k in ("B", "S", "H", "DK", "DV"))
    return 2.0 * B * H * S * (CHUNK * DK + CHUNK * DV + 2 * DK * DV)
