"""mhc_post: DeepSeek's manifold-constrained hyper-connections, the post-mixing step, as
tilelang's examples/deepseek_mhc/example_mhc_post.py writes it: for each token, its hc
residual streams are mixed by an hc x hc matrix and the layer output, scaled per stream,
is added: out[t, o, :] = post[t, o] * x[t, :] + sum_i comb[t, i, o] * residual[t, i, :].
Memory-bound, no MMA: each hidden tile of the residual and of x is staged through shared
memory, mixed in registers, and written back through shared memory (tilelang's example
turns warp specialization off).

    ws-tune tests/data/mhc_post.py --shape tokens=8192 --budget 16
"""

import tilelang.language as T

PROBLEM = {"tokens": None, "hc": 4, "hidden": 7168}
CHOICES = {"hc": [2, 4, 8]}
PARAMS = {"h_blk": [512, 1024, 2048], "num_stages": [1, 2, 3], "threads": [128, 256]}
OUTPUTS = [4]
TOLERANCE = 2e-2


def check(problem, params, schedule):
    if problem["hidden"] % params["h_blk"]:
        return f"hidden={problem['hidden']} is not a multiple of h_blk={params['h_blk']}"
    return None


def kernel(problem, *, h_blk, num_stages, threads):
    n, hc, h = problem["tokens"], problem["hc"], problem["hidden"]

    @T.prim_func
    def mhc_post(Comb: T.Tensor((n, hc, hc), "float32"), Residual: T.Tensor((n, hc, h), "bfloat16"),
                 Post: T.Tensor((n, hc), "float32"), X: T.Tensor((n, h), "bfloat16"),
                 Out: T.Tensor((n, hc, h), "bfloat16")):  # fmt: skip
        with T.Kernel(n, threads=threads) as i_n:
            out_shared = T.alloc_shared((hc, h_blk), "bfloat16")
            residual_shared = T.alloc_shared((hc, h_blk), "bfloat16")
            x_shared = T.alloc_shared((h_blk,), "bfloat16")
            out_local = T.alloc_fragment((hc, h_blk), "float32")
            residual_local = T.alloc_fragment((hc, h_blk), "float32")
            x_local = T.alloc_fragment((h_blk,), "float32")
            comb_local = T.alloc_fragment((hc, hc), "float32")
            post_local = T.alloc_fragment((hc,), "float32")
            T.copy(Comb[i_n, :, :], comb_local)
            T.copy(Post[i_n, :], post_local)
            for i0_h in T.Pipelined(h // h_blk, num_stages=num_stages):
                T.copy(Residual[i_n, :, i0_h * h_blk : (i0_h + 1) * h_blk], residual_shared)
                T.copy(X[i_n, i0_h * h_blk : (i0_h + 1) * h_blk], x_shared)
                T.copy(residual_shared, residual_local)
                T.copy(x_shared, x_local)
                for o, j in T.Parallel(hc, h_blk):
                    out_local[o, j] = post_local[o] * x_local[j]
                    for i in T.serial(hc):
                        out_local[o, j] += comb_local[i, o] * residual_local[i, j]
                T.copy(out_local, out_shared)
                T.copy(out_shared, Out[i_n, :, i0_h * h_blk : (i0_h + 1) * h_blk])

    return mhc_post


def inputs(problem, device):
    import torch

    n, hc, h = problem["tokens"], problem["hc"], problem["hidden"]
    comb = torch.rand(n, hc, hc, device=device).softmax(dim=1)  # each output stream a convex mix
    residual = torch.randn(n, hc, h, device=device, dtype=torch.bfloat16)
    post = torch.rand(n, hc, device=device) * 2
    x = torch.randn(n, h, device=device, dtype=torch.bfloat16)
    return [comb, residual, post, x, torch.empty(n, hc, h, device=device, dtype=torch.bfloat16)]


def reference(problem, args):
    import torch

    comb, residual, post, x, _ = args
    return [(x.float().unsqueeze(-2) * post.unsqueeze(-1) + torch.bmm(comb.mT, residual.float())).bfloat16()]


def flops(problem):
    n, hc, h = problem["tokens"], problem["hc"], problem["hidden"]
    return 2.0 * n * hc * h * (hc + 1)
