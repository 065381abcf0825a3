"""kda_intra_token: Kimi Delta Attention's intra-sub-chunk scores, token-parallel (BSHD, bf16
in and out, fp32 gates), as tilelang's examples/kda/chunk_intra_token_parallel.py writes it
(FLA's chunk_kda_fwd_intra_token_parallel, with scale 1 as the example runs it). One block per
token t and block_H heads. With i_ts the first token of t's sub-chunk (sub_chunk_size tokens
within a chunk of chunk_size), for every j in [i_ts, t]:

    kg_j        = k_j * exp2(g_t - g_j)                  (per channel, fp32)
    Aqk[t, j % chunk_size] = sum_k q_t * kg_j
    Akk[t, j - i_ts]       = sum_k (k_t * beta_t) * kg_j     (j < t only)

every other column of both rows is zero. The block copies its token's q, k and g rows into
shared memory (k * beta into a 16-bit fragment), then a pipelined loop over j copies k_j and
g_j into shared memory, gates them element-wise into an fp32 fragment, forms the two products
in fp32 shared tiles and row-sums them; each trip writes one column of the two score rows,
held in shared memory and stored after the loop.

For a schedule tuner: no MMA at all. A loop of a variable trip count (1 to sub_chunk_size,
by the token's place in its sub-chunk) with two loads a trip, element-wise work and two
reductions, its results scattered into a shared row by a column index that depends on the
trip; a memory- and latency-bound kernel, judged by GB/s.

Departures from the example: none in the kernel (its T.disable_warp_group_reg_alloc() is kept).
The example's TL_ENABLE_FAST_MATH pass config is not set (a kernel file gives none). Its
autotune space is kept whole (block_H 1/2/4/8, threads 128/256, num_stages 0-3). Inputs as the
example's: q, k, beta N(0, 1), g the chunk-local cumulative sum of logsigmoid(N(0, 1)).

    ws-tune tests/data/kda_intra_token.py --shape B=1,S=8192,H=64 --budget 16
"""

import tilelang.language as T

PROBLEM = {"B": None, "S": None, "H": None, "DK": 128, "chunk_size": 64, "sub_chunk_size": 16, "dtype": "bfloat16"}
CHOICES = {"dtype": ["bfloat16", "float16"]}
# the example's autotune configs (get_configs)
PARAMS = {"block_H": [1, 2, 4, 8], "threads": [128, 256], "num_stages": [0, 1, 2, 3]}
OUTPUTS = [4, 5]  # Aqk, Akk


def check(problem, params, schedule):
    if problem["chunk_size"] % problem["sub_chunk_size"]:
        return f"chunk_size={problem['chunk_size']} is not a multiple of sub_chunk_size={problem['sub_chunk_size']}"
    if problem["H"] % params["block_H"]:
        return f"H={problem['H']} is not a multiple of block_H={params['block_H']}"
    return None


