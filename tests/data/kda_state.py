"""kda_state: Kimi Delta Attention's chunk recurrence (the forward pass's hidden states), as
tilelang's examples/kda/chunk_delta_h_fwd.py writes it (FLA's chunk_gated_delta_rule_fwd_h
with per-channel gates, use_exp2, an initial state, the final state and V_new saved). Each
block owns a DK x block_DV slice of one head's state S and walks the chunks in order; per
chunk it stores S as that chunk's h, computes V_new = U - W S, decays each key row of S by
exp2 of its channel's gate at the chunk's last token, and adds K^T V_new to S.

For a schedule tuner: the same recurrence as gdn_state (the state carried in an fp32
fragment and handed to the next trip's MMA through a shared tile written at the loop's end,
and stored to h from that tile at the trip's top), with the gate a vector: the last token's
DK gates are copied from global memory into a shared vector by a T.copy each trip and read
by the element-wise decay of the fragment, indexed by its row; V_new is not decayed.
role_based gives it no seed as written (b_h_shared is touched by three roles: the h store's,
the MMAs' and the writer's); ws-tune takes the h store from the fragment, which the tile
holds then, as for gdn_state, and the Worker runs it.

    ws-tune tests/data/kda_state.py --shape B=1,S=8192,H=64 --budget 16
"""

import tilelang.language as T

PROBLEM = {"B": None, "S": None, "H": None, "DK": 128, "DV": 128, "chunk_size": 64, "dtype": "float16"}
CHOICES = {"dtype": ["float16", "bfloat16"]}
# the example's autotuner values for the parameters the kernel uses (block_DK is not: each
# block holds all DK rows of its state), num_stages with the 0 its run_test defaults to
PARAMS = {"block_DV": [32, 64, 128], "num_stages": [0, 1, 2], "threads": [128, 256]}
OUTPUTS = [5, 6, 7]  # h, final_state, V_new
TOLERANCE = 2e-2


def check(problem, params, schedule):
    if problem["S"] % problem["chunk_size"]:
        return f"S={problem['S']} is not a multiple of chunk_size={problem['chunk_size']}"
    if problem["DV"] % params["block_DV"]:
        return f"DV={problem['DV']} is not a multiple of block_DV={params['block_DV']}"
    return None


def kernel(problem, *, block_DV, num_stages, threads):
    B, S, H, DK, DV, block_S = (problem[k] for k in ("B", "S", "H", "DK", "DV", "chunk_size"))
    BS = S // block_S
    input_dtype = output_dtype = problem["dtype"]
    accum_dtype, gate_dtype, state_dtype = "float32", "float32", "float32"

    @T.prim_func
    def kda_state(K: T.Tensor((B, S, H, DK), input_dtype), W: T.Tensor((B, S, H, DK), input_dtype),
                  U: T.Tensor((B, S, H, DV), input_dtype), GK: T.Tensor((B, S, H, DK), gate_dtype),
                  initial_state: T.Tensor((B, H, DK, DV), input_dtype), h: T.Tensor((B, BS, H, DK, DV), output_dtype),
                  final_state: T.Tensor((B, H, DK, DV), state_dtype), V_new: T.Tensor((B, S, H, DV), output_dtype)):  # fmt: skip
        with T.Kernel(T.ceildiv(DV, block_DV), B * H, threads=threads) as (bv, bbh):
            bb, bh = bbh // H, bbh % H
            b_h_shared = T.alloc_shared((DK, block_DV), dtype=input_dtype)
            b_h_fragment = T.alloc_fragment((DK, block_DV), dtype=accum_dtype)
            U_shared = T.alloc_shared((block_S, block_DV), dtype=input_dtype)
            U_fragment = T.alloc_fragment((block_S, block_DV), dtype=accum_dtype)
            W_shared = T.alloc_shared((block_S, DK), dtype=input_dtype)
            V_new_fragment = T.alloc_fragment((block_S, block_DV), dtype=accum_dtype)
            V_new_shared = T.alloc_shared((block_S, block_DV), dtype=output_dtype)
            K_shared = T.alloc_shared((block_S, DK), dtype=input_dtype)
            GK_last_shared = T.alloc_shared((DK,), dtype=gate_dtype)

            T.copy(initial_state[bb, bh, 0:DK, bv * block_DV : (bv + 1) * block_DV], b_h_shared)
            T.copy(b_h_shared, b_h_fragment)
            for i_s in T.Pipelined(T.ceildiv(S, block_S), num_stages=num_stages):
                # the state at the chunk's start, as the epilogue of the last trip left it
                T.copy(b_h_shared, h[bb, i_s, bh, :, bv * block_DV : (bv + 1) * block_DV])
                T.copy(W[bb, i_s * block_S : (i_s + 1) * block_S, bh, :], W_shared)
                T.gemm(W_shared, b_h_shared, V_new_fragment, clear_accum=True)
                T.copy(U[bb, i_s * block_S : (i_s + 1) * block_S, bh, bv * block_DV : (bv + 1) * block_DV], U_shared)
                T.copy(U_shared, U_fragment)
                for i_s2, i_v in T.Parallel(block_S, block_DV):
                    V_new_fragment[i_s2, i_v] = -V_new_fragment[i_s2, i_v] + U_fragment[i_s2, i_v]
                T.copy(V_new_fragment, dst=V_new_shared)
                T.copy(V_new_shared, V_new[bb, i_s * block_S : (i_s + 1) * block_S, bh, bv * block_DV : (bv + 1) * block_DV])
                T.copy(K[bb, i_s * block_S : (i_s + 1) * block_S, bh, 0:DK], K_shared)
                T.copy(GK[bb, (i_s + 1) * block_S - 1, bh, :], GK_last_shared)  # the chunk's last token
                for i_k, i_v in T.Parallel(DK, block_DV):
                    b_h_fragment[i_k, i_v] *= T.exp2(GK_last_shared[i_k])
                T.copy(V_new_fragment, V_new_shared)
                T.gemm(K_shared, V_new_shared, b_h_fragment, transpose_A=True)
                T.copy(b_h_fragment, b_h_shared)
            T.copy(b_h_fragment, final_state[bb, bh, 0:DK, bv * block_DV : (bv + 1) * block_DV])

    return kda_state


