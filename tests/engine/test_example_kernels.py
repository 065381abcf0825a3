"""The example kernel files on real tilelang passes and real nvcc: every variant
that check() allows lowers through MaterializeWSSchedule, a representative few
compile for sm_90a, the async forms keep their wgmma pipeline in the binary,
and check() refuses what cannot work, including schedules that break the
kernels' data flow (which the verifier does not track)."""

from __future__ import annotations

import itertools
import os
import re
import subprocess
from pathlib import Path

import pytest

from ws_tuner import compiler
from ws_tuner.builder import BuildInput, LocalBuilder
from ws_tuner.candidate import Candidate
from ws_tuner.kernel import load_kernel
from ws_tuner.result import Status
from ws_tuner.schedule import Pipeline, Role, Scope, Sync
from ws_tuner.task import Task

ROOT = Path(__file__).resolve().parents[2]
ATTENTION = ROOT / "examples" / "attention.py"
GEMM = ROOT / "examples" / "gemm.py"

ATTN_PROBLEM = {"B": 4, "H": 16, "S": 4096, "D": 128, "causal": 0, "dtype": "float16"}
GEMM_PROBLEM = {"M": 4096, "N": 4096, "K": 4096, "dtype": "float16", "b_layout": "row"}
GEMM_PARAMS = {"block_M": 128, "block_N": 256, "block_K": 64, "swizzle": 8, "epilogue": "direct", "persistent": False, "mma": "sync"}
ATTN_PARAMS = {"block_M": 128, "block_N": 128, "stages": 2, "mma": "async", "consumers": "cooperative", "persistent": False}


@pytest.fixture(scope="module")
def attention():
    return load_kernel(ATTENTION)


@pytest.fixture(scope="module")
def gemm():
    return load_kernel(GEMM)


def allowed_variants(spec, problem, grid=None):
    """(params, kernel, seed) of every kernel-parameter point that check() allows, with its seed."""
    grid = grid or spec.params
    keys = sorted(grid)
    for values in itertools.product(*(grid[k] for k in keys)):
        params = dict(zip(keys, values))
        if spec.check(problem, params, None) is None:
            func, seed = compiler.prepare(spec.build(problem, params))
            if spec.check(problem, params, seed) is None:
                yield params, func, seed


def verify(func, schedule):
    """The builder's path: the schedule attached through the plain model, then MaterializeWSSchedule."""
    compiler.verify(compiler.attach(func, schedule))


def build_inputs(spec, problem, variants):
    return [BuildInput(str(spec.path), spec.source_hash, problem, Candidate.make(p, Task.make(spec, problem).point_info(p).seed)) for p in variants]


# --- MaterializeWSSchedule: every allowed variant ---------------------------


@pytest.mark.parametrize(
    "changes",
    [
        {"D": 64, "causal": 1},
        {"dtype": "bfloat16"},
        pytest.param({"causal": 1, "dtype": "bfloat16", "S": 4000}, marks=pytest.mark.slow),
    ],
    ids=["d64-causal", "d128-bf16", "d128-causal-bf16-tails"],
)
def test_every_allowed_attention_variant_verifies(attention, changes):
    """Every structure (roles, pipelines, the persistent walk: the product of the
    parameters that shape them) with the tile sizes and softmax variants at one value,
    then every value of those at four structures: the whole product (1,536 points, each
    a PrimFunc built and verified) took most of an hour of CI."""
    problem = {**ATTN_PROBLEM, **changes}
    # Blocks of 64 keys: at D=128, 128 leave no room for ping-pong's own buffers nor registers for 192 rows.
    pinned = {"block_N": (64,), "stages": (2,), "exp": ("ftz",), "reduce": ("lane",)}
    grids = [{**attention.params, **pinned}]
    for mma, consumers, persistent in (("sync", "cooperative", False), ("async", "cooperative", True), ("async", "pingpong", False), ("sync", "pingpong", True)):
        form = {"mma": (mma,), "consumers": (consumers,), "persistent": (persistent,), "block_M": (128,), "q_buffers": (1,), "store": ("consumer",)}
        grids.append({**attention.params, **form})
    varied = lambda grid: {k for k, v in grid.items() if len(v) > 1}  # noqa: E731
    assert varied(grids[0]) | varied(grids[1]) == varied(attention.params)  # no parameter is left out
    seen, values = set(), {k: set() for k in pinned}
    for grid in grids:
        for params, func, seed in allowed_variants(attention, problem, grid):
            verify(func, seed)
            seen.add((params["mma"], params["consumers"], params["persistent"], params["block_M"], params["q_buffers"], params["store"], params["order"]))
            for k in pinned:
                values[k].add(params[k])
    forms = attention.params["consumers"]  # cooperative, alternating, pingpong
    assert {v[:3] for v in seen} == set(itertools.product(("sync", "async"), forms, (False, True)))
    assert {v[3] for v in seen} == {64, 128, 192}  # one to three consumer warpgroups
    # A second Q buffer and the Storer warp: persistent only, with every mma and consumer form.
    assert {v[:3] for v in seen if v[4:6] == (2, "role")} == set(itertools.product(("sync", "async"), forms, (True,)))
    # The program's own order: the sync form, every consumer form and tile walk.
    assert {v[:3] for v in seen if v[6] == "plain"} == set(itertools.product(("sync",), forms, (False, True)))
    assert values == {k: set(attention.params[k]) for k in pinned}


