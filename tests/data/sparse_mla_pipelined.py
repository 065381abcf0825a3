"""sparse_mla_pipelined: DeepSeek-V3.2's sparse MLA forward (bf16) as tilelang's
examples/deepseek_v32/sparse_mla_fwd_pipelined.py writes it: each query attends to topk key
positions named by an index tensor; the keys carry a 64-wide rotary tail and the values are
the keys' first dim columns. Index slots past a query's causal end (q_start + s) hold
seq_kv and are masked.

New for a schedule tuner: the example specializes its 384 threads by hand, by the raw thread
index, with barriers, setmaxnreg budgets and a two-stage ring of its own (no T.Pipelined):
warps 256-383 gather each block of 64 keys by cp.async (one 16-byte chunk per thread, only
the valid rows) and arrive on bar_k_ready by cp.async.mbarrier.arrive.noinc; warpgroup 0
computes S = Q K^T (three wgmmas), the online softmax and the left half of O, and hands P
and its rescale factors to warpgroup 1 through shared memory; warpgroup 1 computes the right
half of O. Q comes by TMA before the split and its tile is reused for the output. The
example computes the log2-sum-exp but never stores it: Lse is an argument the kernel leaves
untouched, and only Output is checked.

    ws-tune tests/data/sparse_mla_pipelined.py --shape batch=1,seq=4096,seq_kv=8192,q_start=1024,topk=2048
"""

import tilelang.language as T

PROBLEM = {"batch": 1, "seq": 128, "seq_kv": 1024, "q_start": 64, "heads": 128, "kv_group": 1, "topk": 256, "dim": 512, "tail": 64}
CHOICES = {"heads": [64, 128], "kv_group": [1], "dim": [512], "tail": [64]}
# The example's barriers count 384 threads, its producer covers 64 rows of a block in 4 x 16,
# and its ring has two stages: nothing here is free to vary.
PARAMS = {"block_I": [64], "num_stages": [2], "threads": [384]}
OUTPUTS = [4]
TOLERANCE = 2e-2
LOG2E = 1.44269504
KV_STRIDE = 1  # the example's correctness test runs kv_stride=1 only


def check(problem, params, schedule):
    if problem["q_start"] + problem["seq"] > problem["seq_kv"]:
        return "q_start + seq must not exceed seq_kv (the masked slots hold seq_kv, past every query's causal end)"
    if problem["topk"] % (params["block_I"] * params["num_stages"]):
        return "topk must be a multiple of block_I * num_stages (the ring takes two blocks per trip)"
    return None


