"""gdn_chunk_o_bwd: Gated DeltaNet's chunked-output backward, dq, dk, dw and dg (bf16 in and
out, fp32 gates), as tilelang's examples/gdn/example_chunk_o_bwd.py writes it (FLA's
chunk_bwd_kernel_dqkwg). Each block owns one chunk of 64 tokens of one head and a 64-wide
slice of the key dimension. Its pipelined loop walks the value dimension: per tile it copies
V, dO, dv, h and dh to shared memory and adds four MMAs into fp32 accumulators (ds = dO V^T,
dq = dO h^T, dk = V dh^T, dw = dv h^T) and, element by element, h * dh into a fragment that it
reduces to a scalar carried across the loop in a variable (the chunk's last-token gate
gradient). After the loop it gates dq, dk and ds, builds dg from row and column sums
(ds * q k^T, transposed in registers for its column sums, through two shared vectors), adds
ds k and ds^T q through a bf16 shared ds, and stores; dg has one row per key slice
(dg.sum(0) is the gradient).

Three slips of the example are fixed, as FLA computes it: it never loads the last gate
(G_last_local stays 0, which zeroes dk), it overwrites the h * dh sum with that gate, and it
adds the last-token term to every token's dg instead of the last one's. Its dead code (G
copied into an unread shared tile, q and k copied into unread fragments) and its unused W
argument are left out.

New for a schedule tuner: five global tiles (dO, V and h each read by two MMAs) feed four
accumulators and a whole-tile elementwise reduction in one loop whose trip count is
DV / block_DV (1 to 4); a scalar variable accumulates across the trips; the long epilogue
reads shared tiles the loop never touches (q, k) and round-trips fragments through shared
memory. role_based seeds it (a consumer warpgroup doing all the math, a producer warp
with a pipeline for each of the loop's five tiles and one each for q and k); threads and
num_stages then give one candidate per block_DV.

    ws-tune tests/data/gdn_chunk_o_bwd.py --shape B=1,S=32768,H=8 --budget 16
"""

import tilelang
import tilelang.language as T

PROBLEM = {"B": None, "S": None, "H": None, "DK": 128, "DV": 128}
CHOICES = {"DK": [64, 128], "DV": [64, 128]}
PARAMS = {"block_DV": [32, 64], "num_stages": [0, 1, 2], "threads": [128, 256]}
OUTPUTS = [8, 9, 10, 11]
TOLERANCE = 2e-2
CHUNK = 64  # the chunk (block_S) of the example
BLOCK_DK = 64  # the key slice of a block; dg's leading dimension is DK / BLOCK_DK, so not tuned


def check(problem, params, schedule):
    if problem["S"] % CHUNK:
        return f"S={problem['S']} is not a multiple of the chunk ({CHUNK})"
    if problem["DK"] % BLOCK_DK:
        return f"DK={problem['DK']} is not a multiple of {BLOCK_DK}"
    if problem["DV"] % params["block_DV"]:
        return f"DV={problem['DV']} is not a multiple of block_DV={params['block_DV']}"
    return None


