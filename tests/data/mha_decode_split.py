"""mha_decode_split: flash decoding for multi-head attention (split-KV attention
and its combine) as tilelang's examples/flash_decoding/example_mha_inference.py
writes it. Each block takes `block_M` query rows of one (batch, head) and one of
`num_split` parts of the KV sequence, runs an online-softmax attention over that
part and writes its partial output and log-sum-exp (float16, log2 domain) to
global scratch; a second kernel in the same function combines the parts.
Non-causal only: the example's causal branch is a TODO that ignores the split.

New for a schedule tuner compared with gqa_decode.py:
- every MMA row is a real query (no padded heads), and a seqlen_q that is not a
  multiple of block_M is allowed (the last query block is guarded);
- Q and the partial output move through SIMT copies that refuse TMA
  (`disable_tma`, the example's workaround for that ragged seqlen_q; the
  installed tilelang takes it through `annotations`): role_based's seed keeps
  the Q load with the consumer warps, so only K and V are pipelined;
- the log-sum-exp is written by a whole-tile `T.copy` from a fragment, in float16;
- the combine kernel has two `T.Pipelined` loops (gqa_decode's has serial
  ones), one with num_stages=2, that read global memory straight into fragments
  and a 2-D fragment (`lse_local`) reduced along its first axis; like
  gqa_decode's combine it is not specialized (the seed's roles are the split
  kernel's), and compiles as tilelang lowers it;
- `num_split` is a kernel parameter (a module constant in the example).

    ws-tune tests/data/mha_decode_split.py --shape seqlen_q=128,seqlen_kv=8192 --budget 16
"""

import tilelang.language as T

PROBLEM = {"batch": 1, "heads": 32, "seqlen_q": None, "seqlen_kv": None, "dim": 128}
PARAMS = {"block_M": [64, 128], "block_N": [64, 128], "num_split": [2, 4]}
TOLERANCE = 2e-2  # the parts' log-sum-exp goes through float16, as in the example
NO_TMA = {"disable_tma": True}


def check(problem, params, schedule):
    part = problem["seqlen_kv"] // params["num_split"]
    if problem["seqlen_kv"] % params["num_split"] or part % params["block_N"]:
        return f"seqlen_kv={problem['seqlen_kv']} does not cut into {params['num_split']} parts of whole {params['block_N']}-key blocks"
    return None


