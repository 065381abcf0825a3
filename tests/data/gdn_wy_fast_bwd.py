"""gdn_wy_fast_bwd: Gated DeltaNet's backward through the WY representation, second pass
(bf16 in and out, fp32 gates), as tilelang's examples/gdn/example_wy_fast_bwd_split.py writes
it in tilelang_wy_fast_bwd_split (the back half of FLA's prepare_wy_repr_bwd). One block per
chunk of 64 tokens and head. Its prologue takes the gradient dA of the chunk's WY matrix A
(from the first pass), masks it to its strict lower triangle and pulls it back through the
inverse that made A: two chunk x chunk MMAs, dA <- A^T (tril(dA) A^T), each round-tripping
its fp32 fragment through a bf16 shared tile; then it negates, gates (exp(g_i - g_j) where
that is at most 1, else 0) and writes the result to shared memory. Its pipelined loop walks
the key dimension: per tile it copies K and the first pass's dk to shared memory, scales K by
beta into a second shared tile and runs three MMAs (beta K K^T accumulated across the loop
into a chunk x chunk fragment, dA K into a cleared fragment, dA^T (beta K) into dk's
fragment), reduces (dA K) * K over the tile into dbeta's fragment, adds beta (dA K) through a
bf16 shared tile and stores dk. After the loop, dA * (beta K K^T) is stored twice (as is and
transposed: dg is its row sums minus its column sums, taken outside), and dbeta.

Departures from the example: the first pass's dk, which the example reads from dk and
overwrites in place, is an input of its own (dk_in) beside the output dk: a tuner launches a
candidate many times on the same arguments and fills outputs with NaN before its check, so
an output cannot also be an input. V, dw, du and dv, which this kernel never reads, are not
arguments. Its dead code is left out: G copied into a shared vector and exponentiated into
another that nothing reads, the row and column sums of dA * (beta K K^T) reduced into two
fragments that are never stored (the column sum by a reduce_sum over dim=0 that the example
itself marks FIXME), A's shared tile overwritten after the loop and never read again, and a
clear of a scratch fragment that the loop overwrites whole. The example's pass config
(TL_DISABLE_WARP_SPECIALIZED) is not set: warp specialization is what is tuned here. The
example has no autotune configs; PARAMS spans its kernel config (block_DK 64 by default, 32
in its main; threads 128; num_stages 0) and the autotune space of its sibling
example_chunk_delta_h.py (block_DK 32/64/128, threads 128/256, num_stages 1-3). Inputs as
the model makes them rather than the example's N(0, 1): gates are chunk-local sums of
log-sigmoids (so the gating guard g_i - g_j <= 0 holds below the diagonal), beta is a
sigmoid, K is normalized and A is the WY matrix of K, beta and g; dA and dk_in (the first
pass's outputs) are N(0, 1). The reference is the kernel's math in fp32 (rounded to bf16
where the kernel goes through a bf16 shared tile); with a torch version of the first pass it
matches autograd through FLA's forward (w = A (beta exp(g) K), u = A (beta V)) to 3e-3.

For a schedule tuner: a heavy prologue (two dependent chunk x chunk MMAs through shared
memory, then element-wise masking and gating) whose result, dA's shared tile, every MMA of
the loop reads; one loop with two global tiles (K, dk_in), a shared tile the consumers write
from K (beta K) and two MMAs read, an accumulator carried across trips (beta K K^T) beside
one cleared by its MMA and one loaded from dk_in, a row reduction and a store per trip; dA's
fp32 fragment stays live through the loop for the epilogue, which stores a fragment element
by element, once transposed. Every problem argument has a default (the example's main), so
--shape may be left out.

    ws-tune tests/data/gdn_wy_fast_bwd.py --budget 16
"""

import tilelang.language as T

PROBLEM = {"B": 1, "S": 32768, "H": 8, "DK": 128}  # the example's main
CHOICES = {"DK": [64, 128]}
# the example has no autotuner: its kernel config (block_DK 64, 32 in its main; threads 128;
# num_stages 0) widened to the sibling example_chunk_delta_h.py's autotune space
PARAMS = {"block_DK": [32, 64, 128], "num_stages": [0, 1, 2, 3], "threads": [128, 256]}
OUTPUTS = [6, 7, 8, 9]  # dk, dbeta_k, dg_A_positive, dg_A_negative
TOLERANCE = 2e-2
CHUNK = 64  # the example's chunk_size


