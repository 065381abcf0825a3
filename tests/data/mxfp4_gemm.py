"""mxfp4_gemm: an MXFP4 weight-only GEMM for Hopper, C = A @ B^T (+ Bias) with bf16
activations A (M x K), fp4 (e2m1) weights B (N x K, two per byte), one power-of-two scale
exponent (uint8) per 32 weights along K and fp32 accumulation, as tilelang's
examples/dequantize_gemm/example_dequant_gemm_bf16_mxfp4_hopper.py writes it. Each K-step
copies an A tile and a packed B tile (swizzled) to shared memory, dequantizes B into a bf16
shared tile and feeds the MMA from shared memory; C goes out through a shared tile.

Both of the example's decodes are kept, chosen by the problem argument ``fast_dequant``:
- ``fast_dequant=1`` (the example's default): every thread loads its own 4 packed bytes
  at a time (indexed by its raw thread index, T.get_thread_binding, and the block index
  by T.get_block_binding), expands them to 8 bf16 values with the example's PTX device
  function ``decode_fp4_to_bf16_twiddling`` (T.import_source + T.call_extern), multiplies
  them by ``1 << Scale`` and stores them to the shared tile. The weights are in the
  example's bit-twiddled layout (dequantize_utils.torch_convert_bit_twiddling);
- ``fast_dequant=0``: the packed tile goes shared -> fragment, a T.Parallel loop builds
  each bf16 bit pattern from a plain nibble (the low one first; _tir_u8_to_f4_to_bf16)
  times ``1 << Scale``, and the fragment goes back to the shared tile. Its decode, like
  the example's torch_convert, has no zero or subnormal: exponent 0 reads as 2^-1, so the
  magnitudes are 0.5, 0.75, 1, 1.5, 2, 3, 4, 6 (the fast path's are e2m1's 0, 0.5, ...).

What a schedule tuner sees: a plain kernel (no seed of its own; tilelang's role_based
scheduler seeds it), one pipelined K loop with two loads (A, packed B), a dequantize
stage between the packed B tile and the MMA (opaque extern calls over raw thread indices,
or a fragment round trip), one synchronous MMA from shared memory, and C stored after the
loop (with_bias: C_local first filled from Bias through a shared tile). ``threads`` fixes
how many pieces each thread decodes when the kernel is built (fast path).

Departures from the example:
- PARAMS are the example's get_configs axes, crossed (block_M/N/K 64/128/256, num_stages
  0/2, threads 128/256/512, split 1/2); ``split`` only enters the example's assertion
  ``K % (block_K * split) == 0``, which ``check`` keeps; ``check`` also asks M and N to
  be multiples of their blocks (the example's tests only use such shapes);
- the quantize/ intrin lookup (get_mxfp_intrin_group) is inlined as its one CUDA source;
  in/out dtype bf16, accum fp32, scale_size 32, num_bits 4, as the example runs them;
- ``fast_dequant`` and ``with_bias`` are bool problem arguments (the example's main runs
  all four combinations); Bias is always an argument, as in the example's signature;
- the reference is the example's ref_program_* in fp32 (no bf16 rounding of C); the
  Scale inputs are small exponents (0..3) so that ``1 << Scale`` stays well inside bf16.

    ws-tune tests/data/mxfp4_gemm.py --shape M=4096,N=4096,K=4096 --budget 16
"""

import tilelang
import tilelang.language as T
from tilelang import tvm as tvm
from tvm import DataType
from tvm import tirx

NUM_BITS = 4
SCALE_SIZE = 32  # the example's scale_size: one exponent per 32 weights along K
SCALE_MAX = 4  # Scale entries are drawn from [0, SCALE_MAX)

PROBLEM = {"M": None, "N": None, "K": None, "fast_dequant": True, "with_bias": False}
# the example's get_configs, crossed
PARAMS = {
    "block_M": [64, 128, 256],
    "block_N": [64, 128, 256],
    "block_K": [64, 128, 256],
    "num_stages": [0, 2],
    "threads": [128, 256, 512],
    "split": [1, 2],
}
OUTPUTS = [4]
TOLERANCE = 1e-2  # the example's rtol

