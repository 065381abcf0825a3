"""The schedule space: the four axes, static pruning with reasons, and seeds."""

from __future__ import annotations

import random

import pytest

from ws_tuner import compiler
from ws_tuner.candidate import Candidate
from ws_tuner.kernel import load_kernel
from ws_tuner.schedule import Role, Schedule
from ws_tuner.space import MERGED, SEPARATE, Point, RoleSplit, SpaceConfig, register_reason
from ws_tuner.task import Task


@pytest.fixture(scope="module")
def space(gemm_task):
    return gemm_task.space()


@pytest.fixture(scope="module")
def count(space):
    return space.count()


def test_counts_before_and_after_pruning(count):
    assert count.total > count.kept >= 10_000
    assert sum(count.pruned.values()) == count.total - count.kept
    # Each static rule fires on this space and says why.
    assert {"smem", "registers", "nreg", "kernel", "stage"} <= set(count.pruned)
    assert "KB" in count.examples["smem"] and "65536" in count.examples["registers"]


def test_all_four_axes_vary(gemm_spec):
    # M=3072 admits block_M=192, the one tile three consumer warpgroups can split.
    space = Task.make(gemm_spec, gemm_spec.parse_problem("M=3072,N=4096,K=4096"), gemm_spec.parse_params("mma=sync")).space()
    seen = {"split": set(), "layout": set(), "depth": set(), "stage": set(), "nreg": set()}
    for point, _ in space.walk():
        seen["split"].add(point.split)
        seen["layout"].add(point.layout)
        seen["depth"].add(point.depths)
        seen["stage"].add(point.stages)
        seen["nreg"].add(point.nregs)
    warpgroups = {s.consumer_warpgroups for s in seen["split"]}
    assert warpgroups == {1, 2, 3}
    assert {s.producer for s in seen["split"]} == {"warp", "warpgroup"}
    assert seen["layout"] == {MERGED, SEPARATE}
    assert any(len(d) == 2 and d[0] != d[1] for d in seen["depth"])  # per-pipeline depths
    assert any(s and s[0] > 0 for s in seen["stage"])  # a producer span offset
    assert len(seen["nreg"]) > 10


def test_separate_pipelines_rewrite_the_spans(space, gemm_task):
    point = next(p for p, _ in space.walk() if p.layout == SEPARATE and p.stages == (1,) and p.depths == (3, 4))
    cand = space.candidate(point)
    sched = cand.schedule
    assert [p.name for p in sched.pipelines] == ["A_shared", "B_shared"]
    producer = sched.scopes[0].body("Producer")
    stages = [i.stage for i in producer if not isinstance(i, str)]
    assert stages == [0, 0, 1, 1]
    # And tilelang's verifier accepts the rewritten schedule.
    prepared, _ = compiler.prepare(gemm_task.primfunc(cand.param_dict))
    compiler.verify(compiler.attach(prepared, sched))


def test_random_survivors_pass_the_real_verifier(space, gemm_task):
    rng = random.Random(7)
    points = [p for p, _ in space.walk()]
    for point in rng.sample(points, 8):
        cand = space.candidate(point)
        assert isinstance(cand, Candidate)
        prepared, _ = compiler.prepare(gemm_task.primfunc(cand.param_dict))
        compiler.verify(compiler.attach(prepared, cand.schedule))


def test_every_rule_names_its_reason(space, gemm_spec):
    params = (("block_K", 64), ("block_M", 128), ("block_N", 256), ("epilogue", "direct"), ("persistent", False), ("swizzle", 0))
    two_wg = RoleSplit(2, "warp", False)
    assert space.candidate(Point(params, two_wg, MERGED, (3,), (), (232, 40))).hash
    assert space.candidate(Point(params, two_wg, MERGED, (6,), (), (232, 40))).startswith("smem:")
    assert space.candidate(Point(params, two_wg, MERGED, (3,), (), (256, 40))).startswith("nreg:")
    assert space.candidate(Point(params, RoleSplit(2, "warpgroup", False), MERGED, (3,), (), (240, 56))).startswith("registers:")
    assert space.candidate(Point(params, two_wg, SEPARATE, (1, 3), (1,), (232, 40))).startswith("stage:")
    assert space.candidate(Point(params, RoleSplit(3, "warp", False), MERGED, (3,), (), (160, 40))).startswith("kernel:")
    odd = (("block_K", 64), ("block_M", 192), ("block_N", 256), ("epilogue", "direct"), ("persistent", False), ("swizzle", 0))
    assert "not a multiple" in Task.make(gemm_spec, gemm_spec.parse_problem("M=4000,N=4096,K=4096")).space().candidate(
        Point(odd, two_wg, MERGED, (3,), (), (232, 40))
    )


def test_register_rules_on_hand_written_schedules():
    def sched(*roles, warps=12):
        return Schedule(warps, tuple(roles), ())

    assert register_reason(sched(Role("c", 0, 8, 232), Role("p", 8, 9, 40))) is None
    assert "different max_nreg" in register_reason(sched(Role("c", 0, 6, 232), Role("p", 6, 8, 40)))
    assert "outside" in register_reason(sched(Role("c", 0, 16, 232)))
    assert "65536" in register_reason(sched(Role("c", 0, 8, 248), Role("p", 8, 12, 56)))


def test_threads_and_alignment_rules(space):
    params = (("block_K", 64), ("block_M", 128), ("block_N", 256), ("epilogue", "direct"), ("persistent", False), ("swizzle", 0))
    shape = space.shape(params)
    wide = RoleSplit(8, "warpgroup", False)  # 36 warps: 1152 threads
    assert space._split_reason(params, shape, wide).startswith("threads:")


def test_config_rejects_budgets_that_are_not_multiples_of_8():
    with pytest.raises(ValueError, match="multiples of 8"):
        SpaceConfig(consumer_nreg=(230,))


def test_plain_kernel_is_seeded_by_role_based(data_dir):
    spec = load_kernel(data_dir / "plain_gemm.py")
    task = Task.make(spec, spec.parse_problem("M=1024,N=1024,K=1024"))
    space = task.space()
    seed = space.seed_candidate((("block_K", 64), ("block_M", 128), ("block_N", 256)))
    roles = {r.name: (r.warp_lo, r.warp_hi, r.max_nreg) for r in seed.schedule.roles}
    assert roles == {"Worker": (0, 8, 240), "Load": (8, 9, 24)}
    count = space.count()
    assert count.kept > 1000
    cand = next(space.candidates())
    prepared, _ = compiler.prepare(task.primfunc(cand.param_dict))
    compiler.verify(compiler.attach(prepared, cand.schedule))


def test_sample_is_define_by_run_with_fixed_choices(space):
    rng = random.Random(0)
    names: dict[str, tuple] = {}

    def choose(name, options):
        options = tuple(options)
        assert names.setdefault(name, options) == options  # a name always offers the same choices
        return rng.choice(options)

    kept = 0
    for _ in range(300):
        cand = space.candidate(space.sample(choose))
        kept += isinstance(cand, Candidate)
    assert kept > 20