def check(problem, params, schedule):
    if problem["S"] % CHUNK:
        return f"S={problem['S']} is not a multiple of the chunk ({CHUNK})"
    if problem["DK"] % params["block_DK"]:
        return f"DK={problem['DK']} is not a multiple of block_DK={params['block_DK']}"
    return None


def kernel(problem, *, block_DK, num_stages, threads):
    B, S, H, DK = (problem[k] for k in ("B", "S", "H", "DK"))
    block_S = CHUNK
    dtype, accum, gate = "bfloat16", "float32", "float32"

    @T.prim_func
    def gdn_wy_fast_bwd(K: T.Tensor((B, S, H, DK), dtype), Beta: T.Tensor((B, S, H), dtype), G: T.Tensor((B, S, H), gate),
                        A: T.Tensor((B, S, H, block_S), dtype), dA: T.Tensor((B, S, H, block_S), dtype),
                        dk_in: T.Tensor((B, S, H, DK), dtype), dk: T.Tensor((B, S, H, DK), dtype), dbeta_k: T.Tensor((B, S, H), dtype),
                        dg_A_positive: T.Tensor((B, S, H, block_S), gate), dg_A_negative: T.Tensor((B, S, H, block_S), gate)):  # fmt: skip
        with T.Kernel(T.ceildiv(S, block_S), B * H, threads=threads) as (bs, bbh):
            bb, bh = bbh // H, bbh % H

            A_shared = T.alloc_shared((block_S, block_S), dtype)
            A_fragment = T.alloc_fragment((block_S, block_S), accum)
            K_shared = T.alloc_shared((block_S, block_DK), dtype)
            K_shared_beta = T.alloc_shared((block_S, block_DK), dtype)
            dA_shared = T.alloc_shared((block_S, block_S), dtype)
            dA_fragment = T.alloc_fragment((block_S, block_S), accum)
            dA_A_fragment = T.alloc_fragment((block_S, block_S), accum)
            dk_shared = T.alloc_shared((block_S, block_DK), dtype)
            dk_shared_beta = T.alloc_shared((block_S, block_DK), dtype)
            dk_fragment = T.alloc_fragment((block_S, block_DK), accum)
            dk_fragment_beta = T.alloc_fragment((block_S, block_DK), accum)
            Beta_shared = T.alloc_shared((block_S,), dtype)
            dbeta_fragment_reduce_tmpk = T.alloc_fragment((block_S, block_DK), accum)
            dbeta_fragment_k = T.alloc_fragment((block_S,), accum)

            T.clear(dbeta_fragment_k)

            T.copy(A[bb, bs * block_S : (bs + 1) * block_S, bh, :], A_shared)
            for i_s in T.Parallel(block_S):
                Beta_shared[i_s] = Beta[bb, bs * block_S + i_s, bh]

            T.copy(dA[bb, bs * block_S : (bs + 1) * block_S, bh, :], dA_shared)
            T.copy(dA_shared, dA_fragment)
            for i_s1, i_s2 in T.Parallel(block_S, block_S):
                if i_s1 <= i_s2:
                    dA_fragment[i_s1, i_s2] = 0
            T.copy(dA_fragment, dA_shared)
            T.gemm(dA_shared, A_shared, dA_fragment, clear_accum=True, transpose_B=True)
            T.copy(dA_fragment, dA_shared)
            T.gemm(A_shared, dA_shared, dA_fragment, clear_accum=True, transpose_A=True)
            for i_s1, i_s2 in T.Parallel(block_S, block_S):
                dA_fragment[i_s1, i_s2] = T.if_then_else(i_s1 <= i_s2, 0, -dA_fragment[i_s1, i_s2])
            for i_s1, i_s2 in T.Parallel(block_S, block_S):
                dA_fragment[i_s1, i_s2] = T.if_then_else(
                    G[bb, bs * block_S + i_s1, bh] - G[bb, bs * block_S + i_s2, bh] <= 0,
                    dA_fragment[i_s1, i_s2] * T.exp(G[bb, bs * block_S + i_s1, bh] - G[bb, bs * block_S + i_s2, bh]),
                    0,
                )
            T.copy(dA_fragment, dA_shared)

            T.clear(A_fragment)
            for i_k in T.Pipelined(T.ceildiv(DK, block_DK), num_stages=num_stages):
                T.copy(K[bb, bs * block_S : (bs + 1) * block_S, bh, i_k * block_DK : (i_k + 1) * block_DK], K_shared)
                T.copy(dk_in[bb, bs * block_S : (bs + 1) * block_S, bh, i_k * block_DK : (i_k + 1) * block_DK], dk_shared)
                T.copy(dk_shared, dk_fragment)
                for i_s, i_k2 in T.Parallel(block_S, block_DK):
                    K_shared_beta[i_s, i_k2] = K_shared[i_s, i_k2] * Beta_shared[i_s]
                T.gemm(K_shared_beta, K_shared, A_fragment, transpose_B=True)
                T.gemm(dA_shared, K_shared, dk_fragment_beta, clear_accum=True)
                for i_s, i_k2 in T.Parallel(block_S, block_DK):
                    dbeta_fragment_reduce_tmpk[i_s, i_k2] = dk_fragment_beta[i_s, i_k2] * K_shared[i_s, i_k2]
                T.reduce_sum(dbeta_fragment_reduce_tmpk, dbeta_fragment_k, dim=1, clear=False)
                T.gemm(dA_shared, K_shared_beta, dk_fragment, transpose_A=True)
                for i_s, i_k2 in T.Parallel(block_S, block_DK):
                    dk_shared_beta[i_s, i_k2] = dk_fragment_beta[i_s, i_k2] * Beta_shared[i_s]
                for i_s, i_k2 in T.Parallel(block_S, block_DK):
                    dk_fragment[i_s, i_k2] = dk_fragment[i_s, i_k2] + dk_shared_beta[i_s, i_k2]
                T.copy(dk_fragment, dk[bb, bs * block_S : (bs + 1) * block_S, bh, i_k * block_DK : (i_k + 1) * block_DK])

            for i_s1, i_s2 in T.Parallel(block_S, block_S):
                dA_A_fragment[i_s1, i_s2] = dA_fragment[i_s1, i_s2] * A_fragment[i_s1, i_s2]

            for i_s1, i_s2 in T.Parallel(block_S, block_S):
                dg_A_positive[bb, bs * block_S + i_s1, bh, i_s2] = dA_A_fragment[i_s1, i_s2]
                dg_A_negative[bb, bs * block_S + i_s2, bh, i_s1] = dA_A_fragment[i_s1, i_s2]

            for i_s in T.Parallel(block_S):
                dbeta_k[bb, bs * block_S + i_s, bh] = dbeta_fragment_k[i_s]

    return gdn_wy_fast_bwd


