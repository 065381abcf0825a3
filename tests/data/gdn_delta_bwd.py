"""gdn_delta_bwd: Gated DeltaNet's backward through the chunk recurrence (dh, dh0, dv2), as
tilelang's examples/gdn/example_chunk_delta_bwd.py writes it (FLA's
chunk_gated_delta_rule_bwd_dhu). Each block owns a DK x block_DV slice of one head's state
gradient dh and walks the chunks from the last to the first; per chunk it stores dh (the
gradient of the state the chunk writes), computes dv2 = exp(g_last - g) * (K dh) + dv, decays
dh by the chunk's last gate and adds (scale exp(g) Q)^T dO - W^T dv2. After the loop it stores
dh0, the initial state's gradient.

For a schedule tuner: a reverse-order recurrence whose state is carried in an fp32 fragment
and handed to the next trip's first MMA through a 16-bit shared tile written at the trip's top
(the same tile is stored to dh); three MMAs per trip, one of them tf32 with its A operand in
registers (Q gated and transposed element by element) and its B operand transposed through
registers into a tf32 shared tile (dO); a second MMA reads dv2's shared tile, which is also
stored to global memory; G's tile is copied without TMA and its last element read as a
scalar from shared memory. role_based gives it no seed as written (b_dh_shared is written by
the Worker, stored to dh by a Store role and then read by the Worker's MMA: "the body ends in
the producer's span"); ws-tune takes both stores (dh and dv2) from the fragments their tiles
were written from in the same trip, as it does gdn_state's from the last trip's.

Departures from the example: none in the kernel. use_g, use_initial_state and
use_final_state_gradient are problem arguments (they change what is computed, so the
reference must see them), not tuned parameters; use_initial_state is fixed at True: at False
the kernel leaves dh0 unwritten, which a fixed OUTPUTS list cannot express (h0 is an argument
the kernel never reads, as in the example). Inputs: the example's G (logsigmoid of N(0, 1),
summed within each chunk) reaches about -50 at a chunk's end, so that exp(g_last) ~ 1e-22
and no dh survives a chunk (the recurrence is then never tested); here each head gets a rate
that leaves about 0.05 to 0.75 of dh per chunk. With that, the example's W (N(0, 1),
independent of K) makes the recurrence dh <- (exp(g_last) I - W^T D K) dh grow without bound
(NaN before the first chunk at S=32768), so W is made as the model makes it (FLA's WY
representation, betas in (0, 1), with the gates: W = (I + tril(beta K K^T * exp(g_i - g_j),
-1))^-1 (beta exp(g) K)), under which that map is a product of contractions. Q, dO, dv and
dht are N(0, 1) as in the example.

    ws-tune tests/data/gdn_delta_bwd.py --shape B=1,S=32768,H=8 --budget 16
"""

import tilelang
import tilelang.language as T

PROBLEM = {"B": None, "S": None, "H": None, "DK": 128, "DV": 128, "chunk_size": 64, "dtype": "bfloat16",
           "use_g": True, "use_initial_state": True, "use_final_state_gradient": True}  # fmt: skip
CHOICES = {"dtype": ["bfloat16", "float16"], "use_g": [True, False], "use_initial_state": [True],
           "use_final_state_gradient": [True, False]}  # fmt: skip
