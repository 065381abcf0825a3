"""mla_paged: DeepSeek MLA decoding over a paged KV cache, as tilelang's
examples/deepseek_mla/example_mla_decode_paged.py writes it (its one-kernel form, without
the KV split): each tile of keys is found through the sequence's block table (a page
number read from global memory in the loop, bound in every role that loads), the key loop
runs backwards from the sequence's last tile, and only that first tile is masked.

    ws-tune tests/data/mla_paged.py --shape batch=64,seqlen=8192 --budget 16
"""

import tilelang.language as T

PROBLEM = {"batch": None, "seqlen": None, "heads": 128, "dim": 512, "pe_dim": 64, "page": 64}
CHOICES = {"heads": [64, 128], "page": [64, 128, 256]}
PARAMS = {"block_N": [32, 64], "num_stages": [1, 2], "threads": [256]}
OUTPUTS = [6]
TOLERANCE = 2e-2
BLOCK_H = 64  # query heads of one block (one KV head serves them all)
LOG2E = 1.44269504


def check(problem, params, schedule):
    if problem["page"] % params["block_N"] or problem["seqlen"] % problem["page"]:
        return f"page={problem['page']} is not a multiple of block_N={params['block_N']}, or seqlen of page"
    if problem["heads"] % BLOCK_H:
        return f"heads={problem['heads']} is not a multiple of {BLOCK_H}"
    return None


