"""token_cast_fp8: per-token-group fp8 quantization, as tilelang's
examples/cast/example_per_token_cast_to_fp8.py writes it (DeepSeek-V3 / DeepGEMM's
activation format): each row of x is cut into groups of 128 columns; a group's scale is
s = max(amax(|x|), 1e-4) / 448, and its values become clamp(x / s, -448, 448) cast to
float8_e4m3fn. Outputs: the fp8 tensor and the (M, N/128) fp32 scales. Memory-bound: it
reads 4 bytes and writes 1 (plus a scale per 128) per element; no MMA.

What a schedule tuner sees: no loop at all. One block takes a blk_m x 128 tile with a
single T.copy from global memory straight into registers (a fragment, no shared tile),
reduces |x| over each row of it (T.reduce_absmax), scales, clamps, casts the fragment to
fp8 and stores it, with the scales written element by element. There is no pipelined
loop, no shared memory and no MMA: nothing a producer warp could take over, so nothing to
warp-specialize. ws-tune finds no seed ("role_based scheduler skipped the kernel: no
cross-role on-chip handoff to pipeline"), so there is no schedule space: a tuning measures
tilelang's own lowerings at each point of blk_m (the example's tunable) x threads, and the
torch vendor, and names the fastest; --budget has nothing to spend.

Departures from the example: a @T.prim_func with the outputs as arguments (X, X_fp8,
X_amax) instead of the eager @tilelang.jit form with T.const/T.empty; threads, fixed at
128 there, is a parameter; check refuses M not a multiple of blk_m (the scale store has no
bound guard) and N not a multiple of 128 (the example's reference pads N, its kernel does
not). The group example beside it (example_group_per_split_token_cast_to_fp8.py) adds
groups of rows (batch_sizes read from global memory, a serial prefix sum for the row
offset, guarded stores, bf16 input with fp32 fragments) but the same loop-free,
copy-to-registers structure: nothing new for a schedule tuner.

The reference is the example's ref_program (x * (448 / amax), not x / (amax / 448)): the
two round alike but for rare ties, which the relative L2 error of the whole fp8 tensor
(compared as float) tolerates; a wrong scale, rounding mode or clamp does not pass.

    ws-tune tests/data/token_cast_fp8.py --shape M=8192,N=8192
"""

import tilelang.language as T

GROUP = 128  # the format's scale group: one scale per 128 values of a row
FP8_MAX = 448.0  # largest float8_e4m3fn

PROBLEM = {"M": None, "N": None}
PARAMS = {"blk_m": [1, 2, 4, 8, 16, 32], "threads": [128, 256]}
OUTPUTS = [1, 2]  # X_fp8, X_amax (the scales)
# fp8 values are compared as float against the reference's fp8: one rounding tie that goes
# the other way costs one fp8 ulp (6-12%) of one element, far below 1e-2 of the tensor's
# norm; the scales are fp32 and agree to ~1e-7.
TOLERANCE = 1e-2


def check(problem, params, schedule):
    if problem["M"] % params["blk_m"]:
        return f"M={problem['M']} is not a multiple of blk_m={params['blk_m']}"
    if problem["N"] % GROUP:
        return f"N={problem['N']} is not a multiple of the scale group {GROUP}"
    return None


def kernel(problem, *, blk_m, threads):
    M, N = problem["M"], problem["N"]
    dtype = "float32"
    fp8 = "float8_e4m3fn"
    group_size = GROUP
    fp8_min, fp8_max = -FP8_MAX, FP8_MAX

    @T.prim_func
    def per_token_cast_to_fp8(X: T.Tensor((M, N), dtype), X_fp8: T.Tensor((M, N), fp8),
                              X_amax: T.Tensor((M, T.ceildiv(N, group_size)), dtype)):  # fmt: skip
        with T.Kernel(T.ceildiv(M, blk_m), T.ceildiv(N, group_size), threads=threads) as (bx, by):
            row = bx
            row_g_id = by
            y_local = T.alloc_fragment((blk_m, group_size), dtype)
            y_amax_local = T.alloc_fragment((blk_m,), dtype)
            y_s_local = T.alloc_fragment((blk_m,), dtype)
            y_q_local = T.alloc_fragment((blk_m, group_size), dtype)
            y_q_local_fp8 = T.alloc_fragment((blk_m, group_size), fp8)

            T.copy(X[row * blk_m : (row + 1) * blk_m, row_g_id * group_size : (row_g_id + 1) * group_size], y_local)
            T.reduce_absmax(y_local, y_amax_local, dim=1)
            for i in T.Parallel(blk_m):
                y_amax_local[i] = T.max(y_amax_local[i], 1e-4)
                y_s_local[i] = y_amax_local[i] / fp8_max
            for i, j in T.Parallel(blk_m, group_size):
                y_q_local[i, j] = T.clamp(y_local[i, j] / y_s_local[i], fp8_min, fp8_max)
            T.copy(y_q_local, y_q_local_fp8)
            for i in T.Parallel(blk_m):
                X_amax[row * blk_m + i, row_g_id] = y_s_local[i]
            T.copy(y_q_local_fp8, X_fp8[row * blk_m : (row + 1) * blk_m, row_g_id * group_size : (row_g_id + 1) * group_size])

    return per_token_cast_to_fp8


def inputs(problem, device):
    import torch

    M, N = problem["M"], problem["N"]
    return [torch.randn(M, N, device=device, dtype=torch.float32),
            torch.empty(M, N, device=device, dtype=torch.float8_e4m3fn),
            torch.empty(M, (N + GROUP - 1) // GROUP, device=device, dtype=torch.float32)]  # fmt: skip


def _cast(x):
    """The example's ref_program: (fp8 values, scales), on any device."""
    import torch

    m, n = x.shape
    new_n = (n + GROUP - 1) // GROUP * GROUP
    x_view = torch.nn.functional.pad(x, (0, new_n - n)).view(m, -1, GROUP)
    x_amax = x_view.abs().float().amax(dim=2).view(m, -1).clamp(1e-4)
    x_fp8 = (x_view * (FP8_MAX / x_amax.unsqueeze(2))).to(torch.float8_e4m3fn)
    return x_fp8.view(m, -1)[:, :n].contiguous(), (x_amax / FP8_MAX).view(m, -1)


def reference(problem, args):
    return list(_cast(args[0]))


def flops(problem):
    # per element: |x| and a max (the amax), a divide and a two-sided clamp; the cast is not counted
    return 5.0 * problem["M"] * problem["N"]


def bytes_moved(problem):
    # x in fp32 read once; the fp8 values and one fp32 scale per group written once
    M, N = problem["M"], problem["N"]
    return 4.0 * M * N + 1.0 * M * N + 4.0 * M * ((N + GROUP - 1) // GROUP)


def vendors(problem):
    return {"torch": lambda args: list(_cast(args[0]))}
