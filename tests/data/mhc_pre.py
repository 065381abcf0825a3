"""mhc_pre: DeepSeek's manifold-constrained hyper-connections, the pre-mixing step, as
tilelang's examples/deepseek_mhc/example_mhc_pre.py writes its fused kernel
(``mhc_pre_big_fuse_tilelang``). Per token, from the split-K partial results of the
example's first kernel (x @ fn^T and sum(x^2) over the flattened hc x hidden residual,
computed here in ``inputs`` with torch): the RMS-normalized mixes give the pre weights
(sigmoid), the post weights (sigmoid, out: post_mix) and an hc x hc matrix made doubly
stochastic by Sinkhorn iterations (out: comb_mix); the layer input is the pre-weighted
sum of the hc residual streams, tile by hidden tile: out[t, :] = sum_i pre[t, i] *
residual[t, i, :]. Memory-bound, no MMA (the example turns warp specialization off).

New for a schedule tuner: the block partitions its warps by hand, by the raw thread
index (``if T.get_thread_binding() < 32``): warp 0 runs the Sinkhorn normalization on
registers and writes post_mix and comb_mix, the other warps stream the residual through
a pipelined loop. Both branches read a shared tile the whole block fills first, and the
pipelined branch also a shared tile of its own, filled before its loop.

    ws-tune tests/data/mhc_pre.py --shape tokens=2048 --budget 16
"""

import tilelang.language as T

PROBLEM = {"tokens": None, "hc": 4, "hidden": 4096, "splits": 16}
PARAMS = {"hidden_block": [256, 512, 1024], "num_stages": [1, 2], "threads": [96, 160]}
OUTPUTS = [5, 6, 7]
TOLERANCE = 1e-2

RMS_EPS = 1e-6
PRE_EPS = 1e-6
SINKHORN_EPS = 1e-6
POST_MULT = 1.0
SINKHORN_REPEAT = 10


def check(problem, params, schedule):
    if problem["hidden"] % params["hidden_block"]:
        return f"hidden={problem['hidden']} is not a multiple of hidden_block={params['hidden_block']}"
    loop_threads = params["threads"] - 32  # warp 0 runs Sinkhorn; the others share out each hidden tile
    if params["hidden_block"] > loop_threads and params["hidden_block"] % loop_threads:
        return f"hidden_block={params['hidden_block']} cannot be split over the {loop_threads} threads after warp 0"
    return None


