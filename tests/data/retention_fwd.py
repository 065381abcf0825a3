"""retention_fwd: RetNet's chunked retention, forward (BSHD, fp16 in, fp16 out) as tilelang's
examples/linear_attention/example_retention_fwd.py writes it. Head h decays by
gamma_h = 1 - 2^(-5 - h); o_t = sum_{s<=t} gamma_h^(t-s) (q_t . k_s) v_s, q scaled by DK^-0.5.
Each block owns a BK x BV slice of one head's state and walks the sequence in chunks of 64,
carrying the state h in an fp32 fragment; per chunk: s = decay-masked q k^T (to an fp16
shared tile), o = decay_row * (q h) + s v, then v is decayed in place in its shared tile, h
is decayed, o is stored, and h += k^T v. The output has a leading NK axis (one slice per key
block; the caller sums it, as the example's ``postprocess``), so the reference gives each
key block's part.

Departures from the example: the example fixes BK = BV = 64 (its comment: 128 can be faster),
threads (128, T.Kernel's default) and num_stages (0, T.Pipelined's default); here BV, threads
and num_stages are PARAMS, and BK is a problem argument (default 64, CHOICES 64/128), because
O's leading axis is DK // BK and ``inputs`` (which sees no parameters) must size O. The
example compiles with ``tl.disable_warp_specialized``; a kernel file returns the PrimFunc and
ws-tune decides the lowering. Inputs are scaled by 1/4 (the example's are plain randn).
flops() counts the chunk algorithm's work (as linear_attn.py), not the example's
2 B S^2 H D "causal" figure.

    ws-tune tests/data/retention_fwd.py --shape B=8,S=4096,H=32 --budget 16
"""

import tilelang.language as T

PROBLEM = {"B": None, "S": None, "H": None, "DK": 128, "DV": 128, "BK": 64}
# O's leading axis is DK // BK: BK is a problem argument, since inputs() must size O
CHOICES = {"BK": [64, 128]}
PARAMS = {"BV": [64, 128], "num_stages": [0, 1, 2], "threads": [128, 256]}
OUTPUTS = [3]
TOLERANCE = 2e-2
CHUNK = 64


def check(problem, params, schedule):
    if problem["S"] % CHUNK:
        return f"S={problem['S']} is not a multiple of the chunk {CHUNK}"
    if problem["DK"] % problem["BK"]:
        return f"DK={problem['DK']} is not a multiple of BK={problem['BK']}"
    if problem["DV"] % params["BV"]:
        return f"DV={problem['DV']} is not a multiple of BV={params['BV']}"
    return None


