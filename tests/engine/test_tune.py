"""Tuning orchestration on a real store (SQLite and PostgreSQL) with the
runner test double and tilelang's real verifier (no nvcc)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ws_tuner import search
from ws_tuner.candidate import Lowering
from ws_tuner.result import Status
from ws_tuner.testing import DUMMY_DEVICE, DummyRunner, VerifyOnlyBuilder
from ws_tuner.tune import BASELINE, SEARCH, TuneOptions, Tuner

PINNED = {"block_K": (64,), "block_M": (128,), "block_N": (128, 256), "epilogue": ("direct",), "persistent": (False,), "swizzle": (0, 8)}


@pytest.fixture
def task(gemm_spec):
    from ws_tuner.task import Task

    return Task.make(gemm_spec, gemm_spec.parse_problem("M=4096,N=4096,K=4096"), PINNED)


class CountingBuilder(VerifyOnlyBuilder):
    def __init__(self):
        self.submitted: list[str] = []

    def submit(self, build_input):
        self.submitted.append(build_input.candidate.hash)
        return super().submit(build_input)


class ConcurrentBuilder(CountingBuilder):
    """Builds that finish on another thread, as a process pool's do: many in flight at once."""

    def __init__(self):
        super().__init__()
        self._thread = ThreadPoolExecutor(max_workers=1)  # one at a time: tilelang's passes share state

    def submit(self, build_input):
        self.submitted.append(build_input.candidate.hash)
        return self._thread.submit(lambda: VerifyOnlyBuilder.submit(self, build_input).result())


def tune(task, store, *, budget=12, strategy="tpe", runner=None, listener=None, builder=None, **options):
    builder = builder or CountingBuilder()
    tuner = Tuner(task, store=store, builder=builder, runner=runner or DummyRunner(), strategy=search.create(strategy, seed=1),
                  options=TuneOptions(budget=budget, **options), listener=listener)  # fmt: skip
    return tuner.run(), builder


def test_tunes_stores_and_reports_against_baselines(task, store):
    report, builder = tune(task, store, budget=12)
    assert report.key.device == DUMMY_DEVICE
    stored = store.trials_by_hash(workload_id=report.workload_id)
    assert len(stored) == len(report.records) == len(builder.submitted)
    search_records = [r for r in report.records if r.role == SEARCH]
    assert len(search_records) == 12 and not report.out_of_time
    for kind in ("seed", "default", "no_ws", "role_based", "reference"):
        assert report.baseline(kind) is not None, kind
    assert len([r for r in report.records if r.role == BASELINE]) == 4 * 4 + 1  # 4 param points, + the reference
    best = report.best
    assert best.candidate.lowering is Lowering.WS
    assert all(best.result.rank_key() <= r.result.rank_key() for r in report.records if r.result.timing and r.candidate.lowering is Lowering.WS)
    # The leaders were re-timed and marked confirmed in the store.
    assert stored[best.candidate.hash].result.confirmed is True
    assert store.best(key=report.key).candidate == best.candidate


def test_rerun_reuses_every_stored_outcome(task, store):
    first, _ = tune(task, store, budget=10)
    second, builder = tune(task, store, budget=10)
    assert builder.submitted == []  # nothing built again
    assert {r.candidate.hash for r in second.records} == {r.candidate.hash for r in first.records}
    assert all(r.cached for r in second.records)


def test_a_tuning_pinned_to_part_of_the_grid_neither_replays_nor_counts_the_rest(task, store):
    """``--param`` narrows the grid, not the workload: the store holds an earlier run's
    other points, which are not this run's results and do not use up its budget."""
    import dataclasses

    tune(task, store, budget=6)
    narrow = dataclasses.replace(task, param_grid={**task.param_grid, "block_N": (256,)})
    report, _ = tune(narrow, store, budget=6)
    assert report.records and all(r.candidate.param_dict.get("block_N", 256) == 256 for r in report.records)
    assert len([r for r in report.records if r.role == SEARCH]) == 6


def test_interrupted_tuning_keeps_results_and_resumes(task, store):
    seen = []

    def interrupt_after_five(event, record):
        seen.append(record)
        if len([r for r in seen if r and r.role == SEARCH]) == 5:
            raise KeyboardInterrupt

    report, _ = tune(task, store, budget=10, listener=interrupt_after_five)
    assert report.interrupted
    kept = store.trials_by_hash(workload_id=report.workload_id)
    assert len([t for t in kept.values() if t.result.info.get("role") == SEARCH]) == 5
    resumed, builder = tune(task, store, budget=10)
    assert not resumed.interrupted
    assert len([r for r in resumed.records if r.role == SEARCH]) == 10
    assert len(builder.submitted) == 5  # only what was missing