def test_every_allowed_gemm_async_variant_verifies(gemm):
    grid = {**{k: (v,) for k, v in GEMM_PARAMS.items()}, "mma": ("async",), "persistent": (False, True), "epilogue": ("direct", "smem"),
            "block_K": (64, 128), "split": ("square", "rows")}  # fmt: skip
    variants = list(allowed_variants(gemm, {**GEMM_PROBLEM, "b_layout": "col"}, grid))
    assert len(variants) == 16
    for _, func, seed in variants:
        verify(func, seed)


def test_every_allowed_gemm_pingpong_variant_verifies(gemm):
    """Both MMA forms, tile walks and epilogues, both K blocks: one warpgroup per consumer fits a 128x128 accumulator."""
    grid = {**{k: (v,) for k, v in GEMM_PARAMS.items()}, "block_N": (128, 256), "consumers": ("pingpong",), "persistent": (False, True),
            "epilogue": ("direct", "smem"), "block_K": (64, 128), "mma": ("sync", "async")}  # fmt: skip
    variants = list(allowed_variants(gemm, GEMM_PROBLEM, grid))
    assert {p["block_N"] for p, _, _ in variants} == {128}  # 128x256 needs 256 registers a thread
    # Async at block_K=128: its two stages of 2 x 64 KB leave no room (sync fits one).
    assert {(p["mma"], p["block_K"]) for p, _, _ in variants} == {("sync", 64), ("sync", 128), ("async", 64)}
    assert len(variants) == 12
    for params, func, seed in variants:
        assert {r.name: r.warps for r in seed.roles} == {"Consumer0": 4, "Consumer1": 4, "Producer": 1}
        # Each consumer its own pipelines, over buffers of its own: A and B, and the async form's token.
        own = {f"smem{p}": (f"A_shared{p}", f"B_shared{p}") for p in (0, 1)}
        if params["mma"] == "async":
            own.update({f"token{p}": (f"token{p}",) for p in (0, 1)})
        assert {p.name: p.buffers for p in seed.pipelines} == own
        assert len({p.depth for p in seed.pipelines}) == 1  # a token per stage
        verify(func, seed)


# --- check(): what cannot work is refused, with the reason -------------------


@pytest.mark.parametrize(
    "problem, params, needle",
    [
        ({"S": 4000}, {}, None),  # tails: TMA clips the rows past S, the last key block is masked
        ({}, {"consumers": "pingpong", "block_M": 64}, "whole warpgroup"),
        ({}, {"consumers": "pingpong", "block_M": 192}, "whole warpgroup"),
        ({}, {"consumers": "pingpong", "stages": 2}, "shared memory"),
        ({}, {"consumers": "alternating", "block_M": 64}, "2 to 3 consumer warpgroups"),
        ({"D": 64}, {"consumers": "alternating", "block_M": 192}, None),
        ({"D": 64}, {}, None),
        ({}, {"q_buffers": 2}, "only serve a persistent kernel"),
        ({}, {"store": "role"}, "only serve a persistent kernel"),
        ({}, {"persistent": True, "q_buffers": 2, "store": "role"}, None),
        # Q 3 x 32 KB + K, V 2 x 2 x 32 KB + O 32 KB at D=128 with block_M=192 (48 KB tiles): over the SM.
        ({}, {"persistent": True, "q_buffers": 2, "block_M": 192}, "shared memory"),
        ({}, {"order": "plain"}, "order=plain is the sync form"),  # ATTN_PARAMS are async
        ({}, {"order": "plain", "mma": "sync", "block_M": 192, "persistent": True}, None),
    ],
)
def test_attention_check_refuses_what_cannot_work(attention, problem, params, needle):
    reason = attention.check({**ATTN_PROBLEM, **problem}, {**ATTN_PARAMS, **params}, None)
    assert reason is None if needle is None else needle in reason


def _with_stage(schedule, pipeline, stage):
    """The schedule with every consumer sync of one pipeline moved to ``stage``."""
    def move(i):
        return Sync(i.kind, i.pipeline, stage) if isinstance(i, Sync) and i.pipeline == pipeline and not i.is_producer else i

    return schedule.with_(scopes=tuple(Scope(s.id, tuple((r, tuple(map(move, b))) for r, b in s.bodies)) for s in schedule.scopes))


def _renamed(schedule, names, merged):
    """The schedule with some pipelines merged into one (what a merged layout does)."""
    def rename(i):
        return Sync(i.kind, names.get(i.pipeline, i.pipeline), i.stage) if isinstance(i, Sync) else i

    kept = tuple(p for p in schedule.pipelines if p.name not in names and p.name != merged.name)
    scopes = tuple(Scope(s.id, tuple((r, tuple(map(rename, b))) for r, b in s.bodies)) for s in schedule.scopes)
    return schedule.with_(pipelines=kept + (merged,), scopes=scopes)


