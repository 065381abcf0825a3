"""fp4_gemm: a bf16 x fp4 weight-only GEMM for Hopper, C = A @ B^T with bf16 activations A
(M x K), fp4 (e2m1) weights B (N x K, two per byte) and fp32 accumulation, as tilelang's
examples/dequantize_gemm/example_dequant_gemm_bf16_fp4_hopper.py writes it with its default
(``fast_dequant=True``) decode: each K-step copies an A tile and a packed B tile to shared
memory; every thread then loads its own 4 packed bytes at a time (indexed by its raw
thread index, T.get_thread_binding), expands them to 8 bf16 values with the example's PTX
device function ``decode_fp4_to_bf16_twiddling`` (brought in with T.import_source, called
through T.call_extern) and stores them to a bf16 shared tile that the MMA reads.

The weights are in the example's bit-twiddled layout: each pair of bytes, read as the
16-bit word ``b0 << 8 | b1``, holds 4 fp4 values, value j's sign, exponent and mantissa
bits at the positions the PTX masks expect (``SIGN``, ``EXP``, ``MAN`` below), so that
one AND, a shift and a bf16 multiply by 2^126 decode each of them. The example's other
variant (``fast_dequant=False``) reads plain nibbles (the low one first) and builds each
bf16 bit pattern in TIR in a T.Parallel loop over a fragment; it is not kept here. The
example's ``split`` parameter only asserts that K divides by ``block_K * split`` and is
left out; its ``in_dtype``/``out_dtype`` are bf16 and its ``num_stages`` 2, as it runs them.

New for a schedule tuner: the decode is an opaque extern call (inline PTX that writes to
its input operands, as the example has it) whose work is split over ``threads`` threads
by the raw thread index, so the decoded bf16 tile is produced by threads between its
load and its MMA and the number of pieces each thread decodes is fixed by ``threads``
when the kernel is built; its source comes in through a block attribute set inside the
pipelined loop (T.import_source) rather than the kernel's prelude; and a 2-byte decoded
tile, the size of the A tile at block_M = block_N, sits in shared memory beside the
pipelined copies.

    ws-tune tests/data/fp4_gemm.py --shape M=4096,N=4096,K=4096 --budget 16
"""

import tilelang.language as T

PER_BYTE = 2  # fp4 values per byte
LOCAL = 8  # bf16 values one thread decodes per call (one 128-bit vector)
LOCAL_COMPRESS = LOCAL // PER_BYTE  # the 4 packed bytes they come from
BLOCK_K = 128  # the example tunes block_K over [128] only
NUM_STAGES = 2  # the example's pipeline depth

PROBLEM = {"M": None, "N": None, "K": None}
PARAMS = {"block_M": [128, 256], "block_N": [64, 128], "threads": [128, 256]}
TOLERANCE = 1e-2  # the example's rtol; rounding the output to bf16 alone costs 1.7e-3

# Where value j (0..3) of a twiddled 16-bit word keeps its bits (bit 15 the word's top bit):
# the example's layout (0,0)(3,0)(3,3)(1,0)(3,1)(3,2)(2,0)(0,1)(0,2)(0,3)(1,1)(1,2)(1,3)(2,1)(2,2)(2,3).
SIGN = (15, 12, 9, 14)
EXP = ((8, 7), (5, 4), (2, 1), (11, 10))  # (high, low) exponent bit
MAN = (6, 3, 0, 13)
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # fp4 e2m1 magnitudes by (exponent << 1 | mantissa)

# The example's quantize/mxfp.py, decode_f4_to_bf16_twiddling (from Triton's hopper_value.py).
DECODE = """
// N should be the number of elements processed by one thread
template<typename T1, typename T2>
__device__ void decode_fp4_to_bf16_twiddling(T1 *B_local, T2 *B_local_decode, const int N = 8) {
  #pragma unroll
  for (int i = 0; i < N; ++i) {
    uint B_dequantize_local_vec[4];
    uint tmp, bias, d0, d1, d2, d3, d4, d5, d6;
    asm volatile(
      // To handle the endianness issue
      "prmt.b32 %13, %4, 0, 0x0123;"
      "mov.b32 %12, 0x7e807e80;"
      "and.b32 %0, %13, 0b10000001110000001000000111000000;"
      "mul.bf16x2 %0, %0, %12;"
      "shl.b32 %1, %13, 3;"
      "and.b32 %1, %1, 0b10000001110000001000000111000000;"
      "mul.bf16x2 %1, %1, %12;"
      "shl.b32 %2, %13, 6;"
      "and.b32 %2, %2, 0b10000001110000001000000111000000;"
      "mul.bf16x2 %2, %2, %12;"
      "shl.b32 %5, %13, 1;"
      "and.b32 %6, %5, 0b10000000000000001000000000000000;"
      "shr.b32 %7, %13, 3;"
      "and.b32 %8, %7, 0b00000001100000000000000110000000;"
      "or.b32 %9, %6, %8;"
      "shr.b32 %10, %13, 7;"
      "and.b32 %11, %10, 0b00000000010000000000000001000000;"
      "or.b32 %3, %9, %11;"
      "mul.bf16x2 %3, %3, %12;"
      :"=r"(B_dequantize_local_vec[0])
      ,"=r"(B_dequantize_local_vec[1])
      ,"=r"(B_dequantize_local_vec[2])
      ,"=r"(B_dequantize_local_vec[3])
      :"r"(*(uint*)&B_local[i << 2]), "r"(d0), "r"(d1), "r"(d2), "r"(d3), "r"(d4), "r"(d5), "r"(d6), "r"(bias), "r"(tmp)
    );
    for (int j = 0; j < 4; ++j) {
      // Pay attention to the big-endianness issue
      B_local_decode[(i << 3) + j] = reinterpret_cast<T2*>(&B_dequantize_local_vec[j])[1];
      B_local_decode[(i << 3) + j + 4] = reinterpret_cast<T2*>(&B_dequantize_local_vec[j])[0];
    }
  }
  // Check if the synchronization is needed
}
"""


