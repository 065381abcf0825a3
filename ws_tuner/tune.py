"""Tuning: wiring only. A strategy proposes, the builder builds, the runner
runs, the store remembers; this module moves candidates between them.

Builds and runs overlap: up to ``jobs`` compiles are in flight while the GPU
worker measures what is already built. Every outcome is committed the moment
it is known, so Ctrl-C or a crash loses at most the candidates in flight,
and a second run of the same tuning reuses what the first one stored.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from typing import Any, Callable

from .builder import Builder, BuildInput, BuildResult
from .candidate import Candidate, Lowering
from .result import Status, TrialResult
from .runner import EvaluatorConfig, RunInput, Runner
from .search import Proposal, SearchStrategy
from .store import Store, StoredTrial
from .task import Task
from .workload import COMPILE_ONLY_DEVICE, Environment, WorkloadKey

SEARCH, BASELINE, WARM = "search", "baseline", "warm"


@dataclass(frozen=True)
class TuneOptions:
    budget: int = 64  # search candidates to measure (baselines come on top)
    time_budget: float | None = None  # seconds of wall time; None is no limit
    jobs: int = 1  # compile workers
    baselines: bool = True
    confirm_top: int = 3  # leaders timed again, interleaved with the baselines
    confirm_rounds: int = 5
    evaluator: EvaluatorConfig = field(default_factory=EvaluatorConfig)


@dataclass
class TrialRecord:
    candidate: Candidate
    result: TrialResult
    role: str  # SEARCH, BASELINE or WARM
    cached: bool = False  # reused from the store, not measured again


@dataclass
class TuneReport:
    key: WorkloadKey
    workload_id: int
    compile_only: bool
    records: list[TrialRecord] = field(default_factory=list)
    pruned: int = 0
    interrupted: bool = False
    wall_seconds: float = 0.0

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.records:
            out[r.result.status.value] = out.get(r.result.status.value, 0) + 1
        return out

    def _fastest(self, records: list[TrialRecord]) -> TrialRecord | None:
        ok = [r for r in records if r.result.status is Status.OK and r.result.timing]
        return min(ok, key=lambda r: r.result.timing.median_ms) if ok else None  # type: ignore[union-attr]

    @property
    def best(self) -> TrialRecord | None:
        """The fastest correct WS candidate (the seed schedule included)."""
        return self._fastest([r for r in self.records if r.candidate.lowering is Lowering.WS])

    def baseline(self, kind: str) -> TrialRecord | None:
        """Best of one baseline: "seed", "default", "role_based" or "reference"."""
        if kind == "seed":
            return self._fastest([r for r in self.records if r.role == BASELINE and r.candidate.lowering is Lowering.WS])
        return self._fastest([r for r in self.records if r.candidate.lowering.value == kind])


Listener = Callable[[str, TrialRecord | None], None]


def compile_only_environment() -> Environment:
    from . import compiler

    return Environment(
        arch=compiler.ARCH,
        device=COMPILE_ONLY_DEVICE,
        tilelang_version=compiler.tilelang_version(),
        cuda_version=compiler.cuda_version(),
        driver_version="none",
    )


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
        self._known = store.trials_by_hash(workload_id=self.workload_id)
        self._builds: dict[Future, tuple[Proposal, str]] = {}
        self._runs: dict[Future, tuple[Proposal, str, BuildResult]] = {}
        self._done_hashes: set[str] = set()

    # --- entry point --------------------------------------------------------
    def run(self) -> TuneReport:
        """Measure up to ``budget`` search candidates for this workload, counting
        those stored by earlier runs: a finished tuning re-run measures nothing
        again, an interrupted one resumes where it stopped."""
        start = time.monotonic()
        deadline = start + self.options.time_budget if self.options.time_budget else math.inf
        reusable = {h: t for h, t in self._known.items() if self._reusable(t)}
        history = [(t.result.info.get("decisions", {}), t.result) for t in reusable.values()]
        self.strategy.pre_tuning(self.task.space(), history)
        for trial in reusable.values():
            self._done_hashes.add(trial.candidate.hash)
            self._record(Proposal(trial.candidate), trial.result, trial.result.info.get("role", SEARCH), cached=True, notify=False)
        searched = sum(t.result.info.get("role", SEARCH) == SEARCH for t in reusable.values())
        try:
            for proposal, role in self._warm_start():
                self._submit(proposal, role)
            self._drain(deadline)
            exhausted = False
            batch = max(2 * self.options.jobs, 2)
            while not exhausted and searched < self.options.budget and time.monotonic() < deadline:
                if len(self._builds) + len(self._runs) < batch:
                    proposals = self.strategy.propose(min(batch, self.options.budget - searched))
                    exhausted = not proposals
                    for proposal in proposals:
                        searched += self._submit(proposal, SEARCH)
                self._wait_one(deadline)
            self._drain(deadline)
            self.report.pruned = int(getattr(self.strategy, "pruned", 0))
            if self.runner and self.options.confirm_top:
                self._confirm()
        except KeyboardInterrupt:
            self.report.interrupted = True
            for fut in list(self._builds) + list(self._runs):
                fut.cancel()
        finally:
            self.strategy.post_tuning()
            self.report.wall_seconds = time.monotonic() - start
        return self.report

    def _reusable(self, trial: StoredTrial) -> bool:
        # A compile-only BUILT says nothing about speed: with a GPU it is measured again.
        return trial.result.status is not Status.BUILT or self.runner is None

    # --- what to measure first ----------------------------------------------
    def _warm_start(self) -> list[tuple[Proposal, str]]:
        out: list[tuple[Proposal, str]] = []
        if self.options.baselines:
            points = self._valid_param_points()
            # Compile-only runs show that the baselines build; timing them needs the GPU.
            for params in points if self.runner else points[:1]:
                out += [(Proposal(c), BASELINE) for c in self.task.baselines(dict(params))]
            if self.runner:
                out.append((Proposal(Candidate.make({}, None, Lowering.REFERENCE)), BASELINE))
        out += [(Proposal(c), WARM) for c in self._nearest_best()]
        return out

    def _valid_param_points(self) -> list[tuple[tuple[str, Any], ...]]:
        space = self.task.space()
        return [p for p in space.param_points() if not isinstance(space.shape(p), str)]

    def _nearest_best(self, k: int = 3) -> list[Candidate]:
        """The best stored schedules of the nearest problem of this kernel on this device."""
        best: tuple[float, list[StoredTrial]] | None = None
        for workload_id, key in self.store.find_workloads(kernel=self.key.kernel, source_hash=self.key.source_hash, device=self.key.device):
            if workload_id == self.workload_id:
                continue
            distance = self.task.spec.problem_distance(self.task.problem, json.loads(key.problem))
            if distance is not None and (best is None or distance < best[0]):
                top = self.store.top_k(workload_id=workload_id, k=k)
                if top:
                    best = (distance, top)
        space = self.task.space()
        # Only schedules whose kernel parameters can serve this problem (tile divisibility and the like).
        return [t.candidate for t in best[1] if t.candidate.lowering is Lowering.WS and not isinstance(space.shape(t.candidate.params), str)] if best else []

    # --- the build -> run -> store pipeline ---------------------------------
    def _ref(self) -> tuple[str, str, dict[str, Any]]:
        """How a worker process finds this task again: kernel file, its hash, the problem."""
        return str(self.task.spec.path), self.task.spec.source_hash, self.task.problem

    def _submit(self, proposal: Proposal, role: str) -> bool:
        """Send a candidate to the builder; False if it was already measured."""
        candidate = proposal.candidate
        if candidate.hash in self._done_hashes:
            return False
        self._done_hashes.add(candidate.hash)
        self._builds[self.builder.submit(BuildInput(*self._ref(), candidate))] = (proposal, role)
        return True

    def _wait_one(self, deadline: float) -> None:
        pending = list(self._builds) + list(self._runs)
        if not pending:
            return
        timeout = None if deadline == math.inf else max(deadline - time.monotonic(), 0.05)
        done, _ = wait(pending, timeout=timeout, return_when=FIRST_COMPLETED)
        for fut in done:
            if fut in self._builds:
                self._built(fut, *self._builds.pop(fut))
            else:
                proposal, role, build = self._runs.pop(fut)
                result = fut.result()
                self._finish(proposal, dataclasses.replace(result, build_seconds=build.seconds), role)

    def _drain(self, deadline: float) -> None:
        while (self._builds or self._runs) and time.monotonic() < deadline:
            self._wait_one(deadline)

    def _built(self, fut: Future, proposal: Proposal, role: str) -> None:
        build: BuildResult = fut.result()
        if not build.ok or self.runner is None:
            result = TrialResult(proposal.candidate.hash, build.status, build.message, build_seconds=build.seconds)
            self._finish(proposal, result, role)
            return
        run_input = RunInput(*self._ref(), proposal.candidate, self.options.evaluator)
        self._runs[self.runner.submit(run_input)] = (proposal, role, build)

    def _finish(self, proposal: Proposal, result: TrialResult, role: str) -> None:
        # The role and the sampler's decisions travel with the result, for resuming.
        result = dataclasses.replace(result, info={**result.info, "role": role, "decisions": proposal.decisions})
        self.store.commit_trial(workload_id=self.workload_id, candidate=proposal.candidate, result=result)
        self._record(proposal, result, role, cached=False)

    def _record(self, proposal: Proposal, result: TrialResult, role: str, *, cached: bool, notify: bool = True) -> None:
        record = TrialRecord(proposal.candidate, result, role, cached)
        self.report.records.append(record)
        if role == SEARCH and notify:
            self.strategy.notify(proposal, result)
        self.listener("trial", record)

    # --- confirmation -------------------------------------------------------
    def _confirm(self) -> None:
        """Time the leaders again, interleaved with the best of each baseline."""
        assert self.runner is not None
        ws = sorted(
            (r for r in self.report.records if r.candidate.lowering is Lowering.WS and r.result.status is Status.OK and r.result.timing),
            key=lambda r: r.result.timing.median_ms,  # type: ignore[union-attr]
        )[: self.options.confirm_top]
        baselines = [self.report.baseline(k) for k in ("seed", "default", "role_based", "reference")]
        chosen = {r.candidate.hash: r for r in ws + [b for b in baselines if b]}
        if not chosen:
            return
        inputs = [RunInput(*self._ref(), r.candidate, self.options.evaluator) for r in chosen.values()]
        self.listener("confirm", None)
        for result in self.runner.retime(inputs, self.options.confirm_rounds):
            record = chosen[result.candidate_hash]
            if result.status is not Status.OK:
                continue
            first = record.result.timing.median_ms if record.result.timing else None
            confirmed = dataclasses.replace(
                record.result, status=Status.OK, message="confirmed by interleaved re-timing", timing=result.timing,
                tflops=result.tflops, info={**record.result.info, **result.info, "first_median_ms": first, "confirmed": True},
            )  # fmt: skip
            self.store.commit_trial(workload_id=self.workload_id, candidate=record.candidate, result=confirmed)
            record.result = confirmed