# The example's quantize/mxfp.py, decode_f4_to_bf16_twiddling (from Triton's hopper_value.py).
decode_f4_to_bf16_twiddling = """
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
    if problem["K"] % (params["block_K"] * params["split"]):
        return f"K={problem['K']} is not a multiple of block_K * split={params['block_K'] * params['split']} (the example's assertion)"
    return None


def _tir_u8_to_f4_to_bf16(nbit: int, val: tirx.PrimExpr, pos: tirx.PrimExpr, scale: tirx.PrimExpr, dtype: str):
    """The example's helper: the 4-bit field of ``val`` at nibble ``pos`` as a bf16 (scale unused, as there)."""
    assert nbit == 4
    assert dtype == T.bfloat16
    assert val.dtype == T.uint8
    mask = tirx.const((1 << nbit) - 1, T.uint16)
    f4 = (val >> (pos.astype(T.uint16) * tirx.const(nbit, T.uint16))) & mask
    s = f4 >> tirx.const(3, T.uint16)
    e_f4 = (f4 & tirx.const(6, T.uint16)) >> tirx.const(1, T.uint16)
    # Exponential bias between f4 and bf16 is 2^(8-1) - 2^(2-1) = 126
    e_bf16 = e_f4 + tirx.const(126, T.uint16)
    m_f4 = f4 & tirx.const(1, T.uint16)
    val_bf16 = tirx.reinterpret(
        T.bfloat16,
        ((((s << tirx.const(8, T.uint16)) | e_bf16) << tirx.const(7, T.uint16)) | (m_f4 << tirx.const(6, T.uint16))).astype(T.uint16),
    )
    return val_bf16