def test_check_refuses_schedules_that_break_the_data_flow(attention, gemm):
    # V back at K's stage: P V would multiply the previous block's P with this block's V.
    params = {**ATTN_PARAMS, "consumers": "pingpong", "stages": 1}
    seed = Task.make(attention, ATTN_PROBLEM).point_info(params).seed
    assert "V_1 must be consumed one stage after K_1" in attention.check(ATTN_PROBLEM, params, _with_stage(seed, "v1", 0))
    merged = _renamed(seed, {"k0": "kv0", "v0": "kv0"}, Pipeline("kv0", ("K_0", "V_0"), 1))
    assert "share a pipeline" in attention.check(ATTN_PROBLEM, params, merged)
    # Persistent async: a second Q buffer lets the producer load the next tile's V into
    # the stage the last P V product still reads (the sync form retires it first).
    # q_buffers=2 has the P V op retire the last product before the stage is freed: allowed.
    for mma, q_buffers, refused in (("async", 1, True), ("sync", 1, False), ("async", 2, False)):
        params = {**ATTN_PARAMS, "persistent": True, "mma": mma, "q_buffers": q_buffers}
        seed = Task.make(attention, ATTN_PROBLEM).point_info(params).seed
        assert attention.check(ATTN_PROBLEM, params, seed) is None
        double_q = seed.with_(pipelines=tuple(Pipeline(p.name, p.buffers, 2) if p.name == "q0" else p for p in seed.pipelines))
        reason = attention.check(ATTN_PROBLEM, params, double_q)
        assert ("needs Q_0 in one buffer" in reason) if refused else reason is None
    # Alternating turns pass among the kernel's warpgroups: a role of fewer (a
    # split the space may make) would wait for a turn nobody gives.
    params = {**ATTN_PARAMS, "consumers": "alternating"}
    seed = Task.make(attention, ATTN_PROBLEM).point_info(params).seed
    assert attention.check(ATTN_PROBLEM, params, seed) is None
    half = seed.with_(roles=tuple(Role(r.name, r.warp_lo, r.warp_lo + 4, r.max_nreg) if r.name == "Consumer" else r for r in seed.roles))
    assert "pass among the kernel's 2 warpgroups" in attention.check(ATTN_PROBLEM, params, half)
    # The plain order: P V of the same block, so V at K's stage and nowhere else.
    params = {**ATTN_PARAMS, "mma": "sync", "order": "plain"}
    seed = Task.make(attention, ATTN_PROBLEM).point_info(params).seed
    assert attention.check(ATTN_PROBLEM, params, seed) is None
    assert "V_0 must be consumed at K_0's stage" in attention.check(ATTN_PROBLEM, params, _with_stage(seed, "v0", 1))
    # Three consumer warpgroups at D=128 hold S and P of two blocks only in the plain order.
    for order, refused in (("shifted", True), ("plain", False)):
        params = {**ATTN_PARAMS, "mma": "sync", "block_M": 192, "order": order}
        reason = attention.check(ATTN_PROBLEM, params, Task.make(attention, ATTN_PROBLEM).point_info(params).seed)
        assert ("registers per thread" in reason) if refused else reason is None
    # The token released at the stage of A and B: a stage freed under a running wgmma.
    params = {**GEMM_PARAMS, "mma": "async"}
    seed = Task.make(gemm, GEMM_PROBLEM).point_info(params).seed
    assert gemm.check(GEMM_PROBLEM, params, seed) is None
    assert "one stage after A and B" in gemm.check(GEMM_PROBLEM, params, _with_stage(seed, "token", 0))
    one = _renamed(seed, {"token": "smem"}, Pipeline("smem", ("A_shared", "B_shared", "token"), 3))
    assert "pipeline of its own" in gemm.check(GEMM_PROBLEM, params, one)
    shallow = seed.with_(pipelines=tuple(Pipeline(p.name, p.buffers, 1) for p in seed.pipelines))  # the token freed a k-block late: a deadlock
    assert "the token in 2 stages or more" in gemm.check(GEMM_PROBLEM, params, shallow)


GEMM_PINGPONG = {**GEMM_PARAMS, "block_N": 128, "consumers": "pingpong"}


@pytest.mark.parametrize(
    "problem, params, needle",
    [
        ({}, {}, None),
        ({}, {"persistent": True, "epilogue": "smem", "block_K": 128}, None),
        ({}, {"block_N": 256}, "registers"),  # a 128x256 fp32 accumulator in one warpgroup
        ({}, {"block_M": 256}, "registers"),
        ({}, {"mma": "async"}, None),
        ({}, {"mma": "async", "persistent": True, "epilogue": "smem"}, None),
        # The token protocol needs two stages: 2 x 2 x 64 KB of A and B at block_K=128.
        ({}, {"mma": "async", "block_K": 128}, "shared memory"),
        ({"M": 4096 - 128}, {}, "2 x block_M"),  # a block covers two tiles along M
        # Two consumers' A and B at one stage, 2 x 80 KB, and two 48 KB C tiles: over the SM.
        ({"M": 4608}, {"block_M": 192, "block_K": 128, "epilogue": "smem"}, "shared memory"),
        ({"M": 4608}, {"block_M": 192, "block_K": 128}, None),
        ({}, {"block_M": 64, "block_N": 256, "block_K": 128, "epilogue": "smem"}, None),  # 160 KB + 2 x 32 KB
        ({}, {"split": "rows"}, "one warpgroup"),  # the cooperative split: one consumer warpgroup has nothing to split
    ],
)
def test_gemm_pingpong_check_refuses_what_cannot_work(gemm, problem, params, needle):
    reason = gemm.check({**GEMM_PROBLEM, **problem}, {**GEMM_PINGPONG, **params}, None)
    assert reason is None if needle is None else needle in reason


