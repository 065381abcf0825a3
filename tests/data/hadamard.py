"""hadamard: the unnormalized Walsh-Hadamard transform of each row of x, y = x @ H with H
the dim x dim Sylvester Hadamard matrix (entries +-1, no 1/sqrt(dim) scale, as the
example's ref_program F.linear(x, scipy.linalg.hadamard(dim)) has it), as tilelang's
examples/hadamard_transform/example_hadamard.py writes it. One block per row; the row's
log2(dim) butterfly rounds go in three tiers: within a thread (on its thread_elem = dim /
threads contiguous elements, in registers), within a warp (T.tvm_warp_shuffle with the
lane tx ^ 2^i, in a T.macro), and across warps (the row is transposed through a shared
tile, warp index <-> lane, shuffled again over the warp bits, and transposed back; in
exchange_round passes when the row does not fit the shared-memory cap). Memory-bound: it
reads and writes each element once and does log2(dim) adds per element; no MMA.

What a schedule tuner sees: no loop over global tiles at all. Every global access is a
per-thread vectorized loop indexed by the raw thread index (T.get_thread_binding), the
shuffles read it too, and the only shared tile is a transpose buffer each thread writes
and another thread reads back in serial loops (no T.copy; the one T.Pipelined, in the
shuffle macro, runs over a thread's registers with num_stages=1): there is no
producer/consumer handoff for a warp to take over. ws-tune finds no seed, so there is no
schedule space: role_based skips the kernel, at threads=32 and 64 with "worker threads
must be a multiple of 128 so issuer warps start a fresh warpgroup", from 128 up with "no
cross-role on-chip handoff to pipeline". A tuning measures tilelang's own lowerings at
each point of threads x smem_kb, and the torch vendor, and names the fastest; --budget
has nothing to spend.

Departures from the example: a @T.prim_func with the output as an argument (A, B)
instead of the eager @tilelang.jit form with T.const("b")/T.empty; the batch is a
problem argument. The example has no tunables: its threads come from a table of
log2(dim) (256 from dim=2048 up, 128 at 1024, 32 at 256-512, fewer below), and its
shared tile is capped at 32 KB ("Suppose we use 32KB shared memory at most"); here both
are PARAMS (threads, smem_kb; the example's point is threads=256, smem_kb=32 at
dim >= 2048), and check refuses the points the algorithm cannot serve (threads above dim,
a cap that does not divide a thread's elements into whole passes). threads below 32 (the
table's choice for dim <= 128) are not offered, so dim must be at least 32. The dtype
(float32 in the example) is a problem argument with the example's three choices.

The reference is a fast Walsh-Hadamard transform in fp32 torch (log2(dim) butterflies
over a reshaped row, O(dim log dim)): the example's x @ H needs the dim x dim matrix
(4 GB at dim=32768). The vendor baseline is that matmul, x @ H in the input dtype.

    ws-tune tests/data/hadamard.py --shape batch=64,dim=32768
"""

import math

import tilelang.language as T
from tilelang.cuda.intrinsics import make_mma_swizzle_layout

PROBLEM = {"batch": None, "dim": None, "dtype": "float32"}
CHOICES = {"dtype": ["float32", "float16", "bfloat16"]}
PARAMS = {"threads": [32, 64, 128, 256, 512, 1024], "smem_kb": [16, 32, 64]}
OUTPUTS = [1]
TOLERANCE = 1e-2

ELEM_SIZE = {"float32": 4, "float16": 2, "bfloat16": 2}


def _is_pow_of_2(n):
    return isinstance(n, int) and n > 0 and (n & (n - 1)) == 0


def _exchange_round(dim, dtype, smem_kb):
    """The example's passes through the shared tile: the row's bytes over the cap, at least 1."""
    row_bytes, cap = dim * ELEM_SIZE[dtype], smem_kb * 1024
    return row_bytes // cap if row_bytes > cap else 1


def check(problem, params, schedule):
    dim, threads = problem["dim"], params["threads"]
    if not _is_pow_of_2(dim) or not 2 <= dim <= 32768:
        return f"dim={dim} is not a power of 2 in [2, 32768]"
    if threads > dim:
        return f"threads={threads} is more than dim={dim}: a thread needs at least one element"
    thread_elem = dim // threads
    rounds = _exchange_round(dim, problem["dtype"], params["smem_kb"])
    if thread_elem % rounds:
        return f"{thread_elem} elements per thread do not split into {rounds} passes through a {params['smem_kb']} KB shared tile"
    return None


@T.macro
def warp_shfl(local, buf, thread_elem, warp_size, round):
    tx = T.get_thread_binding(0)
    for i in T.serial(round):
        tx_stride = 1 << i
        another_tx = tx ^ tx_stride
        sign = (tx >> i) & 1  # get i-th lowest bit of tx, which determines the operation type for shared[tx, :]
        for j in T.Pipelined(thread_elem, num_stages=1):
            buf[j] = T.tvm_warp_shuffle(
                0xFFFFFFFF,  # mask of all threads
                local[j],
                another_tx % warp_size,
                warp_size,
                warp_size,
            )
            local[j] = T.if_then_else(sign == 0, local[j] + buf[j], buf[j] - local[j])