def kernel(problem, *, block_I, num_stages, threads):
    batch, seq_len, seq_len_kv, heads, kv_group, topk, dim, tail_dim = (
        problem[k] for k in ("batch", "seq", "seq_kv", "heads", "kv_group", "topk", "dim", "tail"))  # fmt: skip
    CP0 = problem["q_start"] == 0
    sm_scale = (1.0 / (dim + tail_dim)) ** 0.5 * LOG2E
    head_kv = heads // kv_group
    q_shape = [batch, seq_len, heads, dim + tail_dim]
    kv_shape = [batch, seq_len_kv, kv_group, dim + tail_dim]
    o_shape = [batch, seq_len, heads, dim]
    indices_shape = [batch, seq_len, kv_group, topk]
    lse_shape = [batch, seq_len, heads]
    indices_dtype, dtype, accum_dtype = "int32", "bfloat16", "float32"

    padded_H = max(1 << (head_kv - 1).bit_length(), 16)
    BI = block_I
    NI = (topk + block_I - 1) // block_I
    D = dim
    D_tail = tail_dim
    KV_stride = KV_STRIDE
    REPLICATE_H = head_kv // 64 if head_kv > 64 else 1
    H_per_block = padded_H if REPLICATE_H == 1 else 64

    @T.prim_func
    def sparse_mla_pipelined(Q: T.Tensor(q_shape, dtype), KV: T.Tensor(kv_shape, dtype),
                             Indices: T.Tensor(indices_shape, indices_dtype), q_start_index_s: T.Tensor((1,), indices_dtype),
                             Output: T.Tensor(o_shape, dtype), Lse: T.Tensor(lse_shape, accum_dtype)):  # fmt: skip
        with T.Kernel((seq_len - KV_stride + 1 if CP0 else seq_len) * REPLICATE_H, batch, kv_group, threads=threads) as (bx, by, bz):
            Q_shared = T.alloc_shared([H_per_block, D + D_tail], dtype)
            KV_shared = T.alloc_shared([num_stages, BI, D + D_tail], dtype)
            O_shared = Q_shared
            is_kv_valid = T.alloc_shared([num_stages, BI], "bool", scope="shared")

            acc_o_l = T.alloc_fragment([H_per_block, D // 2], accum_dtype)
            acc_o_r = T.alloc_fragment([H_per_block, D // 2], accum_dtype)
            acc_s = T.alloc_fragment([H_per_block, BI], accum_dtype)
            S_shared = T.alloc_shared([H_per_block, BI], dtype)
            sumexp = T.alloc_fragment([H_per_block], accum_dtype)
            sum_exp_shared = T.alloc_shared([H_per_block], accum_dtype)
            sumexp_i = T.alloc_fragment([H_per_block], accum_dtype)
            alpha_shared = T.alloc_shared([H_per_block], accum_dtype, scope="shared")
            alpha_local = T.alloc_fragment([H_per_block], accum_dtype)
            m_i = T.alloc_fragment([H_per_block], accum_dtype)
            m_i_prev = T.alloc_fragment([H_per_block], accum_dtype)
            indices_local = T.alloc_var(indices_dtype)

            bar_q = T.alloc_barrier(arrive_count=384)
            bar_k_ready = T.alloc_barrier(arrive_count=[128] * num_stages)
            bar_k_free = T.alloc_barrier(arrive_count=[256] * num_stages)
            bar_sScale_and_sS_ready = T.alloc_barrier(arrive_count=256)
            bar_sScale_and_sS_free = T.alloc_barrier(arrive_count=256)

            b_i, g_i = by, bz
            s_i = (bx + (KV_stride - 1 if CP0 else 0)) if REPLICATE_H == 1 else (bx // REPLICATE_H + (KV_stride - 1 if CP0 else 0))
            q_i = q_start_index_s[0] + s_i
            max_kv_i = (q_i + 1 - KV_stride) // KV_stride

            H0 = g_i * padded_H + (0 if REPLICATE_H == 1 else (bx % REPLICATE_H) * 64)
            H1 = H0 + H_per_block

            tx = T.get_thread_binding()

            T.tma_copy(Q[b_i, s_i, H0:H1, :], Q_shared, barrier=bar_q)
            T.barrier_arrive(bar_q)

            if tx < 128:
                T.set_max_nreg(240, 1)
                T.fill(sumexp, 0)
                T.fill(m_i, -(2**30))  # avoid -inf - inf to cause nan
                T.fill(acc_o_l, 0)
                T.barrier_wait(bar_q, 0)

                for i_i in T.serial(T.ceildiv(NI, num_stages)):
                    for stage in T.unroll(num_stages):
                        T.barrier_wait(bar_k_ready[stage], (i_i & 1))

                        for h_i, bi_i in T.Parallel(H_per_block, BI):
                            acc_s[h_i, bi_i] = T.if_then_else(is_kv_valid[stage, bi_i], 0, -T.infinity(acc_s.dtype))
                        T.wgmma_gemm(Q_shared[:, : D // 2], KV_shared[stage, :, : D // 2], acc_s, transpose_B=True)
                        T.wgmma_gemm(Q_shared[:, D // 2 : D], KV_shared[stage, :, D // 2 : D], acc_s, transpose_B=True)
                        T.wgmma_gemm(Q_shared[:, D:], KV_shared[stage, :, D:], acc_s, transpose_B=True)

                        T.wait_wgmma(0)

                        if i_i != 0 or stage != 0:
                            T.barrier_arrive(bar_sScale_and_sS_free)
                            T.barrier_wait(bar_sScale_and_sS_free, ((i_i * num_stages + stage) & 1) ^ 1)

                        T.copy(m_i, m_i_prev)
                        T.reduce_max(acc_s, m_i, dim=1, clear=False)
                        for h_i in T.Parallel(H_per_block):
                            m_i[h_i] = T.max(m_i[h_i], m_i_prev[h_i])
                        for h_i in T.Parallel(H_per_block):
                            alpha_local[h_i] = T.exp2((m_i_prev[h_i] - m_i[h_i]) * sm_scale)
                        for h_i, bi_i in T.Parallel(H_per_block, BI):
                            acc_s[h_i, bi_i] = T.exp2(acc_s[h_i, bi_i] * sm_scale - m_i[h_i] * sm_scale)
                        T.reduce_sum(acc_s, sumexp_i, dim=1)
                        for h_i in T.Parallel(H_per_block):
                            sumexp[h_i] = sumexp[h_i] * alpha_local[h_i] + sumexp_i[h_i]
                        for h_i, d_i in T.Parallel(H_per_block, D // 2):
                            acc_o_l[h_i, d_i] *= alpha_local[h_i]
                        T.copy(alpha_local, alpha_shared)

                        T.copy(acc_s, S_shared)
                        T.gemm(S_shared, KV_shared[stage, :, : D // 2], acc_o_l)

                        T.barrier_arrive(bar_sScale_and_sS_ready)
                        T.barrier_arrive(bar_k_free[stage])

                # Rescale
                for h_i in T.Parallel(H_per_block):
                    sum_exp_shared[h_i] = sumexp[h_i]
                for h_i, d_i in T.Parallel(H_per_block, D // 2):
                    acc_o_l[h_i, d_i] /= sumexp[h_i]
                for h_i in T.Parallel(H_per_block):
                    sumexp[h_i] = T.log2(sumexp[h_i]) + m_i[h_i] * sm_scale
                T.copy(acc_o_l, O_shared[:, : D // 2])
                T.copy(O_shared[:, : D // 2], Output[b_i, s_i, H0:H1, 0 : D // 2])

            elif tx >= 128 and tx < 256:
                T.set_max_nreg(168, 1)
                T.fill(acc_o_r, 0)
                for i_i in T.serial(T.ceildiv(NI, num_stages)):
                    for stage in T.unroll(num_stages):
                        T.barrier_arrive(bar_sScale_and_sS_ready)
                        T.barrier_wait(bar_sScale_and_sS_ready, ((i_i * num_stages + stage) & 1))
                        for h_i, d_i in T.Parallel(H_per_block, D // 2):
                            acc_o_r[h_i, d_i] *= alpha_shared[h_i]
                        T.gemm(S_shared, KV_shared[stage, :, D // 2 : D], acc_o_r)
                        T.barrier_arrive(bar_k_free[stage])
                        if stage != num_stages - 1 or i_i != T.ceildiv(NI, num_stages) - 1:
                            T.barrier_arrive(bar_sScale_and_sS_free)

                # Rescale
                for h_i, d_i in T.Parallel(H_per_block, D // 2):
                    acc_o_r[h_i, d_i] /= sum_exp_shared[h_i]

                T.copy(acc_o_r, O_shared[:, D // 2 : D])
                T.copy(O_shared[:, D // 2 : D], Output[b_i, s_i, H0:H1, D // 2 : D])
            elif tx >= 256:
                # producer
                T.set_max_nreg(80, 0)
                for i_i in T.serial(T.ceildiv(NI, num_stages)):
                    for stage in T.unroll(num_stages):
                        T.barrier_wait(bar_k_free[stage], ((i_i & 1) ^ 1))
                        for r in T.serial(4):
                            indices_local = Indices[b_i, s_i, g_i, (i_i * num_stages + stage) * BI + r * 16 + (tx - 256) // 8]
                            is_kv_valid[stage, r * 16 + (tx - 256) // 8] = indices_local <= max_kv_i
                            if is_kv_valid[stage, r * 16 + (tx - 256) // 8]:
                                for u in T.serial((D + D_tail) // 64):
                                    T.ptx_cp_async(
                                        T.access_ptr(KV_shared[stage, r * 16 + (tx - 256) // 8, 64 * u + (tx - 256) % 8 * 8], "w", 8),
                                        T.access_ptr(KV[b_i, indices_local, g_i, 64 * u + (tx - 256) % 8 * 8], "r", 8),
                                        8,
                                    )
                        T.cp_async_barrier_noinc(bar_k_ready[stage])

    return sparse_mla_pipelined


def inputs(problem, device):
    import torch

    batch, seq, seq_kv, q_start, heads, groups, topk = (problem[k] for k in ("batch", "seq", "seq_kv", "q_start", "heads", "kv_group", "topk"))
    width = problem["dim"] + problem["tail"]
    q = (torch.randn(batch, seq, heads, width, device=device, dtype=torch.bfloat16) / 10).clamp_(-10, 10)
    kv = (torch.randn(batch, seq_kv, groups, width, device=device, dtype=torch.bfloat16) / 10).clamp_(-10, 10)
    # as the example's test: query t draws up to topk distinct positions below max(1, q_start + t);
    # the slots left over hold seq_kv
    limit = (torch.arange(seq, device=device) + q_start).clamp(min=1, max=seq_kv)
    draw = torch.rand(batch, seq, groups, seq_kv, device=device)
    late = torch.arange(seq_kv, device=device) >= limit[:, None, None]
    picked = draw.masked_fill(late, -1.0).topk(topk, dim=-1)
    indices = picked.indices.masked_fill(picked.values < 0, seq_kv).to(torch.int32)
    start = torch.tensor([q_start], device=device, dtype=torch.int32)
    return [q, kv, indices, start, torch.empty(batch, seq, heads, problem["dim"], device=device, dtype=torch.bfloat16),
            torch.empty(batch, seq, heads, device=device, dtype=torch.float32)]  # fmt: skip


def reference(problem, args):
    import torch

    q, kv, indices, start = args[0].float(), args[1].float(), args[2].long(), int(args[3][0])
    batch, seq, heads, width = q.shape
    groups, D = kv.shape[2], problem["dim"]
    q = q.view(batch, seq, groups, heads // groups, width)
    b = torch.arange(batch, device=q.device)[:, None, None, None]
    g = torch.arange(groups, device=q.device)[None, None, :, None]
    gathered = kv[b, indices.clamp(max=kv.shape[1] - 1), g]  # (batch, seq, groups, topk, width)
    logits = torch.einsum("bsghd,bsgkd->bsghk", q, gathered) / width**0.5
    late = indices > (start + torch.arange(seq, device=q.device))[None, :, None, None]
    logits = logits.masked_fill(late[:, :, :, None, :], float("-inf"))
    out = torch.einsum("bsghk,bsgkd->bsghd", logits.softmax(-1), gathered[..., :D])
    return [out.reshape(batch, seq, heads, D)]


def flops(problem):
    # every index slot is computed, masked or not
    b, s, h, k, D, tail = (problem[key] for key in ("batch", "seq", "heads", "topk", "dim", "tail"))
    return 2.0 * b * s * h * k * (D + tail + D)