def kernel(problem, *, block_M, block_N, num_split):
    batch, heads, seqlen_q, seqlen_kv, dim = (problem[k] for k in ("batch", "heads", "seqlen_q", "seqlen_kv", "dim"))
    scale = (1.0 / dim) ** 0.5 * 1.44269504  # log2(e)
    shape_q = [batch, seqlen_q, heads, dim]
    shape_kv = [batch, seqlen_kv, heads, dim]
    part_shape = [batch, seqlen_q, heads, num_split, dim]
    part = seqlen_kv // num_split
    dtype, accum_dtype = "float16", "float32"

    @T.prim_func
    def flashattn_mha_inference(Q: T.Tensor(shape_q, dtype), K: T.Tensor(shape_kv, dtype), V: T.Tensor(shape_kv, dtype),
                                Output: T.Tensor(shape_q, dtype)):  # fmt: skip
        glse = T.alloc_global([batch, heads, num_split, seqlen_q], dtype)
        Output_partial = T.alloc_global(part_shape, dtype)  # [batch, seqlen_q, heads, num_split, dim]
        # split
        with T.Kernel(T.ceildiv(seqlen_q, block_M), heads * batch, num_split, threads=128) as (bx, by, bz):
            Q_shared = T.alloc_shared([block_M, dim], dtype)
            K_shared = T.alloc_shared([block_N, dim], dtype)
            V_shared = T.alloc_shared([block_N, dim], dtype)
            O_shared = T.alloc_shared([block_M, dim], dtype)
            acc_s = T.alloc_fragment([block_M, block_N], accum_dtype)
            acc_s_cast = T.alloc_fragment([block_M, block_N], dtype)
            acc_o = T.alloc_fragment([block_M, dim], accum_dtype)
            scores_max = T.alloc_fragment([block_M], accum_dtype)
            scores_max_prev = T.alloc_fragment([block_M], accum_dtype)
            scores_scale = T.alloc_fragment([block_M], accum_dtype)
            scores_sum = T.alloc_fragment([block_M], accum_dtype)
            logsum = T.alloc_fragment([block_M], accum_dtype)

            mid = bx
            hid = by % heads
            bid = by // heads
            sid = bz

            # the example's note: TMA has trouble with the padded seqlen_q, so SIMT copies
            T.copy(Q[bid, mid * block_M : (mid + 1) * block_M, hid, :], Q_shared, annotations=NO_TMA)
            T.fill(acc_o, 0)
            T.fill(logsum, 0)
            T.fill(scores_max, -T.infinity(accum_dtype))

            for k in T.Pipelined(T.ceildiv(part, block_N), num_stages=2):
                T.copy(K[bid, part * sid + k * block_N : part * sid + (k + 1) * block_N, hid, :], K_shared)
                T.clear(acc_s)
                T.gemm(Q_shared, K_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)

                T.copy(scores_max, scores_max_prev)
                T.fill(scores_max, -T.infinity(accum_dtype))
                T.reduce_max(acc_s, scores_max, dim=1, clear=False)
                for i in T.Parallel(block_M):
                    scores_max[i] = T.max(scores_max[i], scores_max_prev[i])
                for i in T.Parallel(block_M):
                    scores_scale[i] = T.exp2(scores_max_prev[i] * scale - scores_max[i] * scale)
                for i, j in T.Parallel(block_M, block_N):
                    acc_s[i, j] = T.exp2(acc_s[i, j] * scale - scores_max[i] * scale)
                T.reduce_sum(acc_s, scores_sum, dim=1)
                for i in T.Parallel(block_M):
                    logsum[i] = logsum[i] * scores_scale[i] + scores_sum[i]
                T.copy(acc_s, acc_s_cast)

                for i, j in T.Parallel(block_M, dim):
                    acc_o[i, j] *= scores_scale[i]

                T.copy(V[bid, part * sid + k * block_N : part * sid + (k + 1) * block_N, hid, :], V_shared)
                T.gemm(acc_s_cast, V_shared, acc_o, policy=T.GemmWarpPolicy.FullRow)

            for i, j in T.Parallel(block_M, dim):
                acc_o[i, j] /= logsum[i]
            for i in T.Parallel(block_M):
                logsum[i] = T.log2(logsum[i]) + scores_max[i] * scale
            T.copy(logsum, glse[bid, hid, sid, mid * block_M : (mid + 1) * block_M])
            T.copy(acc_o, O_shared)
            T.copy(O_shared, Output_partial[bid, mid * block_M : (mid + 1) * block_M, hid, sid, :], annotations=NO_TMA)

        # combine
        with T.Kernel(T.ceildiv(seqlen_q, block_M), heads, batch, threads=128) as (bx, by, bz):
            po_local = T.alloc_fragment([block_M, dim], dtype)
            o_accum_local = T.alloc_fragment([block_M, dim], accum_dtype)
            o_shared = T.alloc_shared([block_M, dim], dtype)
            lse_local = T.alloc_fragment([num_split, block_M], dtype)
            lse_local_split = T.alloc_fragment([block_M], accum_dtype)
            lse_logsum_local = T.alloc_fragment([block_M], accum_dtype)
            lse_max_local = T.alloc_fragment([block_M], accum_dtype)
            scale_local = T.alloc_fragment([block_M], accum_dtype)

            T.clear(lse_logsum_local)
            T.clear(o_accum_local)
            T.copy(glse[bz, by, :, bx * block_M : (bx + 1) * block_M], lse_local)
            T.reduce_max(lse_local, lse_max_local, dim=0, clear=True)
            for k in T.Pipelined(num_split):
                T.copy(lse_local[k, :], lse_local_split)
                for i in T.Parallel(block_M):
                    lse_logsum_local[i] += T.exp2(lse_local_split[i] - lse_max_local[i])
            for i in T.Parallel(block_M):
                lse_logsum_local[i] = T.log2(lse_logsum_local[i]) + lse_max_local[i]
            for k in T.Pipelined(num_split, num_stages=2):
                T.copy(Output_partial[bz, bx * block_M : (bx + 1) * block_M, by, k, :], po_local)
                for i in T.Parallel(block_M):
                    lse_local_split[i] = lse_local[k, i]
                for i in T.Parallel(block_M):
                    scale_local[i] = T.exp2(lse_local_split[i] - lse_logsum_local[i])
                for i, j in T.Parallel(block_M, dim):
                    o_accum_local[i, j] += po_local[i, j] * scale_local[i]
            T.copy(o_accum_local, o_shared)
            T.copy(o_shared, Output[bz, bx * block_M : (bx + 1) * block_M, by, :], annotations=NO_TMA)

    return flashattn_mha_inference


def inputs(problem, device):
    import torch

    batch, heads, seqlen_q, seqlen_kv, dim = (problem[k] for k in ("batch", "heads", "seqlen_q", "seqlen_kv", "dim"))
    q = torch.randn(batch, seqlen_q, heads, dim, device=device, dtype=torch.float16)
    k = torch.randn(batch, seqlen_kv, heads, dim, device=device, dtype=torch.float16)
    v = torch.randn(batch, seqlen_kv, heads, dim, device=device, dtype=torch.float16)
    return [q, k, v, torch.empty(batch, seqlen_q, heads, dim, device=device, dtype=torch.float16)]


def reference(problem, args):
    import torch

    q, k, v, _ = (a.float() for a in args)
    # the example's ref_program: softmax(Q K^T / sqrt(dim)) V over the whole KV sequence
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / q.shape[-1] ** 0.5
    return [torch.einsum("bhqk,bkhd->bqhd", torch.softmax(scores, dim=-1), v)]


def _sdpa(args):
    import torch.nn.functional as F

    q, k, v, _ = args
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    return [out.transpose(1, 2)]


def flops(problem):
    return 4.0 * problem["batch"] * problem["heads"] * problem["seqlen_q"] * problem["seqlen_kv"] * problem["dim"]


def vendors(problem):
    return {"sdpa": _sdpa}