def kernel(problem, *, hidden_block, num_stages, threads):
    n, hc, h, splits = problem["tokens"], problem["hc"], problem["hidden"], problem["splits"]
    hc3 = hc * (2 + hc)

    @T.prim_func
    def mhc_pre(GemmOut: T.Tensor((splits, n, hc3), "float32"), SqrSum: T.Tensor((splits, n), "float32"),
                Scale: T.Tensor((3,), "float32"), Base: T.Tensor((hc3,), "float32"),
                Residual: T.Tensor((n, hc, h), "bfloat16"), PostMix: T.Tensor((n, hc), "float32"),
                CombMix: T.Tensor((n, hc * hc), "float32"), LayerInput: T.Tensor((n, h), "bfloat16")):  # fmt: skip
        with T.Kernel(n, threads=threads) as i:
            # the RMS-normalized mixes, summed over the split-K partials
            rms = T.alloc_fragment((1,), "float32")
            mixes = T.alloc_fragment((hc3,), "float32")
            T.clear(mixes)
            rms[0] = 0
            for i_split in T.serial(splits):
                rms[0] += SqrSum[i_split, i]
            rms[0] = T.rsqrt(rms[0] / (hc * h) + RMS_EPS)
            for j in T.Parallel(hc3):
                mixes[j] = 0
                for i_split in T.serial(splits):
                    mixes[j] += GemmOut[i_split, i, j]
                mixes[j] *= rms[0]
            mixes_shared = T.alloc_shared((hc3,), "float32")
            T.copy(mixes, mixes_shared)

            if T.get_thread_binding() < 32:
                # warp 0: post weights, and the comb matrix through Sinkhorn
                cm = T.alloc_fragment((hc, hc), "float32")
                for j in T.Parallel(hc):
                    PostMix[i, j] = T.sigmoid(mixes_shared[j + hc] * Scale[1] + Base[j + hc]) * POST_MULT
                for j, k in T.Parallel(hc, hc):
                    cm[j, k] = mixes_shared[j * hc + k + hc * 2] * Scale[2] + Base[j * hc + k + hc * 2]
                row_sum = T.alloc_fragment((hc,), "float32")
                col_sum = T.alloc_fragment((hc,), "float32")
                row_max = T.alloc_fragment((hc,), "float32")
                # softmax over each row, + eps
                T.reduce_max(cm, row_max, dim=1)
                for j, k in T.Parallel(hc, hc):
                    cm[j, k] = T.exp(cm[j, k] - row_max[j])
                T.reduce_sum(cm, row_sum, dim=1)
                for j, k in T.Parallel(hc, hc):
                    cm[j, k] = cm[j, k] / row_sum[j] + SINKHORN_EPS
                T.reduce_sum(cm, col_sum, dim=0)
                for j, k in T.Parallel(hc, hc):
                    cm[j, k] = cm[j, k] / (col_sum[k] + SINKHORN_EPS)
                for _ in T.serial(SINKHORN_REPEAT - 1):
                    T.reduce_sum(cm, row_sum, dim=1)
                    for j, k in T.Parallel(hc, hc):
                        cm[j, k] = cm[j, k] / (row_sum[j] + SINKHORN_EPS)
                    T.reduce_sum(cm, col_sum, dim=0)
                    for j, k in T.Parallel(hc, hc):
                        cm[j, k] = cm[j, k] / (col_sum[k] + SINKHORN_EPS)
                for j, k in T.Parallel(hc, hc):
                    CombMix[i, j * hc + k] = cm[j, k]
            else:
                # the other warps: pre weights, then the pre-weighted sum of the streams
                pre_mix_shared = T.alloc_shared((hc,), "float32")
                for j in T.Parallel(hc):
                    pre_mix_shared[j] = T.sigmoid(mixes_shared[j] * Scale[0] + Base[j]) + PRE_EPS
                for i0_h in T.Pipelined(h // hidden_block, num_stages=num_stages):
                    xs = T.alloc_shared((hc, hidden_block), "float32")
                    xl = T.alloc_fragment((hc, hidden_block), "float32")
                    T.copy(Residual[i, 0, i0_h * hidden_block], xs)
                    T.copy(xs, xl)
                    ol = T.alloc_fragment((hidden_block,), "float32")
                    T.clear(ol)
                    for i_hc in T.serial(hc):
                        pre = pre_mix_shared[i_hc]
                        for i1_h in T.Parallel(hidden_block):
                            ol[i1_h] += pre * xl[i_hc, i1_h]
                    T.copy(ol, LayerInput[i, i0_h * hidden_block])

    return mhc_pre


def _sinkhorn(x, repeat, eps):
    x = x.softmax(-1) + eps
    x = x / (x.sum(-2, keepdim=True) + eps)
    for _ in range(repeat - 1):
        x = x / (x.sum(-1, keepdim=True) + eps)
        x = x / (x.sum(-2, keepdim=True) + eps)
    return x


def inputs(problem, device):
    """The example's test data, and what its first kernel (the split-K GEMM and sum of
    squares over the flattened residual) hands the fused one."""
    import torch

    n, hc, h, splits = problem["tokens"], problem["hc"], problem["hidden"], problem["splits"]
    hc3 = hc * (2 + hc)
    stream = 1 + torch.arange(hc, device=device).mul(0.01).view(1, -1, 1)
    residual = (torch.randn(n, hc, h, device=device) * stream).bfloat16()
    fn = (torch.randn(hc3, hc, h, device=device) * 1e-4 * stream).flatten(1, 2)
    scale = torch.randn(3, device=device) * 0.1
    base = torch.randn(hc3, device=device) * 0.1
    x = residual.flatten(1, 2).float().view(n, splits, hc * h // splits).transpose(0, 1)  # splits x n x K/splits
    gemm_out = torch.bmm(x, fn.view(hc3, splits, hc * h // splits).permute(1, 2, 0))
    sqrsum = x.square().sum(-1)
    return [gemm_out.contiguous(), sqrsum.contiguous(), scale, base, residual,
            torch.empty(n, hc, device=device), torch.empty(n, hc * hc, device=device),
            torch.empty(n, h, device=device, dtype=torch.bfloat16)]  # fmt: skip


def reference(problem, args):
    import torch

    hc, h = problem["hc"], problem["hidden"]
    gemm_out, sqrsum, scale, base, residual = args[:5]
    rms = torch.rsqrt(sqrsum.sum(0) / (hc * h) + RMS_EPS)
    mixes = gemm_out.sum(0) * rms.unsqueeze(-1)
    mixes = mixes * torch.cat([scale[0].expand(hc), scale[1].expand(hc), scale[2].expand(hc * hc)]) + base
    pre = mixes[:, :hc].sigmoid() + PRE_EPS
    post = mixes[:, hc : 2 * hc].sigmoid() * POST_MULT
    comb = _sinkhorn(mixes[:, 2 * hc :].view(-1, hc, hc), SINKHORN_REPEAT, SINKHORN_EPS)
    layer_input = (residual.float() * pre.unsqueeze(-1)).sum(-2)
    return [post, comb.flatten(1, 2), layer_input]


def flops(problem):
    n, hc, h, splits = problem["tokens"], problem["hc"], problem["hidden"], problem["splits"]
    mixes = (splits + 1) * (hc * (2 + hc) + 1)  # split-K sums, normalization
    sinkhorn = 2 * SINKHORN_REPEAT * 2 * hc * hc  # a row and a column pass per repeat
    return float(n * (2 * hc * h + mixes + sinkhorn))
