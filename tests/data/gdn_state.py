"""gdn_state: the gated delta rule's chunk recurrence (Gated DeltaNet, the forward pass's
hidden states) as tilelang's examples/gdn/example_chunk_delta_h.py writes it: each block
owns a DK x block_DV slice of one head's state and walks the chunks in order; per chunk it
stores the state (h), computes V_new = U - W S, decays V_new and S by the chunk's gates,
and adds K^T V_new to S. The state is carried across the loop in an fp32 fragment and
handed to the next chunk's MMA through a shared buffer written at the loop's end; the
gate is a scalar variable; G's tile is filled element by element from global memory.
role_based gives it no seed as written (the state's shared buffer is touched by three
roles: the h store's, the MMA's and the writer's); ws-tune takes the h store from the
fragment, which the tile holds then (stop 41), and the Worker runs it. tilelang's own
lowerings are right only at num_stages=0 on the H200 (run 27), as the example runs it (at
1 and 2 stages every one is WRONG, NaN at 2).

    ws-tune tests/data/gdn_state.py --shape B=8,S=4096,H=16 --budget 16
"""

import tilelang
import tilelang.language as T

PROBLEM = {"B": None, "S": None, "H": None, "DK": 128, "DV": 128, "chunk": 64}
PARAMS = {"block_DV": [32, 64, 128], "num_stages": [0, 1, 2], "threads": [128, 256]}
OUTPUTS = [5, 6, 7]
TOLERANCE = 2e-2
LOG2E = 1.442695


def check(problem, params, schedule):
    if problem["S"] % problem["chunk"]:
        return f"S={problem['S']} is not a multiple of chunk={problem['chunk']}"
    if problem["DV"] % params["block_DV"]:
        return f"DV={problem['DV']} is not a multiple of block_DV={params['block_DV']}"
    return None