class SlowBuilder(ConcurrentBuilder):
    def submit(self, build_input):
        self.submitted.append(build_input.candidate.hash)
        return self._thread.submit(lambda: (time.sleep(0.3), VerifyOnlyBuilder.submit(self, build_input).result())[1])


def test_a_time_budget_is_the_search_s_own_clock(task, store):
    """The baselines take longer than the whole time budget (17 builds of 0.3 s, one at a
    time) and are measured in full; the search still gets its seconds after them, and
    past them no search candidate starts while nothing in flight is dropped."""
    start = time.monotonic()
    report, builder = tune(task, store, budget=12, builder=SlowBuilder(), jobs=1, time_budget=1.0)
    roles = [r.role for r in report.records]
    assert roles.count(BASELINE) == 4 * len(list(task.space().param_points())) + len(task.vendor_baselines()), roles  # seed, default, no_ws, role_based; cuBLAS
    assert time.monotonic() - start > 3.0  # the baselines alone outlasted the budget ...
    assert 1 <= roles.count(SEARCH) < 12 and report.out_of_time  # ... and the search ran, then the clock ended it
    assert sorted(r.candidate.hash for r in report.records) == sorted(builder.submitted)
    assert all(r.result.status is Status.OK for r in report.records)


def test_a_time_budget_of_zero_measures_the_baselines_only(task, store):
    report, _ = tune(task, store, budget=12, jobs=1, time_budget=0.0)
    roles = [r.role for r in report.records]
    assert SEARCH not in roles and BASELINE in roles and report.out_of_time


def test_failures_are_recorded_and_never_win(task, store):
    # Make the seed's neighbourhood fail: every candidate the runner sees first crashes or is wrong.
    runner = DummyRunner()
    first, _ = tune(task, store, budget=6, strategy="grid", runner=runner)
    victims = [r.candidate.hash for r in first.records if r.role == SEARCH][:3]
    store2_failures = {victims[0]: Status.CRASH, victims[1]: Status.WRONG, victims[2]: Status.TIMEOUT}
    fresh = DummyRunner(latency=lambda c: 0.01 if c.hash in store2_failures else 1.0, failures=store2_failures)
    from ws_tuner.task import Task

    other = Task.make(task.spec, {**task.problem, "M": 8192}, PINNED)
    report, _ = tune(other, store, budget=6, strategy="grid", runner=fresh)
    statuses = {r.candidate.hash: r.result.status for r in report.records}
    assert [statuses[h] for h in victims] == [Status.CRASH, Status.WRONG, Status.TIMEOUT]
    assert report.best.candidate.hash not in victims


def test_warm_start_from_the_nearest_problem(task, store):
    from ws_tuner.task import Task

    first, _ = tune(task, store, budget=8)
    near = Task.make(task.spec, {**task.problem, "M": 8192}, PINNED)
    report, builder = tune(near, store, budget=1, baselines=False)
    warm = [r for r in report.records if r.role == "warm"]
    assert first.best.candidate in [r.candidate for r in warm]


def test_a_warm_start_that_is_a_seed_point_is_measured_once(task, store):
    """The nearest problem's winner is often the seed at some point, which is also a
    baseline here: one measurement, one record, one place in the final tournament."""
    from ws_tuner.task import Task

    seeds = {task.space().seed_candidate(p).hash for p in task.space().param_points()}
    runner = DummyRunner(latency=lambda c: 0.5 if c.hash in seeds else 1.0)  # the seeds win
    first, _ = tune(task, store, budget=4, runner=runner)
    assert first.best.candidate.hash in seeds
    near = Task.make(task.spec, {**task.problem, "M": 8192}, PINNED)
    report, builder = tune(near, store, budget=4, runner=runner, builder=ConcurrentBuilder(), jobs=16)
    hashes = [r.candidate.hash for r in report.records]
    assert first.best.candidate.hash in hashes
    assert len(hashes) == len(set(hashes)) and len(builder.submitted) == len(set(builder.submitted))
    found = {r.candidate.hash for r in report.found() if r.result.status is Status.OK}
    assert len(set(runner.tournaments[-1]) & found) == min(TuneOptions().confirm_top, len(found))


