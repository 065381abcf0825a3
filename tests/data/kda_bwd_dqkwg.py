"""kda_bwd_dqkwg: Kimi Delta Attention's backward through the inter-chunk terms (dq, dk, dw, dg;
BSHD, fp32 gates), as tilelang's examples/kda/chunk_bwd_dqkwg.py writes it (FLA's
chunk_kda_bwd_kernel_inter, use_exp2). One block per key-dimension tile, chunk and head. The
chunk's gates and its last token's gates are copied into shared memory first; a value-dimension
loop then copies tiles of h, dh, v, dO and dv into shared memory, writes h * dh element-wise
into a shared tile and row-reduces it into the last token's gate gradient, and adds three
MMAs into fp32 accumulators: dq += dO h^T, dk += v dh^T, dw += dv h^T. After the loop the
accumulators are gated (dq by scale exp2(g), dk by exp2(g_last - g)), dw negated, the three
stored from the fragments; q and k are copied in, dk * k is written to a shared tile and
column-reduced (shared to shared) into the last token's gradient, and dg = q dq - k dk (plus
that gradient on the chunk's last row) is written to a shared tile and stored.

For a schedule tuner: one pipelined loop with five loads and three MMAs sharing two B operands
(h_shared feeds two of them, dh_shared one), a reduction of a shared tile the loop writes from
two of its loads, and an epilogue with two more loads and two shared-to-global stores.

Departures from the example: none in the kernel (its shared tiles of G and of the last token's
G are in the input dtype, as written, and the reference rounds the gates to it). The
example's TL_ENABLE_FAST_MATH pass config is not set (a kernel file gives none). scale is
DK**-0.5, as the model uses it (the example's main passes 1.0). dtype defaults to float32, the
example's input_dtype (its gemms are then tf32); bfloat16 and float16 are allowed. Inputs: the
example's G is N(0, 1), which makes exp2(g_last - g) reach 2^6; here the gates are per-channel
log2-decays, small negative steps summed within each chunk (chunk_local_cumsum), as in
kda_chunk_o, and h and dh are scaled down to the states' size. The example's W, which the
kernel never reads, is not an argument.

    ws-tune tests/data/kda_bwd_dqkwg.py --shape B=1,S=8192,H=64 --budget 16
"""

import tilelang.language as T

PROBLEM = {"B": None, "S": None, "H": None, "DK": 128, "DV": 128, "chunk_size": 64, "dtype": "float32"}
CHOICES = {"chunk_size": [64, 128], "dtype": ["float32", "bfloat16", "float16"]}
# the example's autotuner space (get_configs): block_DK, block_DV, threads, num_stages
PARAMS = {"block_DK": [32, 64, 128], "block_DV": [32, 64, 128], "num_stages": [0, 1, 2, 3], "threads": [32, 64, 128, 256]}
OUTPUTS = [8, 9, 10, 11]  # dq, dk, dw, dg
TOLERANCE = 2e-2


def check(problem, params, schedule):
    if problem["S"] % problem["chunk_size"]:
        return f"S={problem['S']} is not a multiple of chunk_size={problem['chunk_size']}"
    for dim, block in (("DK", "block_DK"), ("DV", "block_DV")):
        if problem[dim] % params[block]:
            return f"{dim}={problem[dim]} is not a multiple of {block}={params[block]}"
    return None


