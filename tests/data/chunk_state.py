"""chunk_state: Mamba-2's chunk states (the SSD scan's first pass) as tilelang's
examples/linear_attention/example_mamba_chunk_state.py writes it: per chunk and head,
states = sum over the chunk's positions of x^T * (decay * dt) @ B. Each K-step copies a
tile of x from shared memory into registers, transposes and scales it there by a vector
computed from two small per-position tensors (copied to shared memory beside the tiles),
and feeds it to the MMA as its register operand; x's shared tile has a swizzled layout
annotated by hand.

    ws-tune tests/data/chunk_state.py --shape batch=8,seqlen=4096 --budget 16
"""

import tilelang
import tilelang.language as T

PROBLEM = {"batch": None, "seqlen": None, "nheads": 80, "ngroups": 1, "chunk_size": 256, "headdim": 64, "dstate": 128}
PARAMS = {"block_M": [64], "block_N": [64, 128], "block_K": [32, 64], "num_stages": [1, 2, 3, 4], "threads": [128]}
TOLERANCE = 2e-2
LOG2E = 1.44269504


def check(problem, params, schedule):
    if problem["seqlen"] % problem["chunk_size"]:
        return f"seqlen={problem['seqlen']} is not a multiple of chunk_size={problem['chunk_size']}"
    for dim, block in (("headdim", "block_M"), ("dstate", "block_N"), ("chunk_size", "block_K")):
        if problem[dim] % params[block]:
            return f"{dim}={problem[dim]} is not a multiple of {block}={params[block]}"
    if problem["nheads"] % problem["ngroups"]:
        return f"nheads={problem['nheads']} is not a multiple of ngroups={problem['ngroups']}"
    return None


def kernel(problem, *, block_M, block_N, block_K, num_stages, threads):
    batch, seqlen, nheads, ngroups, chunk_size, headdim, dstate = (
        problem[k] for k in ("batch", "seqlen", "nheads", "ngroups", "chunk_size", "headdim", "dstate"))  # fmt: skip
    nchunks = seqlen // chunk_size
    dtype, acc = "float16", "float32"

    @T.prim_func
    def chunk_state(B: T.Tensor((batch, seqlen, ngroups, dstate), dtype), x: T.Tensor((batch, seqlen, nheads, headdim), dtype),
                    dt: T.Tensor((batch, nheads, nchunks, chunk_size), dtype), dA_cumsum: T.Tensor((batch, nheads, nchunks, chunk_size), dtype),
                    Output: T.Tensor((batch, nchunks, nheads, headdim, dstate), dtype)):  # fmt: skip
        with T.Kernel(nheads, (headdim // block_M) * (dstate // block_N), batch * nchunks, threads=threads) as (bz, bx, by):
            x_shared = T.alloc_shared((block_K, block_M), dtype)
            x_local = T.alloc_fragment((block_K, block_M), dtype)
            xt_local = T.alloc_fragment((block_M, block_K), dtype)
            B_shared = T.alloc_shared((block_K, block_N), dtype)
            dt_shared = T.alloc_shared((block_K,), dtype)
            dA_cumsum_shared = T.alloc_shared((block_K,), dtype)
            acc_o = T.alloc_fragment((block_M, block_N), acc)
            acc_o_shared = T.alloc_shared((block_M, block_N), dtype)
            scale = T.alloc_fragment((block_K,), acc)
            dA_cs_last = T.alloc_fragment((1,), acc)
            dA_cumsum_local = T.alloc_fragment((block_K,), acc)
            dt_local = T.alloc_fragment((block_K,), acc)

            batch_idx = by % batch
            chunk_idx = by // batch
            m_idx = bx // (dstate // block_N)
            n_idx = bx % (dstate // block_N)

            T.annotate_layout({x_shared: tilelang.layout.make_swizzled_layout(x_shared)})
            dA_cs_last[0] = dA_cumsum[batch_idx, bz, chunk_idx, chunk_size - 1]
            T.clear(acc_o)
            for k in T.Pipelined(chunk_size // block_K, num_stages=num_stages):
                pos = chunk_idx * chunk_size + k * block_K
                T.copy(x[batch_idx, pos : pos + block_K, bz, m_idx * block_M : (m_idx + 1) * block_M], x_shared)
                T.copy(dA_cumsum[batch_idx, bz, chunk_idx, k * block_K : (k + 1) * block_K], dA_cumsum_shared)
                T.copy(dt[batch_idx, bz, chunk_idx, k * block_K : (k + 1) * block_K], dt_shared)
                T.copy(dA_cumsum_shared, dA_cumsum_local)
                T.copy(dt_shared, dt_local)
                for i in T.Parallel(block_K):
                    scale[i] = T.exp2(dA_cs_last[0] * LOG2E - dA_cumsum_local[i] * LOG2E) * dt_local[i]
                T.copy(x_shared, x_local)
                for i, j in T.Parallel(block_M, block_K):
                    xt_local[i, j] = x_local[j, i] * scale[j]
                T.copy(B[batch_idx, pos : pos + block_K, bz // (nheads // ngroups), n_idx * block_N : (n_idx + 1) * block_N], B_shared)
                T.gemm(xt_local, B_shared, acc_o)
            T.copy(acc_o, acc_o_shared)
            T.copy(acc_o_shared, Output[batch_idx, chunk_idx, bz, m_idx * block_M : (m_idx + 1) * block_M, n_idx * block_N : (n_idx + 1) * block_N])

    return chunk_state


def inputs(problem, device):
    import torch

    batch, seqlen, nheads, ngroups, chunk_size, headdim, dstate = (
        problem[k] for k in ("batch", "seqlen", "nheads", "ngroups", "chunk_size", "headdim", "dstate"))  # fmt: skip
    nchunks = seqlen // chunk_size
    b = torch.randn(batch, seqlen, ngroups, dstate, device=device, dtype=torch.float16)
    x = torch.randn(batch, seqlen, nheads, headdim, device=device, dtype=torch.float16)
    dt = (torch.rand(batch, nheads, nchunks, chunk_size, device=device) / 8).to(torch.float16)
    # a cumulative sum of negative steps, as Mamba's A * dt gives: decays stay in (0, 1]
    dA_cumsum = (-torch.rand(batch, nheads, nchunks, chunk_size, device=device) / chunk_size).cumsum(-1).to(torch.float16)
    out = torch.empty(batch, nchunks, nheads, headdim, dstate, device=device, dtype=torch.float16)
    return [b, x, dt, dA_cumsum, out]


def reference(problem, args):
    import torch

    b, x, dt, dA_cumsum, _ = args
    batch, seqlen, nheads, headdim = x.shape
    chunk_size, nchunks = problem["chunk_size"], seqlen // problem["chunk_size"]
    b = b.float().repeat_interleave(nheads // b.shape[2], dim=2).reshape(batch, nchunks, chunk_size, nheads, -1)
    x = x.float().reshape(batch, nchunks, chunk_size, nheads, headdim)
    decay = torch.exp(dA_cumsum.float()[..., -1:] - dA_cumsum.float()) * dt.float()  # b h c l
    return [torch.einsum("bclhn,bhcl,bclhp->bchpn", b, decay, x)]


def flops(problem):
    return 2.0 * problem["batch"] * problem["seqlen"] * problem["nheads"] * problem["headdim"] * problem["dstate"]