@pytest.mark.parametrize("persistent", [False, True])
def test_gemm_pingpong_async_check_refuses_each_consumers_broken_token_protocol(gemm, persistent):
    """Async ping-pong: each consumer's token in a pipeline of its own, freed one stage
    after its A and B (a stage freed under its running wgmma otherwise)."""
    params = {**GEMM_PINGPONG, "mma": "async", "persistent": persistent}
    seed = Task.make(gemm, GEMM_PROBLEM).point_info(params).seed
    assert gemm.check(GEMM_PROBLEM, params, seed) is None
    for p in (0, 1):
        assert f"Consumer{p} must free token{p} one stage after A and B" in gemm.check(GEMM_PROBLEM, params, _with_stage(seed, f"token{p}", 0))
        merged = _renamed(seed, {f"token{p}": f"smem{p}"}, Pipeline(f"smem{p}", (f"A_shared{p}", f"B_shared{p}", f"token{p}"), 3))
        assert f"token{p} in a pipeline of its own" in gemm.check(GEMM_PROBLEM, params, merged)
        shallow = seed.with_(pipelines=tuple(Pipeline(q.name, q.buffers, 1) if q.name == f"token{p}" else q for q in seed.pipelines))
        assert f"token{p} in 2 stages or more" in gemm.check(GEMM_PROBLEM, params, shallow)
    # Past the seed's three stages of two consumers' 32 KB of A and B, a fourth no longer fits.
    deep = seed.with_(pipelines=tuple(Pipeline(q.name, q.buffers, 4) for q in seed.pipelines))
    assert "shared memory" in gemm.check(GEMM_PROBLEM, params, deep)


@pytest.mark.parametrize("stages", [2, 3])
def test_gemm_pingpong_async_seed_counts_its_tokens(gemm, stages, monkeypatch):
    """The async seed takes one stage fewer where its tokens' few bytes would tip the
    last stage over the limit (the sync seed keeps it), never fewer than two, and
    check() agrees with it."""
    params = {**GEMM_PINGPONG, "mma": "async"}
    stage = 2 * 2 * (128 * 64 + 64 * 128)  # two consumers' A and B, fp16
    tokens = 2 * gemm.module.TOKEN_BYTES
    for limit, fits in ((stages * stage, stages - 1), (stages * (stage + tokens), stages)):
        monkeypatch.setattr(gemm.module, "SMEM_LIMIT", limit)
        assert gemm.module._pingpong_stages({**params, "mma": "sync"}) == stages
        assert gemm.module._pingpong_stages(params) == max(fits, 2)
        seed = Task.make(gemm, GEMM_PROBLEM).point_info(params).seed
        assert {p.depth for p in seed.pipelines} == {max(fits, 2)}
        reason = gemm.check(GEMM_PROBLEM, params, seed)
        assert reason is None if fits >= 2 else "shared memory" in reason


def test_gemm_pingpong_check_refuses_schedules_that_cannot_fit(gemm):
    seed = Task.make(gemm, GEMM_PROBLEM).point_info(GEMM_PINGPONG).seed
    assert gemm.check(GEMM_PROBLEM, GEMM_PINGPONG, seed) is None
    # Four stages of 32 KB for each consumer: 256 KB.
    deep = seed.with_(pipelines=tuple(Pipeline(p.name, p.buffers, 4) for p in seed.pipelines))
    assert "shared memory" in gemm.check(GEMM_PROBLEM, GEMM_PINGPONG, deep)
    # The turns are named barriers of two warpgroups: one per consumer.
    wide = seed.with_(num_warps=20, roles=(Role("Consumer0", 0, 8, 232), Role("Consumer1", 8, 16, 232), Role("Producer", 16, 17, 40)))
    assert "one warpgroup per consumer" in gemm.check(GEMM_PROBLEM, GEMM_PINGPONG, wide)
    # Under a lower register budget the 128x128 accumulator no longer fits.
    tight = seed.with_(roles=tuple(Role(r.name, r.warp_lo, r.warp_hi, 152 if r.name != "Producer" else r.max_nreg) for r in seed.roles))
    assert "registers" in gemm.check(GEMM_PROBLEM, GEMM_PINGPONG, tight)


def test_role_splits_that_cannot_work_are_refused(attention):
    seed = Task.make(attention, ATTN_PROBLEM).point_info(ATTN_PARAMS).seed
    one_group = seed.with_(roles=tuple(Role(r.name, r.warp_lo, 4, r.max_nreg) if r.name == "Consumer" else r for r in seed.roles))
    assert "registers" in attention.check(ATTN_PROBLEM, ATTN_PARAMS, one_group)
    # Ping-pong turns are named barriers sized for one warpgroup per consumer.
    wide = {**ATTN_PARAMS, "consumers": "pingpong", "block_M": 256, "block_N": 64, "stages": 1, "D": 64}
    roles = (Role("Consumer0", 0, 8, 240), Role("Consumer1", 8, 16, 240), Role("Producer", 16, 17, 24))
    assert "one warpgroup per consumer" in attention.check({**ATTN_PROBLEM, "D": 64}, wide, seed.with_(num_warps=20, roles=roles))


# --- the contract's other functions -----------------------------------------


def test_flops_count_causal_as_half(attention):
    full = attention.flops(ATTN_PROBLEM)
    assert full == 4 * 4 * 16 * 4096 * 4096 * 128
    assert attention.flops({**ATTN_PROBLEM, "causal": 1}) == full / 2


