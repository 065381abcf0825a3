"""The builder on real tilelang passes and real nvcc: every outcome is data."""

from __future__ import annotations

import os
import re
from dataclasses import replace
from pathlib import Path

import pytest
import tilelang

from ws_tuner import compiler
from ws_tuner.builder import BuildInput, LocalBuilder
from ws_tuner.candidate import Candidate, Lowering
from ws_tuner.kernel import load_kernel
from ws_tuner.result import Status
from ws_tuner.schedule import Role, Sync
from ws_tuner.space import Point
from ws_tuner.task import Task

ROOT = Path(__file__).resolve().parents[2]
PARAMS = {"block_K": 64, "block_M": 128, "block_N": 256, "epilogue": "direct", "persistent": False, "swizzle": 8}


@pytest.fixture(scope="module")
def seed(gemm_task):
    return gemm_task.space().seed_candidate(tuple(sorted(PARAMS.items())))


def _input(task, candidate):
    return BuildInput(str(task.spec.path), task.spec.source_hash, task.problem, candidate)


@pytest.mark.slow
def test_outcomes_are_data(gemm_task, seed, fresh_cache):
    s = seed.schedule
    loop = s.scopes[0]
    # The consumer never releases: the verifier refuses, and nvcc never runs.
    no_release = tuple((role, tuple(i for i in body if not (isinstance(i, Sync) and i.kind == "CONSUMER_RELEASE"))) for role, body in loop.bodies)
    broken = Candidate.make(PARAMS, s.with_(scopes=(loop.__class__(loop.id, no_release),) + s.scopes[1:]))
    # Twelve consumer warps cannot split a 128x256 tile: tilelang's lowering refuses.
    unsplittable = Candidate.make(PARAMS, s.with_(num_warps=16, roles=(Role("Consumer", 0, 12, 160), Role("Producer", 12, 13, 40))))
    with LocalBuilder(jobs=2, timeout=240) as builder:
        results = builder.build([_input(gemm_task, c) for c in (seed, broken, unsplittable)])
    by = {r.candidate.hash: r for r in results}
    assert by[seed.hash].status is Status.BUILT, by[seed.hash].message
    assert by[broken.hash].status is Status.REJECTED
    assert "pipeline smem" in by[broken.hash].message and "\n" not in by[broken.hash].message
    assert by[broken.hash].seconds < by[seed.hash].seconds  # verified in ms; nvcc never ran
    assert by[unsplittable.hash].status is Status.COMPILE_ERROR
    assert "warp partition" in by[unsplittable.hash].message


@pytest.mark.slow
def test_ptxas_failure_is_a_compile_error_with_its_line(gemm_spec, fresh_cache):
    from ws_tuner.task import Task

    gemm_task = Task.make(gemm_spec, gemm_spec.parse_problem("M=3072,N=4096,K=4096"))
    params = {**PARAMS, "block_M": 192}
    seed = gemm_task.space().seed_candidate(tuple(sorted(params.items())))
    three_groups = Candidate.make(params, seed.schedule.with_(num_warps=16, roles=(Role("Consumer", 0, 12, 160), Role("Producer", 12, 13, 40))))
    with LocalBuilder(jobs=1, timeout=240) as builder:
        (result,) = builder.build([_input(gemm_task, three_groups)])
    assert result.status is Status.COMPILE_ERROR
    assert "ptxas" in result.message and "registers" in result.message


@pytest.mark.slow
def test_timeout_kills_the_worker_and_the_pool_goes_on(gemm_task, seed, fresh_cache):
    default = Candidate.make(PARAMS, None, Lowering.DEFAULT)
    with LocalBuilder(jobs=1, timeout=0.5) as builder:
        (slow,) = builder.build([_input(gemm_task, seed)])
        assert slow.status is Status.COMPILE_TIMEOUT and "0.5 s" in slow.message
        builder.timeout = 240
        (after,) = builder.build([_input(gemm_task, default)])
    assert after.status is Status.BUILT, after.message


def test_changed_kernel_file_is_refused(gemm_task, seed):
    from ws_tuner.builder import build_one

    stale = BuildInput(str(gemm_task.spec.path), "0" * 64, gemm_task.problem, seed)
    result = build_one(stale)
    assert result.status is Status.COMPILE_ERROR and "changed while tuning" in result.message


