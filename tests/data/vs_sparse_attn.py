"""vs_sparse_attn: MInference's vertical-slash sparse attention (causal prefill), as
tilelang's examples/minference/example_vertical_slash_sparse_attn.py computes it, written
plainly (the example partitions its warps by hand): each block of 64 queries attends to a
list of 64-key "slash" blocks (a key offset each, TMA-loadable, causally masked) and then
to a list of single "vertical" key columns, gathered row by row by index. Two pipelined
loops in one kernel, one after the other, share the online softmax; both trip counts are
read from global memory, per query block.

The index lists are drawn in ``inputs``: the diagonal block and up to SLASH - 1 earlier
blocks, then up to VERTICAL columns left of the query block outside those blocks (the
example's index builder keeps the two apart too, so that no key counts twice).

    ws-tune tests/data/vs_sparse_attn.py --shape batch=1,heads=16,seq=8192 --budget 16
"""

import tilelang.language as T

PROBLEM = {"batch": None, "heads": None, "seq": None, "dim": 128, "slash": 16, "vertical": 512}
CHOICES = {"dim": [64, 128]}
PARAMS = {"num_stages": [1, 2, 3], "threads": [128, 256]}
TOLERANCE = 2e-2
BLOCK = 64  # query rows of a block, and keys of a slash block (the index lists' unit)
LOG2E = 1.44269504


def check(problem, params, schedule):
    if problem["seq"] % BLOCK:
        return f"seq={problem['seq']} is not a multiple of {BLOCK}"
    if problem["vertical"] % BLOCK:
        return f"vertical={problem['vertical']} is not a multiple of {BLOCK} (the column loop's tiles)"
    if params["threads"] > 2 * BLOCK:  # 8 warps over 64 rows: tilelang lays out no lowering (H200 run 36)
        return f"{params['threads']} threads over a {BLOCK}-row block: tilelang's layout inference refuses it (acc_s and acc_s_cast conflict)"
    return None


