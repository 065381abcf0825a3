"""nsa_bwd: the backward pass of DeepSeek's native sparse attention, the selected-blocks
branch, as tilelang's examples/deepseek_nsa/example_tilelang_nsa_bwd.py writes it (its
``tilelang_kernel_bwd_dqkv``, the one ``parallel_nsa_bwd`` launches): one block per (block
of keys, batch and KV head) keeps that block's K and V in shared memory and walks every
query from the block's start to the end of the sequence; a query that selected the block
(``BlockMask``, read from global memory inside the loop) runs five MMAs with its G query
heads as the short side (S^T, dP^T, dV += P^T dO, dK += dS^T Q, dQ = dS K), keys after the
query masked to 0, and adds its dQ rows into global memory with per-element fp16 atomics.
The forward's base-2 log-sum-exp and the preprocessing kernel's row sums
Delta = rowsum(O * dO) come in as inputs, computed with torch in float32 (the forward is
tests/data/nsa_fwd.py).

Departures from the example:
- only the main kernel is ported; Delta (``tilelang_kernel_preprocess``), the LSE and the
  block mask (``tilelang_kernel_block_mask``) are made by ``inputs`` with torch;
- the example's mask kernel writes ``BlockMask[b, t, h, i_s]`` at the selection slot i_s
  rather than at the selected block's index (right only when S = NS = 1, as in its test);
  here the mask is 1 at [b, t, h, blk] for each block blk that query t selected and that
  starts at or before t;
- the kernel reads ``H`` for the number of KV heads, a global the example's ``__main__``
  defines (H = 1); here ``heads // groups``;
- ``num_stages`` and ``threads`` are parameters (the example fixes num_stages=0 and 32
  threads, one point of PARAMS);
- dim is a power of two up to 128, so NV = 1 (the example copies ``:BV`` whatever i_v);
  DQ and DK keep the example's leading NV axis (of 1), DQ in fp16 as the example's
  ``q.dtype if NV == 1``; ``is_causal``/``scale`` are the example's defaults (causal,
  1/sqrt(dim));
- the example's ``TL_ENABLE_FAST_MATH`` pass config is not set (a kernel file gives none);
- seq_len must be a multiple of block_size (the example's ceildiv grid guards nothing).

    ws-tune tests/data/nsa_bwd.py --shape batch=1,seq_len=4096 --budget 16
"""

import tilelang.language as T

PROBLEM = {"batch": None, "seq_len": None, "heads": 64, "groups": 16, "dim": 64, "selected_blocks": 16, "block_size": 64}
CHOICES = {"dim": [32, 64, 128], "block_size": [32, 64]}
PARAMS = {"num_stages": [0, 1, 2], "threads": [32, 64, 128]}
OUTPUTS = [6, 7, 8]  # DQ, DK, DV
RESET_TO_ZERO = [6]  # DQ: every selected key block adds its share
TOLERANCE = 2e-2
LOG2E = 1.44269504


def check(problem, params, schedule):
    if problem["heads"] % problem["groups"]:
        return f"heads={problem['heads']} is not a multiple of groups={problem['groups']}"
    if problem["groups"] % 16:
        return f"groups={problem['groups']} is not a multiple of 16 (NSA's group size)"
    if problem["seq_len"] % problem["block_size"]:
        return f"seq_len={problem['seq_len']} is not a multiple of block_size={problem['block_size']}"
    if problem["seq_len"] < problem["selected_blocks"] * problem["block_size"]:
        return f"seq_len={problem['seq_len']} holds fewer than selected_blocks={problem['selected_blocks']} blocks"
    return None


