"""nsa_fwd: DeepSeek's native sparse attention, the selected-blocks branch, as tilelang's
examples/deepseek_nsa writes it: one block per query position and KV head, its G query
heads as the MMA's rows; the loop walks the block indices selected for that query (read
from global memory inside the loop), and skips a block that starts after the query.

    ws-tune tests/data/nsa_fwd.py --shape batch=2,seq_len=4096 --budget 16
"""

import tilelang.language as T

PROBLEM = {"batch": None, "seq_len": None, "heads": 64, "groups": 16, "dim": 128, "selected_blocks": 16, "block_size": 64}
PARAMS = {"num_stages": [1, 2, 3], "threads": [128, 64, 32]}
TOLERANCE = 2e-2


def check(problem, params, schedule):
    if problem["heads"] % problem["groups"]:
        return f"heads={problem['heads']} is not a multiple of groups={problem['groups']}"
    if problem["seq_len"] < problem["selected_blocks"] * problem["block_size"]:
        return f"seq_len={problem['seq_len']} holds fewer than selected_blocks={problem['selected_blocks']} blocks"
    return None


def kernel(problem, *, num_stages, threads):
    batch, seq_len, heads, G, dim, S, BS = (
        problem[k] for k in ("batch", "seq_len", "heads", "groups", "dim", "selected_blocks", "block_size"))  # fmt: skip
    head_kv = heads // G
    scale = (1.0 / dim) ** 0.5 * 1.44269504  # log2(e)
    dtype, acc = "float16", "float32"

    @T.prim_func
    def nsa_fwd(Q: T.Tensor((batch, seq_len, heads, dim), dtype), K: T.Tensor((batch, seq_len, head_kv, dim), dtype),
                V: T.Tensor((batch, seq_len, head_kv, dim), dtype), BlockIndices: T.Tensor((batch, seq_len, head_kv, S), "int32"),
                Output: T.Tensor((batch, seq_len, heads, dim), dtype)):  # fmt: skip
        with T.Kernel(seq_len, batch * head_kv, threads=threads) as (i_t, i_bh):
            Q_shared = T.alloc_shared((G, dim), dtype)
            K_shared = T.alloc_shared((BS, dim), dtype)
            V_shared = T.alloc_shared((BS, dim), dtype)
            O_shared = T.alloc_shared((G, dim), dtype)
            acc_s = T.alloc_fragment((G, BS), acc)
            acc_s_cast = T.alloc_fragment((G, BS), dtype)
            acc_o = T.alloc_fragment((G, dim), acc)
            scores_max = T.alloc_fragment((G,), acc)
            scores_max_prev = T.alloc_fragment((G,), acc)
            scores_scale = T.alloc_fragment((G,), acc)
            scores_sum = T.alloc_fragment((G,), acc)
            logsum = T.alloc_fragment((G,), acc)
            i_b, i_h = i_bh // head_kv, i_bh % head_kv

            T.copy(Q[i_b, i_t, i_h * G : (i_h + 1) * G, :], Q_shared)
            T.fill(acc_o, 0)
            T.fill(logsum, 0)
            T.fill(scores_max, -T.infinity(acc))
            for i in T.Pipelined(S, num_stages=num_stages):
                i_s = BlockIndices[i_b, i_t, i_h, i] * BS
                if i_s <= i_t and i_s >= 0:
                    T.copy(K[i_b, i_s : i_s + BS, i_h, :], K_shared)
                    for r, j in T.Parallel(G, BS):
                        acc_s[r, j] = T.if_then_else(i_t >= (i_s + j), 0, -T.infinity(acc))
                    T.gemm(Q_shared, K_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                    T.copy(scores_max, scores_max_prev)
                    T.fill(scores_max, -T.infinity(acc))
                    T.reduce_max(acc_s, scores_max, dim=1, clear=True)
                    for r in T.Parallel(G):
                        scores_scale[r] = T.exp2(scores_max_prev[r] * scale - scores_max[r] * scale)
                    for r, j in T.Parallel(G, BS):
                        acc_s[r, j] = T.exp2(acc_s[r, j] * scale - scores_max[r] * scale)
                    T.reduce_sum(acc_s, scores_sum, dim=1)
                    for r in T.Parallel(G):
                        logsum[r] = logsum[r] * scores_scale[r] + scores_sum[r]
                    T.copy(acc_s, acc_s_cast)
                    for r, j in T.Parallel(G, dim):
                        acc_o[r, j] *= scores_scale[r]
                    T.copy(V[i_b, i_s : i_s + BS, i_h, :], V_shared)
                    T.gemm(acc_s_cast, V_shared, acc_o, policy=T.GemmWarpPolicy.FullRow)
            for r, j in T.Parallel(G, dim):
                acc_o[r, j] /= logsum[r]
            T.copy(acc_o, O_shared)
            T.copy(O_shared, Output[i_b, i_t, i_h * G : (i_h + 1) * G, :])

    return nsa_fwd


def inputs(problem, device):
    import torch

    batch, seq_len, heads, G, dim, S, BS = (
        problem[k] for k in ("batch", "seq_len", "heads", "groups", "dim", "selected_blocks", "block_size"))  # fmt: skip
    head_kv = heads // G
    q = torch.randn(batch, seq_len, heads, dim, device=device, dtype=torch.float16)
    k, v = (torch.randn(batch, seq_len, head_kv, dim, device=device, dtype=torch.float16) for _ in range(2))
    # S distinct blocks per query, drawn among the blocks it can see (block 0 always among them)
    t = torch.arange(seq_len, device=device).view(1, seq_len, 1, 1)
    keys = torch.rand(batch, seq_len, head_kv, seq_len // BS, device=device)
    keys = keys.masked_fill(torch.arange(seq_len // BS, device=device) * BS > t, 2.0)  # invisible blocks sort last
    keys[..., 0] = -1.0
    idx = keys.argsort(dim=-1)[..., :S].to(torch.int32)
    idx = idx.masked_fill(idx * BS > t, -1)  # fewer visible blocks than S: the rest unused
    return [q, k, v, idx, torch.empty_like(q)]


def reference(problem, args):
    import torch

    q, k, v, idx, _ = args
    G, BS = problem["groups"], problem["block_size"]
    batch, seq_len, heads, dim = q.shape
    out = torch.empty(batch, seq_len, heads, dim, device=q.device, dtype=torch.float32)
    t = torch.arange(seq_len, device=q.device)
    for b in range(batch):
        for h in range(heads // G):
            pos = (idx[b, :, h, :].long() * BS).unsqueeze(-1) + torch.arange(BS, device=q.device)  # T, S, BS
            visible = (idx[b, :, h, :, None] >= 0) & (pos <= t[:, None, None])
            pos = pos.clamp(0, seq_len - 1).flatten(1)  # T, S*BS
            kk, vv = k[b, :, h].float()[pos], v[b, :, h].float()[pos]  # T, S*BS, D
            s = torch.einsum("tgd,tnd->tgn", q[b, :, h * G : (h + 1) * G].float(), kk) * dim**-0.5
            s = s.masked_fill(~visible.flatten(1)[:, None, :], float("-inf"))
            out[b, :, h * G : (h + 1) * G] = torch.einsum("tgn,tnd->tgd", s.softmax(-1), vv)
    return [out]


def flops(problem):
    # two MMAs over G x (S * block_size) x dim per query position and KV head (blocks past the query count too)
    work = problem["batch"] * problem["seq_len"] * problem["heads"] * problem["selected_blocks"] * problem["block_size"] * problem["dim"]
    return 4.0 * work
