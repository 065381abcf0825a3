"""bitnet_gemm: BitNet b1.58's prefill GEMM, C = A @ W^T with int8 activations A (M x K),
2-bit weights W (N x K, four per byte, in the interleaved order the decoder expects) and
int32 accumulation, as tilelang's
examples/bitnet-1.58b/kernel_benchmark/tilelang_bitnet_158_int8xint2_prefill.py writes it:
each K-step copies an A tile and a packed W tile to shared memory; every thread then reads
its own 16 packed values (thread-indexed through T.get_thread_binding), expands them to
int8 with the example's LOP3 device function (``decode_i2u_to_i8s``, in the kernel's
prelude, called through T.call_extern) and writes them to a second shared tile that the
int8 MMA reads. The example's hand-written ldmatrix/mma macros are a T.gemm here.

New for a schedule tuner: the weights are decoded from shared memory to shared memory
inside the pipelined loop, by an opaque extern call whose work is split over the threads
by their raw thread index, so the decoded tile is produced by threads between its load
and its MMA; and the MMA is int8 x int8 -> int32.

    ws-tune tests/data/bitnet_gemm.py --shape M=4096,N=4096,K=4096 --budget 16
"""

import tilelang.language as T

PER_BYTE = 4  # 2-bit weights per byte
LOCAL = 16  # int8 values one thread decodes at a time (a 128-bit vector)

PROBLEM = {"M": None, "N": None, "K": None}
PARAMS = {"block_M": [64, 128], "block_N": [64, 128], "block_K": [64, 128]}
THREADS = 128  # the example's 2 x 2 warps
NUM_STAGES = 2  # the example's pipeline depth
TOLERANCE = 1e-3  # integer arithmetic: exact

DECODE = """template <typename T1, typename T2>
__device__ void decode_i2s_to_i8s(T1 *_i2b, T2 *_i8s, const int N = 16)
{
    uint *i8s = reinterpret_cast<uint *>(_i8s);
    uint const i2b = *reinterpret_cast<uint *>(_i2b);
    static constexpr uint immLut = (0xf0 & 0xcc) | 0xaa;
    static constexpr uint BOTTOM_MASK = 0x03030303;
    static constexpr uint I8s_MAGIC_NUM = 0x00000000;
    static constexpr uint MEDIAN_NUM = 0x02020202;
#pragma unroll
    for (int i = 0; i < (N / 4); i++)
    {
        asm volatile("lop3.b32 %0, %1, %2, %3, %4;\\n"
                     : "=r"(i8s[i])
                     : "r"(i2b >> (2 * i)), "n"(BOTTOM_MASK), "n"(I8s_MAGIC_NUM), "n"(immLut));
        i8s[i] = __vsub4(i8s[i], MEDIAN_NUM);
    }
}
template <typename T1, typename T2>
__device__ void decode_i2u_to_i8s(T1 *_i2b, T2 *_i8s, const int N = 16)
{
    uint *i8s = reinterpret_cast<uint *>(_i8s);
    uint const i2b = *reinterpret_cast<uint *>(_i2b);
    static constexpr uint immLut = (0xf0 & 0xcc) | 0xaa;
    static constexpr uint BOTTOM_MASK = 0x03030303;
    static constexpr uint I8s_MAGIC_NUM = 0x00000000;
#pragma unroll
    for (int i = 0; i < (N / 4); i++)
    {
        asm volatile("lop3.b32 %0, %1, %2, %3, %4;\\n"
                     : "=r"(i8s[i])
                     : "r"(i2b >> (2 * i)), "n"(BOTTOM_MASK), "n"(I8s_MAGIC_NUM), "n"(immLut));
    }
}
"""


def check(problem, params, schedule):
    for dim, block in (("M", "block_M"), ("N", "block_N"), ("K", "block_K")):
        if problem[dim] % params[block]:
            return f"{dim}={problem[dim]} is not a multiple of {block}={params[block]}"
    if params["block_N"] * params["block_K"] % (THREADS * LOCAL):
        return f"a {params['block_N']}x{params['block_K']} weight tile is not a whole number of {LOCAL}-value pieces per thread"
    return None