def kernel(problem, *, block_H, threads, num_stages):
    B, S, H, DK, CS, SCS = (problem[k] for k in ("B", "S", "H", "DK", "chunk_size", "sub_chunk_size"))
    input_dtype = output_dtype = problem["dtype"]
    accum_dtype, gate_dtype = "float32", "float32"

    @T.prim_func
    def kda_intra_token(Q: T.Tensor((B, S, H, DK), input_dtype), K: T.Tensor((B, S, H, DK), input_dtype),
                        GK: T.Tensor((B, S, H, DK), gate_dtype), Beta: T.Tensor((B, S, H), input_dtype),
                        Aqk: T.Tensor((B, S, H, CS), output_dtype), Akk: T.Tensor((B, S, H, SCS), output_dtype)):  # fmt: skip
        with T.Kernel(B * S, T.ceildiv(H, block_H), threads=threads) as (bbs, bh):
            bb, bs = bbs // S, bbs % S
            i_c = bs // CS  # the token's chunk
            i_s = (bs % CS) // SCS  # its sub-chunk within the chunk
            i_tc = i_c * CS
            i_ts = i_tc + i_s * SCS
            loops = bs + 1 - i_ts

            Q_i_shared = T.alloc_shared((block_H, DK), dtype=input_dtype)
            K_i_shared = T.alloc_shared((block_H, DK), dtype=input_dtype)
            GK_i_shared = T.alloc_shared((block_H, DK), dtype=gate_dtype)
            Beta_shared = T.alloc_shared((block_H,), dtype=input_dtype)
            K_j_shared = T.alloc_shared((block_H, DK), dtype=input_dtype)
            GK_j_shared = T.alloc_shared((block_H, DK), dtype=gate_dtype)
            Aqk_shared = T.alloc_shared((block_H, DK), dtype=accum_dtype)
            Akk_shared = T.alloc_shared((block_H, DK), dtype=accum_dtype)
            Sum_Aqk_shared = T.alloc_shared((block_H, CS), dtype=output_dtype)
            Sum_Akk_shared = T.alloc_shared((block_H, SCS), dtype=output_dtype)

            Q_i_fragment = T.alloc_fragment((block_H, DK), dtype=input_dtype)
            K_i_fragment = T.alloc_fragment((block_H, DK), dtype=input_dtype)
            K_j_fragment = T.alloc_fragment((block_H, DK), dtype=accum_dtype)
            Sum_Aqk_fragment = T.alloc_fragment((block_H,), dtype=accum_dtype)
            Sum_Akk_fragment = T.alloc_fragment((block_H,), dtype=accum_dtype)

            T.copy(Q[bb, bs, bh * block_H : (bh + 1) * block_H, :], Q_i_shared)
            T.copy(K[bb, bs, bh * block_H : (bh + 1) * block_H, :], K_i_shared)
            T.copy(GK[bb, bs, bh * block_H : (bh + 1) * block_H, :], GK_i_shared)

            T.disable_warp_group_reg_alloc()
            for i_h in T.Parallel(block_H):
                Beta_shared[i_h] = Beta[bb, bs, bh * block_H + i_h]

            for i_h, i_k in T.Parallel(block_H, DK):
                K_i_fragment[i_h, i_k] = K_i_shared[i_h, i_k] * Beta_shared[i_h]
                Q_i_fragment[i_h, i_k] = Q_i_shared[i_h, i_k]

            T.clear(Sum_Akk_shared)
            T.clear(Sum_Aqk_shared)

            for d in T.Pipelined(loops, num_stages=num_stages):
                j = d + i_ts
                T.copy(K[bb, j, bh * block_H : (bh + 1) * block_H, :], K_j_shared)
                T.copy(GK[bb, j, bh * block_H : (bh + 1) * block_H, :], GK_j_shared)
                for i_h, i_k in T.Parallel(block_H, DK):
                    K_j_fragment[i_h, i_k] = K_j_shared[i_h, i_k] * T.exp2(GK_i_shared[i_h, i_k] - GK_j_shared[i_h, i_k])
                    Aqk_shared[i_h, i_k] = Q_i_fragment[i_h, i_k] * K_j_fragment[i_h, i_k]
                    Akk_shared[i_h, i_k] = K_i_fragment[i_h, i_k] * K_j_fragment[i_h, i_k]

                T.reduce_sum(Aqk_shared, Sum_Aqk_fragment, dim=-1, clear=True)
                T.reduce_sum(Akk_shared, Sum_Akk_fragment, dim=-1, clear=True)

                T.copy(Sum_Aqk_fragment, Sum_Aqk_shared[:, j % CS])

                if j < bs:
                    T.copy(Sum_Akk_fragment, Sum_Akk_shared[:, d])

            T.copy(Sum_Aqk_shared, Aqk[bb, bs, bh * block_H : (bh + 1) * block_H, :])
            T.copy(Sum_Akk_shared, Akk[bb, bs, bh * block_H : (bh + 1) * block_H, :])

    return kda_intra_token