def kernel(problem, *, threads, smem_kb):
    b, n, dtype = problem["batch"], problem["dim"], problem["dtype"]

    thread_elem = n // threads  # Each thread is responsible for a chunk of elements
    thread_round = int(math.log2(thread_elem))

    warps = 1 if threads <= 32 else threads // 32
    warp_round = int(math.log2(threads / warps))
    warp_size = threads // warps

    block_round = int(math.log2(warps))

    exchange_round = _exchange_round(n, dtype, smem_kb)
    thread_elem_in_smem = thread_elem // exchange_round if exchange_round > 1 else thread_elem

    @T.prim_func
    def hadamard(A: T.Tensor((b, n), dtype), B: T.Tensor((b, n), dtype)):
        with T.Kernel(b, threads=threads) as bx:
            local = T.alloc_local((thread_elem,), dtype)
            shared = T.alloc_shared((threads, thread_elem_in_smem), dtype)
            T.annotate_layout({shared: make_mma_swizzle_layout(shared)})
            tx = T.get_thread_binding(0)

            # 1. Load from HBM to register
            for i in T.vectorized(thread_elem):
                local[i] = A[bx, tx * thread_elem + i]

            # 2. Hadamard inside thread, n<=8
            for i in T.serial(thread_round):
                chunksize = 1 << (i + 1)
                chunknum = thread_elem // chunksize
                for j in T.serial(chunknum):
                    chunkbase = j * chunksize
                    for k in T.serial(chunksize // 2):
                        local[chunkbase + k] = local[chunkbase + k] + local[chunkbase + k + chunksize // 2]
                        local[chunkbase + k + chunksize // 2] = local[chunkbase + k] - 2 * local[chunkbase + k + chunksize // 2]

            # 3. Hadamard inside warp, n<=512
            # In warp level, we rely on warp shuffle to exchange data inside each warp, without using shared memory
            another_val = T.alloc_local((thread_elem,), dtype)

            warp_shfl(local, another_val, thread_elem, warp_size, warp_round)

            # 4. Hadamard inside block, n<=32768
            # Only exchange once for n<=8192, since shared mem can hold all elems
            if block_round > 0:
                warp_id = tx // warp_size
                lane_id = tx % warp_size
                src_tx = warp_id * warp_size + lane_id
                tgt_warp_id = tx % warps
                tgt_lane_id = tx // warps
                tgt_tx = tgt_warp_id * warp_size + tgt_lane_id

                # 4.1 Write to smem, swap, read from smem
                for cur_round in T.serial(exchange_round):
                    exchange_base = thread_elem_in_smem * cur_round
                    for j in T.vectorized(thread_elem_in_smem):
                        shared[src_tx, j] = local[exchange_base + j]

                    for j in T.vectorized(thread_elem_in_smem):
                        local[exchange_base + j] = shared[tgt_tx, j]

                # 4.2 Warp shuffle
                warp_shfl(local, another_val, thread_elem, warp_size, block_round)

                # 4.3 Write to smem, swap, read from smem
                for cur_round in T.serial(exchange_round):
                    exchange_base = thread_elem_in_smem * cur_round
                    for j in T.vectorized(thread_elem_in_smem):
                        shared[tgt_tx, j] = local[exchange_base + j]

                    for j in T.vectorized(thread_elem_in_smem):
                        local[exchange_base + j] = shared[src_tx, j]

            # 5. Write back to HBM
            for i in T.vectorized(thread_elem):
                B[bx, tx * thread_elem + i] = local[i]

    return hadamard


def inputs(problem, device):
    import torch

    b, n = problem["batch"], problem["dim"]
    dtype = getattr(torch, problem["dtype"])
    return [torch.randn(b, n, device=device, dtype=dtype), torch.empty(b, n, device=device, dtype=dtype)]


def fwht(x):
    """x @ H (Sylvester H, unnormalized) over the last axis, in fp32: log2(dim) butterflies."""
    import torch

    b, n = x.shape
    y = x.float()
    h = 1
    while h < n:
        y = y.reshape(b, n // (2 * h), 2, h)
        lo, hi = y[:, :, 0, :], y[:, :, 1, :]
        y = torch.stack((lo + hi, lo - hi), dim=2)
        h *= 2
    return y.reshape(b, n)


def sylvester(n, device=None, dtype=None):
    """The n x n Sylvester Hadamard matrix, H_2k = [[H_k, H_k], [H_k, -H_k]] (scipy.linalg.hadamard)."""
    import torch

    h = torch.ones(1, 1, device=device, dtype=dtype)
    while h.shape[0] < n:
        h = torch.cat((torch.cat((h, h), dim=1), torch.cat((h, -h), dim=1)), dim=0)
    return h


def reference(problem, args):
    return [fwht(args[0])]


def flops(problem):
    # an add or a subtract per element per butterfly round
    return float(problem["batch"] * problem["dim"] * int(math.log2(problem["dim"])))


def bytes_moved(problem):
    # x read once, y written once
    size = {"float32": 4, "float16": 2, "bfloat16": 2}[problem["dtype"]]
    return 2.0 * size * problem["batch"] * problem["dim"]


def vendors(problem):
    cache = {}

    def matmul(args):
        import torch

        x = args[0]
        key = (x.device, x.dtype)
        if key not in cache:
            cache[key] = sylvester(problem["dim"], device=x.device, dtype=x.dtype)
        return [torch.nn.functional.linear(x, cache[key])]  # the example's ref_program

    return {"torch x @ H": matmul}
