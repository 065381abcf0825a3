"""A kernel file's PASS_CONFIGS: what ``@tilelang.jit(pass_configs=...)`` gives a tilelang
example, carried to every build of the kernel (ws-tune's candidates and tilelang's own
lowerings), and refused in one line where tilelang has no such config or ws-tune sets it."""

from __future__ import annotations

import pytest
from test_cli import assert_one_line_error, ws_tune

from ws_tuner import compiler
from ws_tuner.candidate import Candidate, Lowering
from ws_tuner.kernel import load_kernel
from ws_tuner.task import Task, params_key

# Threads write a shared tile row-wise and read it column-wise: tilelang's ThreadSync puts a
# __syncthreads between the two loops, unless the kernel file turns it off (as an example
# with hand-placed T.sync_threads() does).
TRANSPOSE = '''
import tilelang
import tilelang.language as T

PROBLEM = {"N": 64}
PARAMS = {"threads": [128]}
OUTPUTS = [1]


def kernel(problem, *, threads):
    N = problem["N"]

    @T.prim_func
    def transpose(A: T.Tensor((N, N), "float32"), B: T.Tensor((N, N), "float32")):
        with T.Kernel(1, threads=threads) as bx:
            S = T.alloc_shared((N, N), "float32")
            for i, j in T.Parallel(N, N):
                S[i, j] = A[i, j]
            for i, j in T.Parallel(N, N):
                B[i, j] = S[j, i]

    return transpose


def inputs(problem, device):
    import torch

    return [torch.randn(problem["N"], problem["N"], device=device), torch.empty(problem["N"], problem["N"], device=device)]


def reference(problem, args):
    return [args[0].T]


def flops(problem):
    return 0.0
'''


def _kernel_file(tmp_path, name: str, configs: str | None):
    path = tmp_path / f"{name}.py"
    path.write_text(TRANSPOSE + (f"\nPASS_CONFIGS = {configs}\n" if configs is not None else ""))
    return path


def _built_source(path) -> str:
    task = Task.make(load_kernel(path), {"N": 64}, None)
    func, configs = task.lowered(Candidate.make({"threads": 128}, lowering=Lowering.DEFAULT))
    return compiler.compile_kernel(func, configs).get_kernel_source()


def test_a_kernel_files_pass_configs_reach_its_build(tmp_path, uncached):
    plain = _kernel_file(tmp_path, "synced", None)
    unsynced = _kernel_file(tmp_path, "unsynced", "{tilelang.PassConfigKey.TL_DISABLE_THREAD_STORAGE_SYNC: True}")
    assert load_kernel(unsynced).pass_configs == {"tl.disable_thread_storage_sync": True}  # the Enum, as its name
    assert "__syncthreads()" in _built_source(plain)
    assert "__syncthreads()" not in _built_source(unsynced)


def test_every_lowering_gets_the_files_configs_beside_its_own(tmp_path, example_path):
    """tilelang's own lowerings keep the config that picks them; ws-tune's seed gets the
    file's configs too (examples/gemm.py, with one added)."""
    path = tmp_path / "gemm_fast.py"
    path.write_text(example_path.read_text() + '\nPASS_CONFIGS = {"tl.enable_fast_math": True}\n')
    spec = load_kernel(path)
    params = {"block_M": 128, "block_N": 256, "block_K": 64, "swizzle": 8, "epilogue": "smem", "persistent": False,
              "mma": "sync", "consumers": "cooperative", "split": "rows"}
    task = Task.make(spec, spec.parse_problem("M=1024,N=1024,K=1024"), {k: (v,) for k, v in params.items()})
    seed = task.space().seed_candidate(params_key(params))
    assert isinstance(seed, Candidate), seed
    expected = {
        Lowering.WS: {"tl.enable_fast_math": True},
        Lowering.DEFAULT: {"tl.enable_fast_math": True},
        Lowering.ROLE_BASED: {"tl.enable_fast_math": True, **compiler.ROLE_BASED_CONFIG},
        Lowering.NO_WS: {"tl.enable_fast_math": True, **compiler.NO_WS_CONFIG},
    }
    for lowering, configs in expected.items():
        candidate = seed if lowering is Lowering.WS else Candidate.make(params, lowering=lowering)
        assert task.lowered(candidate)[1] == configs, lowering


@pytest.mark.parametrize(
    ("configs", "needle"),
    [
        ('{"tl.enable_fast_maths": True}', "PASS_CONFIGS: tilelang has no pass config 'tl.enable_fast_maths' (did you mean 'tl.enable_fast_math'?)"),
        ('{"tl.disable_warp_specialized": True}',
         "PASS_CONFIGS: 'tl.disable_warp_specialized' chooses the warp-specialization lowering, which ws-tune sets for each baseline and candidate"),
        ('[("tl.enable_fast_math", True)]', "PASS_CONFIGS must be a dict of tilelang pass configs, got list"),
        # found when the file loads, not as a compile error of every build (a helper's port)
        ('{"tl.enable_fast_math": "yes"}', "PASS_CONFIGS: Expect config tl.enable_fast_math to have type ir.IntImm, but instead get ffi.SmallStr"),
        ('{"tl.enable_fast_math": None}', "PASS_CONFIGS: tl.enable_fast_math is None"),
    ],
)
def test_a_pass_config_tilelang_lacks_or_ws_tune_sets_or_of_a_wrong_type_is_one_line_and_exit_2(tmp_path, configs, needle):
    proc = ws_tune("space", str(_kernel_file(tmp_path, "configured", configs)), "--shape", "N=64")
    assert_one_line_error(proc, needle)