def kernel(problem, *, block_DV, num_stages, threads):
    B, S, H, DK, DV, block_S = (problem[k] for k in ("B", "S", "H", "DK", "DV", "chunk"))
    dtype, accum = "float16", "float32"

    @T.prim_func
    def gdn_state(K: T.Tensor((B, S, H, DK), dtype), W: T.Tensor((B, S, H, DK), dtype), U: T.Tensor((B, S, H, DV), dtype),
                  G: T.Tensor((B, S, H), accum), initial_state: T.Tensor((B, H, DK, DV), dtype),
                  h: T.Tensor((B, S // block_S, H, DK, DV), dtype), final_state: T.Tensor((B, H, DK, DV), accum),
                  V_new: T.Tensor((B, S, H, DV), dtype)):  # fmt: skip
        with T.Kernel(T.ceildiv(DV, block_DV), B * H, threads=threads) as (bv, bbh):
            bb, bh = bbh // H, bbh % H
            b_h_shared = T.alloc_shared((DK, block_DV), dtype)
            b_h_fragment = T.alloc_fragment((DK, block_DV), accum)
            U_shared = T.alloc_shared((block_S, block_DV), dtype)
            U_fragment = T.alloc_fragment((block_S, block_DV), accum)
            W_shared = T.alloc_shared((block_S, DK), dtype)
            V_new_fragment = T.alloc_fragment((block_S, block_DV), accum)
            V_new_shared = T.alloc_shared((block_S, block_DV), dtype)
            K_shared = T.alloc_shared((block_S, DK), dtype)
            G_last_local = T.alloc_var(accum)
            G_shared = T.alloc_shared((block_S, block_DV), accum)
            G_fragment = T.alloc_fragment((block_S, block_DV), accum)

            T.annotate_layout({U_shared: tilelang.layout.make_swizzled_layout(U_shared), G_shared: tilelang.layout.make_swizzled_layout(G_shared)})
            T.use_swizzle(10)
            T.copy(initial_state[bb, bh, 0:DK, bv * block_DV : (bv + 1) * block_DV], b_h_shared)
            T.copy(b_h_shared, b_h_fragment)
            for i_s in T.Pipelined(T.ceildiv(S, block_S), num_stages=num_stages):
                T.copy(b_h_shared, h[bb, i_s, bh, 0:DK, bv * block_DV : (bv + 1) * block_DV])
                T.copy(W[bb, i_s * block_S : (i_s + 1) * block_S, bh, 0:DK], W_shared)
                T.gemm(W_shared, b_h_shared, V_new_fragment, clear_accum=True)
                T.copy(U[bb, i_s * block_S : (i_s + 1) * block_S, bh, bv * block_DV : (bv + 1) * block_DV], U_shared)
                T.copy(U_shared, U_fragment)
                for i_s2, i_v in T.Parallel(block_S, block_DV):
                    V_new_fragment[i_s2, i_v] = -V_new_fragment[i_s2, i_v] + U_fragment[i_s2, i_v]
                T.copy(V_new_fragment, dst=V_new_shared)
                T.copy(V_new_shared, V_new[bb, i_s * block_S : (i_s + 1) * block_S, bh, bv * block_DV : (bv + 1) * block_DV])
                T.copy(K[bb, i_s * block_S : (i_s + 1) * block_S, bh, 0:DK], K_shared)
                G_last_local = G[bb, (i_s + 1) * block_S - 1, bh]
                for i_s2, i_v in T.Parallel(block_S, block_DV):
                    G_shared[i_s2, i_v] = G[bb, i_s * block_S + i_s2, bh]
                T.copy(G_shared, G_fragment)
                for i_s2, i_v in T.Parallel(block_S, block_DV):
                    V_new_fragment[i_s2, i_v] = (
                        V_new_fragment[i_s2, i_v] * T.exp2((G_last_local - G_fragment[i_s2, i_v]) * LOG2E)
                        if G_last_local - G_fragment[i_s2, i_v] <= 0
                        else 0
                    )
                G_last_local = T.exp2(G_last_local * LOG2E)
                for i_k, i_v in T.Parallel(DK, block_DV):
                    b_h_fragment[i_k, i_v] *= G_last_local
                T.copy(V_new_fragment, V_new_shared)
                T.gemm(K_shared, V_new_shared, b_h_fragment, transpose_A=True)
                T.copy(b_h_fragment, b_h_shared)
            T.copy(b_h_fragment, final_state[bb, bh, 0:DK, bv * block_DV : (bv + 1) * block_DV])

    return gdn_state


def inputs(problem, device):
    import torch
    import torch.nn.functional as F

    B, S, H, DK, DV, chunk = (problem[k] for k in ("B", "S", "H", "DK", "DV", "chunk"))
    k, w = (F.normalize(torch.randn(B, S, H, DK, device=device), dim=-1).half() for _ in range(2))
    u = F.normalize(torch.randn(B, S, H, DV, device=device), dim=-1).half()
    # log-gates summed within each chunk, as the model's chunk_local_cumsum gives them
    g = F.logsigmoid(torch.randn(B, S // chunk, chunk, H, device=device)).cumsum(2).reshape(B, S, H)
    state = torch.randn(B, H, DK, DV, device=device).half()
    outs = (torch.empty(B, S // chunk, H, DK, DV, device=device).half(), torch.empty(B, H, DK, DV, device=device),
            torch.empty(B, S, H, DV, device=device).half())  # fmt: skip
    return [k, w, u, g, state, *outs]


def reference(problem, args):
    import torch

    k, w, u, g, state = (a.float() for a in args[:5])
    chunk = problem["chunk"]
    hs, v_new = [], torch.empty_like(u)
    for c in range(0, k.shape[1], chunk):
        # the kernel's MMA and h read the state through an fp16 shared tile
        seen = state.half().float()
        hs.append(seen)
        part = u[:, c : c + chunk] - torch.einsum("bshk,bhkv->bshv", w[:, c : c + chunk], seen)
        v_new[:, c : c + chunk] = part
        gate = g[:, c : c + chunk]
        last = gate[:, -1:]
        decay = torch.where(last - gate <= 0, torch.exp(last - gate), 0.0)
        part = (part * decay[..., None]).half().float()
        state = state * torch.exp(last[:, 0])[..., None, None] + torch.einsum("bshk,bshv->bhkv", k[:, c : c + chunk], part)
    return [torch.stack(hs, 1), state, v_new]


def flops(problem):
    # two MMAs of chunk x DK x DV per chunk (W S and K^T V_new), per batch and head
    return 4.0 * problem["B"] * problem["S"] * problem["H"] * problem["DK"] * problem["DV"]
