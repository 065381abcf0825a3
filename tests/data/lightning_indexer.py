"""lightning_indexer: DeepSeek-V3.2's lightning indexer (fp8), as tilelang's
examples/deepseek_v32/fp8_lighting_indexer.py writes it: each block of block_Q query
tokens scores the keys in the union of their ranges [ks, ke): one fp8 MMA of a key tile
against the block's query heads, rectified, weighted per head and summed over heads,
scaled per key. The range is reduced into two local variables by serial loops at the top
(``T.alloc_var``), and sets the pipelined loop's start and trip count. A second kernel
clears what lies outside each query's own range.

Cleared logits are 0 here, not the example's -inf (the correctness gate's relative error
needs finite values); the score stores past seq_kv are guarded (the example's run into
the next row, which its clearing kernel then overwrites).

    ws-tune tests/data/lightning_indexer.py --shape seq=4096 --budget 16
"""

import tilelang.language as T

PROBLEM = {"seq": None, "heads": 64, "dim": 128, "seqs": 4}
CHOICES = {"heads": [32, 64]}
PARAMS = {"block_N": [64, 128, 256], "block_Q": [1, 2], "num_stages": [1, 2], "threads": [128, 256]}
TOLERANCE = 2e-2
CLEAR = 256  # columns a clearing step covers


def check(problem, params, schedule):
    if problem["seq"] % params["block_Q"] or problem["seq"] % problem["seqs"]:
        return f"seq={problem['seq']} is not a multiple of block_Q={params['block_Q']} and of seqs={problem['seqs']}"
    return None


def kernel(problem, *, block_N, block_Q, num_stages, threads):
    seq, heads, dim = problem["seq"], problem["heads"], problem["dim"]
    seq_kv = seq  # packed causal prefill: the keys are the queries' own tokens
    fp8, accum = "float8_e4m3", "float32"
    rows = block_Q * heads

    @T.prim_func
    def lightning_indexer(IndexQ: T.Tensor((seq * heads, dim), fp8), IndexK: T.Tensor((seq_kv, dim), fp8),
                          IndexKScale: T.Tensor((seq_kv,), accum), Weights: T.Tensor((seq, heads), accum),
                          CuSeqLenKS: T.Tensor((seq,), "int32"), CuSeqLenKE: T.Tensor((seq,), "int32"),
                          Logits: T.Tensor((seq, seq_kv), accum)):  # fmt: skip
        with T.Kernel(seq // block_Q, threads=threads) as bx:
            index_q_shared = T.alloc_shared((rows, dim), fp8)
            index_k_shared = T.alloc_shared((block_N, dim), fp8)
            scale = T.alloc_fragment((block_N,), accum)
            s = T.alloc_fragment((block_N, rows), accum)
            s_reshaped = T.reshape(s, (block_N, block_Q, heads))
            logits = T.alloc_fragment((block_N, block_Q), accum)
            weights = T.alloc_fragment((block_Q, heads), accum)
            q0 = bx * block_Q
            k_lo = T.alloc_var("int32")
            k_hi = T.alloc_var("int32")
            k_lo = 2147483647
            k_hi = -2147483648
            for q in T.serial(block_Q):
                k_lo = T.min(k_lo, T.min(CuSeqLenKS[q0 + q], seq_kv))
            for q in T.serial(block_Q):
                k_hi = T.max(k_hi, T.min(CuSeqLenKE[q0 + q], seq_kv))

            T.copy(IndexQ[q0 * heads : q0 * heads + rows, :], index_q_shared)
            T.copy(Weights[q0 : q0 + block_Q, :], weights)
            for n_i in T.Pipelined(T.ceildiv(k_hi - k_lo, block_N), num_stages=num_stages):
                k0 = k_lo + n_i * block_N
                T.copy(IndexK[k0 : k0 + block_N, :], index_k_shared)
                T.copy(IndexKScale[k0 : k0 + block_N], scale)
                T.gemm(index_k_shared, index_q_shared, s, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullCol)
                for n, q, h in T.Parallel(block_N, block_Q, heads):
                    s_reshaped[n, q, h] = T.max(s_reshaped[n, q, h], 0) * weights[q, h] * scale[n]
                T.reduce_sum(s_reshaped, logits, dim=-1, clear=True)
                for q, n in T.Parallel(block_Q, block_N):
                    if k0 + n < seq_kv:
                        Logits[q0 + q, k0 + n] = logits[n, q]

        with T.Kernel(seq, threads=CLEAR) as i:
            ks = CuSeqLenKS[i]
            ke = CuSeqLenKE[i]
            for c in T.serial(T.ceildiv(seq_kv, CLEAR)):
                for j in T.Parallel(CLEAR):
                    if c * CLEAR + j < seq_kv and (c * CLEAR + j < ks or c * CLEAR + j >= ke):
                        Logits[i, c * CLEAR + j] = 0

    return lightning_indexer


def inputs(problem, device):
    import torch

    seq, heads, dim, seqs = problem["seq"], problem["heads"], problem["dim"], problem["seqs"]
    q = torch.randn(seq * heads, dim, device=device).to(torch.float8_e4m3fn)
    k = torch.randn(seq, dim, device=device).to(torch.float8_e4m3fn)
    k_scale = 0.1 + 0.01 * torch.rand(seq, device=device)
    weights = torch.randn(seq, heads, device=device)
    positions = torch.arange(seq, device=device, dtype=torch.int32)
    ks = positions - positions % (seq // seqs)  # the start of the query's sequence
    ke = positions + 1  # causal: up to the query itself
    return [q, k, k_scale, weights, ks, ke, torch.empty(seq, seq, device=device)]


def reference(problem, args):
    import torch

    q, k, k_scale, weights, ks, ke, _ = args
    heads = problem["heads"]
    keys = k.float() * k_scale[:, None]
    cols = torch.arange(k.shape[0], device=k.device)
    out = []
    for rows in torch.arange(q.shape[0] // heads, device=q.device).split(256):  # a slice of queries at a time
        scores = (q[rows[0] * heads : (rows[-1] + 1) * heads].float() @ keys.T).view(len(rows), heads, -1)
        logits = (scores.clamp(min=0) * weights[rows, :, None]).sum(dim=1)
        inside = (cols >= ks[rows, None]) & (cols < ke[rows, None])
        out.append(logits * inside)
    return [torch.cat(out)]


def flops(problem):
    """The MMA over each query block's key range, at block_Q=1: about half the keys a query."""
    return 2.0 * problem["heads"] * problem["dim"] * problem["seq"] * (problem["seq"] / problem["seqs"]) / 2