# the example's kernel config: block_DV 64 (its default) and 32 (its main), threads 256 and
# 128, num_stages 0 and 1 (and 2, as the sibling recurrences try)
PARAMS = {"block_DV": [32, 64], "num_stages": [0, 1, 2], "threads": [128, 256]}
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
    use_g, use_initial_state, use_final_state_gradient = (problem[k] for k in ("use_g", "use_initial_state", "use_final_state_gradient"))
    input_dtype = output_dtype = problem["dtype"]
    accum_dtype, gate_dtype, state_dtype = "float32", "float32", "float32"
    scale = DK**-0.5

    block_S = chunk_size
    BS = S // block_S

    Q_shape = (B, S, H, DK)
    K_shape = (B, S, H, DK)
    W_shape = (B, S, H, DK)
    G_shape = (B, S, H)
    h0_shape = (B, H, DK, DV)
    dht_shape = (B, H, DK, DV)
    dO_shape = (B, S, H, DV)
    dv_shape = (B, S, H, DV)

    dh_shape = (B, BS, H, DK, DV)
    dh0_shape = (B, H, DK, DV)
    dv2_shape = (B, S, H, DV)

    @T.prim_func
    def gdn_delta_bwd(
        # Input
        Q: T.Tensor(Q_shape, dtype=input_dtype),
        K: T.Tensor(K_shape, dtype=input_dtype),
        W: T.Tensor(W_shape, dtype=input_dtype),
        G: T.Tensor(G_shape, dtype=gate_dtype),
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
            dO_shared_t = T.alloc_shared((block_DV, block_S), dtype=T.tfloat32)
            dO_fragment = T.alloc_fragment((block_S, block_DV), dtype=T.float32)
            dO_fragment_t = T.alloc_fragment((block_DV, block_S), dtype=T.tfloat32)
            K_shared = T.alloc_shared((block_S, DK), dtype=input_dtype)

            Q_shared = T.alloc_shared((block_S, DK), dtype=input_dtype)
            W_shared = T.alloc_shared((block_S, DK), dtype=input_dtype)

            G_shared = T.alloc_shared((block_S), dtype=gate_dtype, scope="shared")
            G_fragment = T.alloc_fragment((block_S), dtype=gate_dtype)
            G_fragment_post = T.alloc_fragment((block_S), dtype=gate_dtype)
            G_fragment_exp = T.alloc_fragment((block_S), dtype=gate_dtype)
            Q_fragment = T.alloc_fragment((block_S, DK), dtype=accum_dtype)
            Q_fragment_t = T.alloc_fragment((DK, block_S), dtype=T.tfloat32)

            T.use_swizzle(10)

            T.annotate_layout(
                {
                    dO_shared: tilelang.layout.make_swizzled_layout(dO_shared),
                    Q_shared: tilelang.layout.make_swizzled_layout(Q_shared),
                }
            )

            if use_final_state_gradient:
                T.copy(dht[bb, bh, 0:DK, bv * block_DV : (bv + 1) * block_DV], b_dh_shared)
                T.copy(b_dh_shared, b_dh_fragment)
            else:
                T.clear(b_dh_fragment)

            for i_s in T.Pipelined(T.ceildiv(S, block_S), num_stages=num_stages):
                # The gradient should be stored in the reverse order
                i_s_inv = T.ceildiv(S, block_S) - i_s - 1

                # Store the updated dh
                T.copy(b_dh_fragment, b_dh_shared)
                T.copy(b_dh_shared, dh[bb, i_s_inv, bh, 0:DK, bv * block_DV : (bv + 1) * block_DV])

                # Update dv
                T.copy(K[bb, i_s_inv * block_S : (i_s_inv + 1) * block_S, bh, 0:DK], K_shared)
                T.gemm(K_shared, b_dh_shared, dv_fragment, clear_accum=True)

                if use_g:
                    T.copy(G[bb, i_s_inv * block_S : (i_s_inv + 1) * block_S, bh], G_shared, disable_tma=True)
                    T.copy(G_shared, G_fragment)
                    G_last_local = G_shared[block_S - 1]
                    G_last_local_exp = T.exp(G_last_local)
                    for i_s2 in T.Parallel(block_S):
                        G_fragment_post[i_s2] = T.exp(G_last_local - G_fragment[i_s2])
                    for i_s2, i_v in T.Parallel(block_S, block_DV):
                        dv_fragment[i_s2, i_v] = (
                            dv_fragment[i_s2, i_v] * G_fragment_post[i_s2] if G_last_local - G_fragment[i_s2] <= 0 else 0
                        )

                T.copy(dv[bb, i_s_inv * block_S : (i_s_inv + 1) * block_S, bh, bv * block_DV : (bv + 1) * block_DV], dv_shared)
                T.copy(dv_shared, dv_fragment_2)
                for i_s2, i_v in T.Parallel(block_S, block_DV):
                    dv_fragment[i_s2, i_v] = dv_fragment[i_s2, i_v] + dv_fragment_2[i_s2, i_v]

                # Store the updated dv
                T.copy(dv_fragment, dv_shared)
                T.copy(dv_shared, dv2[bb, i_s_inv * block_S : (i_s_inv + 1) * block_S, bh, bv * block_DV : (bv + 1) * block_DV])

                # Update dh
                T.copy(Q[bb, i_s_inv * block_S : (i_s_inv + 1) * block_S, bh, 0:DK], Q_shared)
                T.copy(W[bb, i_s_inv * block_S : (i_s_inv + 1) * block_S, bh, 0:DK], W_shared)

                T.clear(Q_fragment)
                if use_g:
                    for i_k, i_v in T.Parallel(DK, block_DV):
                        b_dh_fragment[i_k, i_v] *= G_last_local_exp
                    T.copy(Q_shared, Q_fragment)
                    for i_s2 in T.Parallel(block_S):
                        G_fragment_exp[i_s2] = T.exp(G_shared[i_s2])
                    for i_s2, i_k in T.Parallel(block_S, DK):
                        Q_fragment[i_s2, i_k] = Q_fragment[i_s2, i_k] * G_fragment_exp[i_s2] * scale
                else:
                    T.copy(Q_shared, Q_fragment)
                    for i_s2, i_k in T.Parallel(block_S, DK):
                        Q_fragment[i_s2, i_k] = Q_fragment[i_s2, i_k] * scale
                # Get transpose of Q_fragment to meet tf32 gemm requirement
                for i_s2, i_k in T.Parallel(block_S, DK):
                    Q_fragment_t[i_k, i_s2] = Q_fragment[i_s2, i_k]

                T.copy(dO[bb, i_s_inv * block_S : (i_s_inv + 1) * block_S, bh, bv * block_DV : (bv + 1) * block_DV], dO_shared)
                T.copy(dO_shared, dO_fragment)
                for i_s2, i_v in T.Parallel(block_S, block_DV):
                    dO_fragment_t[i_v, i_s2] = dO_fragment[i_s2, i_v]
                T.copy(dO_fragment_t, dO_shared_t)

                T.clear(b_dh_fragment_1)
                T.gemm(Q_fragment_t, dO_shared_t, b_dh_fragment_1, transpose_B=True)
                T.clear(b_dh_fragment_2)
                T.gemm(W_shared, dv_shared, b_dh_fragment_2, transpose_A=True)
                for i_k, i_v in T.Parallel(DK, block_DV):
                    b_dh_fragment[i_k, i_v] += b_dh_fragment_1[i_k, i_v] - b_dh_fragment_2[i_k, i_v]

            if use_initial_state:
                T.copy(b_dh_fragment, dh0[bb, bh, 0:DK, bv * block_DV : (bv + 1) * block_DV])

    return gdn_delta_bwd


def inputs(problem, device):
    import torch
    import torch.nn.functional as F

    B, S, H, DK, DV, chunk = (problem[k] for k in ("B", "S", "H", "DK", "DV", "chunk_size"))
    dtype = getattr(torch, problem["dtype"])
    NC = S // chunk
    q = torch.randn(B, S, H, DK, device=device)
    k = F.normalize(torch.randn(B, S, H, DK, device=device), dim=-1)
    # log-gates summed within each chunk (chunk_local_cumsum), each head at its own rate:
    # exp(g_last) between about 0.05 and 0.75 (the example's rate 1 gives ~1e-22)
    rate = torch.empty(B, 1, 1, H, device=device).uniform_(0.005, 0.06)
    g = (F.logsigmoid(torch.randn(B, NC, chunk, H, device=device)) * rate).cumsum(2)
    # W as the model makes it (WY representation of the chunk's delta rule)
    beta = torch.sigmoid(torch.randn(B, NC, chunk, H, device=device))
    kc = k.view(B, NC, chunk, H, DK).permute(0, 1, 3, 2, 4)  # B, NC, H, chunk, DK
    gc, bc = g.permute(0, 1, 3, 2), beta.permute(0, 1, 3, 2)  # B, NC, H, chunk
    decay = torch.exp(gc[..., :, None] - gc[..., None, :]).tril(-1)  # exp(g_i - g_j), i > j
    a = bc[..., :, None] * (kc @ kc.transpose(-1, -2)) * decay
    eye = torch.eye(chunk, device=device).expand_as(a)
    w = torch.linalg.solve_triangular(eye + a, (bc * torch.exp(gc))[..., None] * kc, upper=False, unitriangular=True)
    w = w.permute(0, 1, 3, 2, 4).reshape(B, S, H, DK)
    g = g.reshape(B, S, H).contiguous()
    h0 = torch.randn(B, H, DK, DV, device=device).to(dtype)
    dht = torch.randn(B, H, DK, DV, device=device).to(dtype)
    do = torch.randn(B, S, H, DV, device=device).to(dtype)
    dv = torch.randn(B, S, H, DV, device=device).to(dtype)
    dh = torch.empty(B, NC, H, DK, DV, device=device, dtype=dtype)
    dh0 = torch.empty(B, H, DK, DV, device=device)
    dv2 = torch.empty(B, S, H, DV, device=device, dtype=dtype)
    return [q.to(dtype), k.to(dtype), w.contiguous().to(dtype), g, h0, dht, do, dv, dh, dh0, dv2]


def reference(problem, args):
    import torch

    dtype = getattr(torch, problem["dtype"])
    q, k, w, g, _h0, dht, do, dv = (a.float() for a in args[:8])
    B, S, H, DK = q.shape
    chunk, scale = problem["chunk_size"], DK**-0.5
    use_g = problem["use_g"]
    state = dht.clone() if problem["use_final_state_gradient"] else torch.zeros_like(dht)
    dh = torch.empty(B, S // chunk, H, DK, dht.shape[-1], device=q.device)
    dv2 = torch.empty_like(dv)
    for c in reversed(range(S // chunk)):
        t = slice(c * chunk, (c + 1) * chunk)
        seen = state.to(dtype).float()  # the MMA and the dh store read the state through a 16-bit shared tile
        dh[:, c] = seen
        part = torch.einsum("bshk,bhkv->bshv", k[:, t], seen)
        qg = q[:, t] * scale
        if use_g:
            gate = g[:, t]
            last = gate[:, -1:]
            part = part * torch.where(last - gate <= 0, torch.exp(last - gate), 0.0)[..., None]
            state = state * torch.exp(last[:, 0])[..., None, None]
            qg = qg * torch.exp(gate)[..., None]
        part = (part + dv[:, t]).to(dtype).float()  # dv2, and W^T dv2 reads it from a 16-bit shared tile
        dv2[:, t] = part
        state = state + torch.einsum("bshk,bshv->bhkv", qg, do[:, t]) - torch.einsum("bshk,bshv->bhkv", w[:, t], part)
    return [dh, state, dv2]


def flops(problem):
    # three MMAs of chunk x DK x DV per chunk (K dh, Q^T dO, W^T dv2), per batch and head
    return 6.0 * problem["B"] * problem["S"] * problem["H"] * problem["DK"] * problem["DV"]