@pytest.mark.parametrize("causal", [0, 1])
def test_reference_and_vendors_agree_with_a_plain_softmax(attention, causal):
    import torch

    problem = {**ATTN_PROBLEM, "B": 2, "H": 3, "S": 128, "D": 64, "causal": causal, "dtype": "bfloat16"}
    args = attention.inputs(problem, "cpu")
    assert [tuple(a.shape) for a in args] == [(2, 128, 3, 64)] * 4 and attention.outputs == (3,)
    q, k, v = (a.float() for a in args[:3])
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / 8
    if causal:
        scores = scores.masked_fill(torch.ones(128, 128).triu(1).bool(), float("-inf"))
    expected = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v)

    def error(out):
        return ((out.float() - expected).norm() / expected.norm()).item()

    assert error(attention.reference(problem, args)[0]) < 1e-5
    vendors = attention.module.vendors(problem)
    assert set(vendors) == {"sdpa_flash", "sdpa_efficient", "sdpa_cudnn"}
    assert error(vendors["sdpa_flash"](args)[0]) < attention.tolerance  # torch has a CPU flash kernel
    with pytest.raises(RuntimeError):  # no cuDNN on a CPU: raises, and is recorded as failed
        vendors["sdpa_cudnn"](args)


def test_gemm_vendor_is_cublas_through_torch(gemm):
    import torch

    problem = {**GEMM_PROBLEM, "M": 64, "N": 32, "K": 16, "dtype": "float32", "b_layout": "col"}
    args = gemm.inputs(problem, "cpu")
    (out,) = gemm.module.vendors(problem)["cublas"](args)
    assert torch.allclose(out, args[0] @ args[1].T)


# --- nvcc: a representative few compile for sm_90a ---------------------------


REPRESENTATIVE = [
    (ATTENTION, ATTN_PROBLEM, ATTN_PARAMS),
    (ATTENTION, {**ATTN_PROBLEM, "D": 64, "causal": 1, "dtype": "bfloat16"}, {**ATTN_PARAMS, "block_N": 64, "mma": "sync", "consumers": "pingpong"}),
    # Persistent, causal: the tile loop with a per-tile K/V extent, the async drain before Q is freed;
    # a quarter of the exponentials on the FMA pipe, of masked (-inf) scores too.
    (ATTENTION, {**ATTN_PROBLEM, "D": 64, "causal": 1}, {**ATTN_PARAMS, "persistent": True, "exp": "poly"}),
    # The same with two Q buffers, the O store in the Storer warp and the inline-PTX exponential.
    (ATTENTION, {**ATTN_PROBLEM, "D": 64, "causal": 1}, {**ATTN_PARAMS, "persistent": True, "q_buffers": 2, "store": "role", "exp": "ftz"}),
    (GEMM, GEMM_PROBLEM, {**GEMM_PARAMS, "mma": "async", "persistent": True, "epilogue": "smem"}),
    (GEMM, {**GEMM_PROBLEM, "b_layout": "col"}, {**GEMM_PARAMS, "block_N": 128, "consumers": "pingpong", "epilogue": "smem"}),
]


def test_representative_variants_compile(fresh_cache):
    inputs = [build_inputs(load_kernel(path), problem, [params])[0] for path, problem, params in REPRESENTATIVE]
    with LocalBuilder(jobs=2, timeout=600) as builder:
        results = builder.build(inputs)
    for (path, _, params), result in zip(REPRESENTATIVE, results):
        assert result.status is Status.BUILT, (path.name, params, result.message)


