"""kda_delta_bwd: Kimi Delta Attention's backward through the chunk recurrence (dh, dh0, dv2;
per-channel gates), as tilelang's examples/kda/chunk_delta_bwd.py writes it (FLA's
chunk_gated_delta_rule_bwd_dhu with gk, use_exp2). Each block owns a DK x block_DV slice of
one head's state gradient dh and walks the chunks from the last to the first; per chunk it
stores dh (the gradient of the state the chunk writes), computes dv2 = K dh + dv, decays each
key row of dh by exp2 of its channel's gate at the chunk's last token and adds
scale Q^T dO - W^T dv2. After the loop it stores dh0, the initial state's gradient.

For a schedule tuner: a reverse-order recurrence whose state is carried in an fp32 fragment
and handed to the trip's first MMA (K dh) through a 16-bit shared tile written at the trip's
top, the same tile being stored to dh; five tile loads per trip (K, dv, Q, W, dO) and a 1-D
copy of the last token's DK gates into a shared vector, read by the element-wise decay of the
fragment, indexed by its row; three MMAs per trip, two of them with A transposed (Q^T dO,
W^T dv2) into fragments of their own that an element-wise update folds into the state. dv's
shared tile is loaded from dv, read into a fragment, then overwritten with dv2 from the first
MMA's fragment, stored to dv2 and read by the W^T dv2 MMA: one shared tile, two values per
trip. Unlike gdn_delta_bwd there is no tf32 MMA and no transposition through registers, and
dv2 is not gated (the model passes K already gated, k * exp2(g_last - g)).

Departures from the example: none in the kernel. use_gk, use_initial_state and
use_final_state_gradient are problem arguments (they change what is computed, so the
reference must see them), not tuned parameters; use_initial_state is fixed at True: at False
the kernel leaves dh0 unwritten, which a fixed OUTPUTS list cannot express (h0 is an argument
the kernel never reads, as in the example). The example's autotune space is kept whole
(block_DV 32/64/128, threads 32/64/128/256, num_stages 0-4). Inputs: the example's gates
(logsigmoid of N(0, 1), summed within each chunk) reach about -50 at a chunk's end, so that
no dh survives a chunk; here each key channel gets its own rate, leaving about 0.03 to 0.85
of a row per chunk (as kda_state). The example's W (N(0, 1), independent of K) makes the
recurrence dh <- (diag(exp2(g_last)) - W^T K) dh grow without bound, so W and K are made as
the model makes them (FLA's KDA WY representation, betas in (0, 1), unit-norm keys, log2
gates): W = (I + tril(beta_i sum_d k_id k_jd exp2(g_id - g_jd), -1))^-1 (beta exp2(g) k) and
K = k * exp2(g_last - g), under which that map is the transpose of a product of
contractions. Q is the gated query q * exp2(g), q, dO, dv and dht are N(0, 1) (the example
scales Q and dO by 0.01).

    ws-tune tests/data/kda_delta_bwd.py --shape B=1,S=8192,H=64 --budget 16
"""

import tilelang.language as T

PROBLEM = {"B": None, "S": None, "H": None, "DK": 128, "DV": 128, "chunk_size": 64, "dtype": "bfloat16",
           "use_gk": True, "use_initial_state": True, "use_final_state_gradient": True}  # fmt: skip
CHOICES = {"dtype": ["bfloat16", "float16"], "use_gk": [True, False], "use_initial_state": [True],
           "use_final_state_gradient": [True, False]}  # fmt: skip
# the example's autotuner space (get_configs): block_DV, threads, num_stages
PARAMS = {"block_DV": [32, 64, 128], "num_stages": [0, 1, 2, 3, 4], "threads": [32, 64, 128, 256]}
OUTPUTS = [8, 9, 10]  # dh, dh0, dv2
TOLERANCE = 2e-2


def check(problem, params, schedule):
    if problem["S"] % problem["chunk_size"]:
        return f"S={problem['S']} is not a multiple of chunk_size={problem['chunk_size']}"
    if problem["DV"] % params["block_DV"]:
        return f"DV={problem['DV']} is not a multiple of block_DV={params['block_DV']}"
    return None


