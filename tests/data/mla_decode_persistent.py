"""mla_decode_persistent: DeepSeek's multi-head latent attention for decoding, split over
the KV sequence and persistent, as tilelang's examples/deepseek_mla/
example_mla_decode_persistent.py writes it: one query token per sequence, 128 query heads
over one latent KV head of 512 values plus a 64-value rotary part (mla_decode.py's
computation). One kernel of PERSISTENT_BLOCKS blocks does both phases:

- split: the blocks walk the (sequence, group of block_H heads, part of num_split) tiles
  in waves; each runs mla_decode's online-softmax loop over its part of the keys (the
  latent tile is both the keys, S = Q KV^T + Q_pe K_pe^T as two MMAs into one
  accumulator, and the values, O += P KV with P staged in shared memory) and writes its
  partial output and log-sum-exp (float16, log2 domain) to global scratch (Output_partial,
  glse);
- `T.sync_grid()`, then combine: the blocks walk the (head, sequence) pairs and merge the
  parts into Output with SIMT loops over 1-D fragments and scalar `T.alloc_var`s.

What a schedule tuner sees: the pipelined key loop (the KV and K_pe tiles) is nested in
a serial loop over waves and under an `if` that guards the last wave; Q and Q_pe are
reloaded per tile; the epilogue writes a 1-D fragment (logsum) and the 2-D accumulator
straight to global memory with no shared tile between; after a grid-wide barrier comes a
second, MMA-free phase with a `T.Pipelined(num_split, num_stages=1)` loop over global
scalars. The combine is kept in the kernel (the tuner gets the example's program whole):
Output is the one output, and `reference` is the example's ref_program (attention over the
whole sequence), so a schedule that breaks either phase is caught there.

Departures from the example:
- the grid is PERSISTENT_BLOCKS = 132 blocks (one per SM of an H100/H200 SXM), a fixed
  number in place of `driver.get_num_sms()`, so that kernels build on a machine without a
  GPU. The split phase is correct for any count, but `T.sync_grid()` needs every block
  resident at once (a cooperative launch): on a GPU of fewer SMs (H100 PCIe, 114) the
  launch fails or hangs;
- kv_head_num is fixed to 1 (the example asserts it) and not a problem argument;
- glse and Output_partial are `T.alloc_global` scratch, not arguments: their shapes
  depend on num_split, a parameter, and `inputs(problem, device)` does not see the
  parameters (gqa_decode.py does the same); the kernel's arguments are Q, Q_pe, KV, K_pe,
  Output, as the example's out_idx=[6] returns Output alone;
- dtypes are spelled as strings; threads=256 and num_stages=2 stay fixed as the example
  has them, and its tunables block_N, block_H and num_split are PARAMS;
- `check` refuses a part of the keys that is not whole block_N tiles (the example's loop
  would read the next part's keys, or past the end of KV, there).

    ws-tune tests/data/mla_decode_persistent.py --shape batch=128,seqlen_kv=8192 --budget 16
"""

import tilelang.language as T

PROBLEM = {"batch": None, "heads": 128, "seqlen_kv": None, "dim": 512, "pe_dim": 64}
# block_H stays at the example's 64: at 32, tilelang's layout inference refuses the kernel
# in every lowering ("Layout infer conflict between scores_max_prev and scores_scale in
# T.Parallel loop", FullCol over 8 warps).
PARAMS = {"block_N": [32, 64], "block_H": [64], "num_split": [2, 4]}
OUTPUTS = [4]
TOLERANCE = 2e-2  # the parts' log-sum-exp and outputs go through float16, as in the example
# Blocks of the persistent grid: one per SM of an H100/H200 SXM (132), a grid size and
# not a device query (see the docstring: the grid barrier needs them all resident).
PERSISTENT_BLOCKS = 132
THREADS = 256


def check(problem, params, schedule):
    heads, seqlen_kv = problem["heads"], problem["seqlen_kv"]
    block_N, block_H, num_split = params["block_N"], params["block_H"], params["num_split"]
    if heads % block_H:
        return f"heads={heads} is not a multiple of block_H={block_H}"
    part = seqlen_kv // num_split
    if seqlen_kv % num_split or part % block_N:
        return f"seqlen_kv={seqlen_kv} does not cut into {num_split} parts of whole {block_N}-key blocks"
    return None