def test_grid_strategy_is_exhaustive(gemm_spec, store):
    from ws_tuner.space import SpaceConfig
    from ws_tuner.task import Task

    task = Task.make(gemm_spec, gemm_spec.parse_problem("M=4096,N=4096,K=4096"), PINNED, SpaceConfig(**SMALL))
    report, _ = tune(task, store, budget=10**6, strategy="grid", baselines=False, confirm_top=0)
    assert len(report.records) == task.space().count().kept > 10


class SameCodeBuilder(CountingBuilder):
    """As if the compiler ignored ``swizzle``: candidates differing only in it generate the same code."""

    def submit(self, build_input):
        import dataclasses

        from ws_tuner.candidate import Candidate

        result = super().submit(build_input).result()
        c = build_input.candidate
        if result.ok and c.lowering is Lowering.WS:
            twin = Candidate.make({k: v for k, v in c.param_dict.items() if k != "swizzle"}, c.schedule)
            result = dataclasses.replace(result, code_hash="code-" + twin.hash)
        from concurrent.futures import Future

        fut = Future()
        fut.set_result(result)
        return fut


SMALL = dict(consumer_warpgroups=(2,), producer_kinds=("warp",), producer_first=(False,), depths=(2, 3), max_stage_offset=1,
             producer_nreg=(40,), consumer_nreg=(232,))  # fmt: skip


def test_candidates_with_the_same_code_are_measured_once(gemm_spec, store):
    from ws_tuner.space import SpaceConfig
    from ws_tuner.task import Task

    task = Task.make(gemm_spec, gemm_spec.parse_problem("M=4096,N=4096,K=4096"), {**PINNED, "block_N": (256,)}, SpaceConfig(**SMALL))
    runner = DummyRunner()
    tuner = Tuner(task, store=store, builder=SameCodeBuilder(), runner=runner, strategy=search.create("grid"),
                  options=TuneOptions(budget=10**6, baselines=False, confirm_top=0))  # fmt: skip
    report = tuner.run()
    calls = runner.calls[1:]  # the first ran the anchor alone, to choose it
    by_code: dict[str, list] = {}
    for r in report.records:
        by_code.setdefault(r.result.info.get("code_hash"), []).append(r)
    groups = [g for code, g in by_code.items() if code and len(g) > 1]
    assert groups and report.shared == sum(len(g) - 1 for g in groups)
    for group in groups:
        measured = [r for r in group if "shared_with" not in r.result.info]
        assert len(measured) == 1  # one kernel, one measurement...
        for r in group:
            assert r.result.timing == measured[0].result.timing and r.result.ratio == measured[0].result.ratio  # ...shared by its twins
            assert calls.count(r.candidate.hash) == (r is measured[0])
    stored = store.trials_by_hash(workload_id=report.workload_id)
    assert sum("shared_with" in t.result.info for t in stored.values()) == report.shared


def test_every_timing_is_side_by_side_with_the_seed_anchor(task, store):
    report, _ = tune(task, store, budget=6)
    first_point = next(p for p in task.space().param_points() if not isinstance(task.space().shape(p), str))
    assert report.anchor == task.space().seed_candidate(first_point)
    timed = [r for r in report.records if r.result.status is Status.OK]
    assert timed and all(r.result.info.get("anchor") == report.anchor.hash and r.result.ratio is not None for r in timed)
    anchor_record = next(r for r in report.records if r.candidate == report.anchor)
    assert anchor_record.result.ratio == 1.0  # timed beside itself


def test_the_tournament_takes_the_leaders_and_the_best_of_each_baseline(task, store):
    runner = DummyRunner()
    report, _ = tune(task, store, budget=10, runner=runner)
    (entrants,) = runner.tournaments
    leaders = sorted((r for r in report.records if r.candidate.lowering is Lowering.WS and r.result.timing),
                     key=lambda r: r.result.ratio)  # fmt: skip
    assert {r.candidate.hash for r in leaders[:5]} <= set(entrants)
    for kind in ("seed", "default", "no_ws", "role_based", "reference"):
        assert report.baseline(kind).candidate.hash in entrants
    assert report.confirmed == len(entrants) and all(report.baseline(k).result.confirmed for k in ("default", "no_ws", "role_based"))