def kernel(problem, *, block_DV, num_stages, threads):
    B, S, H, DK, DV, chunk_size = (problem[k] for k in ("B", "S", "H", "DK", "DV", "chunk_size"))
    use_gk, use_initial_state, use_final_state_gradient = (problem[k] for k in ("use_gk", "use_initial_state", "use_final_state_gradient"))
    input_dtype = output_dtype = problem["dtype"]
    accum_dtype, gate_dtype, state_dtype = "float32", "float32", "float32"
    scale = DK**-0.5

    block_S = chunk_size
    BS = S // block_S

    Q_shape = (B, S, H, DK)
    K_shape = (B, S, H, DK)
    W_shape = (B, S, H, DK)
    G_shape = (B, S, H, DK)
    h0_shape = (B, H, DK, DV)
    dht_shape = (B, H, DK, DV)
    dO_shape = (B, S, H, DV)
    dv_shape = (B, S, H, DV)

    dh_shape = (B, BS, H, DK, DV)
    dh0_shape = (B, H, DK, DV)
    dv2_shape = (B, S, H, DV)

    @T.prim_func
    def kda_delta_bwd(
        # Input
        Q: T.Tensor(Q_shape, dtype=input_dtype),
        K: T.Tensor(K_shape, dtype=input_dtype),
        W: T.Tensor(W_shape, dtype=input_dtype),
        GK: T.Tensor(G_shape, dtype=gate_dtype),
        h0: T.Tensor(h0_shape, dtype=input_dtype),
        dht: T.Tensor(dht_shape, dtype=input_dtype),
        dO: T.Tensor(dO_shape, dtype=input_dtype),
        dv: T.Tensor(dv_shape, dtype=input_dtype),
        # Output
        dh: T.Tensor(dh_shape, dtype=output_dtype),
        dh0: T.Tensor(dh0_shape, dtype=state_dtype),
        dv2: T.Tensor(dv2_shape, dtype=output_dtype),
    ):
        with T.Kernel(T.ceildiv(DV, block_DV), B * H, threads=threads) as (bv, bbh):
            bb, bh = bbh // H, bbh % H

            b_dh_shared = T.alloc_shared((DK, block_DV), dtype=output_dtype)
            b_dh_fragment = T.alloc_fragment((DK, block_DV), dtype=accum_dtype)
            b_dh_fragment_1 = T.alloc_fragment((DK, block_DV), dtype=accum_dtype)
            b_dh_fragment_2 = T.alloc_fragment((DK, block_DV), dtype=accum_dtype)
            dv_shared = T.alloc_shared((block_S, block_DV), dtype=input_dtype)
            dv_fragment = T.alloc_fragment((block_S, block_DV), dtype=accum_dtype)
            dv_fragment_2 = T.alloc_fragment((block_S, block_DV), dtype=accum_dtype)
            dO_shared = T.alloc_shared((block_S, block_DV), dtype=input_dtype)
            K_shared = T.alloc_shared((block_S, DK), dtype=input_dtype)

            Q_shared = T.alloc_shared((block_S, DK), dtype=input_dtype)
            W_shared = T.alloc_shared((block_S, DK), dtype=input_dtype)

            GK_last_shared = T.alloc_shared((DK,), dtype=gate_dtype)

            if use_final_state_gradient:
                T.copy(dht[bb, bh, 0:DK, bv * block_DV : (bv + 1) * block_DV], b_dh_shared)
                T.copy(b_dh_shared, b_dh_fragment)
            else:
                T.clear(b_dh_fragment)

            for i_s in T.Pipelined(T.ceildiv(S, block_S), num_stages=num_stages):
                # The gradient should be stored in the reverse order
                i_s_inv = T.ceildiv(S, block_S) - i_s - 1  # reverse indices
                # Store the updated dh
                T.copy(b_dh_fragment, b_dh_shared)
                T.copy(b_dh_shared, dh[bb, i_s_inv, bh, 0:DK, bv * block_DV : (bv + 1) * block_DV])

                # Update dv
                T.copy(K[bb, i_s_inv * block_S : (i_s_inv + 1) * block_S, bh, 0:DK], K_shared)
                T.gemm(K_shared, b_dh_shared, dv_fragment, clear_accum=True)
                T.copy(
                    dv[bb, i_s_inv * block_S : (i_s_inv + 1) * block_S, bh, bv * block_DV : (bv + 1) * block_DV], dv_shared
                )  # copy old dv
                T.copy(dv_shared, dv_fragment_2)
                for i_s2, i_v in T.Parallel(block_S, block_DV):
                    dv_fragment[i_s2, i_v] = dv_fragment[i_s2, i_v] + dv_fragment_2[i_s2, i_v]
                # Store the updated dv
                T.copy(dv_fragment, dv_shared)
                T.copy(dv_shared, dv2[bb, i_s_inv * block_S : (i_s_inv + 1) * block_S, bh, bv * block_DV : (bv + 1) * block_DV])

                # Update dh
                T.copy(Q[bb, i_s_inv * block_S : (i_s_inv + 1) * block_S, bh, 0:DK], Q_shared)  # [block_S, DK]
                T.copy(W[bb, i_s_inv * block_S : (i_s_inv + 1) * block_S, bh, 0:DK], W_shared)  # [block_S, DK]
                T.copy(
                    dO[bb, i_s_inv * block_S : (i_s_inv + 1) * block_S, bh, bv * block_DV : (bv + 1) * block_DV], dO_shared
                )  # [block_S, block_DV]

                if use_gk:
                    last_idx = T.min((i_s_inv + 1) * block_S, S) - 1  # chunk last token gk
                    T.copy(GK[bb, last_idx, bh, :], GK_last_shared)
                    for i_k, i_v in T.Parallel(DK, block_DV):
                        b_dh_fragment[i_k, i_v] *= T.exp2(GK_last_shared[i_k])

                T.gemm(Q_shared, dO_shared, b_dh_fragment_1, transpose_A=True, clear_accum=True)  # [DK, block_DV]

                # dv_shared: [block_S, block_DV]
                T.gemm(W_shared, dv_shared, b_dh_fragment_2, transpose_A=True, clear_accum=True)  # [DK, block_DV]
                for i_k, i_v in T.Parallel(DK, block_DV):
                    b_dh_fragment[i_k, i_v] += b_dh_fragment_1[i_k, i_v] * scale - b_dh_fragment_2[i_k, i_v]

            if use_initial_state:
                T.copy(b_dh_fragment, dh0[bb, bh, 0:DK, bv * block_DV : (bv + 1) * block_DV])

    return kda_delta_bwd