@pytest.mark.slow
def test_generated_code_identifies_a_kernel(data_dir, fresh_cache):
    """num_stages is overridden by the schedule's depths: the same code, one hash.
    A real difference (the tile width) gives another hash."""
    from ws_tuner.kernel import load_kernel
    from ws_tuner.task import Task

    spec = load_kernel(data_dir / "stages_gemm.py")
    task = Task.make(spec, spec.parse_problem("M=1024,N=1024,K=1024"))
    point = {"block_K": 64, "block_M": 128, "block_N": 256}
    seed = task.space().seed_candidate(tuple(sorted({**point, "num_stages": 3}.items())))
    same = Candidate.make({**point, "num_stages": 2}, seed.schedule)
    other = task.space().seed_candidate(tuple(sorted({**point, "block_N": 128, "num_stages": 3}.items())))
    with LocalBuilder(jobs=2, timeout=240) as builder:
        a, b, c = builder.build([_input(task, x) for x in (seed, same, other)])
    assert a.status is b.status is c.status is Status.BUILT, (a.message, b.message, c.message)
    assert a.code_hash and a.code_hash == b.code_hash != c.code_hash


@pytest.mark.slow
def test_a_block_over_shared_memory_once_planned_is_rejected(gemm_task, fresh_cache):
    """A candidate the space's rules never saw (a stored one, one written by hand) is held to
    the block tilelang's planner gives it. The seed's 128x256 tiles 5 deep at block_K=64 take
    240 KB even with C's 64 KB over the dead A/B tiles: refused before a launch would fail."""
    params = {**PARAMS, "epilogue": "smem"}
    seed = gemm_task.space().seed_candidate(tuple(sorted(params.items())))
    deep = Candidate.make(params, seed.schedule.with_(pipelines=tuple(replace(p, depth=5) for p in seed.schedule.pipelines)))
    with LocalBuilder(jobs=1, timeout=240) as builder:
        (result,) = builder.build([_input(gemm_task, deep)])
    assert result.status is Status.REJECTED, result.message
    assert result.message == "smem: tilelang's planner gives the block 240 KB > 227 KB"


@pytest.mark.slow
def test_tilelangs_own_lowering_over_shared_memory_is_rejected(data_dir, fresh_cache):
    """The same bound holds for tilelang's lowerings: 5 stages of 128x64 + 64x256 fp16 tiles
    (240 KB) compile, and no launch could run them."""
    from ws_tuner.kernel import load_kernel
    from ws_tuner.task import Task

    spec = load_kernel(data_dir / "stages_gemm.py")
    task = Task.make(spec, spec.parse_problem("M=1024,N=1024,K=1024"))
    point = {"block_K": 64, "block_M": 128, "block_N": 256}
    with LocalBuilder(jobs=1, timeout=240) as builder:
        deep, fits = builder.build([_input(task, Candidate.make({**point, "num_stages": n}, None, Lowering.DEFAULT)) for n in (5, 3)])
    assert deep.status is Status.REJECTED and deep.message.startswith("smem: tilelang's planner gives the block 24"), deep.message
    assert fits.status is Status.BUILT, fits.message


def test_a_lowering_tilelang_refuses_is_one_line_and_nothing_on_stderr(data_dir, capfd):
    """tilelang logs its pipeline planner's refusal ("[hh:mm:ss] ...: Fatal: ...") on stderr
    before raising it: the message is the CompilerError's, said once, not a raw log line
    among ws-tune's own (KDA's delta-rule backward reuses dv's tile, no_ws at 1 stage)."""
    from ws_tuner.kernel import load_kernel
    from ws_tuner.task import Task

    spec = load_kernel(data_dir / "kda_delta_bwd.py")
    task = Task.make(spec, spec.parse_problem("B=1,S=1024,H=4"))
    func, configs = task.lowered(Candidate.make({"block_DV": 32, "num_stages": 1, "threads": 128}, None, Lowering.NO_WS))
    capfd.readouterr()
    with pytest.raises(compiler.CompilerError, match="^Pipeline planning error: Multiple writes to overlapping buffer regions"):
        compiler.compile_kernel(func, configs)
    assert "Fatal" not in capfd.readouterr().err


def test_shared_memory_counts_the_static_mbarriers_beside_the_planned_buffer(gemm_task, seed, uncached):
    """CUDA holds a block's static shared arrays and its dynamic buffer together to the
    227 KB: a candidate whose planned buffer was exactly 227 KB passed the builder and failed
    to launch beside its pipelines' mbarriers (H100 run 42)."""
    func, configs = gemm_task.lowered(seed)
    kernel = compiler.compile_kernel(func, configs)
    dynamic = max(int(f.attrs["dyn_shared_memory_buf"]) for f in kernel.artifact.device_mod.functions.values()
                  if f.attrs is not None and "dyn_shared_memory_buf" in f.attrs)  # fmt: skip
    barriers = re.findall(r"__shared__ __align__\(\d+\) uint64_t (\w+)\[(\d+)\];", kernel.get_kernel_source())
    assert barriers, "the pipelines' full and empty mbarriers"
    assert compiler.shared_memory(kernel) >= dynamic + sum(8 * int(n) for _, n in barriers) > dynamic