def kernel(problem, *, block_DK, block_DV, num_stages, threads):
    B, S, H, DK, DV, chunk_size = (problem[k] for k in ("B", "S", "H", "DK", "DV", "chunk_size"))
    input_dtype = problem["dtype"]
    gate_dtype = "float32"
    scale = DK**-0.5

    block_S = chunk_size
    BS = S // block_S
    K_shape = (B, S, H, DK)
    V_shape = (B, S, H, DV)
    H_shape = (B, BS, H, DK, DV)

    @T.prim_func
    def kda_bwd_dqkwg(
        Q: T.Tensor(K_shape, dtype=input_dtype),
        K: T.Tensor(K_shape, dtype=input_dtype),
        V: T.Tensor(V_shape, dtype=input_dtype),
        G: T.Tensor(K_shape, dtype=gate_dtype),
        h: T.Tensor(H_shape, dtype=input_dtype),
        dv: T.Tensor(V_shape, dtype=input_dtype),
        DO: T.Tensor(V_shape, dtype=input_dtype),
        Dh: T.Tensor(H_shape, dtype=input_dtype),
        dq: T.Tensor(K_shape, dtype=T.float32),
        dk: T.Tensor(K_shape, dtype=T.float32),
        dw: T.Tensor(K_shape, dtype=gate_dtype),
        dg: T.Tensor(K_shape, dtype=gate_dtype),
    ):
        with T.Kernel(T.ceildiv(DK, block_DK), T.ceildiv(S, block_S), B * H, threads=threads) as (bk, bs, bbh):
            bb, bh = bbh // H, bbh % H
            chunk_last_idx = T.min(S, (bs + 1) * block_S) - 1

            dgkn_fragment = T.alloc_fragment((block_DK), dtype=T.float32)
            dgkn_fragment_tmp = T.alloc_fragment((block_DK,), dtype=T.float32)
            dq_fragment = T.alloc_fragment((block_S, block_DK), dtype=T.float32)
            dk_fragment = T.alloc_fragment((block_S, block_DK), dtype=T.float32)
            dw_fragment = T.alloc_fragment((block_S, block_DK), dtype=T.float32)
            dgk_shared = T.alloc_shared((block_S, block_DK), dtype=T.float32)

            h_shared = T.alloc_shared((block_DK, block_DV), dtype=input_dtype)
            dh_shared = T.alloc_shared((block_DK, block_DV), dtype=input_dtype)
            dgkn_shared = T.alloc_shared((block_DK, block_DV), dtype=input_dtype)  # d of last token in a chunk
            V_shared = T.alloc_shared((block_S, block_DV), dtype=input_dtype)
            DO_shared = T.alloc_shared((block_S, block_DV), dtype=input_dtype)
            DV_shared = T.alloc_shared((block_S, block_DV), dtype=input_dtype)
            G_shared = T.alloc_shared((block_S, block_DK), dtype=input_dtype)  # chunk G
            Gn_shared = T.alloc_shared((block_DK), dtype=input_dtype)  # chunk last token G
            Q_shared = T.alloc_shared((block_S, block_DK), dtype=input_dtype)
            K_shared = T.alloc_shared((block_S, block_DK), dtype=input_dtype)

            dkkn_shared = T.alloc_shared((block_S, block_DK), dtype=T.float32)
            pp_shared = T.alloc_shared((block_DK), dtype=T.float32)

            T.clear(dgkn_fragment)
            T.clear(dq_fragment)
            T.clear(dk_fragment)
            T.clear(dw_fragment)

            T.copy(G[bb, bs * block_S : (bs + 1) * block_S, bh, bk * block_DK : (bk + 1) * block_DK], G_shared)
            T.copy(G[bb, chunk_last_idx, bh, bk * block_DK : (bk + 1) * block_DK], Gn_shared)

            for i_v in T.Pipelined(T.ceildiv(DV, block_DV), num_stages=num_stages):
                T.copy(h[bb, bs, bh, bk * block_DK : (bk + 1) * block_DK, i_v * block_DV : (i_v + 1) * block_DV], h_shared)
                T.copy(Dh[bb, bs, bh, bk * block_DK : (bk + 1) * block_DK, i_v * block_DV : (i_v + 1) * block_DV], dh_shared)
                T.copy(V[bb, bs * block_S : (bs + 1) * block_S, bh, i_v * block_DV : (i_v + 1) * block_DV], V_shared)
                T.copy(DO[bb, bs * block_S : (bs + 1) * block_S, bh, i_v * block_DV : (i_v + 1) * block_DV], DO_shared)
                T.copy(dv[bb, bs * block_S : (bs + 1) * block_S, bh, i_v * block_DV : (i_v + 1) * block_DV], DV_shared)
                # += reduce_sum
                for i_k1, i_v1 in T.Parallel(block_DK, block_DV):
                    dgkn_shared[i_k1, i_v1] = h_shared[i_k1, i_v1] * dh_shared[i_k1, i_v1]
                T.reduce_sum(dgkn_shared, dgkn_fragment_tmp, dim=1, clear=True)  # [block_DK]
                for i_ks in T.Parallel(block_DK):
                    dgkn_fragment[i_ks] += dgkn_fragment_tmp[i_ks]
                T.gemm(DO_shared, h_shared, dq_fragment, transpose_B=True, clear_accum=False)  # [block_S, block_DK]
                T.gemm(V_shared, dh_shared, dk_fragment, transpose_B=True, clear_accum=False)  # [block_S, block_DK]
                T.gemm(DV_shared, h_shared, dw_fragment, transpose_B=True, clear_accum=False)  # [block_S, block_DK]
            # chunk last token
            for i_k0 in T.Parallel(block_DK):
                dgkn_fragment[i_k0] = dgkn_fragment[i_k0] * T.exp2(Gn_shared[i_k0])

            for i_s, i_k in T.Parallel(block_S, block_DK):
                dw_fragment[i_s, i_k] = -dw_fragment[i_s, i_k]
                dq_fragment[i_s, i_k] = dq_fragment[i_s, i_k] * scale * T.exp2(G_shared[i_s, i_k])
                dk_fragment[i_s, i_k] = dk_fragment[i_s, i_k] * T.exp2(Gn_shared[i_k] - G_shared[i_s, i_k])

            T.copy(dw_fragment, dw[bb, bs * block_S : (bs + 1) * block_S, bh, bk * block_DK : (bk + 1) * block_DK])
            T.copy(dq_fragment, dq[bb, bs * block_S : (bs + 1) * block_S, bh, bk * block_DK : (bk + 1) * block_DK])
            T.copy(dk_fragment, dk[bb, bs * block_S : (bs + 1) * block_S, bh, bk * block_DK : (bk + 1) * block_DK])

            T.copy(Q[bb, bs * block_S : (bs + 1) * block_S, bh, bk * block_DK : (bk + 1) * block_DK], Q_shared)
            T.copy(K[bb, bs * block_S : (bs + 1) * block_S, bh, bk * block_DK : (bk + 1) * block_DK], K_shared)

            for i_s2, i_k2 in T.Parallel(block_S, block_DK):
                dkkn_shared[i_s2, i_k2] = dk_fragment[i_s2, i_k2] * K_shared[i_s2, i_k2]
            T.reduce_sum(dkkn_shared, pp_shared, dim=0, clear=True)
            for i_k3 in T.Parallel(block_DK):
                pp_shared[i_k3] += dgkn_fragment[i_k3]

            for i_s4, i_k4 in T.Parallel(block_S, block_DK):
                dgk_shared[i_s4, i_k4] = (
                    Q_shared[i_s4, i_k4] * dq_fragment[i_s4, i_k4]
                    - K_shared[i_s4, i_k4] * dk_fragment[i_s4, i_k4]
                    + T.if_then_else(chunk_last_idx == bs * block_S + i_s4, pp_shared[i_k4], 0.0)
                )

            T.copy(dgk_shared, dg[bb, bs * block_S : (bs + 1) * block_S, bh, bk * block_DK : (bk + 1) * block_DK])

    return kda_bwd_dqkwg


