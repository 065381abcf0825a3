"""block_causal_attn: a diffusion LLM's block-causal attention forward (BSHD), as tilelang's
examples/block_causal_attention/block_causal_attention.py writes it. The sequence is a noisy
half then a clean half. A noisy query sees its own dllm block of noisy keys and the clean keys
of earlier blocks; a clean query sees the clean keys of its block and earlier ones. Each query
tile walks a number of key tiles that depends on the tile, loads K from one half or the other
(an if-else inside the pipelined loop), masks only the boundary tiles, and loads V after the
softmax. Outputs: O and its log2-sum-exp.

    ws-tune tests/data/block_causal_attn.py --shape batch=4,heads=16,seq=8192,dim=128 --budget 16
"""

import tilelang.language as T

PROBLEM = {"batch": None, "heads": None, "seq": None, "dim": 128, "dllm_block": 32}
CHOICES = {"dim": [64, 128], "dllm_block": [1, 2, 4, 8, 16, 32, 64]}
PARAMS = {"block_size": [64, 128], "num_stages": [1, 2], "threads": [128, 256]}
OUTPUTS = [3, 4]
TOLERANCE = 2e-2
LOG2E = 1.4426950408889634
NEG_INF = -1.0e6  # finite, as in the example: a fully masked row stays finite


def check(problem, params, schedule):
    if problem["seq"] % (2 * params["block_size"]):
        return f"seq={problem['seq']} is not two halves of whole {params['block_size']}-row blocks"
    if params["block_size"] == 64 and params["threads"] == 256:
        return "a 64-row tile over two warpgroups: tilelang's layout inference conflicts on acc_s / acc_s_cast"
    if params["block_size"] % problem["dllm_block"]:
        return f"block_size={params['block_size']} is not a multiple of dllm_block={problem['dllm_block']}"
    return None