CACHED_SCRIPT = """
import sys
import tilelang.language as T
from ws_tuner import compiler


@T.prim_func
def staged(A: T.Tensor((128, 64), "float16"), B: T.Tensor((128, 64), "float16")):
    with T.Kernel(1, threads=128):
        S = T.alloc_shared((128, 64), "float16")
        T.copy(A, S)
        for i, j in T.Parallel(128, 64):
            B[i, j] = S[i, j] + OFFSET


kernel = compiler.compile_kernel(staged)
print(kernel.artifact is None, compiler.shared_memory(kernel))
"""


def test_a_kernel_from_tilelangs_cache_still_says_its_shared_memory(tmp_path):
    """tilelang's cache keeps a kernel's code, not its lowered module: the builder could not
    hold a kernel the runner had compiled first (the anchor) to the 227 KB, and a 354 KB seed
    reached the GPU (H100 run 42). ws-tune keeps the planned size in the cache entry, which
    another process reads."""
    import subprocess
    import sys
    import uuid

    script = tmp_path / "staged.py"
    script.write_text(CACHED_SCRIPT.replace("OFFSET", f"{uuid.uuid4().int % 10**6}.0"))  # a kernel no earlier run cached
    env = {**os.environ, "TILELANG_CACHE_DIR": str(tmp_path / "tl-cache")}
    fresh, cached = (subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300, check=True).stdout.split()
                     for _ in range(2))  # fmt: skip
    assert fresh[0] == "False" and cached[0] == "True"  # the second process loaded it from the cache
    assert cached[1] == fresh[1] and int(fresh[1]) >= 128 * 64 * 2


def test_what_tilelang_logs_of_a_kernel_is_said_once_per_process(uncached, capfd):
    """tilelang logs a buffer read before it is written (block-sparse GQA decoding's combine
    kernel) at every build, time-stamped: a compile-only tuning printed it 7 times in 10 builds
    among the progress lines. Another text is still said."""
    import tilelang.language as T

    def kernel(offset: float):
        @T.prim_func
        def unset(A: T.Tensor((64,), "float32"), B: T.Tensor((64,), "float32")):
            with T.Kernel(1, threads=64):
                x = T.alloc_var("float32")
                for i in T.Parallel(64):
                    B[i] = A[i] + x + offset

        return unset

    capfd.readouterr()
    for offset in (1.0, 2.0):  # two kernels, one text
        compiler.compile_kernel(kernel(offset))
    said = capfd.readouterr().err
    assert said.count("`x` is read before anything writes it") == 1, said
    assert re.match(r"^\[\d\d:\d\d:\d\d\] ", said)  # as tilelang wrote it

    @T.prim_func
    def other(A: T.Tensor((64,), "float32"), B: T.Tensor((64,), "float32")):
        with T.Kernel(1, threads=64):
            y = T.alloc_var("float32")
            for i in T.Parallel(64):
                B[i] = A[i] * y

    compiler.compile_kernel(other)
    assert "`y` is read before anything writes it" in capfd.readouterr().err


UNSET_READ = '''
import tilelang.language as T

PROBLEM = {"N": None}
PARAMS = {"offset": [1, 2, 3, 4]}


def kernel(problem, *, offset):
    N = problem["N"]

    @T.prim_func
    def unset(A: T.Tensor((N,), "float32"), B: T.Tensor((N,), "float32")):
        with T.Kernel(T.ceildiv(N, 64), threads=64) as bx:
            never_set = T.alloc_var("float32")
            for i in T.Parallel(64):
                B[bx * 64 + i] = A[bx * 64 + i] + never_set + offset

    return unset


def inputs(problem, device):
    import torch

    return [torch.randn(problem["N"], device=device), torch.empty(problem["N"], device=device)]


def reference(problem, args):
    return [args[0]]


def flops(problem):
    return float(problem["N"])
'''