def kernel(problem, *, block_N, num_stages, threads):
    batch, seqlen, heads, dv, dpe, page = (problem[k] for k in ("batch", "seqlen", "heads", "dim", "pe_dim", "page"))
    scale = (dv + dpe) ** -0.5 * LOG2E
    dtype, accum = "float16", "float32"

    @T.prim_func
    def mla_paged(Q: T.Tensor((batch, heads, dv), dtype), Q_pe: T.Tensor((batch, heads, dpe), dtype),
                  KV: T.Tensor((batch * seqlen, 1, dv), dtype), K_pe: T.Tensor((batch * seqlen, 1, dpe), dtype),
                  block_table: T.Tensor((batch, seqlen // page), "int32"), cache_seqlens: T.Tensor((batch,), "int32"),
                  Output: T.Tensor((batch, heads, dv), dtype)):  # fmt: skip
        with T.Kernel(batch, heads // BLOCK_H, threads=threads) as (bx, by):
            Q_shared = T.alloc_shared((BLOCK_H, dv), dtype)
            S_shared = T.alloc_shared((BLOCK_H, block_N), dtype)
            Q_pe_shared = T.alloc_shared((BLOCK_H, dpe), dtype)
            KV_shared = T.alloc_shared((block_N, dv), dtype)
            K_pe_shared = T.alloc_shared((block_N, dpe), dtype)
            O_shared = T.alloc_shared((BLOCK_H, dv), dtype)
            acc_s = T.alloc_fragment((BLOCK_H, block_N), accum)
            acc_o = T.alloc_fragment((BLOCK_H, dv), accum)
            m = T.alloc_fragment((BLOCK_H,), accum)
            m_prev = T.alloc_fragment((BLOCK_H,), accum)
            alpha = T.alloc_fragment((BLOCK_H,), accum)
            row_sum = T.alloc_fragment((BLOCK_H,), accum)
            logsum = T.alloc_fragment((BLOCK_H,), accum)

            T.copy(Q[bx, by * BLOCK_H : (by + 1) * BLOCK_H, :], Q_shared)
            T.copy(Q_pe[bx, by * BLOCK_H : (by + 1) * BLOCK_H, :], Q_pe_shared)
            T.fill(acc_o, 0)
            T.fill(logsum, 0)
            T.fill(m, -T.infinity(accum))
            loop_range = T.ceildiv(cache_seqlens[bx], block_N)
            for kr in T.Pipelined(loop_range, num_stages=num_stages):
                k = loop_range - 1 - kr  # the last tile first: the only one with keys past the end
                kv_start = block_table[bx, (k * block_N) // page] * page + (k * block_N) % page
                T.copy(KV[kv_start : kv_start + block_N, 0, :], KV_shared)
                T.copy(K_pe[kv_start : kv_start + block_N, 0, :], K_pe_shared)
                T.clear(acc_s)
                T.gemm(Q_shared, KV_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullCol)
                T.gemm(Q_pe_shared, K_pe_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullCol)
                T.copy(m, m_prev)
                T.fill(m, -T.infinity(accum))
                if kr == 0:
                    for i, j in T.Parallel(BLOCK_H, block_N):
                        acc_s[i, j] = T.if_then_else(k * block_N + j >= cache_seqlens[bx], -T.infinity(accum), acc_s[i, j])
                T.reduce_max(acc_s, m, dim=1, clear=False)
                for i in T.Parallel(BLOCK_H):
                    m[i] = T.max(m[i], m_prev[i])
                for i in T.Parallel(BLOCK_H):
                    alpha[i] = T.exp2(m_prev[i] * scale - m[i] * scale)
                for i, j in T.Parallel(BLOCK_H, block_N):
                    acc_s[i, j] = T.exp2(acc_s[i, j] * scale - m[i] * scale)
                T.reduce_sum(acc_s, row_sum, dim=1)
                T.copy(acc_s, S_shared)
                for i in T.Parallel(BLOCK_H):
                    logsum[i] = logsum[i] * alpha[i] + row_sum[i]
                for i, j in T.Parallel(BLOCK_H, dv):
                    acc_o[i, j] *= alpha[i]
                T.gemm(S_shared, KV_shared, acc_o, policy=T.GemmWarpPolicy.FullCol)
            for i, j in T.Parallel(BLOCK_H, dv):
                acc_o[i, j] /= logsum[i]
            T.copy(acc_o, O_shared)
            T.copy(O_shared, Output[bx, by * BLOCK_H : (by + 1) * BLOCK_H, :])

    return mla_paged


def inputs(problem, device):
    import torch

    batch, seqlen, heads, dv, dpe, page = (problem[k] for k in ("batch", "seqlen", "heads", "dim", "pe_dim", "page"))
    q = torch.randn(batch, heads, dv, device=device, dtype=torch.float16)
    q_pe = torch.randn(batch, heads, dpe, device=device, dtype=torch.float16)
    kv = torch.randn(batch * seqlen, 1, dv, device=device, dtype=torch.float16)
    k_pe = torch.randn(batch * seqlen, 1, dpe, device=device, dtype=torch.float16)
    pages = seqlen // page
    block_table = torch.randperm(batch * pages, device=device).to(torch.int32).view(batch, pages)  # pages scattered over the cache
    cache_seqlens = torch.randint(seqlen // 2, seqlen + 1, (batch,), device=device, dtype=torch.int32)
    return [q, q_pe, kv, k_pe, block_table, cache_seqlens, torch.empty(batch, heads, dv, device=device, dtype=torch.float16)]


def reference(problem, args):
    import torch

    q, q_pe, kv, k_pe, block_table, cache_seqlens, out = args
    page = problem["page"]
    result = torch.empty_like(out)
    for b in range(q.shape[0]):
        rows = (block_table[b].long()[:, None] * page + torch.arange(page, device=q.device)).flatten()[: cache_seqlens[b]]
        keys = torch.cat([kv[rows, 0], k_pe[rows, 0]], dim=-1).float()
        scores = torch.cat([q[b], q_pe[b]], dim=-1).float() @ keys.T * (problem["dim"] + problem["pe_dim"]) ** -0.5
        result[b] = (scores.softmax(dim=-1) @ kv[rows, 0].float()).half()
    return [result]


def flops(problem):
    """At the mean cached length (three quarters of seqlen: drawn between half and all of it)."""
    keys = 0.75 * problem["seqlen"]
    return 2.0 * problem["batch"] * problem["heads"] * keys * (2 * problem["dim"] + problem["pe_dim"])