def kernel(problem, *, block_size, num_stages, threads):
    batch, heads, seq, dim, dllm_block = (problem[k] for k in ("batch", "heads", "seq", "dim", "dllm_block"))
    half = seq // 2
    region_tiles = half // block_size
    scale = dim**-0.5 * LOG2E
    shape = (batch, seq, heads, dim)
    dtype, accum = "float16", "float32"

    def allowed(i, j, is_noisy_diag, q_is_noisy):
        q_blk, k_blk = i // dllm_block, j // dllm_block
        clean_boundary = T.if_then_else(q_is_noisy, T.if_then_else(q_blk > k_blk, 1, 0), T.if_then_else(q_blk >= k_blk, 1, 0))
        return T.if_then_else(is_noisy_diag == 1, T.if_then_else(q_blk == k_blk, 1, 0), clean_boundary)

    @T.prim_func
    def block_causal_attn(Q: T.Tensor(shape, dtype), K: T.Tensor(shape, dtype), V: T.Tensor(shape, dtype),
                          Output: T.Tensor(shape, dtype), LSE: T.Tensor((batch, heads, seq), accum)):  # fmt: skip
        with T.Kernel(T.ceildiv(seq, block_size), heads, batch, threads=threads) as (bx, by, bz):
            Q_shared = T.alloc_shared((block_size, dim), dtype)
            K_shared = T.alloc_shared((block_size, dim), dtype)
            V_shared = T.alloc_shared((block_size, dim), dtype)
            O_shared = T.alloc_shared((block_size, dim), dtype)
            acc_s = T.alloc_fragment((block_size, block_size), accum)
            acc_s_cast = T.alloc_fragment((block_size, block_size), dtype)
            acc_o = T.alloc_fragment((block_size, dim), accum)
            scores_max = T.alloc_fragment((block_size,), accum)
            scores_max_prev = T.alloc_fragment((block_size,), accum)
            scores_scale = T.alloc_fragment((block_size,), accum)
            scores_sum = T.alloc_fragment((block_size,), accum)
            logsum = T.alloc_fragment((block_size,), accum)

            T.copy(Q[bz, bx * block_size : (bx + 1) * block_size, by, :], Q_shared)
            T.fill(acc_o, 0)
            T.fill(logsum, 0)
            T.fill(scores_max, NEG_INF)
            q_is_noisy = bx < region_tiles
            last_clean_step = T.if_then_else(q_is_noisy, bx, bx - region_tiles)
            num_steps = T.if_then_else(q_is_noisy, bx + 2, (bx - region_tiles) + 1)
            for s in T.Pipelined(num_steps, num_stages=num_stages):
                is_noisy_diag = T.if_then_else(s > last_clean_step, 1, 0)
                if is_noisy_diag != 0:
                    T.copy(K[bz, bx * block_size : (bx + 1) * block_size, by, :], K_shared)
                else:
                    T.copy(K[bz, half + s * block_size : half + (s + 1) * block_size, by, :], K_shared)
                is_clean_diag = T.if_then_else(s == last_clean_step, 1, 0)
                if is_noisy_diag + is_clean_diag != 0:
                    for i, j in T.Parallel(block_size, block_size):
                        acc_s[i, j] = T.if_then_else(allowed(i, j, is_noisy_diag, q_is_noisy) > 0, 0, NEG_INF)
                else:
                    T.clear(acc_s)
                T.gemm(Q_shared, K_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                T.copy(scores_max, scores_max_prev)
                T.fill(scores_max, NEG_INF)
                T.reduce_max(acc_s, scores_max, dim=1, clear=False)
                for i in T.Parallel(block_size):
                    scores_max[i] = T.max(scores_max[i], scores_max_prev[i])
                for i in T.Parallel(block_size):
                    scores_scale[i] = T.exp2(scores_max_prev[i] * scale - scores_max[i] * scale)
                for i, j in T.Parallel(block_size, block_size):
                    acc_s[i, j] = T.exp2(acc_s[i, j] * scale - scores_max[i] * scale)
                T.reduce_sum(acc_s, scores_sum, dim=1)
                for i in T.Parallel(block_size):
                    logsum[i] = logsum[i] * scores_scale[i] + scores_sum[i]
                T.copy(acc_s, acc_s_cast)
                for i, j in T.Parallel(block_size, dim):
                    acc_o[i, j] *= scores_scale[i]
                if is_noisy_diag != 0:
                    T.copy(V[bz, bx * block_size : (bx + 1) * block_size, by, :], V_shared)
                else:
                    T.copy(V[bz, half + s * block_size : half + (s + 1) * block_size, by, :], V_shared)
                T.gemm(acc_s_cast, V_shared, acc_o, policy=T.GemmWarpPolicy.FullRow)
            for i, j in T.Parallel(block_size, dim):
                acc_o[i, j] /= logsum[i] + 1e-30
            T.copy(acc_o, O_shared)
            T.copy(O_shared, Output[bz, bx * block_size : (bx + 1) * block_size, by, :])
            for i in T.Parallel(block_size):
                logsum[i] = T.log2(logsum[i] + 1e-30) + scores_max[i] * scale
            T.copy(logsum, LSE[bz, by, bx * block_size : (bx + 1) * block_size])

    return block_causal_attn


def inputs(problem, device):
    import torch

    shape = (problem["batch"], problem["seq"], problem["heads"], problem["dim"])
    q, k, v = (torch.randn(shape, device=device, dtype=torch.float16) for _ in range(3))
    return [q, k, v, torch.empty(shape, device=device, dtype=torch.float16),
            torch.empty(problem["batch"], problem["heads"], problem["seq"], device=device, dtype=torch.float32)]  # fmt: skip


def _mask(seq, dllm_block, device):
    import torch

    pos = torch.arange(seq, device=device)
    clean = pos >= seq // 2
    block = torch.where(clean, pos - seq // 2, pos) // dllm_block
    q_clean, k_clean, q_block, k_block = clean[:, None], clean[None, :], block[:, None], block[None, :]
    noisy_diagonal = (q_block == k_block) & ~q_clean & ~k_clean
    offset_causal = (q_block > k_block) & ~q_clean & k_clean
    clean_causal = (q_block >= k_block) & q_clean & k_clean
    return noisy_diagonal | offset_causal | clean_causal


def reference(problem, args):
    import math

    import torch

    q, k, v = (a.float() for a in args[:3])
    logits = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(problem["dim"])
    logits = logits.masked_fill(~_mask(problem["seq"], problem["dllm_block"], q.device), float("-inf"))
    out = torch.einsum("bhqk,bkhd->bqhd", logits.softmax(-1), v)
    return [out, torch.logsumexp(logits, -1) / math.log(2.0)]


def flops(problem):
    # each half's query at local position p sees (p // dllm_block + 1) blocks of keys
    blocks, width = problem["seq"] // 2 // problem["dllm_block"], problem["dllm_block"]
    pairs = width * width * blocks * (blocks + 1)
    return 4.0 * problem["batch"] * problem["heads"] * pairs * problem["dim"]
