"""nsa_decode: DeepSeek's native sparse attention for decoding, the selected-blocks branch,
as tilelang's examples/deepseek_nsa/example_tilelang_nsa_decode.py writes it: one query
token per sequence; one block per sequence and KV head, its G query heads as the MMA's
rows; the loop walks the S block indices selected for that KV head (read from global
memory inside the loop) and skips a negative (padding) index.

    ws-tune tests/data/nsa_decode.py --shape batch=32,seq_len=8192 --budget 16

Departures from the example:
- a `T.prim_func` with the output as its last argument (the example's `T.const` /
  `T.empty` signature is not the kernel-file contract); `block_T`, `NK` and `NV` as the
  example derives them (`check` refuses the dims where its `NK == 1` assert would fail or
  the tile would not match `dim`).
- the example rescales `logsum` but not `acc_o` by `scores_scale` when the running maximum
  moves, which is right only when one block is selected (its main() uses S=1); the line
  `acc_o[i, j] *= scores_scale[i]` of example_tilelang_nsa_fwd.py is added, in the same place.
- `num_stages` (0 in the example) and `threads` (32) are PARAMS (`check` keeps the thread
  counts whose warps each take whole 16-row slices of the G heads: at the example's G=16,
  32 threads only); the example's pass configs
  (TMA lowering and warp specialization off, fast math on: a workaround for 32 threads) are
  not carried, since the lowering is what ws-tune decides.
- block indices: the example's main() draws one block (always block 0) and pads with
  seq_len, an out-of-range index the kernel does not skip; here each (batch, KV head) gets
  S distinct valid blocks among the seq_len // block_size, sorted as the example sorts them.
"""

import tilelang.language as T

PROBLEM = {"batch": None, "seq_len": None, "heads": 64, "groups": 16, "dim": 128, "selected_blocks": 16, "block_size": 64}
PARAMS = {"num_stages": [0, 1, 2], "threads": [32, 64, 128]}
OUTPUTS = [4]
TOLERANCE = 2e-2


def _block_T(dim):
    return min(128, 1 << (dim - 1).bit_length())  # tilelang.math.next_power_of_2


def check(problem, params, schedule):
    if problem["heads"] % problem["groups"]:
        return f"heads={problem['heads']} is not a multiple of groups={problem['groups']}"
    if problem["seq_len"] // problem["block_size"] < problem["selected_blocks"]:
        return f"seq_len={problem['seq_len']} holds fewer than selected_blocks={problem['selected_blocks']} blocks"
    if _block_T(problem["dim"]) != problem["dim"]:
        return f"dim={problem['dim']} is not a power of two up to 128 (the example's NK == 1 and its tiles)"
    warps = params["threads"] // 32
    if problem["groups"] % (16 * warps):
        # the scores feed the second MMA's register operand: each warp must hold whole rows
        # (16 per warp); else tilelang reports "Layout infer conflict between acc_s and acc_s_cast"
        return f"groups={problem['groups']} query heads do not give each of {warps} warps whole 16-row slices"
    return None