def kernel(problem, *, block_N, block_H, num_split):
    batch, heads, seqlen_kv, dim, pe_dim = (problem[k] for k in ("batch", "heads", "seqlen_kv", "dim", "pe_dim"))
    kv_head_num = 1
    scale = (1.0 / (dim + pe_dim)) ** 0.5 * 1.44269504  # log2(e)
    dtype = "float16"
    accum_dtype = "float32"
    kv_group_num = heads // kv_head_num
    VALID_BLOCK_H = min(block_H, kv_group_num)
    sm_num = PERSISTENT_BLOCKS

    @T.prim_func
    def main_split_persistent(
        Q: T.Tensor([batch, heads, dim], dtype),
        Q_pe: T.Tensor([batch, heads, pe_dim], dtype),
        KV: T.Tensor([batch, seqlen_kv, kv_head_num, dim], dtype),
        K_pe: T.Tensor([batch, seqlen_kv, kv_head_num, pe_dim], dtype),
        Output: T.Tensor([batch, heads, dim], dtype),
    ):
        # the example's glse and Output_partial arguments: sized by num_split, a parameter
        # that inputs() does not see, so global scratch here (as gqa_decode.py has them)
        glse = T.alloc_global([batch, heads, num_split], dtype)
        Output_partial = T.alloc_global([batch, heads, num_split, dim], dtype)
        with T.Kernel(sm_num, threads=THREADS) as (block_id):
            Q_shared = T.alloc_shared([block_H, dim], dtype)
            S_shared = T.alloc_shared([block_H, block_N], dtype)
            Q_pe_shared = T.alloc_shared([block_H, pe_dim], dtype)
            KV_shared = T.alloc_shared([block_N, dim], dtype)
            K_pe_shared = T.alloc_shared([block_N, pe_dim], dtype)
            acc_s = T.alloc_fragment([block_H, block_N], accum_dtype)
            acc_s_cast = T.alloc_fragment([block_H, block_N], dtype)
            acc_o = T.alloc_fragment([block_H, dim], accum_dtype)
            scores_max = T.alloc_fragment([block_H], accum_dtype)
            scores_max_prev = T.alloc_fragment([block_H], accum_dtype)
            scores_scale = T.alloc_fragment([block_H], accum_dtype)
            scores_sum = T.alloc_fragment([block_H], accum_dtype)
            logsum = T.alloc_fragment([block_H], accum_dtype)
            po_local = T.alloc_fragment([dim], dtype)
            o_accum_local = T.alloc_fragment([dim], accum_dtype)
            lse_local_split = T.alloc_var(accum_dtype)
            lse_logsum_local = T.alloc_var(accum_dtype)
            lse_max_local = T.alloc_var(accum_dtype)
            scale_local = T.alloc_var(accum_dtype)

            T.use_swizzle(10)

            # split: the blocks walk the (sequence, head group, part) tiles in waves
            total_tiles = batch * (heads // min(block_H, kv_group_num)) * num_split
            waves = T.ceildiv(total_tiles, sm_num)
            for w in T.serial(waves):
                tile_id = sm_num * w + block_id
                bid = tile_id // ((heads // min(block_H, kv_group_num)) * num_split)
                hid = tile_id // num_split % (heads // min(block_H, kv_group_num))
                sid = tile_id % num_split
                cur_kv_head = hid // (kv_group_num // block_H)

                if bid < batch and hid * VALID_BLOCK_H < heads and sid < num_split:
                    T.copy(Q[bid, hid * VALID_BLOCK_H : (hid + 1) * VALID_BLOCK_H, :], Q_shared)
                    T.copy(Q_pe[bid, hid * VALID_BLOCK_H : (hid + 1) * VALID_BLOCK_H, :], Q_pe_shared)
                    T.fill(acc_o, 0)
                    T.fill(logsum, 0)
                    T.fill(scores_max, -T.infinity(accum_dtype))

                    loop_range = T.ceildiv((seqlen_kv // num_split), block_N)
                    for k in T.Pipelined(loop_range, num_stages=2):
                        kv_start = (seqlen_kv // num_split) * sid + k * block_N
                        kv_end = (seqlen_kv // num_split) * sid + (k + 1) * block_N
                        T.copy(KV[bid, kv_start:kv_end, cur_kv_head, :], KV_shared)
                        T.copy(K_pe[bid, kv_start:kv_end, cur_kv_head, :], K_pe_shared)
                        T.clear(acc_s)
                        T.gemm(Q_shared, KV_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullCol)
                        T.gemm(Q_pe_shared, K_pe_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullCol)
                        T.copy(scores_max, scores_max_prev)
                        T.fill(scores_max, -T.infinity(accum_dtype))
                        T.reduce_max(acc_s, scores_max, dim=1, clear=False)
                        for i in T.Parallel(block_H):
                            scores_max[i] = T.max(scores_max[i], scores_max_prev[i])
                        for i in T.Parallel(block_H):
                            scores_scale[i] = T.exp2(scores_max_prev[i] * scale - scores_max[i] * scale)
                        for i, j in T.Parallel(block_H, block_N):
                            acc_s[i, j] = T.exp2(acc_s[i, j] * scale - scores_max[i] * scale)
                        T.reduce_sum(acc_s, scores_sum, dim=1)
                        T.copy(acc_s, S_shared)
                        T.copy(S_shared, acc_s_cast)
                        for i in T.Parallel(block_H):
                            logsum[i] = logsum[i] * scores_scale[i] + scores_sum[i]
                        for i, j in T.Parallel(block_H, dim):
                            acc_o[i, j] *= scores_scale[i]
                        T.gemm(acc_s_cast, KV_shared, acc_o, policy=T.GemmWarpPolicy.FullCol)
                    for i, j in T.Parallel(block_H, dim):
                        acc_o[i, j] /= logsum[i]
                    for i in T.Parallel(block_H):
                        logsum[i] = T.log2(logsum[i]) + scores_max[i] * scale
                    T.copy(logsum, glse[bid, hid * VALID_BLOCK_H : (hid + 1) * VALID_BLOCK_H, sid])
                    T.copy(acc_o, Output_partial[bid, hid * VALID_BLOCK_H : (hid + 1) * VALID_BLOCK_H, sid, :])

            # combine: every part written, the blocks walk the (head, sequence) pairs
            T.sync_grid()
            waves = T.ceildiv(heads * batch, sm_num)
            for w in T.serial(waves):
                tile_id = sm_num * w + block_id
                hid = tile_id // batch
                bid = tile_id % batch
                if bid < batch and hid < heads:
                    T.clear(lse_logsum_local)
                    T.clear(o_accum_local)
                    lse_max_local = -T.infinity(accum_dtype)
                    for k in T.serial(num_split):
                        lse_max_local = T.max(lse_max_local, glse[bid, hid, k])
                    for k in T.Pipelined(num_split, num_stages=1):
                        lse_local_split = glse[bid, hid, k]
                        lse_logsum_local += T.exp2(lse_local_split - lse_max_local)
                    lse_logsum_local = T.log2(lse_logsum_local) + lse_max_local
                    for k in T.serial(num_split):
                        for i in T.Parallel(dim):
                            po_local[i] = Output_partial[bid, hid, k, i]
                        lse_local_split = glse[bid, hid, k]
                        scale_local = T.exp2(lse_local_split - lse_logsum_local)
                        for i in T.Parallel(dim):
                            o_accum_local[i] += po_local[i] * scale_local
                    for i in T.Parallel(dim):
                        Output[bid, hid, i] = o_accum_local[i]

    return main_split_persistent


def inputs(problem, device):
    import torch

    batch, heads, seqlen_kv, dim, pe_dim = (problem[k] for k in ("batch", "heads", "seqlen_kv", "dim", "pe_dim"))
    rand = lambda *shape: torch.randn(*shape, device=device, dtype=torch.float16)
    return [rand(batch, heads, dim), rand(batch, heads, pe_dim), rand(batch, seqlen_kv, 1, dim), rand(batch, seqlen_kv, 1, pe_dim),
            torch.empty(batch, heads, dim, device=device, dtype=torch.float16)]  # fmt: skip


def reference(problem, args):
    """The example's ref_program: softmax((q . kv + q_pe . k_pe) / sqrt(dim + pe_dim)) @ kv
    over the whole KV sequence, in float32 (the split and its combine are exact)."""
    import torch

    q, q_pe, kv, k_pe, _ = (a.float() for a in args)
    kv, k_pe = kv[:, :, 0], k_pe[:, :, 0]  # (B, S, D), (B, S, P): the one latent head serves every query head
    scores = (q @ kv.transpose(1, 2) + q_pe @ k_pe.transpose(1, 2)) * (q.shape[-1] + q_pe.shape[-1]) ** -0.5
    return [torch.softmax(scores, dim=-1) @ kv]


def flops(problem):
    b, h, s, d, p = (problem[k] for k in ("batch", "heads", "seqlen_kv", "dim", "pe_dim"))
    return 2.0 * b * h * s * (d + p) + 2.0 * b * h * s * d
