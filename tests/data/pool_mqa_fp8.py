"""pool_mqa_fp8: the prefill pool-MQA of DeepSeek sparse attention's hierarchical indexer
(HISA, fp8), as tilelang's examples/dsa_hisa/pool_mqa_fp8.py writes it (its kernel
pool_mqa_attn_return_logits_fp8): the keys are pooled, one fp8 key per block of
k_block_size tokens with a per-block scale, and each query token scores the pooled blocks
in its own causal range [ks, ke): one fp8 MMA of a tile of block_N pooled keys against
the block_Q query tokens' heads, scaled per key, rectified, weighted per head and summed
over heads,

    logits[m, n] = sum_h ReLU(Q[m, h] . K[n] * scale[n]) * W[m, h].

Each block of block_Q query tokens reduces the union of their ranges into two local
variables by serial loops at the top (``T.alloc_var``); the union sets the pipelined
loop's start and trip count, and every key tile's logits are stored to global memory.

Departures from the example:
- the example's symbolic seq_len and seq_len_blocked_kv (``T.const``) are concrete: ``seq``
  query tokens in ``seqs`` causal sequences of equal length (ks/ke as the example's
  prepare_ks_ke_from_cu_seqlens makes them, inlined here), whose tokens are pooled into
  ``blocks = ceil(seq / k_block_size)`` keys; the block ranges are the token ranges floored
  (start) and ceiled (end) by k_block_size, as the example's test makes them;
- the raw kernel leaves the logits outside the tile union undefined and, inside it but
  outside a query's own range, unmasked; the example then runs clean_and_maintain_logits
  (-inf outside the range, +inf at its first and last block). Here a second T.Kernel in the
  same prim_func clears what lies outside each query's own range to 0 and keeps the raw
  scores at the range's ends (the correctness gate's relative error needs finite values,
  and unwritten elements are NaN there);
- the score stores past the last pooled key are guarded: the example's run into the next
  query's row (the union's last tile starts at its first block, not at a multiple of
  block_N), which its test only tolerates because the clearing kernel overwrites them, and
  which another thread block may be writing at the same time. With the guard, the example's
  assertion that blocks be a multiple of block_N is not needed;
- block_Q is a parameter given outright (the example derives it as 128 // heads when 0), and
  ``check`` asks that it divide seq (the example's last block reads past the queries);
- the example's pass config TL_ENABLE_FAST_MATH is not set (a kernel file gives none);
- the dtype names are the strings of the other ports ("float8_e4m3"), not T.float8_e4m3fn.

PARAMS are the example's kernel arguments around its defaults (block_N=256, num_stages=3,
threads=512, block_Q = 128 // heads = 2); the example's configs vary only the problem
(M = 32768..131072 tokens, 1..16 sequences, at 64 heads of 128 and 128-token blocks).

    ws-tune tests/data/pool_mqa_fp8.py --shape seq=32768 --budget 16
"""

import tilelang.language as T

PROBLEM = {"seq": None, "heads": 64, "dim": 128, "k_block_size": 128, "seqs": 4}
CHOICES = {"heads": [32, 64], "dim": [64, 128], "k_block_size": [64, 128]}
PARAMS = {"block_N": [128, 256], "block_Q": [1, 2], "num_stages": [2, 3], "threads": [256, 512]}
TOLERANCE = 2e-2
CLEAR = 256  # columns a clearing step covers


