"""gemm_sp: C = A @ B with A 2:4 structured-sparse (two nonzeros in every four values of a
row along K), as tilelang's examples/gemm_sp/example_gemm_sp.py writes it for Hopper: A
comes compressed (A_sparse, M x K/2) with its metadata E (the 2-bit positions of the kept
values, packed into e_dtype words), the pipelined loop loads A_sparse, E and B tiles into
shared memory and `T.gemm_sp` runs the sparse tensor-core MMA (WGMMA .sp on sm90), then C
goes out through shared memory. inputs() prunes a random A to 2:4 and compresses it with
the example's pure-PyTorch compressor (sparse_utils.torch_compress: the same natural
row-major metadata as its TileLang `compress`, which tilelang 0.1.15 no longer ships);
reference() unpacks A from A_sparse and E and multiplies it densely with B.

    ws-tune tests/data/gemm_sp.py --shape M=4096,N=4096,K=4096 --budget 16
"""

import tilelang.language as T

PROBLEM = {"M": None, "N": None, "K": None, "e_dtype": "int16", "accum_dtype": "float32"}
# Metadata words: int8 and int32 only on sm90+ (the example's --e_dtype); C is in accum_dtype.
CHOICES = {"e_dtype": ["int8", "int16", "int32"], "accum_dtype": ["float32", "float16"]}
# The example's Hopper configurations (h20: 128x64x128, 3 stages, 128 threads; its
# command-line defaults: 128x256x128, 2 stages, 256 threads) and their neighbours.
PARAMS = {"block_M": [64, 128], "block_N": [64, 128, 256], "block_K": [64, 128], "num_stages": [2, 3], "thread_num": [128, 256]}
OUTPUTS = [3]
TOLERANCE = 1e-2

E_BITS = {"int8": 8, "int16": 16, "int32": 32}


def _e_factor(e_dtype):
    """Values of A (fp16: groups of 4) that one metadata word covers (get_e_factor)."""
    return E_BITS[e_dtype] // 4 * 4


def check(problem, params, schedule):
    for dim, block in (("M", "block_M"), ("N", "block_N"), ("K", "block_K")):
        if problem[dim] % params[block]:
            return f"{dim}={problem[dim]} is not a multiple of {block}={params[block]}"
    if params["block_K"] % _e_factor(problem["e_dtype"]):
        return f"block_K={params['block_K']} is not a multiple of the {problem['e_dtype']} metadata word's {_e_factor(problem['e_dtype'])} values"
    return None


def kernel(problem, *, block_M, block_N, block_K, num_stages, thread_num, enable_rasterization=True):
    from tilelang.cuda.intrinsics.sparse_layout import get_e_factor

    M, N, K, e_dtype, accum_dtype = (problem[k] for k in ("M", "N", "K", "e_dtype", "accum_dtype"))
    e_factor = get_e_factor(T.float16, e_dtype)
    policy = T.GemmWarpPolicy.Square

    @T.prim_func
    def gemm_sp_fp16(
        A_sparse: T.Tensor((M, K // 2), T.float16),
        E: T.Tensor((M, K // e_factor), e_dtype),
        B: T.Tensor((K, N), T.float16),
        C: T.Tensor((M, N), accum_dtype),
    ):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=thread_num) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K // 2), T.float16)
            E_shared = T.alloc_shared((block_M, block_K // e_factor), e_dtype)
            B_shared = T.alloc_shared((block_K, block_N), T.float16)
            C_shared = T.alloc_shared((block_M, block_N), accum_dtype)
            C_local = T.alloc_fragment((block_M, block_N), accum_dtype)

            T.clear(C_local)
            T.disable_warp_group_reg_alloc()
            T.use_swizzle(panel_size=10, enable=enable_rasterization)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                T.copy(A_sparse[by * block_M, k * block_K // 2], A_shared)
                T.copy(E[by * block_M, k * block_K // e_factor], E_shared)
                T.copy(B[k * block_K, bx * block_N], B_shared)
                T.gemm_sp(A_shared, E_shared, B_shared, C_local, transpose_A=False, transpose_E=False, transpose_B=False, policy=policy)

            T.copy(C_local, C_shared)
            T.copy(C_shared, C[by * block_M, bx * block_N])

    return gemm_sp_fp16


def _compress(dense, meta_dtype):
    """The example's torch_compress (sparse_utils.py) for 16-bit A: (M, K/2) kept values and
    (M, K/e_factor) metadata, each 4-bit chunk = first kept index | second kept index << 2."""
    import torch

    m, k = dense.shape
    quadbits = meta_dtype.itemsize * 8 // 4
    groups = dense.view(-1, k // 4, 4)
    m0, m1, _m2, m3 = (groups != 0).unbind(-1)
    expr0, expr1, expr2 = m0 & m1, ~m0 & m1, ~m0 & ~m1
    idxs0 = expr1.to(torch.int64) | (expr2.to(torch.int64) << 1)
    idxs1 = (expr0 | expr2 | m3).to(torch.int64) | ((expr1 | ~m1).to(torch.int64) << 1)
    sp0 = groups.gather(-1, idxs0.unsqueeze(-1))
    sp1 = groups.gather(-1, idxs1.unsqueeze(-1))
    sparse = torch.stack((sp0, sp1), dim=-1).view(m, k // 2)
    meta_n = (idxs0 | (idxs1 << 2)).view(-1, k // (4 * quadbits), quadbits).to(meta_dtype)
    meta = meta_n[:, :, 0]
    for i in range(1, quadbits):
        meta = meta | (meta_n[:, :, i] << (4 * i))
    return sparse.contiguous(), meta.contiguous()


def _decompress(sparse, meta, K):
    """Dense (M, K) A from A_sparse and E: the inverse of _compress, written independently."""
    import torch

    M = sparse.shape[0]
    quadbits = meta.element_size() * 8 // 4
    shifts = torch.arange(quadbits, device=meta.device) * 4
    nibbles = (meta.to(torch.int64).unsqueeze(-1) >> shifts) & 0xF  # (M, K/e_factor, quadbits)
    nibbles = nibbles.reshape(M, K // 4)
    idx = torch.stack((nibbles & 3, (nibbles >> 2) & 3), dim=-1)  # (M, K/4, 2)
    dense = torch.zeros(M, K // 4, 4, device=sparse.device, dtype=sparse.dtype)
    dense.scatter_(-1, idx, sparse.view(M, K // 4, 2))
    return dense.view(M, K)


def inputs(problem, device):
    import torch

    M, N, K = problem["M"], problem["N"], problem["K"]
    # randn_semi_sparse: zero the two largest of every four values along K.
    a = torch.randn(M, K, device=device).view(M, -1, 4)
    a.scatter_(-1, a.topk(2, dim=-1).indices, 0)
    a = a.view(M, K).to(torch.float16)
    a_sparse, e = _compress(a, getattr(torch, problem["e_dtype"]))
    b = torch.randn(K, N, device=device, dtype=torch.float16)
    return [a_sparse, e, b, torch.empty(M, N, device=device, dtype=getattr(torch, problem["accum_dtype"]))]


def reference(problem, args):
    a_sparse, e, b, _ = args
    return [_decompress(a_sparse, e, problem["K"]).float() @ b.float()]


def flops(problem):
    """The dense GEMM's count, as the example reports (TFLOP/s comparable with a @ b)."""
    return 2.0 * problem["M"] * problem["N"] * problem["K"]