def _chunks(x, B, S, H):  # (B, S, H, D) -> (B, H, C, CHUNK, D), fp32
    return x.float().view(B, S // CHUNK, CHUNK, H, -1).permute(0, 3, 1, 2, 4)


def _tokens(x, B, S, H):  # the inverse
    return x.permute(0, 2, 3, 1, 4).reshape(B, S, H, -1)


def _wy_matrix(k, beta, g, B, S, H):
    """A = (I + tril(beta_i k_i.k_j exp(g_i - g_j), -1))^-1 per chunk, as FLA's forward makes it
    (chunk_scaled_dot_kkt then solve_tril): (B, S, H, CHUNK), fp32."""
    import torch

    kc, bc = _chunks(k, B, S, H), _chunks(beta.unsqueeze(-1), B, S, H)
    gc = _chunks(g.unsqueeze(-1), B, S, H)[..., 0]
    strict = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=k.device).tril(-1)
    L = torch.where(strict, bc * (kc @ kc.transpose(-1, -2)) * (gc.unsqueeze(-1) - gc.unsqueeze(-2)).clamp(max=0).exp(), 0.0)
    eye = torch.eye(CHUNK, device=k.device).expand_as(L)
    return _tokens(torch.linalg.solve_triangular(eye + L, eye, upper=False), B, S, H)