@pytest.mark.slow
def test_what_compile_workers_log_is_said_once_by_the_tuning(tmp_path, fresh_cache, capfd):
    """Each spawned worker logged tilelang's text once: a tuning with --jobs 15 could say it
    15 times. The workers hand their log to the tuning's process, which says it once."""
    path = tmp_path / "unset.py"
    path.write_text(UNSET_READ)
    spec = load_kernel(path)
    task = Task.make(spec, spec.parse_problem("N=256"))
    inputs = [_input(task, Candidate.make({"offset": o}, None, Lowering.DEFAULT)) for o in spec.params["offset"]]
    capfd.readouterr()
    with LocalBuilder(jobs=2, timeout=240) as builder:
        results = builder.build(inputs)
    assert [r.status for r in results] == [Status.BUILT] * 4, [r.message for r in results]
    said = capfd.readouterr().err
    assert said.count("`never_set` is read before anything writes it") == 1, said
    assert all(r.log for r in results)  # each worker logged it at every build: the parent said it once


def test_a_named_barrier_with_two_thread_counts_is_a_compile_error():
    ok = "tl::__sync_thread_partial(3, 32);\n tl::__sync_thread_partial(4, 256);\n tl::__sync_thread_partial(4, 256);"
    assert compiler.barrier_clash(ok) is None
    clash = compiler.barrier_clash(ok + "\n tl::__sync_thread_partial(3, 256);")
    assert clash is not None and clash.startswith("named barrier 3 synchronizes 32 and 256 threads")


@pytest.mark.slow
def test_two_roles_never_wait_at_one_barrier(data_dir, uncached, monkeypatch):
    """DeepSeek-V4's gather by cp.async (the space's ``async`` decision: its loop lowered as
    ``T.Parallel(..., prefer_async=True)``) in a one-warp Load role. tilelang's
    ThreadSync("shared") gives the Load warp's wait barrier 3 for 32 threads, and
    ThreadSync("shared.dyn") the 256-thread Worker's barrier 3 too: it faulted on the H200
    (an illegal instruction, run 33). ws-tune moves the first pass's barriers above the
    second's; without that, the kernel is a compile error."""
    spec = load_kernel(data_dir / "sparse_attn_v4.py")
    task = Task.make(spec, spec.parse_problem("batch=1,seq=256,seq_kv=2048,heads=64,dim=512,topk=512"))
    space = task.space()
    params = (("block_N", 64), ("num_stages", 1), ("threads", 128))
    shape = space.shape(params)
    cand = space.candidate(Point(params, "2xWG+warp@first", shape.layouts()[0], (2,), (), (0, 0, 0), ("parallel_1",), ("parallel_1",)))
    func, configs = task.lowered(cand)
    source = compiler.compile_kernel(func, configs).get_kernel_source()
    assert "cp_async_gs_conditional" in source
    assert sorted(set(re.findall(r"__sync_thread_partial\((\d+), (\d+)\)", source))) == [("3", "256"), ("4", "32")]
    through_registers = compiler.compile_kernel(*task.lowered(Candidate.make(cand.param_dict, cand.schedule.with_(async_copies=())))).get_kernel_source()
    assert "cp_async" not in through_registers
    monkeypatch.setattr(tilelang.transform, "ThreadSync", compiler._thread_sync)  # tilelang's own numbering
    with pytest.raises(compiler.CompilerError, match="named barrier 3 synchronizes 32 and 256 threads"):
        compiler.compile_kernel(func, configs)
    # Copies by cp.async asked of an op that is no element-wise loop: a compile error that says so.
    with pytest.raises(compiler.CompilerError, match="async copies: tl_tileop_copy_0 is no element-wise"):
        task.lowered(Candidate.make(cand.param_dict, cand.schedule.with_(async_copies=("tl_tileop_copy_0",))))



@pytest.mark.slow
def test_a_kernels_own_barrier_by_index_compiles(uncached):
    """examples/attention.py's alternating turns: each warpgroup waits at barrier 13 plus its
    index, an id the kernel computes. Not one of ThreadSync's numbered barriers, it is left
    as written; taking it for one made every such candidate a compile error ("int() argument
    must be ... not 'Add'")."""
    spec = load_kernel(ROOT / "examples" / "attention.py")
    task = Task.make(spec, spec.parse_problem("B=2,H=8,S=2048,D=128"))
    params = {**{k: v[0] for k, v in spec.params.items()}, "consumers": "alternating", "block_M": 128, "block_N": 128}
    cand = task.space().seed_candidate(tuple(sorted(params.items())))
    source = compiler.compile_kernel(*task.lowered(cand)).get_kernel_source()
    assert "__sync_thread_partial(((tl::get_warp_group_idx() & 1) + 13), 256)" in source