def _blocks(problem):
    return -(-problem["seq"] // problem["k_block_size"])


def check(problem, params, schedule):
    if problem["seq"] % params["block_Q"] or problem["seq"] % problem["seqs"]:
        return f"seq={problem['seq']} is not a multiple of block_Q={params['block_Q']} and of seqs={problem['seqs']}"
    return None


def kernel(problem, *, block_N, block_Q, num_stages, threads):
    seq, heads, dim = problem["seq"], problem["heads"], problem["dim"]
    blocks = _blocks(problem)
    fp8, accum = "float8_e4m3", "float32"
    rows = block_Q * heads

    @T.prim_func
    def pool_mqa_fp8(IndexQ: T.Tensor((seq * heads, dim), fp8), IndexBlockedK: T.Tensor((blocks, dim), fp8),
                     IndexBlockedKScale: T.Tensor((blocks,), accum), Weights: T.Tensor((seq, heads), accum),
                     CuSeqLenBlockedKS: T.Tensor((seq,), "int32"), CuSeqLenBlockedKE: T.Tensor((seq,), "int32"),
                     Logits: T.Tensor((seq, blocks), accum)):  # fmt: skip
        with T.Kernel(seq // block_Q, threads=threads) as bx:
            index_q_shared = T.alloc_shared((rows, dim), fp8)
            index_k_shared = T.alloc_shared((block_N, dim), fp8)
            index_k_scale_fragment = T.alloc_fragment((block_N,), accum)
            s = T.alloc_fragment((block_N, rows), accum)
            s_reshaped = T.reshape(s, (block_N, block_Q, heads))
            logits = T.alloc_fragment((block_N, block_Q), accum)
            weights = T.alloc_fragment((block_Q, heads), accum)
            q0 = bx * block_Q
            cu_k_s_min = T.alloc_var("int32")
            cu_k_e_max = T.alloc_var("int32")
            cu_k_s_min = 2147483647
            cu_k_e_max = -2147483648
            for bq_i in T.serial(block_Q):
                cu_k_s_min = T.min(cu_k_s_min, T.min(CuSeqLenBlockedKS[q0 + bq_i], blocks))
            for bq_i in T.serial(block_Q):
                cu_k_e_max = T.max(cu_k_e_max, T.min(CuSeqLenBlockedKE[q0 + bq_i], blocks))

            T.copy(IndexQ[q0 * heads : q0 * heads + rows, :], index_q_shared)
            T.copy(Weights[q0 : q0 + block_Q, :], weights)
            for nbn_i in T.Pipelined(T.ceildiv(cu_k_e_max - cu_k_s_min, block_N), num_stages=num_stages):
                k0 = cu_k_s_min + nbn_i * block_N
                T.copy(IndexBlockedK[k0 : k0 + block_N, :], index_k_shared)
                T.copy(IndexBlockedKScale[k0 : k0 + block_N], index_k_scale_fragment)
                T.gemm(index_k_shared, index_q_shared, s, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullCol)
                for bn_i, bq_i, h_i in T.Parallel(block_N, block_Q, heads):
                    s_reshaped[bn_i, bq_i, h_i] = T.max(s_reshaped[bn_i, bq_i, h_i] * index_k_scale_fragment[bn_i], 0) * weights[bq_i, h_i]
                T.reduce_sum(s_reshaped, logits, dim=-1, clear=True)
                for bq_i, bn_i in T.Parallel(block_Q, block_N):
                    if k0 + bn_i < blocks:
                        Logits[q0 + bq_i, k0 + bn_i] = logits[bn_i, bq_i]

        with T.Kernel(seq, threads=CLEAR) as i:
            ks = CuSeqLenBlockedKS[i]
            ke = CuSeqLenBlockedKE[i]
            for c in T.serial(T.ceildiv(blocks, CLEAR)):
                for j in T.Parallel(CLEAR):
                    if c * CLEAR + j < blocks and (c * CLEAR + j < ks or c * CLEAR + j >= ke):
                        Logits[i, c * CLEAR + j] = 0

    return pool_mqa_fp8


def inputs(problem, device):
    import torch

    seq, heads, dim, kb, seqs = problem["seq"], problem["heads"], problem["dim"], problem["k_block_size"], problem["seqs"]
    blocks = _blocks(problem)
    # prepare_ks_ke_from_cu_seqlens: a token sees its own sequence up to itself
    positions = torch.arange(seq, device=device, dtype=torch.int32)
    ks = positions - positions % (seq // seqs)
    ke = positions + 1
    q = torch.randn(seq * heads, dim, device=device).to(torch.float8_e4m3fn)
    k = torch.randn(blocks, dim, device=device).to(torch.float8_e4m3fn)
    k_scale = 0.1 + 0.01 * torch.rand(blocks, device=device)
    weights = torch.randn(seq, heads, device=device)
    blocked_ks = ks // kb
    blocked_ke = (ke + kb - 1) // kb
    return [q, k, k_scale, weights, blocked_ks, blocked_ke, torch.empty(seq, blocks, device=device)]


def reference(problem, args):
    import torch

    q, k, k_scale, weights, ks, ke, _ = args
    heads = problem["heads"]
    keys = k.float() * k_scale[:, None]  # fp8 tensors multiply poorly: widened first
    cols = torch.arange(k.shape[0], device=k.device)
    out = []
    for rows in torch.arange(q.shape[0] // heads, device=q.device).split(256):  # a slice of queries at a time
        scores = (q[rows[0] * heads : (rows[-1] + 1) * heads].float() @ keys.T).view(len(rows), heads, -1)
        logits = (scores.clamp(min=0) * weights[rows, :, None]).sum(dim=1)
        inside = (cols >= ks[rows, None]) & (cols < ke[rows, None])
        out.append(logits * inside)
    return [torch.cat(out)]


def flops(problem):
    """The MMA over each query's own causal range of pooled keys: about half its sequence's blocks.
    (The example counts the whole seq x blocks grid, 2 * M * H * Nb * D.)"""
    return 2.0 * problem["heads"] * problem["dim"] * problem["seq"] * (_blocks(problem) / problem["seqs"]) / 2