def inputs(problem, device):
    import torch
    import torch.nn.functional as F

    B, S, H, DK, DV, chunk = (problem[k] for k in ("B", "S", "H", "DK", "DV", "chunk_size"))
    dtype = getattr(torch, problem["dtype"])
    NC = S // chunk
    k = F.normalize(torch.randn(B, NC, chunk, H, DK, device=device), dim=-1)
    # per-channel log2-gates summed within each chunk (chunk_local_cumsum), each key channel at
    # its own rate: between about 0.03 and 0.85 of a row of dh survives a chunk
    rate = torch.empty(B, 1, 1, H, DK, device=device).uniform_(0.005, 0.1)
    g = (F.logsigmoid(torch.randn(B, NC, chunk, H, DK, device=device)) * rate).cumsum(2)
    beta = torch.sigmoid(torch.randn(B, NC, chunk, H, device=device))
    # W and K as the model makes them (FLA's KDA WY representation of the chunk's delta rule):
    # exp2(g_i - g_j) per channel, split as (k_i exp2(g_i)) . (k_j exp2(-g_j))
    kc, gc = k.permute(0, 1, 3, 2, 4), g.permute(0, 1, 3, 2, 4)  # B, NC, H, chunk, DK
    bc = beta.permute(0, 1, 3, 2)[..., None]  # B, NC, H, chunk, 1
    a = (bc * (kc * torch.exp2(gc)) @ (kc * torch.exp2(-gc)).transpose(-1, -2)).tril(-1)
    eye = torch.eye(chunk, device=device).expand_as(a)
    w = torch.linalg.solve_triangular(eye + a, bc * torch.exp2(gc) * kc, upper=False, unitriangular=True)
    kg = kc * torch.exp2(gc[..., -1:, :] - gc)  # the key gated to the chunk's last token
    q = torch.randn(B, NC, H, chunk, DK, device=device) * torch.exp2(gc)  # the gated query
    q, kg, w = (t.permute(0, 1, 3, 2, 4).reshape(B, S, H, DK).contiguous().to(dtype) for t in (q, kg, w))
    g = g.reshape(B, S, H, DK).contiguous()
    h0 = torch.randn(B, H, DK, DV, device=device).to(dtype)
    dht = torch.randn(B, H, DK, DV, device=device).to(dtype)
    do = torch.randn(B, S, H, DV, device=device).to(dtype)
    dv = torch.randn(B, S, H, DV, device=device).to(dtype)
    dh = torch.empty(B, NC, H, DK, DV, device=device, dtype=dtype)
    dh0 = torch.empty(B, H, DK, DV, device=device)
    dv2 = torch.empty(B, S, H, DV, device=device, dtype=dtype)
    return [q, kg, w, g, h0, dht, do, dv, dh, dh0, dv2]


def reference(problem, args):
    import torch

    dtype = getattr(torch, problem["dtype"])
    q, k, w, g, _h0, dht, do, dv = (a.float() for a in args[:8])
    B, S, H, DK = q.shape
    chunk, scale = problem["chunk_size"], DK**-0.5
    state = dht.clone() if problem["use_final_state_gradient"] else torch.zeros_like(dht)
    dh = torch.empty(B, S // chunk, H, DK, dht.shape[-1], device=q.device)
    dv2 = torch.empty_like(dv)
    for c in reversed(range(S // chunk)):
        t = slice(c * chunk, (c + 1) * chunk)
        seen = state.to(dtype).float()  # the dh store and the K dh MMA read the state through a 16-bit shared tile
        dh[:, c] = seen
        part = torch.einsum("bshk,bhkv->bshv", k[:, t], seen) + dv[:, t]
        part = part.to(dtype).float()  # dv2, and W^T dv2 reads it from a 16-bit shared tile
        dv2[:, t] = part
        if problem["use_gk"]:
            state = state * torch.exp2(g[:, c * chunk + chunk - 1])[..., None]  # (B, H, DK): each key row's gate
        state = state + torch.einsum("bshk,bshv->bhkv", q[:, t], do[:, t]) * scale - torch.einsum("bshk,bshv->bhkv", w[:, t], part)
    return [dh, state, dv2]


def flops(problem):
    # three MMAs of chunk x DK x DV per chunk (K dh, Q^T dO, W^T dv2), per batch and head
    return 6.0 * problem["B"] * problem["S"] * problem["H"] * problem["DK"] * problem["DV"]
