"""Tuning on the command line: wiring only. The pipeline (pipeline.py) proposes,
builds, runs and confirms; this module gives it the CLI's recorder (places up to
the budget, each result committed to the store the moment it is known) and
decides what to measure first.

Every outcome is committed at once, so Ctrl-C or a crash loses at most the
candidates in flight, and a second run of the same tuning reuses what the
first one stored: a finished tuning re-run measures nothing again, an
interrupted one resumes where it stopped.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from .builder import Builder
from .candidate import Candidate, Lowering
from .pipeline import (
    BASELINE, LATER, SEARCH, WARM, Later, Listener, Pipeline, PipelineOptions, Recorder, Slot, TaskRef, TrialRecord, TuneReport,
    start_points,
)  # fmt: skip
from .result import Status, TrialResult
from .runner import EvaluatorConfig, Runner
from .search import SearchStrategy, study_name_of
from .store import Store, StoredTrial
from .task import Task
from .workload import COMPILE_ONLY_DEVICE, Environment, WorkloadKey

__all__ = ["BASELINE", "SEARCH", "WARM", "TrialRecord", "TuneOptions", "TuneReport", "Tuner", "compile_only_environment", "lowering_starts_after", "nearest_best"]


@dataclass(frozen=True)
class TuneOptions:
    budget: int = 64  # search candidates to measure (baselines come on top)
    time_budget: float | None = None  # seconds of search, after the baselines and warm starts (Pipeline.run); None is no limit
    jobs: int = 1  # compile workers
    baselines: bool = True
    confirm_top: int = 5  # leaders re-timed in the final tournament beside the best of each baseline
    evaluator: EvaluatorConfig = field(default_factory=EvaluatorConfig)


def compile_only_environment() -> Environment:
    from . import compiler

    return Environment(
        arch=compiler.ARCH,
        device=COMPILE_ONLY_DEVICE,
        tilelang_version=compiler.tilelang_version(),
        cuda_version=compiler.cuda_version(),
        driver_version="none",
    )


@contextmanager
def interrupts_deferred() -> Iterator[None]:
    """A Ctrl-C (SIGINT) during the block raises KeyboardInterrupt when it ends, not
    inside it. Only the main thread receives signals; elsewhere the block runs as is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught and callable(previous):  # as it would have landed: Python's default handler raises KeyboardInterrupt
        previous(signal.SIGINT, None)


Places = list[tuple[Candidate, str]]  # candidates to measure, each with its role


class StoreRecorder(Recorder):
    """The CLI's recorder: first the baselines and warm starts; once the results of
    ``awaited`` (some of them) are in, the places planned from them (``then``: the
    lowering starts), after what is still queued; then search places up to the budget
    (counting what earlier runs stored). Results go to the store."""

    def __init__(self, store: Store, workload_id: int, first: Places, budget: int, searched: int,
                 then: Callable[[], Places] | None = None, awaited: Iterable[str] = ()) -> None:  # fmt: skip
        self.store, self.workload_id = store, workload_id
        self.first, self.then, self.awaited = deque(first), then, set(awaited)
        self.budget, self.searched = budget, searched
        self.stored = 0  # trials this run committed (counted here: a Ctrl-C may land before anyone else hears of one)

    def claim(self) -> Slot | Later | None:
        if self.then is not None and not self.awaited:
            then, self.then = self.then, None
            self.first.extend(then())
        if self.first:
            candidate, role = self.first.popleft()
            return Slot(role, candidate)
        if self.then is not None:
            return LATER
        if self.searched >= self.budget:
            return None
        self.searched += 1
        return Slot(SEARCH)

    def release(self, slot: Slot, *, exhausted: bool) -> None:
        if slot.candidate is not None:
            self.awaited.discard(slot.candidate.hash)
        if slot.role == SEARCH:
            self.searched -= 1
            if exhausted:
                self.budget = self.searched  # the space has nothing more: stop asking

    def record(self, slot: Slot, candidate: Candidate, result: TrialResult) -> bool:
        with interrupts_deferred():  # a Ctrl-C between the commit and the count miscounted what was stored
            self.store.commit_trial(workload_id=self.workload_id, candidate=candidate, result=result)
            self.stored += 1
        self.awaited.discard(candidate.hash)
        return True

    def record_confirmed(self, results: Sequence[tuple[Candidate, TrialResult]]) -> None:
        self.store.commit_trials(workload_id=self.workload_id, items=results)