def kernel(problem, *, num_stages, threads):
    batch, seq_len, heads, groups, dim, selected_blocks, block_size = (
        problem[k] for k in ("batch", "seq_len", "heads", "groups", "dim", "selected_blocks", "block_size"))  # fmt: skip
    scale = (1.0 / dim) ** 0.5 * 1.44269504  # log2(e)
    head_kv = heads // groups
    q_shape = [batch, 1, heads, dim]
    kv_shape = [batch, seq_len, head_kv, dim]
    block_indices_shape = [batch, 1, head_kv, selected_blocks]
    block_indices_dtype = "int32"
    dtype = "float16"
    accum_dtype = "float32"
    block_S = block_size
    block_T = _block_T(dim)

    NK = (dim + block_T - 1) // block_T
    NV = (dim + block_T - 1) // block_T
    assert NK == 1, "The key dimension can not be larger than 256"

    S = selected_blocks
    G = groups
    BS = block_S
    BK = BV = block_T

    @T.prim_func
    def nsa_decode(
        Q: T.Tensor(q_shape, dtype),  # [batch, 1, heads, dim]
        K: T.Tensor(kv_shape, dtype),  # [batch, seq_len, head_kv, dim]
        V: T.Tensor(kv_shape, dtype),  # Same shape as K
        BlockIndices: T.Tensor(block_indices_shape, block_indices_dtype),  # Selected block indices
        Output: T.Tensor(q_shape, dtype),
    ):
        with T.Kernel(1, NV, batch * head_kv, threads=threads) as (bx, by, bz):
            Q_shared = T.alloc_shared([G, BK], dtype)
            K_shared = T.alloc_shared([BS, BK], dtype)
            V_shared = T.alloc_shared([BS, BV], dtype)
            O_shared = T.alloc_shared([G, BV], dtype)

            acc_s = T.alloc_fragment([G, BS], accum_dtype)
            acc_s_cast = T.alloc_fragment([G, BS], dtype)
            acc_o = T.alloc_fragment([G, BV], accum_dtype)
            scores_max = T.alloc_fragment([G], accum_dtype)
            scores_max_prev = T.alloc_fragment([G], accum_dtype)
            scores_scale = T.alloc_fragment([G], accum_dtype)
            scores_sum = T.alloc_fragment([G], accum_dtype)
            logsum = T.alloc_fragment([G], accum_dtype)

            i_v, i_bh = by, bz
            i_b, i_h = i_bh // head_kv, i_bh % head_kv

            NS = S
            T.copy(Q[i_b, 0, i_h * G : (i_h + 1) * G, :], Q_shared)

            T.fill(acc_o, 0)
            T.fill(logsum, 0)
            T.fill(scores_max, -T.infinity(accum_dtype))

            for i in T.Pipelined(NS, num_stages=num_stages):
                i_s = BlockIndices[i_b, 0, i_h, i] * BS  # Get block offset
                if i_s >= 0:  # Skip invalid/padding blocks
                    T.copy(K[i_b, i_s : i_s + BS, i_h, :], K_shared)

                    T.clear(acc_s)
                    T.gemm(Q_shared, K_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)

                    T.copy(scores_max, scores_max_prev)
                    T.fill(scores_max, -T.infinity(accum_dtype))
                    T.reduce_max(acc_s, scores_max, dim=1, clear=True)

                    for i in T.Parallel(G):
                        scores_scale[i] = T.exp2(scores_max_prev[i] * scale - scores_max[i] * scale)
                    for i, j in T.Parallel(G, BS):
                        acc_s[i, j] = T.exp2(acc_s[i, j] * scale - scores_max[i] * scale)
                    T.reduce_sum(acc_s, scores_sum, dim=1)
                    for i in T.Parallel(G):
                        logsum[i] = logsum[i] * scores_scale[i] + scores_sum[i]
                    T.copy(acc_s, acc_s_cast)
                    for i, j in T.Parallel(G, BV):  # added (see the docstring)
                        acc_o[i, j] *= scores_scale[i]

                    T.copy(V[i_b, i_s : i_s + BS, i_h, i_v * BV : (i_v + 1) * BV], V_shared)
                    T.gemm(acc_s_cast, V_shared, acc_o, policy=T.GemmWarpPolicy.FullRow)

            for i, j in T.Parallel(G, BV):
                acc_o[i, j] /= logsum[i]
            T.copy(acc_o, O_shared)
            T.copy(O_shared, Output[i_b, 0, i_h * G : (i_h + 1) * G, i_v * BV : (i_v + 1) * BV])

    return nsa_decode


def inputs(problem, device):
    import torch

    batch, seq_len, heads, G, dim, S, BS = (
        problem[k] for k in ("batch", "seq_len", "heads", "groups", "dim", "selected_blocks", "block_size"))  # fmt: skip
    head_kv = heads // G
    q = torch.randn(batch, 1, heads, dim, device=device, dtype=torch.float16)
    k, v = (torch.randn(batch, seq_len, head_kv, dim, device=device, dtype=torch.float16) for _ in range(2))
    # S distinct blocks per (batch, KV head) among the seq_len // BS, sorted as the example sorts them
    keys = torch.rand(batch, 1, head_kv, seq_len // BS, device=device)
    idx = keys.argsort(dim=-1)[..., :S].sort(dim=-1).values.to(torch.int32)
    return [q, k, v, idx, torch.empty_like(q)]


def reference(problem, args):
    import torch

    q, k, v, idx, _ = args
    G, BS = problem["groups"], problem["block_size"]
    batch, _, heads, dim = q.shape
    out = torch.empty(batch, 1, heads, dim, device=q.device, dtype=torch.float32)
    for b in range(batch):
        for h in range(heads // G):
            sel = idx[b, 0, h]
            pos = ((sel.long() * BS).unsqueeze(-1) + torch.arange(BS, device=q.device))[sel >= 0].flatten()  # S*BS keys
            kk, vv = k[b, pos, h].float(), v[b, pos, h].float()  # S*BS, D
            s = q[b, 0, h * G : (h + 1) * G].float() @ kk.T * dim**-0.5  # G, S*BS
            out[b, 0, h * G : (h + 1) * G] = s.softmax(-1) @ vv
    return [out]


def flops(problem):
    # two MMAs over G x (S * block_size) x dim per KV head of each sequence
    return 4.0 * problem["batch"] * problem["heads"] * problem["selected_blocks"] * problem["block_size"] * problem["dim"]