def kernel(problem, *, block_M, block_N, block_K):
    M, N, K = problem["M"], problem["N"], problem["K"]
    packed = LOCAL // PER_BYTE

    @T.prim_func
    def bitnet(A: T.Tensor((M, K), "int8"), B: T.Tensor((N, K // PER_BYTE), "int8"), C: T.Tensor((M, N), "int32")):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=THREADS, prelude=DECODE) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K), "int8")
            B_shared = T.alloc_shared((block_N, block_K // PER_BYTE), "int8")
            B_dequantize_shared = T.alloc_shared((block_N, block_K), "int8")
            C_local = T.alloc_fragment((block_M, block_N), "int32")
            C_shared = T.alloc_shared((block_M, block_N), "int32")
            B_local = T.alloc_local((packed,), "int8")
            B_dequantize_local = T.alloc_local((LOCAL,), "int8")
            tx = T.get_thread_binding(0)

            T.use_swizzle(panel_size=10)
            T.clear(C_local)
            for ko in T.Pipelined(K // block_K, num_stages=NUM_STAGES):
                T.copy(A[by * block_M, ko * block_K], A_shared)
                T.copy(B[bx * block_N, ko * (block_K // PER_BYTE)], B_shared)
                for i in T.serial(block_N * block_K // (THREADS * LOCAL)):
                    for v in T.vectorized(packed):
                        vi, vj = T.index_to_coordinates((i * THREADS + tx) * packed + v, (block_N, block_K // PER_BYTE))
                        B_local[v] = B_shared[vi, vj]
                    T.call_extern("handle", "decode_i2u_to_i8s", T.access_ptr(B_local, "r"), T.access_ptr(B_dequantize_local, "w"))
                    for v in T.vectorized(LOCAL):
                        vi, vj = T.index_to_coordinates((i * THREADS + tx) * LOCAL + v, (block_N, block_K))
                        B_dequantize_shared[vi, vj] = B_dequantize_local[v]
                T.gemm(A_shared, B_dequantize_shared, C_local, transpose_B=True)
            T.copy(C_local, C_shared)
            T.copy(C_shared, C[by * block_M, bx * block_N])

    return bitnet


def _pack(w):
    """int8 weights in [0, 3], N x K -> N x K/4 int8 bytes in the decoder's interleaved order:
    in each group of 16 weights (4 bytes), weight 4 * i + b sits in byte b at bits 2 * i."""
    import torch

    n, k = w.shape
    fields = w.to(torch.int32).reshape(n, k // 16, 4, 4)  # [.., i, b]
    shifts = (2 * torch.arange(4, device=w.device, dtype=torch.int32)).reshape(1, 1, 4, 1)
    return (fields << shifts).sum(dim=2).to(torch.uint8).view(torch.int8).reshape(n, k // PER_BYTE)


def _unpack(b):
    import torch

    n, kb = b.shape
    groups = b.view(torch.uint8).to(torch.int32).reshape(n, kb // 4, 1, 4)  # [.., b]
    shifts = (2 * torch.arange(4, device=b.device, dtype=torch.int32)).reshape(1, 1, 4, 1)
    return ((groups >> shifts) & 3).reshape(n, kb * PER_BYTE)  # [.., i, b] -> 4 * i + b


def inputs(problem, device):
    import torch

    M, N, K = problem["M"], problem["N"], problem["K"]
    a = torch.randint(-128, 128, (M, K), device=device, dtype=torch.int8)
    w = torch.randint(0, 4, (N, K), device=device, dtype=torch.int8)
    return [a, _pack(w), torch.empty(M, N, device=device, dtype=torch.int32)]


def reference(problem, args):
    a, b, _ = args
    return [a.double() @ _unpack(b).double().T]


def flops(problem):
    return 2.0 * problem["M"] * problem["N"] * problem["K"]  # int8 operations