class Tuner:
    def __init__(
        self,
        task: Task,
        *,
        store: Store,
        builder: Builder,
        runner: Runner | None,
        strategy: SearchStrategy,
        options: TuneOptions = TuneOptions(),
        listener: Listener | None = None,
    ):
        self.task, self.store, self.builder, self.runner = task, store, builder, runner
        self.strategy, self.options = strategy, options
        self.listener = listener or (lambda event, record: None)
        env = runner.environment() if runner else compile_only_environment()
        self.key = WorkloadKey.make(task.spec.name, task.spec.source_hash, task.problem, env)
        self.workload_id = store.workload_id(self.key)
        self.report = TuneReport(self.key, self.workload_id, compile_only=runner is None)

    def run(self) -> TuneReport:
        """Measure up to ``budget`` search candidates for this workload (counting
        those stored by earlier runs), then confirm the leaders."""
        start = time.monotonic()
        # A compile-only BUILT says nothing about speed: with a GPU it is measured again.
        known = {h: t for h, t in self.store.trials_by_hash(workload_id=self.workload_id).items()
                 if (t.result.status is not Status.BUILT or self.runner is None) and self.task.holds(t.candidate)}  # fmt: skip
        self.strategy.keep_study_in(self.store.url, study_name_of(self.key, self.workload_id, self.task.pinned()))  # for optuna-dashboard
        self.strategy.pre_tuning(self.task.space(), [(t.result.info.get("decisions", {}), t.result) for t in known.values()])
        searched = self.report.searched_before = sum(t.result.info.get("role", SEARCH) == SEARCH for t in known.values())
        first = self._first()
        seeds = [c.hash for c, role in first if role == BASELINE and c.lowering is Lowering.WS]
        recorder = StoreRecorder(self.store, self.workload_id, first, self.options.budget, searched,
                                 then=lambda: self._starts({c.hash for c, _ in first}), awaited=seeds)  # fmt: skip
        pipeline = Pipeline(
            TaskRef(str(self.task.spec.path), self.task.spec.source_hash, self.task.problem),
            builder=self.builder, runner=self.runner, strategy=self.strategy, recorder=recorder, report=self.report,
            known=known, listener=self.listener,
            options=PipelineOptions(max_in_flight=max(2 * self.options.jobs, 2), confirm_top=self.options.confirm_top,
                                    evaluator=self.options.evaluator),
        )  # fmt: skip
        for trial in known.values():
            self.report.records.append(TrialRecord(trial.candidate, trial.result, trial.result.info.get("role", SEARCH), cached=True))
            self.listener("trial", self.report.records[-1])
        try:
            if self.runner is not None:  # compile-only times nothing
                self.listener("anchor", None)
            pipeline.choose_anchor(self.task.anchors(self.task.space().served_points()))
            pipeline.run(self.options.time_budget)
            self.report.pruned = int(getattr(self.strategy, "pruned", 0))
            pipeline.confirm()
        except KeyboardInterrupt:
            self.report.interrupted = True
            pipeline.abandon()
        finally:
            self.strategy.post_tuning()
            self.report.wall_seconds = time.monotonic() - start
            self.report.stored = recorder.stored
        return self.report

    # --- what to measure first ----------------------------------------------
    def _first(self) -> Places:
        out: Places = []
        if self.options.baselines:
            timed = self.runner is not None
            out += [(c, BASELINE) for c in self.task.baselines_at(self.task.measured_points(timed=timed), timed=timed)]
        out += [(c, WARM) for c in nearest_best(self.store, self.key, self.workload_id, self.task)]
        # Each candidate once, in its first role, as the service's job queue keeps them
        # (unique per job and candidate): a warm start that is also a seed point (the
        # nearest problem's winner often is) would be measured twice, and take two of
        # the final tournament's places.
        distinct: dict[str, tuple[Candidate, str]] = {}
        for candidate, role in out:
            distinct.setdefault(candidate.hash, (candidate, role))
        return list(distinct.values())

    def _starts(self, first: set[str]) -> Places:
        """The lowering starts (Task.lowering_starts: schedules of the space, not baselines;
        they start the search), at the seed schedule's fastest points, just measured."""
        if not self.options.baselines:
            return []
        return [(c, WARM) for c in lowering_starts_after(self.task, self.report.records, timed=self.runner is not None) if c.hash not in first]


def lowering_starts_after(task: Task, records: Iterable[TrialRecord], *, timed: bool) -> list[Candidate]:
    """The lowering starts (Task.lowering_starts) once the seed schedule's baselines are in
    ``records``: at its fastest measured points (pipeline.start_points), for the CLI's
    tuner and the service's workers alike."""
    records = list(records)
    wrong = frozenset(r.candidate.params for r in records if r.candidate.lowering is Lowering.DEFAULT and r.result.status is Status.WRONG)
    return task.lowering_starts(start_points(records, task.seed_points(task.measured_points(timed=timed))), default_wrong=wrong)


def nearest_best(store: Store, key: WorkloadKey, workload_id: int, task: Task, k: int = 3) -> list[Candidate]:
    """The best stored schedules of the nearest problem of this kernel on this device
    whose kernel parameters can serve this problem (tile divisibility and the like)."""
    best: tuple[float, list[StoredTrial]] | None = None
    for other_id, other in store.find_workloads(kernel=key.kernel, source_hash=key.source_hash, device=key.device):
        if other_id == workload_id:
            continue
        distance = task.spec.problem_distance(task.problem, json.loads(other.problem))
        if distance is not None and (best is None or distance < best[0]):
            top = store.top_k(workload_id=other_id, k=k)
            if top:
                best = (distance, top)
    space = task.space()
    return [t.candidate for t in best[1] if t.candidate.lowering is Lowering.WS and task.holds(t.candidate) and not isinstance(space.shape(t.candidate.params), str)] if best else []