def inputs(problem, device):
    import torch
    import torch.nn.functional as F

    B, S, H, DK = (problem[k] for k in ("B", "S", "H", "DK"))
    k = F.normalize(torch.randn(B, S, H, DK, device=device), dim=-1)
    beta = torch.sigmoid(torch.randn(B, S, H, device=device))
    # log-gates summed within each chunk (chunk_local_cumsum): they decrease along a chunk
    g = F.logsigmoid(torch.randn(B, S // CHUNK, CHUNK, H, device=device)).cumsum(2).reshape(B, S, H)
    a = _wy_matrix(k, beta, g, B, S, H)
    k, beta, a = k.to(torch.bfloat16), beta.to(torch.bfloat16), a.to(torch.bfloat16)
    da = torch.randn(B, S, H, CHUNK, device=device).to(torch.bfloat16)
    dk_in = torch.randn(B, S, H, DK, device=device).to(torch.bfloat16)
    dk = torch.empty_like(dk_in)
    dbeta = torch.empty(B, S, H, device=device, dtype=torch.bfloat16)
    dg_pos, dg_neg = (torch.empty(B, S, H, CHUNK, device=device) for _ in range(2))
    return [k, beta, g, a, da, dk_in, dk, dbeta, dg_pos, dg_neg]


def _bf16(x):  # a round trip through a bf16 shared tile
    import torch

    return x.to(torch.bfloat16).float()


def reference(problem, args):
    """The kernel's math in fp32, rounded to bf16 where the kernel stores to a bf16 shared tile."""
    import torch

    B, S, H = problem["B"], problem["S"], problem["H"]
    k, beta, g, a, da, dk_in = args[:6]
    k, a, da, dk_in = (_chunks(x, B, S, H) for x in (k, a, da, dk_in))
    beta = _chunks(beta.unsqueeze(-1), B, S, H)  # (B, H, C, CHUNK, 1)
    g = _chunks(g.unsqueeze(-1), B, S, H)[..., 0]  # (B, H, C, CHUNK)

    lower = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=k.device).tril(-1)  # i > j
    diff = g.unsqueeze(-1) - g.unsqueeze(-2)  # g_i - g_j
    da = torch.where(lower, da, 0.0)
    da = _bf16(da @ a.transpose(-1, -2))
    da = torch.where(lower, -(a.transpose(-1, -2) @ da), 0.0)
    da = torch.where(diff <= 0, da * diff.clamp(max=0).exp(), 0.0)  # the fp32 fragment
    da_bf = _bf16(da)  # its bf16 shared tile, which the loop's MMAs read

    k_beta = _bf16(k * beta)
    kkt = k_beta @ k.transpose(-1, -2)
    dk_beta = da_bf @ k
    dbeta = (dk_beta * k).sum(-1, keepdim=True)
    dk = dk_in + da_bf.transpose(-1, -2) @ k_beta + _bf16(dk_beta * beta)
    dg_a = da * kkt
    return [
        _tokens(dk, B, S, H).bfloat16(),
        _tokens(dbeta, B, S, H)[..., 0].bfloat16(),
        _tokens(dg_a, B, S, H),
        _tokens(dg_a.transpose(-1, -2), B, S, H),
    ]


def flops(problem):
    # per chunk and head: dA's two chunk x chunk x chunk MMAs, then three chunk x chunk x DK
    # MMAs over the key loop (beta K K^T, dA K, dA^T beta K)
    B, S, H, DK = (problem[k] for k in ("B", "S", "H", "DK"))
    return B * H * (S // CHUNK) * 2.0 * CHUNK * CHUNK * (2 * CHUNK + 3 * DK)


def bytes_moved(problem):
    # per token: K, dk_in and dk (bf16, DK each), A and dA (bf16, a chunk's row each),
    # beta and dbeta (bf16), g (fp32), the two dg_A rows (fp32, a chunk each)
    B, S, H, DK = (problem[k] for k in ("B", "S", "H", "DK"))
    return float(B * S * H * (2 * 3 * DK + 2 * 2 * CHUNK + 2 * 2 + 4 + 4 * 2 * CHUNK))