def test_a_baseline_enters_the_tournament_with_its_near_rivals():
    """A baseline point whose search timing is within the margin of its kind's best
    is re-timed too: one point picked by a noisy search timing must not stand for the kind."""
    from ws_tuner.candidate import Candidate
    from ws_tuner.pipeline import TrialRecord, TuneReport
    from ws_tuner.result import Timing, TrialResult
    from ws_tuner.workload import Environment, WorkloadKey

    key = WorkloadKey.make("k", "0" * 64, {"M": 1}, Environment("sm_90a", "NVIDIA H200", "0", "0", "0"))
    report = TuneReport(key, 0, compile_only=False)

    def record(lowering, i, ratio, status=Status.OK, ms=1.0):
        cand = Candidate.make({"i": i}, lowering=Lowering(lowering))
        timed = Timing(median_ms=ms, p20_ms=ms, p80_ms=ms, reps=10)
        return TrialRecord(cand, TrialResult(cand.hash, status, timing=timed, ratio=ratio), BASELINE, False)

    report.records += [record("role_based", i, r) for i, r in enumerate([0.905, 0.900, 0.95, 0.915, 0.9005])]
    report.records += [record("role_based", 9, 0.80, Status.WRONG, ms=0.5), record("default", 10, 1.2)]
    got = [r.result.ratio for r in report.contenders("role_based", 0.02, 5)]
    assert got == [0.900, 0.9005, 0.905, 0.915]  # best first; 0.95 is out of the margin, the WRONG one never in
    assert [r.result.ratio for r in report.contenders("role_based", 0.02, 2)] == [0.900, 0.9005]
    assert [r.result.ratio for r in report.contenders("default", 0.02, 5)] == [1.2] and report.contenders("seed", 0.02, 5) == []
    assert report.baseline("role_based").result.ratio == 0.900
    # The point of least search time is in too, whatever its ratio (its anchor's timing may have met another clock).
    report.records.append(record("default", 11, 1.5, ms=0.8))
    assert [r.result.ratio for r in report.contenders("default", 0.02, 5)] == [1.2, 1.5]
    assert [r.result.ratio for r in report.contenders("default", 0.5, 5)] == [1.2, 1.5]  # once, where the margin takes it already


def test_the_search_starts_from_tilelangs_default_structure_where_the_seed_ran_best(task, store):
    """Once the seed schedule's baselines are in, the schedule shaped as tilelang's
    default warp specialization is measured (warm, once) at the seed's fastest points,
    and nowhere else, before the search."""
    from ws_tuner.pipeline import start_points

    report, builder = tune(task, store, budget=2)
    measured = task.measured_points(timed=True)
    baselines = [r for r in report.records if r.role == BASELINE]
    seeds = [r for r in baselines if r.candidate.lowering is Lowering.WS]
    points = start_points(baselines, task.seed_points(measured))
    assert len(points) == 3 < len(measured)  # not the dummy's slowest seed point (block_N=128, swizzle 0)
    starts = {c.hash for c in task.lowering_starts(points)}
    elsewhere = {c.hash for c in task.lowering_starts(measured)} - starts
    order = {r.candidate.hash: i for i, r in enumerate(report.records)}
    assert len(starts) == len(points) and starts <= set(order) and not elsewhere & set(order)
    assert {report.records[order[h]].role for h in starts} == {"warm"}
    assert max(order[r.candidate.hash] for r in seeds) < min(order[h] for h in starts)  # after the seed's every point
    searched = [builder.submitted.index(r.candidate.hash) for r in report.records if r.role == SEARCH]
    assert searched and max(builder.submitted.index(h) for h in starts) < min(searched)  # and before the search
    assert len(builder.submitted) == len(set(builder.submitted))


def test_the_lowering_starts_go_where_the_seed_ran_best(task):
    """``start_points``: the points whose seed schedule is one of the three fastest by
    search ratio (WRONG and untimed results, tilelang's lowerings and the search's records
    lead nothing), fastest first, every point of a seed that several share; every
    measured point when no seed was timed (compile-only)."""
    from ws_tuner.candidate import Candidate
    from ws_tuner.pipeline import START_POINTS, TrialRecord, start_points
    from ws_tuner.result import TrialResult

    schedule = task.space().seed_candidate(task.measured_points(timed=True)[0]).schedule

    def record(lowering, i, ratio, status=Status.OK, role=BASELINE):
        cand = Candidate.make({"i": i}, schedule) if lowering == "seed" else Candidate.make({"i": i}, lowering=Lowering(lowering))
        return TrialRecord(cand, TrialResult(cand.hash, status, ratio=ratio), role)

    # The schedule sets the thread count: two points, one seed (measured once, as its own parameters say).
    seeds = {(("i", i), ("threads", t)): record("seed", i, None).candidate.hash for i in range(8) for t in (128, 256)}
    points = list(seeds)
    assert START_POINTS == 3
    records = [record("seed", i, r) for i, r in enumerate([1.3, 1.1, 1.2, 1.0, 1.4])]
    records += [record("seed", 6, 0.5, Status.WRONG), record("seed", 7, None), record("seed", 2, 1.15)]
    records += [record("default", 5, 0.7), record("role_based", 0, 0.8), record("seed", 4, 0.1, role=SEARCH)]
    assert start_points(records, seeds) == points[6:8] + points[2:6]  # seeds 3, 1 and 2, at both thread counts
    elsewhere = {p: s for p, s in seeds.items() if p[0][1] != 3}  # seed 3 measured, its points not among these
    assert start_points(records, elsewhere) == points[2:6] + points[:2]  # seeds 1, 2 and then 0
    assert start_points(records[-3:], dict(list(seeds.items())[:3])) == points[:3]  # no seed timed: everywhere