def kernel(problem, *, num_stages, threads):
    batch, seq_len, heads, G, dim, BS = (problem[k] for k in ("batch", "seq_len", "heads", "groups", "dim", "block_size"))
    sm_scale = (1.0 / dim) ** 0.5
    scale = sm_scale * LOG2E
    BK = BV = dim  # a power of two up to 128: the example's next_power_of_2 and min(128, ...)
    NS, NV = seq_len // BS, 1
    H = heads // G
    dtype, accum_dtype = "float16", "float32"
    q_shape, kv_shape = (batch, seq_len, heads, dim), (batch, seq_len, H, dim)

    @T.prim_func
    def nsa_bwd(Q: T.Tensor(q_shape, dtype), K: T.Tensor(kv_shape, dtype), V: T.Tensor(kv_shape, dtype),
                LSE_slc: T.Tensor((batch, seq_len, heads), accum_dtype),
                Delta_slc: T.Tensor((batch, seq_len, heads), accum_dtype), DO_slc: T.Tensor(q_shape, dtype),
                DQ: T.Tensor((NV, *q_shape), dtype), DK: T.Tensor((NV, *kv_shape), dtype), DV: T.Tensor(kv_shape, dtype),
                BlockMask: T.Tensor((batch, seq_len, H, NS), "int32")):  # fmt: skip
        with T.Kernel(NV, NS, batch * H, threads=threads) as (i_v, i_s, i_bh):
            K_shared = T.alloc_shared([BS, BK], dtype)
            dsT_shared = T.alloc_shared([BS, G], dtype)
            V_shared = T.alloc_shared([BS, BV], dtype)
            Q_shared = T.alloc_shared([G, BK], dtype)
            qkT = T.alloc_fragment([BS, G], accum_dtype)
            qkT_cast = T.alloc_fragment([BS, G], dtype)
            dsT = T.alloc_fragment([BS, G], accum_dtype)
            dsT_cast = T.alloc_fragment([BS, G], dtype)
            lse_shared = T.alloc_shared([G], accum_dtype)
            delta = T.alloc_shared([G], accum_dtype)

            do = T.alloc_shared([G, BV], dtype)
            dv = T.alloc_fragment([BS, BV], accum_dtype)
            dk = T.alloc_fragment([BS, BK], accum_dtype)
            dq = T.alloc_fragment([G, BK], accum_dtype)

            dv_shared = T.alloc_shared([BS, BV], dtype)
            dk_shared = T.alloc_shared([BS, BK], dtype)

            i_b, i_h = i_bh // H, i_bh % H

            T.copy(K[i_b, i_s * BS : (i_s + 1) * BS, i_h, :BK], K_shared)
            T.copy(V[i_b, i_s * BS : (i_s + 1) * BS, i_h, :BV], V_shared)
            T.clear(dk)  # [BS, BK]
            T.clear(dv)  # [BS, BV]

            loop_st = i_s * BS
            loop_ed = seq_len
            for i in T.Pipelined(start=loop_st, stop=loop_ed, num_stages=num_stages):
                b_m_slc = BlockMask[i_b, i, i_h, i_s]
                if b_m_slc != 0:
                    T.copy(Q[i_b, i, i_h * G : (i_h + 1) * G, :BK], Q_shared)  # [G, BK]
                    T.clear(qkT)
                    # [BS, BK] @ [G, BK] -> [BS, G]
                    T.gemm(K_shared, Q_shared, qkT, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                    T.copy(LSE_slc[i_b, i, i_h * G : (i_h + 1) * G], lse_shared)  # [G]
                    for _i, _j in T.Parallel(BS, G):
                        qkT[_i, _j] = T.exp2(qkT[_i, _j] * scale - lse_shared[_j])
                    for _i, _j in T.Parallel(BS, G):
                        qkT[_i, _j] = T.if_then_else(i >= (i_s * BS + _i), qkT[_i, _j], 0)
                    T.copy(DO_slc[i_b, i, i_h * G : (i_h + 1) * G, :BV], do)  # [G, BV]
                    T.clear(dsT)
                    # [BS, BV] @ [G, BV] -> [BS, G]
                    T.gemm(V_shared, do, dsT, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                    T.copy(qkT, qkT_cast)
                    # [BS, G] @ [G, BV] -> [BS, BV]
                    T.gemm(qkT_cast, do, dv, policy=T.GemmWarpPolicy.FullRow)
                    T.copy(Delta_slc[i_b, i, i_h * G : (i_h + 1) * G], delta)  # [G]
                    for _i, _j in T.Parallel(BS, G):
                        dsT_cast[_i, _j] = qkT[_i, _j] * (dsT[_i, _j] - delta[_j]) * sm_scale
                    # [BS, G] @ [G, BK] -> [BS, BK]
                    T.gemm(dsT_cast, Q_shared, dk, policy=T.GemmWarpPolicy.FullRow)
                    T.copy(dsT_cast, dsT_shared)
                    T.clear(dq)
                    # [BS, G]^T @ [BS, BK] -> [G, BK]
                    T.gemm(dsT_shared, K_shared, dq, transpose_A=True)
                    for _i, _j in T.Parallel(G, BK):
                        T.atomic_add(DQ[i_v, i_b, i, i_h * G + _i, _j], dq[_i, _j])

            T.copy(dv, dv_shared)
            T.copy(dk, dk_shared)
            T.copy(dv_shared, DV[i_b, i_s * BS : (i_s + 1) * BS, i_h, :BV])
            T.copy(dk_shared, DK[i_v, i_b, i_s * BS : (i_s + 1) * BS, i_h, :BK])

    return nsa_bwd


def _visible(problem, mask):
    """(batch, T, H, T) bool: key n is seen by query t of KV head h (its block selected, n <= t)."""
    import torch

    seq_len, BS = mask.shape[1], problem["block_size"]
    pos = torch.arange(seq_len, device=mask.device)
    return mask.bool()[..., pos // BS] & (pos[None, :] <= pos[:, None])[None, :, None, :]


def _forward(problem, q, k, v, mask):
    """(O, lse): the selected-blocks attention output and the natural log-sum-exp of the scaled
    scores, per query head, in q's precision."""
    import torch

    heads, dim = q.shape[2:]
    G = problem["groups"]
    visible = _visible(problem, mask)
    o, lse = [], []
    for h in range(heads // G):
        s = torch.einsum("btgd,bnd->btgn", q[:, :, h * G : (h + 1) * G], k[:, :, h]) * dim**-0.5
        s = s.masked_fill(~visible[:, :, h, None, :], float("-inf"))
        o.append(torch.einsum("btgn,bnd->btgd", s.softmax(-1), v[:, :, h]))
        lse.append(s.logsumexp(-1))
    return torch.cat(o, 2), torch.cat(lse, 2)


def inputs(problem, device):
    import torch

    batch, seq_len, heads, G, dim, S, BS = (
        problem[k] for k in ("batch", "seq_len", "heads", "groups", "dim", "selected_blocks", "block_size"))  # fmt: skip
    H, NS = heads // G, seq_len // BS
    q, do = (torch.randn(batch, seq_len, heads, dim, device=device, dtype=torch.float16) for _ in range(2))
    k, v = (torch.randn(batch, seq_len, H, dim, device=device, dtype=torch.float16) for _ in range(2))
    # S distinct blocks per query, drawn among the blocks it can see (block 0 always among
    # them), as a mask over all NS blocks (the example's tilelang_kernel_block_mask, by block)
    t = torch.arange(seq_len, device=device).view(1, seq_len, 1, 1)
    visible = torch.arange(NS, device=device) * BS <= t
    keys = torch.rand(batch, seq_len, H, NS, device=device).masked_fill(~visible, 2.0)  # invisible blocks sort last
    keys[..., 0] = -1.0
    idx = keys.argsort(dim=-1)[..., :S]
    mask = torch.zeros(batch, seq_len, H, NS, device=device, dtype=torch.int32)
    mask.scatter_(-1, idx, 1)
    mask &= visible.to(torch.int32)
    o, lse = _forward(problem, q.float(), k.float(), v.float(), mask)
    delta = (o * do.float()).sum(-1)
    dq = torch.zeros(1, batch, seq_len, heads, dim, device=device, dtype=torch.float16)
    dk = torch.empty(1, batch, seq_len, H, dim, device=device, dtype=torch.float16)
    dv = torch.empty_like(k)
    return [q, k, v, (lse * LOG2E).contiguous(), delta.contiguous(), do, dq, dk, dv, mask]


def reference(problem, args):
    import torch

    q, k, v = (a.float().requires_grad_() for a in args[:3])
    do, mask = args[5].float(), args[9]
    o, _ = _forward(problem, q, k, v, mask)
    dq, dk, dv = torch.autograd.grad(o, (q, k, v), do)
    return [dq.unsqueeze(0), dk.unsqueeze(0), dv]


def flops(problem):
    # five MMAs over G x block_size x dim per query position, KV head and selected block
    # (blocks past the query count too)
    work = problem["batch"] * problem["seq_len"] * problem["heads"] * problem["selected_blocks"] * problem["block_size"] * problem["dim"]
    return 10.0 * work