def kernel(problem, *, BV, num_stages, threads):
    B, S, H, DK, DV, BK = (problem[k] for k in ("B", "S", "H", "DK", "DV", "BK"))
    scale = DK**-0.5
    dtype, accum_dtype = "float16", "float32"
    chunk_size = CHUNK
    NK, NV, NT = DK // BK, DV // BV, S // chunk_size

    @T.prim_func
    def chunk_retention_fwd(Q: T.Tensor((B, S, H, DK), dtype), K: T.Tensor((B, S, H, DK), dtype), V: T.Tensor((B, S, H, DV), dtype),
                            O: T.Tensor((NK, B, S, H, DV), dtype)):  # fmt: skip
        with T.Kernel(NV, NK, B * H, threads=threads) as (i_v, i_k, i_bh):
            i_b = i_bh // H
            i_h = i_bh % H
            log_decay = T.alloc_var(accum_dtype)
            log_decay = T.log2(1 - T.exp2(-5.0 - 1.0 * i_h))  # head-specific log decay

            q = T.alloc_shared((chunk_size, BK), dtype)
            k = T.alloc_shared((chunk_size, BK), dtype)
            v = T.alloc_shared((chunk_size, BV), dtype)
            h = T.alloc_fragment((BK, BV), accum_dtype)
            h_shared = T.alloc_shared((BK, BV), dtype)
            s = T.alloc_fragment((chunk_size, chunk_size), accum_dtype)
            s_shared = T.alloc_shared((chunk_size, chunk_size), dtype)
            o = T.alloc_fragment((chunk_size, BV), accum_dtype)
            T.clear(h)

            T.use_swizzle(10)

            for i in T.Pipelined(0, NT, num_stages=num_stages):
                for row, col in T.Parallel(chunk_size, BK):
                    q[row, col] = Q[i_b, i * chunk_size + row, i_h, i_k * BK + col] * scale
                T.copy(K[i_b, i * chunk_size : (i + 1) * chunk_size, i_h, i_k * BK : (i_k + 1) * BK], k)
                T.copy(V[i_b, i * chunk_size : (i + 1) * chunk_size, i_h, i_v * BV : (i_v + 1) * BV], v)

                T.gemm(q, k, s, clear_accum=True, transpose_B=True)
                for row, col in T.Parallel(chunk_size, chunk_size):
                    s_shared[row, col] = T.if_then_else(row >= col, s[row, col] * T.exp2((row - col) * log_decay), 0)

                T.copy(h, h_shared)
                T.gemm(q, h_shared, o, clear_accum=True)
                for row, col in T.Parallel(chunk_size, BV):
                    o[row, col] = T.exp2((row + 1) * log_decay) * o[row, col]
                T.gemm(s_shared, v, o)

                for row, col in T.Parallel(chunk_size, BV):
                    v[row, col] = v[row, col] * T.exp2((chunk_size - row - 1) * log_decay)
                for row, col in T.Parallel(BK, BV):
                    h[row, col] = T.exp2(chunk_size * log_decay) * h[row, col]
                T.copy(o, O[i_k, i_b, i * chunk_size : (i + 1) * chunk_size, i_h, i_v * BV : (i_v + 1) * BV])
                T.gemm(k, v, h, transpose_A=True)

    return chunk_retention_fwd


def inputs(problem, device):
    import torch

    B, S, H, DK, DV, BK = (problem[k] for k in ("B", "S", "H", "DK", "DV", "BK"))
    q, k = (torch.randn(B, S, H, DK, device=device, dtype=torch.float16) / 4 for _ in range(2))
    v = torch.randn(B, S, H, DV, device=device, dtype=torch.float16) / 4
    return [q, k, v, torch.empty(DK // BK, B, S, H, DV, device=device, dtype=torch.float16)]


def reference(problem, args):
    """Each key block's part of the output, from the definition (no chunks, no state), one
    head at a time (an S x S score matrix per batch: 0.5 GB at B=8, S=4096)."""
    import torch

    S, H, DK, BK = (problem[k] for k in ("S", "H", "DK", "BK"))
    q = (args[0] * DK**-0.5).float()  # B, S, H, DK: the kernel scales q in fp16
    k, v = (t.float() for t in args[1:3])
    out = torch.empty(DK // BK, *v.shape, device=v.device)
    diff = (torch.arange(S, device=q.device)[:, None] - torch.arange(S, device=q.device)[None, :]).double()
    for h in range(H):
        log_gamma = torch.log1p(-torch.tensor(2.0 ** (-5 - h), dtype=torch.float64))
        decay = torch.where(diff >= 0, torch.exp(diff * log_gamma), 0.0).float()  # S, S: gamma^(t-s), causal
        for i_k in range(DK // BK):
            cols = slice(i_k * BK, (i_k + 1) * BK)
            scores = (q[:, :, h, cols] @ k[:, :, h, cols].transpose(-1, -2)) * decay  # B, S, S
            out[i_k, :, :, h] = scores @ v[:, :, h]
    return [out]  # NK, B, S, H, DV


def flops(problem):
    # the chunk algorithm's work per chunk, as if one block held the whole head:
    # q k^T and s v (CHUNK^2 DK, CHUNK^2 DV), q h and k^T v (CHUNK DK DV each), 2 flops a multiply-add
    B, S, H, DK, DV = (problem[k] for k in ("B", "S", "H", "DK", "DV"))
    return 2.0 * B * H * S * (CHUNK * DK + CHUNK * DV + 2 * DK * DV)