def inputs(problem, device):
    import torch

    B, S, H, DK, DV, BS = (problem[k] for k in ("B", "S", "H", "DK", "DV", "chunk_size"))
    dtype = getattr(torch, problem["dtype"])
    NC = S // BS
    q = torch.randn(B, S, H, DK, device=device, dtype=dtype)
    k = torch.randn(B, S, H, DK, device=device, dtype=dtype)
    v = torch.randn(B, S, H, DV, device=device, dtype=dtype)
    # per-channel log2-decays, small negative steps summed within each chunk (chunk_local_cumsum):
    # exp2(g) stays in (0, 1], about 1/4 at a chunk's end
    steps = -torch.rand(B, NC, BS, H, DK, device=device) / 16
    g = steps.cumsum(2).reshape(B, S, H, DK).contiguous()
    h = (torch.randn(B, NC, H, DK, DV, device=device) / 4).to(dtype)
    dv = torch.randn(B, S, H, DV, device=device, dtype=dtype)
    do = torch.randn(B, S, H, DV, device=device, dtype=dtype)
    dh = (torch.randn(B, NC, H, DK, DV, device=device) / 4).to(dtype)
    dq = torch.empty(B, S, H, DK, device=device)
    dk = torch.empty(B, S, H, DK, device=device)
    dw = torch.empty(B, S, H, DK, device=device)
    dg = torch.empty(B, S, H, DK, device=device)
    return [q, k, v, g, h, dv, do, dh, dq, dk, dw, dg]


def reference(problem, args):
    import torch

    dtype = getattr(torch, problem["dtype"])
    q, k, v, g, h, dv, do, dh = (a.float() for a in args[:8])
    B, S, H, DK = q.shape
    BS = problem["chunk_size"]
    NC = S // BS
    scale = DK**-0.5
    g = g.to(dtype).float()  # G_shared and Gn_shared hold the gates in the input dtype
    gc = g.reshape(B, NC, BS, H, DK)
    gn = gc[:, :, -1:]  # the chunk's last token
    qc, kc = q.reshape(B, NC, BS, H, DK), k.reshape(B, NC, BS, H, DK)
    vc, dvc, doc = (t.reshape(B, NC, BS, H, -1) for t in (v, dv, do))
    # sum over DV of h * dh, each product rounded to the input dtype (dgkn_shared)
    dgkn = (h * dh).to(dtype).float().sum(-1)  # B, NC, H, DK
    dgkn = dgkn * torch.exp2(gn[:, :, 0])
    dq_ = torch.einsum("bnshv,bnhkv->bnshk", doc, h) * scale * torch.exp2(gc)
    dk_ = torch.einsum("bnshv,bnhkv->bnshk", vc, dh) * torch.exp2(gn - gc)
    dw_ = -torch.einsum("bnshv,bnhkv->bnshk", dvc, h)
    pp = (dk_ * kc).sum(2) + dgkn  # B, NC, H, DK
    dg_ = qc * dq_ - kc * dk_
    dg_[:, :, -1] += pp
    return [t.reshape(B, S, H, DK) for t in (dq_, dk_, dw_, dg_)]


def flops(problem):
    # three MMAs of chunk x DV x block_DK per chunk, head and key column: dO h^T, v dh^T, dv h^T
    return 6.0 * problem["B"] * problem["S"] * problem["H"] * problem["DK"] * problem["DV"]