def check(problem, params, schedule):
    for dim, block in (("M", "block_M"), ("N", "block_N")):
        if problem[dim] % params[block]:
            return f"{dim}={problem[dim]} is not a multiple of {block}={params[block]}"
    if problem["K"] % BLOCK_K:
        return f"K={problem['K']} is not a multiple of block_K={BLOCK_K}"
    if params["block_N"] * BLOCK_K % (params["threads"] * LOCAL):
        return f"a {params['block_N']}x{BLOCK_K} weight tile is not a whole number of {LOCAL}-value pieces per thread"
    return None


def kernel(problem, *, block_M, block_N, threads):
    M, N, K = problem["M"], problem["N"], problem["K"]
    block_K = BLOCK_K
    Block_QK = block_K // PER_BYTE

    @T.macro
    def fast_dequant_bf16_fp4_twiddling(B_shared, B_dequantize_shared):
        T.import_source(DECODE)
        tx = T.get_thread_binding()
        B_local_thread = T.alloc_local((LOCAL_COMPRESS,), "uint8")
        B_dequantize_local_thread = T.alloc_local((LOCAL,), "bfloat16")
        for i in T.serial(0, block_N * block_K // threads // LOCAL):
            # load 4 packed bytes from shared memory to registers
            for v in T.vectorized(0, LOCAL_COMPRESS):
                index = i * threads * LOCAL_COMPRESS + tx * LOCAL_COMPRESS + v
                B_local_thread[v] = B_shared[index // Block_QK, index % Block_QK]
            # decode them to 8 bf16 values
            T.call_extern("bfloat16", "decode_fp4_to_bf16_twiddling",
                          T.access_ptr(B_local_thread, "r"), T.access_ptr(B_dequantize_local_thread, "w"), 1)  # fmt: skip
            # store the 8 values to the decoded tile
            for v in T.vectorized(0, LOCAL):
                index = i * threads * LOCAL + tx * LOCAL + v
                B_dequantize_shared[index // block_K, index % block_K] = B_dequantize_local_thread[v]

    @T.prim_func
    def fp4_gemm(A: T.Tensor((M, K), "bfloat16"), B: T.Tensor((N, K // PER_BYTE), "uint8"), C: T.Tensor((M, N), "bfloat16")):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            A_shared = T.alloc_shared((block_M, block_K), "bfloat16")
            B_shared = T.alloc_shared((block_N, Block_QK), "uint8")
            B_dequantize_shared = T.alloc_shared((block_N, block_K), "bfloat16")
            C_local = T.alloc_fragment((block_M, block_N), "float32")
            C_shared = T.alloc_shared((block_M, block_N), "bfloat16")

            T.clear(C_local)
            for k in T.Pipelined(K // block_K, num_stages=NUM_STAGES):
                T.copy(A[by * block_M, k * block_K], A_shared)
                T.copy(B[bx * block_N, k * block_K // PER_BYTE], B_shared)
                fast_dequant_bf16_fp4_twiddling(B_shared, B_dequantize_shared)
                T.gemm(A_shared, B_dequantize_shared, C_local, transpose_B=True)
            T.copy(C_local, C_shared)
            T.copy(C_shared, C[by * block_M : (by + 1) * block_M, bx * block_N : (bx + 1) * block_N])

    return fp4_gemm


def _decode(b):
    """N x K/2 twiddled fp4 bytes -> N x K float32 weights (pure torch)."""
    import torch

    n, kb = b.shape
    words = (b[:, 0::2].to(torch.int32) << 8) | b[:, 1::2].to(torch.int32)  # N x K/4
    table = torch.tensor(E2M1, device=b.device)
    values = []
    for j in range(4):
        code = (((words >> EXP[j][0]) & 1) << 2) | (((words >> EXP[j][1]) & 1) << 1) | ((words >> MAN[j]) & 1)
        sign = 1.0 - 2.0 * ((words >> SIGN[j]) & 1).float()
        values.append(sign * table[code])
    return torch.stack(values, dim=-1).reshape(n, kb * PER_BYTE)


def inputs(problem, device):
    import torch

    M, N, K = problem["M"], problem["N"], problem["K"]
    a = torch.randn(M, K, device=device).to(torch.bfloat16)
    b = torch.randint(0, 256, (N, K // PER_BYTE), device=device, dtype=torch.uint8)  # every byte is 2 valid fp4 values
    return [a, b, torch.empty(M, N, device=device, dtype=torch.bfloat16)]


def reference(problem, args):
    a, b, _ = args
    return [a.float() @ _decode(b).T]


def flops(problem):
    return 2.0 * problem["M"] * problem["N"] * problem["K"]


def vendors(problem):
    import torch

    def dequantize_then_cublas(args):
        a, b, _ = args
        return [a @ _decode(b).to(torch.bfloat16).T]

    return {"torch": dequantize_then_cublas}