def kernel(problem, *, block_DV, num_stages, threads):
    B, S, H, DK, DV = (problem[k] for k in ("B", "S", "H", "DK", "DV"))
    block_S, block_DK, NK = CHUNK, BLOCK_DK, DK // BLOCK_DK
    scale = DK**-0.5
    dtype, accum, gate = "bfloat16", "float32", "float32"

    @T.prim_func
    def gdn_chunk_o_bwd(Q: T.Tensor((B, S, H, DK), dtype), K: T.Tensor((B, S, H, DK), dtype), V: T.Tensor((B, S, H, DV), dtype),
                        h: T.Tensor((B, S // block_S, H, DK, DV), dtype), G: T.Tensor((B, S, H), gate), dO: T.Tensor((B, S, H, DV), dtype),
                        dh: T.Tensor((B, S // block_S, H, DK, DV), dtype), dv: T.Tensor((B, S, H, DV), dtype),
                        dq: T.Tensor((B, S, H, DK), dtype), dk: T.Tensor((B, S, H, DK), dtype), dw: T.Tensor((B, S, H, DK), dtype),
                        dg: T.Tensor((NK, B, S, H), gate)):  # fmt: skip
        with T.Kernel(NK, S // block_S, B * H, threads=threads) as (bk, bs, bbh):
            bb, bh = bbh // H, bbh % H

            V_shared = T.alloc_shared((block_S, block_DV), dtype)
            dO_shared = T.alloc_shared((block_S, block_DV), dtype)
            h_shared = T.alloc_shared((block_DK, block_DV), dtype)
            dh_shared = T.alloc_shared((block_DK, block_DV), dtype)
            dv_shared = T.alloc_shared((block_S, block_DV), dtype)
            q_shared = T.alloc_shared((block_S, block_DK), dtype)
            k_shared = T.alloc_shared((block_S, block_DK), dtype)
            ds_shared = T.alloc_shared((block_S, block_S), dtype)
            dg_shared_1 = T.alloc_shared((block_S,), gate)
            dg_shared_2 = T.alloc_shared((block_S,), gate)
            dk_shared = T.alloc_shared((block_S, block_DK), accum)

            ds_fragment = T.alloc_fragment((block_S, block_S), accum)
            ds_fragment_positive = T.alloc_fragment((block_S, block_S), accum)
            ds_fragment_positive_transpose = T.alloc_fragment((block_S, block_S), accum)
            dq_fragment = T.alloc_fragment((block_S, block_DK), accum)
            dk_fragment = T.alloc_fragment((block_S, block_DK), accum)
            dw_fragment = T.alloc_fragment((block_S, block_DK), accum)
            dg_fragment_reduce_tmp = T.alloc_fragment((block_S, block_DK), gate)
            dg_fragment = T.alloc_fragment((block_S,), gate)
            dg_fragment_2 = T.alloc_fragment((block_S,), gate)
            dg_fragment_final = T.alloc_fragment((block_S,), gate)
            dg_last_local_0 = T.alloc_var(gate)
            dg_last_local_1 = T.alloc_var(gate)
            G_last_local = T.alloc_var(gate)
            dg_last_fragment = T.alloc_fragment((block_DK * block_DV,), gate)
            dg_last_fragment_scalar = T.alloc_fragment((1,), gate)
            dg_last_fragment_2 = T.alloc_fragment((block_S * block_DK,), gate)
            dg_last_fragment_scalar_2 = T.alloc_fragment((1,), gate)

            T.use_swizzle(10)
            T.annotate_layout({q_shared: tilelang.layout.make_swizzled_layout(q_shared), k_shared: tilelang.layout.make_swizzled_layout(k_shared)})

            T.clear(dg_last_local_0)
            T.clear(dg_last_local_1)
            T.clear(G_last_local)
            T.clear(ds_fragment)
            T.clear(dq_fragment)
            T.clear(dk_fragment)
            T.clear(dw_fragment)

            for i_v in T.Pipelined(T.ceildiv(DV, block_DV), num_stages=num_stages):
                T.copy(V[bb, bs * block_S : (bs + 1) * block_S, bh, i_v * block_DV : (i_v + 1) * block_DV], V_shared)
                T.copy(dO[bb, bs * block_S : (bs + 1) * block_S, bh, i_v * block_DV : (i_v + 1) * block_DV], dO_shared)
                T.copy(h[bb, bs, bh, bk * block_DK : (bk + 1) * block_DK, i_v * block_DV : (i_v + 1) * block_DV], h_shared)
                T.copy(dh[bb, bs, bh, bk * block_DK : (bk + 1) * block_DK, i_v * block_DV : (i_v + 1) * block_DV], dh_shared)

                # the last token's gate gradient, sum(h * dh): a whole tile reduced to one value
                T.clear(dg_last_fragment_scalar)
                for i_kv in T.Parallel(block_DK * block_DV):
                    dg_last_fragment[i_kv] = h_shared[i_kv // block_DV, i_kv % block_DV] * dh_shared[i_kv // block_DV, i_kv % block_DV]
                T.reduce_sum(dg_last_fragment, dg_last_fragment_scalar, dim=-1, clear=False)
                dg_last_local_0 = dg_last_local_0 + dg_last_fragment_scalar[0]

                T.gemm(dO_shared, V_shared, ds_fragment, transpose_B=True)
                T.gemm(dO_shared, h_shared, dq_fragment, transpose_B=True)
                T.gemm(V_shared, dh_shared, dk_fragment, transpose_B=True)

                T.copy(dv[bb, bs * block_S : (bs + 1) * block_S, bh, i_v * block_DV : (i_v + 1) * block_DV], dv_shared)
                T.gemm(dv_shared, h_shared, dw_fragment, transpose_B=True)

            for i_s, i_k in T.Parallel(block_S, block_DK):
                dw_fragment[i_s, i_k] = -dw_fragment[i_s, i_k]
            T.copy(dw_fragment, dw[bb, bs * block_S : (bs + 1) * block_S, bh, bk * block_DK : (bk + 1) * block_DK])

            T.copy(Q[bb, bs * block_S : (bs + 1) * block_S, bh, bk * block_DK : (bk + 1) * block_DK], q_shared)
            T.copy(K[bb, bs * block_S : (bs + 1) * block_S, bh, bk * block_DK : (bk + 1) * block_DK], k_shared)

            T.clear(dg_fragment)
            T.clear(dg_fragment_2)
            G_last_local = G[bb, bs * block_S + block_S - 1, bh]
            dg_last_local_0 = dg_last_local_0 * T.exp(G_last_local)

            for i_s, i_k in T.Parallel(block_S, block_DK):
                dq_fragment[i_s, i_k] = dq_fragment[i_s, i_k] * T.exp(G[bb, bs * block_S + i_s, bh]) * scale
            T.clear(dg_fragment_reduce_tmp)
            for i_s, i_k in T.Parallel(block_S, block_DK):
                dg_fragment_reduce_tmp[i_s, i_k] = dq_fragment[i_s, i_k] * q_shared[i_s, i_k]
            T.reduce_sum(dg_fragment_reduce_tmp, dg_fragment, dim=-1, clear=False)  # clear=True trips tilelang's WS pass

            for i_s, i_k in T.Parallel(block_S, block_DK):
                dk_fragment[i_s, i_k] = (
                    dk_fragment[i_s, i_k] * T.exp(G_last_local - G[bb, bs * block_S + i_s, bh]) if G_last_local - G[bb, bs * block_S + i_s, bh] <= 0 else 0
                )
            T.clear(dg_fragment_reduce_tmp)
            for i_s, i_k in T.Parallel(block_S, block_DK):
                dg_fragment_reduce_tmp[i_s, i_k] = dk_fragment[i_s, i_k] * (-k_shared[i_s, i_k])
            T.reduce_sum(dg_fragment_reduce_tmp, dg_fragment, dim=-1, clear=False)

            T.copy(dk_fragment, dk_shared)
            T.clear(dg_last_fragment_scalar_2)
            for i_sk in T.Parallel(block_S * block_DK):
                i_s, i_k = i_sk // block_DK, i_sk % block_DK
                dg_last_fragment_2[i_sk] = dk_shared[i_s, i_k] * k_shared[i_s, i_k]
            T.reduce_sum(dg_last_fragment_2, dg_last_fragment_scalar_2, dim=-1, clear=False)
            dg_last_local_1 = dg_last_fragment_scalar_2[0]

            # gated, causal (the gates decrease along the chunk) and scaled
            for i_s1, i_s2 in T.Parallel(block_S, block_S):
                ds_fragment[i_s1, i_s2] = (
                    (ds_fragment[i_s1, i_s2] * T.exp(G[bb, bs * block_S + i_s1, bh] - G[bb, bs * block_S + i_s2, bh]) * scale)
                    if G[bb, bs * block_S + i_s1, bh] - G[bb, bs * block_S + i_s2, bh] <= 0
                    else 0
                )

            T.clear(ds_fragment_positive)
            T.clear(ds_fragment_positive_transpose)
            T.gemm(q_shared, k_shared, ds_fragment_positive, transpose_B=True)
            for i_s1, i_s2 in T.Parallel(block_S, block_S):
                ds_fragment_positive[i_s1, i_s2] = ds_fragment[i_s1, i_s2] * ds_fragment_positive[i_s1, i_s2]
            T.reduce_sum(ds_fragment_positive, dg_fragment, dim=1, clear=False)
            T.copy(dg_fragment, dg_shared_1)

            # reduce_sum reduces along the last dimension only: the column sums go through a transpose
            for i_s1, i_s2 in T.Parallel(block_S, block_S):
                ds_fragment_positive_transpose[i_s2, i_s1] = ds_fragment_positive[i_s1, i_s2]
            T.reduce_sum(ds_fragment_positive_transpose, dg_fragment_2, dim=1, clear=False)
            T.copy(dg_fragment_2, dg_shared_2)

            for i_s in T.Parallel(block_S):
                dg_fragment_final[i_s] = dg_shared_1[i_s] - dg_shared_2[i_s]

            T.copy(ds_fragment, ds_shared)
            T.gemm(ds_shared, k_shared, dq_fragment)
            T.gemm(ds_shared, q_shared, dk_fragment, transpose_A=True)

            for i_s in T.Parallel(block_S):  # the last token's term, on the last token only
                dg_fragment_final[i_s] = dg_fragment_final[i_s] + (dg_last_local_0 + dg_last_local_1 if i_s == block_S - 1 else 0)

            T.copy(dq_fragment, dq[bb, bs * block_S : (bs + 1) * block_S, bh, bk * block_DK : (bk + 1) * block_DK])
            T.copy(dk_fragment, dk[bb, bs * block_S : (bs + 1) * block_S, bh, bk * block_DK : (bk + 1) * block_DK])
            for i_s in T.Parallel(block_S):
                dg[bk, bb, bs * block_S + i_s, bh] = dg_fragment_final[i_s]

    return gdn_chunk_o_bwd


def inputs(problem, device):
    import torch
    import torch.nn.functional as F

    B, S, H, DK, DV = (problem[k] for k in ("B", "S", "H", "DK", "DV"))
    q, k = (F.normalize(torch.randn(B, S, H, DK, device=device), dim=-1).to(torch.bfloat16) for _ in range(2))
    v, do, dv = (torch.randn(B, S, H, DV, device=device).to(torch.bfloat16) for _ in range(3))
    h, dh = ((torch.randn(B, S // CHUNK, H, DK, DV, device=device) / DK**0.5).to(torch.bfloat16) for _ in range(2))
    # log-gates summed within each chunk (chunk_local_cumsum): they decrease along a chunk
    g = F.logsigmoid(torch.randn(B, S // CHUNK, CHUNK, H, device=device)).cumsum(2).reshape(B, S, H)
    outs = [torch.empty(B, S, H, DK, device=device, dtype=torch.bfloat16) for _ in range(3)]
    dg = torch.empty(DK // BLOCK_DK, B, S, H, device=device)
    return [q, k, v, h, g, do, dh, dv, *outs, dg]


def reference(problem, args):
    import torch

    q, k, v, h, g, do, dh, dv = (a.float() for a in args[:8])
    B, S, H, DK = problem["B"], problem["S"], problem["H"], problem["DK"]
    C, scale = S // CHUNK, DK**-0.5

    def chunks(x):  # (B, S, H, D) -> (B, H, C, CHUNK, D)
        return x.view(B, C, CHUNK, H, -1).permute(0, 3, 1, 2, 4)

    def tokens(x):  # the inverse
        return x.permute(0, 2, 3, 1, 4).reshape(B, S, H, -1)

    q, k, v, do, dv = (chunks(x) for x in (q, k, v, do, dv))
    h, dh = h.transpose(1, 2), dh.transpose(1, 2)  # (B, H, C, DK, DV)
    g = g.view(B, C, CHUNK, H).permute(0, 3, 1, 2)  # (B, H, C, CHUNK)
    g_last = g[..., -1:]

    dw = -(dv @ h.transpose(-1, -2))
    dq = (do @ h.transpose(-1, -2)) * g.exp().unsqueeze(-1) * scale
    dk = (v @ dh.transpose(-1, -2)) * torch.where(g_last - g <= 0, (g_last - g).exp(), 0.0).unsqueeze(-1)
    diff = g.unsqueeze(-1) - g.unsqueeze(-2)
    causal = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device).tril()
    ds = torch.where(causal & (diff <= 0), (do @ v.transpose(-1, -2)) * diff.clamp(max=0).exp(), 0.0) * scale

    dgs = []
    for i in range(DK // BLOCK_DK):  # the kernel's dg: one row per key slice
        s = slice(i * BLOCK_DK, (i + 1) * BLOCK_DK)
        ds2 = ds * (q[..., s] @ k[..., s].transpose(-1, -2))
        part = (dq[..., s] * q[..., s]).sum(-1) - (dk[..., s] * k[..., s]).sum(-1) + ds2.sum(-1) - ds2.sum(-2)
        last = (h[..., s, :] * dh[..., s, :]).sum((-1, -2)) * g_last[..., 0].exp() + (dk[..., s] * k[..., s]).sum((-1, -2))
        part[..., -1] += last
        dgs.append(part.permute(0, 2, 3, 1).reshape(B, S, H))
    ds = ds.to(torch.bfloat16).float()  # the kernel's MMAs read ds from a bf16 shared tile
    dq = dq + ds @ k
    dk = dk + ds.transpose(-1, -2) @ q
    return [tokens(dq).bfloat16(), tokens(dk).bfloat16(), tokens(dw).bfloat16(), torch.stack(dgs)]


def flops(problem):
    # per chunk, head and key slice: ds = dO V^T (recomputed by every key slice), dq, dk and dw over DV,
    # then q k^T, ds k and ds^T q over the slice
    B, S, H, DK, DV = (problem[k] for k in ("B", "S", "H", "DK", "DV"))
    per_slice = 2.0 * CHUNK * (CHUNK * DV + 3 * BLOCK_DK * DV + 3 * CHUNK * BLOCK_DK)
    return B * H * (S // CHUNK) * (DK // BLOCK_DK) * per_slice