def kernel(problem, *, num_stages, threads):
    batch, heads, seq, dim, slash, vertical = (problem[k] for k in ("batch", "heads", "seq", "dim", "slash", "vertical"))
    blocks = seq // BLOCK
    scale = (1.0 / dim) ** 0.5 * LOG2E
    shape = (batch, heads, seq, dim)
    dtype, accum = "float16", "float32"

    @T.macro
    def online_softmax(acc_s, acc_s_cast, acc_o, m, m_prev, alpha, row_sum, logsum):
        """Fold one tile of scores into the running max, sum and output (as the example's Compute)."""
        T.copy(m, m_prev)
        T.reduce_max(acc_s, m, dim=1, clear=False)
        for i in T.Parallel(BLOCK):
            alpha[i] = T.exp2(m_prev[i] * scale - m[i] * scale)
        for i, j in T.Parallel(BLOCK, BLOCK):
            acc_s[i, j] = T.exp2(acc_s[i, j] * scale - m[i] * scale)
        T.reduce_sum(acc_s, row_sum, dim=1)
        for i in T.Parallel(BLOCK):
            logsum[i] = logsum[i] * alpha[i] + row_sum[i]
        for i, j in T.Parallel(BLOCK, dim):
            acc_o[i, j] *= alpha[i]
        T.copy(acc_s, acc_s_cast)

    @T.prim_func
    def vs_sparse_attn(Q: T.Tensor(shape, dtype), K: T.Tensor(shape, dtype), V: T.Tensor(shape, dtype),
                       BlockCount: T.Tensor((batch, heads, blocks), "int32"), BlockOffset: T.Tensor((batch, heads, blocks, slash), "int32"),
                       ColumnCount: T.Tensor((batch, heads, blocks), "int32"), ColumnIndex: T.Tensor((batch, heads, blocks, vertical), "int32"),
                       Output: T.Tensor(shape, dtype)):  # fmt: skip
        with T.Kernel(blocks, heads, batch, threads=threads) as (bc, by, bz):
            Q_shared = T.alloc_shared((BLOCK, dim), dtype)
            K_shared = T.alloc_shared((BLOCK, dim), dtype)
            V_shared = T.alloc_shared((BLOCK, dim), dtype)
            K_col_shared = T.alloc_shared((BLOCK, dim), dtype)
            V_col_shared = T.alloc_shared((BLOCK, dim), dtype)
            O_shared = T.alloc_shared((BLOCK, dim), dtype)
            acc_s = T.alloc_fragment((BLOCK, BLOCK), accum)
            acc_s_cast = T.alloc_fragment((BLOCK, BLOCK), dtype)
            acc_o = T.alloc_fragment((BLOCK, dim), accum)
            m = T.alloc_fragment((BLOCK,), accum)
            m_prev = T.alloc_fragment((BLOCK,), accum)
            alpha = T.alloc_fragment((BLOCK,), accum)
            row_sum = T.alloc_fragment((BLOCK,), accum)
            logsum = T.alloc_fragment((BLOCK,), accum)
            bx = blocks - 1 - bc  # the last query blocks (the most keys) launch first
            block_count = BlockCount[bz, by, bx]
            column_count = ColumnCount[bz, by, bx]

            T.copy(Q[bz, by, bx * BLOCK : (bx + 1) * BLOCK, :], Q_shared)
            T.fill(acc_o, 0)
            T.fill(logsum, 0)
            T.fill(m, -(2**30))  # finite: -inf - -inf would be NaN
            for bi in T.Pipelined(block_count, num_stages=num_stages):
                k = BlockOffset[bz, by, bx, bi]
                T.copy(K[bz, by, k : k + BLOCK, :], K_shared)
                for i, j in T.Parallel(BLOCK, BLOCK):
                    acc_s[i, j] = T.if_then_else(bx * BLOCK + i >= k + j, 0, -T.infinity(accum))
                T.gemm(Q_shared, K_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                online_softmax(acc_s, acc_s_cast, acc_o, m, m_prev, alpha, row_sum, logsum)
                T.copy(V[bz, by, k : k + BLOCK, :], V_shared)
                T.gemm(acc_s_cast, V_shared, acc_o, policy=T.GemmWarpPolicy.FullRow)
            for ci in T.Pipelined(T.ceildiv(column_count, BLOCK), num_stages=num_stages):
                c0 = ci * BLOCK
                for i, j in T.Parallel(BLOCK, dim):
                    K_col_shared[i, j] = T.if_then_else(c0 + i < column_count, K[bz, by, ColumnIndex[bz, by, bx, c0 + i], j], 0)
                for i, j in T.Parallel(BLOCK, BLOCK):
                    acc_s[i, j] = T.if_then_else(c0 + j < column_count, 0, -T.infinity(accum))
                T.gemm(Q_shared, K_col_shared, acc_s, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                online_softmax(acc_s, acc_s_cast, acc_o, m, m_prev, alpha, row_sum, logsum)
                for i, j in T.Parallel(BLOCK, dim):
                    V_col_shared[i, j] = T.if_then_else(c0 + i < column_count, V[bz, by, ColumnIndex[bz, by, bx, c0 + i], j], 0)
                T.gemm(acc_s_cast, V_col_shared, acc_o, policy=T.GemmWarpPolicy.FullRow)
            for i, j in T.Parallel(BLOCK, dim):
                acc_o[i, j] /= logsum[i]
            T.copy(acc_o, O_shared)
            T.copy(O_shared, Output[bz, by, bx * BLOCK : (bx + 1) * BLOCK, :])

    return vs_sparse_attn


def _indices(problem, device):
    """Per query block: slash block offsets (the diagonal first) and vertical columns,
    disjoint, every key at or left of the block's first row."""
    import torch

    batch, heads, seq, slash, vertical = (problem[k] for k in ("batch", "heads", "seq", "slash", "vertical"))
    blocks = seq // BLOCK
    g = torch.Generator().manual_seed(0)
    count = torch.zeros(batch, heads, blocks, dtype=torch.int32)
    offset = torch.zeros(batch, heads, blocks, slash, dtype=torch.int32)
    col_count = torch.zeros(batch, heads, blocks, dtype=torch.int32)
    col_index = torch.zeros(batch, heads, blocks, vertical, dtype=torch.int32)
    for b in range(batch):
        for h in range(heads):
            for x in range(blocks):
                earlier = torch.randperm(x, generator=g)[: min(x, slash - 1, int(torch.randint(0, slash, (1,), generator=g)))]
                chosen = torch.cat([torch.tensor([x]), earlier])
                count[b, h, x] = len(chosen)
                offset[b, h, x, : len(chosen)] = chosen * BLOCK
                free = torch.ones(x * BLOCK, dtype=torch.bool)
                for e in earlier.tolist():
                    free[e * BLOCK : (e + 1) * BLOCK] = False
                cols = free.nonzero().flatten()
                cols = cols[torch.randperm(len(cols), generator=g)[: min(len(cols), vertical, int(torch.randint(0, vertical + 1, (1,), generator=g)))]]
                col_count[b, h, x] = len(cols)
                col_index[b, h, x, : len(cols)] = cols.sort().values
    return [t.to(device) for t in (count, offset, col_count, col_index)]


def inputs(problem, device):
    import torch

    shape = (problem["batch"], problem["heads"], problem["seq"], problem["dim"])
    q, k, v = (torch.randn(shape, device=device, dtype=torch.float16) for _ in range(3))
    return [q, k, v, *_indices(problem, device), torch.empty(shape, device=device, dtype=torch.float16)]


def reference(problem, args):
    import torch

    q, k, v, count, offset, col_count, col_index, _ = args
    seq, dim = problem["seq"], problem["dim"]
    rows = torch.arange(seq, device=q.device)
    out = torch.empty_like(q)
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):  # a head at a time: the mask is seq x seq
            allowed = torch.zeros(seq, seq, dtype=torch.bool, device=q.device)
            for x in range(seq // BLOCK):
                block_rows = slice(x * BLOCK, (x + 1) * BLOCK)
                for o in offset[b, h, x, : count[b, h, x]].tolist():
                    allowed[block_rows, o : o + BLOCK] = True
                allowed[block_rows, col_index[b, h, x, : col_count[b, h, x]].long()] = True
            allowed &= rows[:, None] >= rows[None, :]
            scores = (q[b, h].float() @ k[b, h].float().T) / dim**0.5
            out[b, h] = (scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1) @ v[b, h].float()).half()
    return [out]


def flops(problem):
    """The MMAs the index lists ask for, at their mean sizes (half the slash list, half
    the vertical list, per query block)."""
    keys = BLOCK * problem["slash"] / 2 + problem["vertical"] / 2
    return 4.0 * problem["batch"] * problem["heads"] * problem["seq"] * keys * problem["dim"]
