"""fused_moe: the routed experts' gate and up projections of a mixture-of-experts layer,
as tilelang's examples/fusedmoe writes them (``moe_forward_tilelang_routed``, step 1):
the tokens sorted by expert, each block of rows finds its expert in a per-block table,
reads its rows of X straight into registers (the MMA's register operand, shared by both
projections), multiplies them by the expert's gate and up weights, and stores
silu(gate) * up for the rows its expert owns. The example runs it with warp
specialization turned off.

    ws-tune tests/data/fused_moe.py --shape E=8,tokens=1024,hidden=4096,expert=1024 --budget 16
"""

import tilelang.language as T

PROBLEM = {"E": None, "tokens": None, "hidden": None, "expert": None, "skew": 0, "dtype": "float16"}
CHOICES = {"skew": [0, 1], "dtype": ["float16", "bfloat16"]}
PARAMS = {"block_token": [64, 128], "block_expert": [64, 128], "block_hidden": [64, 128], "threads": [128, 256], "num_stages": [1, 2]}
TOLERANCE = 2e-2
OUTPUTS = [3]
SCALE = 1.44269504  # log2(e)


def group_sizes(problem):
    """Tokens routed to each expert: ``tokens`` each, or alternately half and 1.5x (skew=1)."""
    n, E = problem["tokens"], problem["E"]
    return [n] * E if not problem["skew"] else [n // 2 + (e % 2) * n for e in range(E)]


TABLE_BLOCK = 64  # the host's tables count blocks of 64 rows (inputs() does not see PARAMS)


def blocks(sizes, block_token=TABLE_BLOCK):
    """The expert of each block of rows, with each expert's rows padded to whole blocks."""
    return [e for e, s in enumerate(sizes) for _ in range((s + block_token - 1) // block_token)]


def check(problem, params, schedule):
    if problem["hidden"] % params["block_hidden"] or problem["expert"] % params["block_expert"]:
        return "hidden or expert is not a multiple of its block"
    if any(s % params["block_token"] for s in group_sizes(problem)) and params["block_token"] != TABLE_BLOCK:
        return f"block_token {params['block_token']} needs every expert's tokens in whole blocks (the tables count blocks of {TABLE_BLOCK})"
    return None


def kernel(problem, *, block_token, block_expert, block_hidden, threads, num_stages):
    hidden, expert, dtype = problem["hidden"], problem["expert"], problem["dtype"]
    sizes = group_sizes(problem)
    E, rows, M = len(sizes), sum(sizes), len(blocks(sizes, block_token))

    @T.prim_func
    def moe_gate_up(X: T.Tensor((rows, hidden), dtype), W_gate: T.Tensor((E, expert, hidden), dtype),
                    W_up: T.Tensor((E, expert, hidden), dtype), H: T.Tensor((rows, expert), dtype),
                    group_sizes: T.Tensor((E,), "int32"), group_offsets: T.Tensor((E,), "int32"),
                    group_padded_offsets: T.Tensor((E,), "int32"), group_idx_for_bx: T.Tensor((len(blocks(sizes)),), "int32")):  # fmt: skip
        with T.Kernel(M, T.ceildiv(expert, block_expert), threads=threads) as (bx, by):
            input_shared = T.alloc_fragment((block_token, block_hidden), dtype)
            gate_shared = T.alloc_shared((block_expert, block_hidden), dtype)
            up_shared = T.alloc_shared((block_expert, block_hidden), dtype)
            gate_local = T.alloc_fragment((block_token, block_expert), "float32")
            up_local = T.alloc_fragment((block_token, block_expert), "float32")

            m_start_padded = bx * block_token
            cur_group_idx = group_idx_for_bx[bx * (block_token // TABLE_BLOCK)]
            cur_group_size = group_sizes[cur_group_idx]
            m_start = m_start_padded - group_padded_offsets[cur_group_idx] + group_offsets[cur_group_idx]
            actual_rows = T.max(0, T.min(block_token, cur_group_size - (m_start_padded - group_padded_offsets[cur_group_idx])))

            T.clear(gate_local)
            T.clear(up_local)
            for k in T.Pipelined(T.ceildiv(hidden, block_hidden), num_stages=num_stages):
                T.copy(X[m_start : m_start + block_token, k * block_hidden : (k + 1) * block_hidden], input_shared)
                T.copy(W_gate[cur_group_idx, by * block_expert : (by + 1) * block_expert, k * block_hidden : (k + 1) * block_hidden], gate_shared)
                T.gemm(input_shared, gate_shared, gate_local, transpose_B=True)
                T.copy(W_up[cur_group_idx, by * block_expert : (by + 1) * block_expert, k * block_hidden : (k + 1) * block_hidden], up_shared)
                T.gemm(input_shared, up_shared, up_local, transpose_B=True)

            for i, j in T.Parallel(block_token, block_expert):
                gate_local[i, j] = gate_local[i, j] * (1.0 / (1.0 + T.exp2(-gate_local[i, j] * SCALE)))
                up_local[i, j] = up_local[i, j] * gate_local[i, j]
            for i, j in T.Parallel(block_token, block_expert):
                if i < actual_rows:
                    H[m_start + i, by * block_expert + j] = up_local[i, j]

    return moe_gate_up


def inputs(problem, device):
    import torch

    sizes = group_sizes(problem)
    rows, E, hidden, expert = sum(sizes), len(sizes), problem["hidden"], problem["expert"]
    dtype = getattr(torch, problem["dtype"])
    offsets = [sum(sizes[:e]) for e in range(E)]
    padded = [sum((s + TABLE_BLOCK - 1) // TABLE_BLOCK * TABLE_BLOCK for s in sizes[:e]) for e in range(E)]
    x = torch.randn(rows, hidden, device=device, dtype=dtype)
    w = [torch.randn(E, expert, hidden, device=device, dtype=dtype) / hidden**0.5 for _ in range(2)]
    return [x, *w, torch.empty(rows, expert, device=device, dtype=dtype), *(torch.tensor(v, device=device, dtype=torch.int32) for v in (sizes, offsets, padded)),
            torch.tensor(blocks(sizes), device=device, dtype=torch.int32)]  # fmt: skip


def reference(problem, args):
    import torch

    x, w_gate, w_up = (a.float() for a in args[:3])
    parts = torch.split(x, group_sizes(problem))
    out = [torch.nn.functional.silu(p @ w_gate[e].T) * (p @ w_up[e].T) for e, p in enumerate(parts)]
    return [torch.cat(out)]


def flops(problem):
    return 2.0 * 2 * sum(group_sizes(problem)) * problem["hidden"] * problem["expert"]