def test_a_ctrl_c_during_a_commit_lands_after_it():
    """The recorder commits a trial and counts it inside ``interrupts_deferred``: a
    Ctrl-C between the two (the count said 1 stored with 2 in the store) waits."""
    import os
    import signal

    from ws_tuner.tune import interrupts_deferred

    done = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            done.append("committed")
            done.append("counted")
    assert done == ["committed", "counted"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_lowering_starts_where_the_seed_sets_the_thread_count(store):
    """DeepSeek-V4's seed schedules set their own thread count: the seed of the point at
    256 threads carries the parameters of the one at 128 (its representative), while the
    lowering starts exist at 256 only (H200 run 35, call 5, measured none when the seeds'
    own parameters stood for the points)."""
    from ws_tuner.kernel import load_kernel
    from ws_tuner.pipeline import WARM
    from ws_tuner.task import Task

    spec = load_kernel(Path(__file__).resolve().parents[1] / "data" / "sparse_attn_v4.py")
    task = Task.make(spec, spec.parse_problem("batch=1,seq=4096,seq_kv=8192,heads=128,dim=512,topk=1024"),
                     spec.parse_params("block_N=64,num_stages=1"))  # fmt: skip
    report, _ = tune(task, store, budget=1, strategy="random", builder=VerifyOnlyBuilder(), confirm_top=0)
    measured = task.measured_points(timed=True)
    seeds = task.seed_points(measured)
    by_hash = {c.hash: c for p in measured for c in task.baselines(dict(p)) if c.lowering is Lowering.WS}
    assert len(measured) == 2 and set(seeds.values()) == set(by_hash)
    assert {dict(c.params)["threads"] for c in by_hash.values()} == {128}  # both seeds name the point at 128
    assert not task.lowering_starts([p for p in measured if dict(p)["threads"] == 128])
    warm = {r.candidate.hash for r in report.records if r.role == WARM}
    assert warm and warm == {c.hash for c in task.lowering_starts(measured)}


def test_a_reference_that_fails_at_the_problem_ends_the_tuning_before_anything_is_timed(task, store):
    """Every check runs the kernel file's reference: where it fails (a backward pass whose
    reference ran out of memory on an H100, run 42), each of 108 candidates failed with it and
    nothing was timed. The anchor's choice finds it first, and the tuning ends in one line."""
    from ws_tuner.pipeline import ReferenceFails
    from ws_tuner.testing import OutOfMemoryRunner

    runner = OutOfMemoryRunner()
    with pytest.raises(ReferenceFails, match=r"^the kernel file's reference fails at this problem, and every candidate's check runs it: "
                                             r"launch_error: CUDA out of memory\. .* \(a smaller --shape fits\)$"):  # fmt: skip
        tune(task, store, budget=4, runner=runner)
    reference = next(c for c in task.anchors(task.space().served_points()) if c.lowering is Lowering.REFERENCE)
    assert runner.calls[-1] == reference.hash and len(runner.calls) <= 3  # the seeds, then the reference: nothing else ran
    workload = store.workload_id(Tuner(task, store=store, builder=CountingBuilder(), runner=runner, strategy=search.create("tpe")).key)
    assert store.trials_by_hash(workload_id=workload) == {}


def test_a_failing_seed_leaves_the_reference_as_the_anchor(task, store):
    seeds = {c.hash for c in task.anchors(task.space().served_points()) if c.lowering is Lowering.WS}
    report, _ = tune(task, store, budget=2, runner=DummyRunner(failures=dict.fromkeys(seeds, Status.WRONG)))
    assert report.anchor is not None and report.anchor.lowering is Lowering.REFERENCE