def ptxas_report(spec, problem, params, tmp_path: Path) -> str:
    """ptxas's verbose report on the kernel: registers, spills, and whether it
    had to serialize the wgmma pipeline (it does when registers an in-flight
    wgmma writes are read before the wait that retires it)."""
    from tilelang.env import CUTLASS_INCLUDE_DIR, TILELANG_TEMPLATE_PATH

    func, _ = Task.make(spec, problem).lowered(Candidate.make(params, Task.make(spec, problem).point_info(params).seed))
    source = compiler.compile_kernel(func).get_kernel_source()
    path = tmp_path / "kernel.cu"
    path.write_text(source)
    nvcc = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvcc"
    proc = subprocess.run(
        [str(nvcc) if nvcc.exists() else "nvcc", "--cubin", "-O3", f"-arch={compiler.ARCH}", "-std=c++20", f"-I{TILELANG_TEMPLATE_PATH}",
         f"-I{CUTLASS_INCLUDE_DIR}", "--ptxas-options=--verbose", "-o", str(path.with_suffix(".cubin")), str(path)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    return "\n".join(line for line in proc.stderr.splitlines() if "ptxas" in line or "spill" in line)


def assert_wgmma_pipelined(report: str) -> None:
    assert "Used" in report and "registers" in report, report
    assert "C7514" not in report and "serialized" not in report, report  # the async wgmma stays async
    assert re.search(r"\b0 bytes spill stores", report), report


@pytest.mark.parametrize("consumers", ["cooperative", "pingpong"])
def test_async_gemm_keeps_its_wgmma_in_flight(gemm, consumers, tmp_path):
    params = {**GEMM_PARAMS, "mma": "async"} if consumers == "cooperative" else {**GEMM_PINGPONG, "mma": "async", "persistent": True}
    assert_wgmma_pipelined(ptxas_report(gemm, GEMM_PROBLEM, params, tmp_path))


@pytest.mark.slow
@pytest.mark.parametrize("consumers", ["cooperative", "pingpong"])
def test_async_attention_keeps_its_wgmma_in_flight(attention, consumers, tmp_path):
    problem = {**ATTN_PROBLEM, "causal": 1}
    assert_wgmma_pipelined(ptxas_report(attention, problem, {**ATTN_PARAMS, "consumers": consumers, "stages": 1}, tmp_path))


@pytest.mark.slow
def test_more_variants_compile(fresh_cache):
    """Three consumer warpgroups, tails (S a multiple of no block size), a column-major async GEMM."""
    attention, gemm = load_kernel(ATTENTION), load_kernel(GEMM)
    cases = [
        ({"D": 64}, {"block_M": 192, "mma": "async"}),
        ({"S": 1000, "D": 64}, {"block_N": 64}),
        ({"S": 1000, "causal": 1, "dtype": "bfloat16"}, {"consumers": "pingpong", "stages": 1, "mma": "sync"}),
    ]
    inputs = [build_inputs(attention, {**ATTN_PROBLEM, **p}, [{**ATTN_PARAMS, **q}])[0] for p, q in cases]
    inputs += build_inputs(gemm, {**GEMM_PROBLEM, "b_layout": "col", "dtype": "bfloat16"}, [{**GEMM_PARAMS, "mma": "async"}])
    with LocalBuilder(jobs=2, timeout=600) as builder:
        results = builder.build(inputs)
    failed = [(r.candidate.describe(), r.message) for r in results if r.status is not Status.BUILT]
    assert not failed and len(results) == 4


def test_compile_only_tuning_measures_the_attention_seed(tmp_path, fresh_cache):
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "ws_tuner", str(ATTENTION), "--shape", "B=4,H=16,S=4096,D=128,causal=0", "--compile-only",
         "--budget", "0", "--jobs", "2", "--db", str(tmp_path / "r.db"),
         "--param", "block_M=128,block_N=128,stages=2,mma=async,consumers=cooperative"],
        capture_output=True, text=True, timeout=900, env={**os.environ, "WS_TUNE_DB": ""},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "built" in proc.stdout


def test_examples_check_plans_each_variant_and_its_baselines(monkeypatch):
    """benchmarks/examples_check.py (the GPU script): what it will build and time."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("examples_check", ROOT / "benchmarks" / "examples_check.py")
    script = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "examples_check", script)  # its dataclasses look their module up
    spec.loader.exec_module(script)
    rows, _ = script.plan(["attention", "gemm"], sweep=False)
    by_problem = {}
    for row in rows:
        by_problem.setdefault((row.kernel, row.key()[1]), []).append(row)
    assert len(by_problem) == len(script.PROBLEMS["attention"]) + len(script.PROBLEMS["gemm"])
    for (kernel, _), group in by_problem.items():
        variants = [r for r in group if r.kind == "variant"]
        assert all(r.candidate and r.candidate["lowering"] == "ws" for r in variants)
        assert [r.params.get("mma", "sync") for r in group if r.kind == "tilelang"] == ["sync", "sync"]
        if kernel == "attention":
            one_block_per_tile = set(itertools.product(("sync", "async"), ("cooperative", "pingpong"), (128,))) | {
                ("sync", "cooperative", 192), ("async", "cooperative", 192)}  # fmt: skip
            assert {(r.params["mma"], r.params["consumers"], r.params["block_M"], r.params["persistent"]) for r in variants} == {
                (*v, persistent) for v in one_block_per_tile for persistent in (False, True)}  # fmt: skip
            assert [r.params["persistent"] for r in group if r.kind == "tilelang"] == [False, False]
            assert [r.label for r in group if r.kind == "vendor"] == ["sdpa_flash", "sdpa_efficient", "sdpa_cudnn"]
        else:
            assert {(r.params["mma"], r.params["persistent"], r.params.get("consumers", "cooperative")) for r in variants} == set(
                itertools.product(("sync", "async"), (False, True), ("cooperative", "pingpong")))  # fmt: skip
            assert [r.label for r in group if r.kind == "vendor"] == ["cublas"]


# --- persistent attention: the next tile's Q under this one, O stored by a warp of its own


def test_attention_store_role_seed_hands_o_to_the_storer(attention):
    params = {**ATTN_PARAMS, "persistent": True, "store": "role", "consumers": "pingpong", "stages": 1, "block_N": 64}
    problem = {**ATTN_PROBLEM, "D": 64}
    seed = Task.make(attention, problem).point_info(params).seed
    assert attention.check(problem, params, seed) is None
    roles = {r.name: r for r in seed.roles}
    assert roles["Storer"].warps == 1 and roles["Storer"].max_nreg == roles["Producer"].max_nreg  # one warpgroup, one budget
    for p in (0, 1):
        assert seed.producer_of(f"o{p}") == f"Consumer{p}" and seed.consumer_of(f"o{p}") == "Storer"
        assert {role for s in seed.scopes for role, body in s.bodies if f"store_out{p}" in body} == {"Storer"}
        assert {role for s in seed.scopes for role, body in s.bodies if f"stage_out{p}" in body} == {f"Consumer{p}"}
    # stage_out one tile late would read an accumulator the next tile's init has cleared.
    def late(i):
        return Sync(i.kind, i.pipeline, 1) if isinstance(i, Sync) and i.pipeline == "o0" and i.is_producer else i

    late_o = seed.with_(scopes=tuple(Scope(s.id, tuple((r, tuple(map(late, b))) for r, b in s.bodies)) for s in seed.scopes))
    assert "stage_out0 must stay in its own tile" in attention.check(problem, params, late_o)
    plain = Task.make(attention, problem).point_info({**params, "store": "consumer"}).seed
    assert "Storer" not in {r.name for r in plain.roles} and not any(p.name.startswith("o") for p in plain.pipelines)


def _last_v_release(source: str) -> tuple[str, str]:
    """In the consumer's code after its K/V loop: the wgmma wait before the last
    release of V's stage, and what comes between that wait and the release."""
    release = [m.start() for m in re.finditer(r"v0_empty\[.*?\]\.arrive\(\)", source)][-1]  # the consumer's side
    wait = source.rindex("tl::wait_wgmma<", 0, release)
    issue = source.rindex("tl::warpgroup_arrive()", 0, release)
    return source[wait : source.index(">", wait) + 1] if wait > issue else "", source[issue:release]


@pytest.mark.parametrize("q_buffers", [1, 2])
def test_persistent_async_attention_frees_the_last_v_stage_after_its_product(attention, q_buffers, tmp_path):
    """With two Q buffers the producer may refill the last V stage as soon as it is
    freed: the P V product reading it must be retired (wait<0>) first. With one, the
    seed frees it right after the issue, and check() keeps Q single-buffered."""
    problem = {**ATTN_PROBLEM, "D": 64, "causal": 1}
    params = {**ATTN_PARAMS, "persistent": True, "q_buffers": q_buffers}
    task = Task.make(attention, problem)
    func, _ = task.lowered(Candidate.make(params, task.point_info(params).seed))
    wait, _ = _last_v_release(compiler.compile_kernel(func).get_kernel_source())
    assert wait == ("tl::wait_wgmma<0>" if q_buffers == 2 else "")


@pytest.mark.parametrize("exp", ["exp2", "ftz", "poly"])
def test_attention_ftz_exponential_is_the_bare_ex2(attention, exp, tmp_path):
    """exp="ftz": every softmax exponential is ex2.approx.ftz.f32 (what exp2f becomes
    under --use_fast_math); exp2f without it is ex2.approx.f32, which ptxas wraps in a
    denormal path. exp="poly": the same, but the scores' exponentials go to the
    polynomial in one column group of POLY_GROUPS, chosen by the register index of an
    unrolled loop (no thread index: the choice is made at compile time)."""
    params = {**ATTN_PARAMS, "persistent": True, "exp": exp, "mma": "sync"}
    task = Task.make(attention, {**ATTN_PROBLEM, "D": 64})
    func, _ = task.lowered(Candidate.make(params, task.point_info(params).seed))
    source = compiler.compile_kernel(func).get_kernel_source()
    calls = re.findall(r"\b(exp2f|__expf|ws_tune_ex2_ftz|ws_tune_ex2_poly)\(", source)
    expected = {"exp2": {"exp2f"}, "ftz": {"ws_tune_ex2_ftz"}, "poly": {"ws_tune_ex2_ftz", "ws_tune_ex2_poly"}}[exp]
    assert calls and set(calls) == expected
    assert ("ex2.approx.ftz.f32" in source) == (exp != "exp2")
    if exp == "poly":
        # Each copy of the K/V loop: `#pragma unroll`, `for (...; i < 64; ...)`, the column-group test, the call.
        tests = re.findall(r"#pragma unroll\s+for \(int (\w+) = 0; \1 < (\d+); \+\+\1\) \{\s+float \w+;\s+if \((.*)\) \{\s+\w+ = ws_tune_ex2_poly\(", source)
        assert tests and len(tests) == source.count("= ws_tune_ex2_poly(")  # every call, one per loop copy
        groups = attention.module.POLY_GROUPS
        for var, extent, test in tests:
            assert "threadIdx" not in test and re.findall(r"[A-Za-z_]\w*", test) == [var], test
            on_fma = [eval(re.sub(rf"\b{var}\b", str(r), test.replace("&&", " and ").replace("||", " or "))) for r in range(int(extent))]
            assert sum(on_fma) * groups == int(extent)  # one register in POLY_GROUPS


def test_attention_poly_exponential_is_within_fp16_rounding():
    """exp="poly": the device function ws_tune_ex2_poly emulated in numpy (float32, the
    floor by the 1.5 * 2^23 shift, the integer part added into the exponent bits) is
    within 1e-4 of 2^x over the max-subtracted scores x in [-126, 0] (fp16 rounds at
    4.9e-4), and gives 0 for masked scores (-inf, clamped to -127)."""
    import numpy as np
    module = load_kernel(ATTENTION).module
    c = np.array(module.EX2_POLY_COEFFS, dtype=np.float32)
    assert c.astype(np.float64).tolist() == list(module.EX2_POLY_COEFFS)  # the source's literals are these fp32 values exactly

    def ex2_poly(x):
        x = np.maximum(x.astype(np.float32), np.float32(-127))
        shift = np.float32(1.5 * 2**23)
        shifted = shift + np.floor(x)  # __fadd_rd(x, shift): exact, as floor(x) fits the mantissa
        f = x - (shifted - shift)
        assert ((f >= 0) & (f < 1)).all()
        p = ((c[3] * f + c[2]) * f + c[1]) * f + c[0]
        exponent = (shifted.view(np.uint32) << np.uint32(23)).view(np.int32)  # floor(x) << 23, the high bits gone
        return (p.view(np.int32) + exponent).view(np.float32)

    x = np.concatenate([np.linspace(-126, 0, 1_000_001, dtype=np.float32), -np.arange(127, dtype=np.float32), np.float32([-0.0, -1e-7, 1e-7])])
    error = np.abs(ex2_poly(x).astype(np.float64) / np.exp2(x.astype(np.float64)) - 1).max()
    assert error < 1e-4, error
    assert (ex2_poly(np.float32([-np.inf, -127, -1000])) == 0).all()
    assert (ex2_poly(np.float32([-126.5])) < 2.0**-126).all()  # a denormal, not 2^x: nothing next to the row max's 1


@pytest.mark.parametrize("reduce", ["row", "lane"])
def test_attention_lane_reduce_defers_the_row_sum(attention, reduce):
    """reduce="lane": inside the K/V loop only the row max is all-reduced across a
    row's four lanes; the row sum stays per thread and is all-reduced once, after
    the loop (FlashAttention-3's deferred l). "row" all-reduces both every step."""
    params = {**ATTN_PARAMS, "persistent": True, "exp": "ftz", "mma": "sync", "reduce": reduce}
    task = Task.make(attention, {**ATTN_PROBLEM, "D": 64})
    func, _ = task.lowered(Candidate.make(params, task.point_info(params).seed))
    source = compiler.compile_kernel(func).get_kernel_source()
    sums = [m.start() for m in re.finditer(r"AllReduce<tl::SumOp", source)]
    maxes = [m.start() for m in re.finditer(r"AllReduce<tl::MaxOp", source)]
    assert maxes and sums
    if reduce == "row":
        assert len(sums) == len(maxes)  # one per copy of the loop body
    else:
        assert len(sums) == 1 and sums[0] > max(maxes)  # the epilogue's, after every step's max


# --- ping-pong GEMM: turns around whole K loops, a pipeline per consumer -----


def _ordered(text: str, *needles: str) -> list[int]:
    """Positions of each needle in text, each searched after the previous one (-1: missing)."""
    out, at = [], 0
    for needle in needles:
        at = text.find(needle, at)
        out.append(at)
        if at < 0:
            break
    return out


@pytest.mark.parametrize("mma", ["sync", "async"])
def test_pingpong_gemm_takes_turns_over_whole_k_loops(gemm, mma):
    """The persistent ping-pong GEMM's generated code: each consumer waits for its turn
    before its whole K loop and passes it on after the loop, before its epilogue; each
    waits on and frees only its own pipelines' mbarriers. Async: inside the loop each
    k-block waits for the previous one's wgmma (wait<1>), and the last waits for all
    (wait<0>) before the turn is passed on."""
    params = {**GEMM_PINGPONG, "persistent": True, "epilogue": "smem", "mma": mma}
    task = Task.make(gemm, GEMM_PROBLEM)
    func, _ = task.lowered(Candidate.make(params, task.point_info(params).seed))
    source = compiler.compile_kernel(func).get_kernel_source()
    turn0, turn1 = (f"tl::__sync_thread_partial({b}, 256)" for b in gemm.module.TURN_BARRIERS)
    pass0, pass1 = (f"tl::__named_barrier_arrive({b}, 256)" for b in (gemm.module.TURN_BARRIERS[1], gemm.module.TURN_BARRIERS[0]))
    # The role branches, in warp order: consumer 0, consumer 1, the producer.
    starts = [source.index(f"if (((int)threadIdx.x) < {n})") for n in (128, 256, 288)]
    consumer0, consumer1 = source[starts[0] : starts[1]], source[starts[1] : starts[2]]
    for p, (code, turn, give) in enumerate(((consumer0, turn0, pass0), (consumer1, turn1, pass1))):
        mine, other = f"smem{p}", f"smem{1 - p}"
        assert other not in code and f"token{1 - p}" not in code
        loop = code.index("for (int k")
        last_release = code.rindex(f"{mine}_empty[")
        assert -1 not in _ordered(code, turn, "for (int k", f"{mine}_full[", f"{mine}_empty[", give, "tl::tma_store(")
        assert code.count(turn) == 1 and code.rindex(turn) < loop  # one wait, before the K loop
        assert last_release < code.rindex(give) < code.index("tl::tma_store(")  # passed on after it, before the epilogue
        waits = re.findall(r"tl::wait_wgmma<(\d)>", code)
        if mma == "sync":
            assert f"token{p}" not in code and not waits
        else:
            # The loop (k-blocks 1..): one wait<1>, between that block's wgmma and the release of k-1's token.
            body = code[loop : code.index(f"token{p}_empty[", loop)]
            assert "tl::wait_wgmma<1>();" in body and body.index("tl::warpgroup_arrive()") < body.index("tl::wait_wgmma<1>")
            # After it, the last k-block's token: wait<0>, then its release, then the turn passed on.
            drain = code.rindex("tl::wait_wgmma<0>();")
            assert waits == ["1", "0"] and loop < drain < code.rindex(f"token{p}_empty[") < code.rindex(give)
    assert consumer1.index(pass1) < consumer1.index(turn1)  # start1: consumer 0's first turn, before consumer 1's loop
    assert source.count(turn0) == source.count(turn1) == 1



def test_gemm_split_rows_needs_a_row_band_per_warp(gemm):
    """split=rows puts every consumer warp along M (16 rows each at least): 64 rows
    do not split over two warpgroups that way, while the square split takes them."""
    params = {**GEMM_PARAMS, "block_M": 64}
    seed = Task.make(gemm, GEMM_PROBLEM).point_info(params).seed
    assert gemm.check(GEMM_PROBLEM, params, seed) is None
    assert "cannot be split over 8 consumer warps" in gemm.check(GEMM_PROBLEM, {**params, "split": "rows"}, seed)
    assert gemm.check(GEMM_PROBLEM, {**GEMM_PARAMS, "split": "rows"}, seed) is None