def kernel(problem, *, block_M, block_N, block_K, num_stages, threads, split):
    M, N, K = problem["M"], problem["N"], problem["K"]
    fast_dequant, with_bias = problem["fast_dequant"], problem["with_bias"]
    in_dtype, out_dtype, accum_dtype = T.bfloat16, T.bfloat16, T.float32
    num_bits, scale_size = NUM_BITS, SCALE_SIZE

    num_elems_per_byte = 8 // num_bits
    storage_dtype = T.uint8
    QK = K // num_elems_per_byte
    Block_QK = block_K // num_elems_per_byte
    A_shape = (M, K)
    B_shape = (N, QK)
    Bias_shape = (M, N)
    Scale_shape = (N, K // scale_size)
    A_shared_shape = (block_M, block_K)
    B_shared_shape = (block_N, Block_QK)
    Bias_shared_shape = (block_M, block_N)
    B_dequantize_shared_shape = (block_N, block_K)
    assert K % (block_K * split) == 0

    import_source = decode_f4_to_bf16_twiddling
    func_name = "decode_fp4_to_bf16_twiddling"

    def get_fast_dequant_twiddling_func(in_dtype="fp4", out_dtype=T.bfloat16):
        assert in_dtype in ["fp4"]
        assert out_dtype in [T.bfloat16]

        # Some variables for dequantization in each thread
        MAX_TRANSACTION_SIZE_BITS = 128
        local_size = MAX_TRANSACTION_SIZE_BITS // DataType(out_dtype).bits
        local_compress_size = local_size // num_elems_per_byte

        @T.macro
        def fast_dequant_bf16_fp4_twiddling(B_shared, B_dequantize_shared, Scale, k):
            T.import_source(import_source)

            tx = T.get_thread_binding()
            bx = T.get_block_binding(0)

            B_local_thread = T.alloc_local((local_compress_size,), storage_dtype)
            B_dequantize_local_thread = T.alloc_local((local_size,), out_dtype)
            Scale_local_thread = T.alloc_local((1,), storage_dtype)
            Scale_local_thread_exponent = T.alloc_local((1,), out_dtype)

            for i in T.serial(0, block_N * block_K // threads // local_size):
                # First, load data from share memory to register.
                index_base = i * threads * local_compress_size + tx * local_compress_size
                for v in T.vectorized(0, local_compress_size):
                    index = index_base + v
                    B_local_thread[v] = B_shared[index // Block_QK, index % Block_QK]
                index_scale = index_base // (scale_size // num_elems_per_byte)
                si = index_scale // (block_K // scale_size)
                sj = index_scale % (block_K // scale_size)
                Scale_local_thread[0] = Scale[bx * block_N + si, k * block_K // scale_size + sj]
                Scale_local_thread_exponent[0] = T.shift_left(1, (Scale_local_thread[0]))

                # Then, dequant.
                T.call_extern(
                    func_name,
                    T.access_ptr(B_local_thread, "r"),
                    T.access_ptr(B_dequantize_local_thread, "w"),
                    1,
                    dtype=out_dtype,
                )

                # Finally, store the dequantized data to shared memory.
                for v in T.vectorized(local_size):
                    B_dequantize_local_thread[v] *= Scale_local_thread_exponent[0]

                for v in T.vectorized(0, local_size):
                    index = i * threads * local_size + tx * local_size + v
                    B_dequantize_shared[index // block_K, index % block_K] = B_dequantize_local_thread[v]

        return fast_dequant_bf16_fp4_twiddling

    def get_simple_dequant_func(in_dtype="fp4", out_dtype=T.bfloat16):
        assert in_dtype in ["fp4"]
        assert out_dtype in [T.bfloat16]

        @T.macro
        def simple_dequant_bf16_fp4(B_shared, B_dequantize_shared, Scale, k):
            B_local = T.alloc_fragment(B_shared_shape, storage_dtype)
            B_dequantize_local = T.alloc_fragment(B_dequantize_shared_shape, out_dtype)

            bx = T.get_block_binding(0)
            T.copy(B_shared, B_local)
            for i, j in T.Parallel(block_N, block_K):
                B_dequantize_local[i, j] = _tir_u8_to_f4_to_bf16(
                    num_bits,
                    B_local[i, j // num_elems_per_byte],
                    j % num_elems_per_byte,
                    Scale[bx * block_N + i, k * block_K // scale_size + j // scale_size],
                    dtype=out_dtype,
                ) * T.shift_left(1, (Scale[bx * block_N + i, k * block_K // scale_size + j // scale_size]))
            T.copy(B_dequantize_local, B_dequantize_shared)

        return simple_dequant_bf16_fp4

    @T.prim_func
    def main(
        A: T.Tensor(A_shape, in_dtype),
        B: T.Tensor(B_shape, storage_dtype),
        Scale: T.Tensor(Scale_shape, storage_dtype),
        Bias: T.Tensor(Bias_shape, out_dtype),
        C: T.Tensor((M, N), out_dtype),
    ):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            A_shared = T.alloc_shared(A_shared_shape, in_dtype)
            B_shared = T.alloc_shared(B_shared_shape, storage_dtype)
            B_dequantize_shared = T.alloc_shared(B_dequantize_shared_shape, in_dtype)
            Bias_shared = T.alloc_shared(Bias_shared_shape, out_dtype)
            C_local = T.alloc_fragment((block_M, block_N), accum_dtype)
            C_shared = T.alloc_shared((block_M, block_N), out_dtype)

            T.annotate_layout(
                {
                    B_shared: tilelang.layout.make_swizzled_layout(B_shared),
                }
            )

            if with_bias:
                T.annotate_layout(
                    {
                        Bias_shared: tilelang.layout.make_swizzled_layout(Bias_shared),
                    }
                )

            if threads == 512:
                T.disable_warp_group_reg_alloc()

            if with_bias:
                T.copy(Bias[by * block_M : (by + 1) * block_M, bx * block_N : (bx + 1) * block_N], Bias_shared)
                T.copy(Bias_shared, C_local)
            else:
                T.clear(C_local)

            for k in T.Pipelined(K // block_K, num_stages=num_stages):
                T.copy(A[by * block_M, k * block_K], A_shared)
                T.copy(B[bx * block_N, k * block_K // num_elems_per_byte], B_shared)
                if fast_dequant:
                    get_fast_dequant_twiddling_func()(B_shared, B_dequantize_shared, Scale, k)
                else:
                    get_simple_dequant_func()(B_shared, B_dequantize_shared, Scale, k)
                T.gemm(A_shared, B_dequantize_shared, C_local, transpose_B=True)

            T.copy(C_local, C_shared)
            T.copy(C_shared, C[by * block_M : (by + 1) * block_M, bx * block_N : (bx + 1) * block_N])

    return main


def torch_convert_bit_twiddling(tensor):
    """The example's dequantize_utils.torch_convert_bit_twiddling: N x K/2 twiddled bytes -> N x K bf16."""
    import torch

    assert tensor.dim() == 2 and tensor.dtype == torch.uint8
    N, K = tensor.shape
    assert K % 2 == 0, "Number of columns must be even"
    val0 = tensor[:, 0::2].to(torch.int32)
    val1 = tensor[:, 1::2].to(torch.int32)
    val_concat = (val0 << 8) | val1
    val_concat_expanded = val_concat.repeat_interleave(4, dim=1)
    pos = torch.arange(K * 2, device=tensor.device) % 4
    mask = 0b1000000111000000
    mask1 = 0b1000000000000000
    mask2 = 0b0000000110000000
    mask3 = 0b0000000001000000
    res0 = val_concat_expanded & mask
    res1 = (val_concat_expanded << 3) & mask
    res2 = (val_concat_expanded << 6) & mask
    res3 = ((val_concat_expanded << 1) & mask1) | ((val_concat_expanded >> 3) & mask2) | ((val_concat_expanded >> 7) & mask3)
    bf16 = torch.where(pos == 0, res0, torch.where(pos == 1, res1, torch.where(pos == 2, res2, res3)))
    bf16_uint16 = (bf16 & 0xFFFF).to(torch.uint16)
    bf16_bf16 = bf16_uint16.view(torch.bfloat16)
    return bf16_bf16 * (2.0**126)


def torch_convert(tensor):
    """The example's dequantize_utils.torch_convert (no scale): N x K/2 plain nibbles, low first -> N x K bf16."""
    import torch

    assert tensor.dim() == 2 and tensor.dtype == torch.uint8
    N, K = tensor.shape
    f4 = torch.stack((tensor & 0x0F, tensor >> 4), dim=-1)
    f4 = f4.reshape(N, K * 2).to(torch.int16)
    sign = (f4 >> 3) * -32768
    exponent = ((f4 & 6) >> 1) + 126
    mantissa = (f4 & 1) << 6
    return (sign + (exponent << 7) + mantissa).view(torch.bfloat16)


def _weights(problem, qB, Scale):
    """B (N x K, fp32) as the example's references rebuild it: decode, times 2 ** Scale per 32 columns."""
    import torch

    B = (torch_convert_bit_twiddling(qB) if problem["fast_dequant"] else torch_convert(qB)).float()
    return B * 2.0 ** Scale[:, torch.arange(B.shape[1], device=B.device) // SCALE_SIZE].float()


def inputs(problem, device):
    import torch

    M, N, K = problem["M"], problem["N"], problem["K"]
    a = torch.randn(M, K, device=device).to(torch.bfloat16)
    qb = torch.randint(0, 256, (N, K // 2), device=device, dtype=torch.uint8)  # every byte is 2 valid fp4 values
    scale = torch.randint(0, SCALE_MAX, (N, K // SCALE_SIZE), device=device, dtype=torch.uint8)
    bias = torch.randn(M, N, device=device).to(torch.bfloat16)
    return [a, qb, scale, bias, torch.empty(M, N, device=device, dtype=torch.bfloat16)]


def reference(problem, args):
    """The example's ref_program_{twiddling,simple}[_with_bias], in fp32."""
    a, qb, scale, bias, _ = args
    c = a.float() @ _weights(problem, qb, scale).T
    return [c + bias.float() if problem["with_bias"] else c]


def flops(problem):
    return 2.0 * problem["M"] * problem["N"] * problem["K"]


def vendors(problem):
    import torch

    def dequantize_then_cublas(args):
        a, qb, scale, bias, _ = args
        c = a @ _weights(problem, qb, scale).to(torch.bfloat16).T
        return [c + bias if problem["with_bias"] else c]

    return {"torch": dequantize_then_cublas}