def inputs(problem, device):
    import torch
    import torch.nn.functional as F

    B, S, H, DK, DV, chunk = (problem[k] for k in ("B", "S", "H", "DK", "DV", "chunk_size"))
    dtype = getattr(torch, problem["dtype"])
    k, w = (F.normalize(torch.randn(B, S, H, DK, device=device), dim=-1).to(dtype) for _ in range(2))
    u = F.normalize(torch.randn(B, S, H, DV, device=device), dim=-1).to(dtype)
    # per-channel log2-gates summed within each chunk (chunk_local_cumsum). The example's
    # logsigmoid of N(0, 1) sums to about -50 over a chunk, so that no state survives one;
    # here each key channel gets its own rate, leaving between 0.03 and 0.85 of a row per chunk
    rate = torch.empty(B, 1, 1, H, DK, device=device).uniform_(0.005, 0.1)
    steps = F.logsigmoid(torch.randn(B, S // chunk, chunk, H, DK, device=device)) * rate
    g = steps.cumsum(2).reshape(B, S, H, DK).contiguous()
    state = torch.randn(B, H, DK, DV, device=device).to(dtype)
    h = torch.empty(B, S // chunk, H, DK, DV, device=device, dtype=dtype)
    final_state = torch.empty(B, H, DK, DV, device=device)
    v_new = torch.empty(B, S, H, DV, device=device, dtype=dtype)
    return [k, w, u, g, state, h, final_state, v_new]


def reference(problem, args):
    import torch

    dtype = getattr(torch, problem["dtype"])
    k, w, u, g, state = (a.float() for a in args[:5])
    chunk = problem["chunk_size"]
    hs, v_new = [], torch.empty_like(u)
    for c in range(0, k.shape[1], chunk):
        # the kernel's h store and its MMA read the state through a 16-bit shared tile
        seen = state.to(dtype).float()
        hs.append(seen)
        part = u[:, c : c + chunk] - torch.einsum("bshk,bhkv->bshv", w[:, c : c + chunk], seen)
        v_new[:, c : c + chunk] = part
        decay = torch.exp2(g[:, c + chunk - 1])  # (B, H, DK): each key row's gate
        part = part.to(dtype).float()  # K^T V_new reads V_new from a 16-bit shared tile
        state = state * decay[..., None] + torch.einsum("bshk,bshv->bhkv", k[:, c : c + chunk], part)
    return [torch.stack(hs, 1), state, v_new]


def flops(problem):
    # two MMAs of chunk x DK x DV per chunk (W S and K^T V_new), per batch and head
    return 4.0 * problem["B"] * problem["S"] * problem["H"] * problem["DK"] * problem["DV"]