def inputs(problem, device):
    import torch
    import torch.nn.functional as F

    B, S, H, DK, CS, SCS = (problem[k] for k in ("B", "S", "H", "DK", "chunk_size", "sub_chunk_size"))
    dtype = getattr(torch, problem["dtype"])
    q = torch.randn(B, S, H, DK, device=device, dtype=dtype)
    k = torch.randn(B, S, H, DK, device=device, dtype=dtype)
    beta = torch.randn(B, S, H, device=device, dtype=dtype)
    # chunk_local_cumsum(logsigmoid(N(0, 1))): the gates summed within each chunk (the last one may be short)
    steps = F.logsigmoid(torch.randn(B, S, H, DK, device=device))
    pad = -S % CS
    steps = F.pad(steps, (0, 0, 0, 0, 0, pad)).reshape(B, (S + pad) // CS, CS, H, DK)
    g = steps.cumsum(2).reshape(B, S + pad, H, DK)[:, :S].contiguous()
    aqk = torch.empty(B, S, H, CS, device=device, dtype=dtype)
    akk = torch.empty(B, S, H, SCS, device=device, dtype=dtype)
    return [q, k, g, beta, aqk, akk]


def reference(problem, args):
    import torch
    import torch.nn.functional as F

    dtype = getattr(torch, problem["dtype"])
    CS, SCS = problem["chunk_size"], problem["sub_chunk_size"]
    q, k, g, beta = (a.float() for a in args[:4])
    B, S, H, DK = q.shape
    kb = (k * beta[..., None]).to(dtype).float()  # the kernel's k * beta is a 16-bit fragment
    # sub-chunks of SCS tokens (chunk_size is a multiple of SCS, so none straddles a chunk)
    pad = -S % SCS
    n = (S + pad) // SCS
    q, k, g, kb = (F.pad(t, (0, 0, 0, 0, 0, pad)).reshape(B, n, SCS, H, DK) for t in (q, k, g, kb))
    # exp2(g_t - g_j) = exp2(g_t - g_0) * exp2(g_0 - g_j), g_0 the sub-chunk's first token's gate:
    # within a sub-chunk the exponents stay small
    g = g - g[:, :, :1]
    kg = k * torch.exp2(-g)  # [b, n, j, h, k]
    aqk = torch.einsum("bnthk,bnjhk->bnthj", q * torch.exp2(g), kg)
    akk = torch.einsum("bnthk,bnjhk->bnthj", kb * torch.exp2(g), kg)
    t = torch.arange(SCS, device=q.device)
    aqk = aqk * (t[None, :] <= t[:, None])[:, None, :]  # [t, 1, j]: j <= t
    akk = akk * (t[None, :] < t[:, None])[:, None, :]  # j < t
    akk = akk.reshape(B, n * SCS, H, SCS)[:, :S]
    # Aqk's row holds the sub-chunk's SCS columns at their place in the chunk
    aqk = aqk.reshape(B, n * SCS, H, SCS)[:, :S]
    full = aqk.new_zeros(B, S, H, CS)
    offset = (torch.arange(S, device=q.device) % CS) // SCS * SCS  # the token's sub-chunk's first column
    cols = offset[None, :, None, None] + t  # [1, S, 1, SCS]
    full.scatter_(3, cols.expand(B, S, H, SCS), aqk)
    return [full, akk]


def flops(problem):
    # per token, head and earlier-or-same token of its sub-chunk (on average (SCS + 1) / 2 of
    # them): the gated key (a subtraction and a product per channel) and two dot products over DK
    B, S, H, DK, SCS = (problem[k] for k in ("B", "S", "H", "DK", "sub_chunk_size"))
    return 6.0 * B * S * H * DK * (SCS + 1) / 2


def bytes_moved(problem):
    # q, k (16-bit) and g (fp32) read once, beta once; Aqk and Akk (16-bit) written once
    B, S, H, DK, CS, SCS = (problem[k] for k in ("B", "S", "H", "DK", "chunk_size", "sub_chunk_size"))
    return B * S * H * (DK * (2 + 2 + 4) + 2 + 2 * (CS + SCS))
