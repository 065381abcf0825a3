"""The measurement pipeline: propose -> build -> run -> result, for the CLI tuner
and the service worker alike.

What differs between the two is where a result goes and how a measurement
gets its place, and that is a ``Recorder`` (MetaSchedule's MeasureCallback):
the CLI's hands out places up to the budget and commits each trial to the
store; the worker's claims lease-fenced job slots in the database and
finishes them. Everything else is here, once:

* builds and runs overlap: up to ``max_in_flight`` candidates are being built
  or measured while the strategy proposes the next;
* one anchor per tuning (the seed schedule, else the kernel file's reference),
  timed side by side with every candidate, so that results rank by their
  ratio to it (measure.py);
* one kernel, one measurement: candidates whose generated code is the same
  (a kernel parameter the schedule overrides) are measured once and share it;
* the lowering starts wait for the seed schedule's baselines: a recorder answers
  LATER until their results are in, then plans the starts at the seed's fastest
  points (``start_points``);
* the final tournament: the leaders and the best of every baseline (with the
  points of a baseline whose search timings come within 5% of its best, and its
  fastest), re-timed all together until the winner's ratio is known to 1%.
"""

from __future__ import annotations

import abc
import dataclasses
import math
import time
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from .builder import Builder, BuildInput, BuildResult
from .candidate import Candidate, Lowering, ParamsKey
from .result import Status, TrialResult
from .runner import EvaluatorConfig, RunInput, Runner
from .search import Proposal, SearchStrategy
from .store import StoredTrial

SEARCH, BASELINE, WARM = "search", "baseline", "warm"
# The lowering starts go to the seed schedule's fastest points, not to every point: in the 13
# tunings of H200 runs 33-34 the best start's point was the seed's fastest (11) or its second
# (2), while a large grid paid 192 starts before the search; the third is a margin.
START_POINTS = 3
POLL_SECONDS = 0.5  # how often the loop looks at what is in flight, or asks again after LATER
MAX_REFUSALS = 200  # proposals refused beyond what is known or taken before the space counts as exhausted
BASELINE_KINDS = ("seed", "default", "no_ws", "role_based", "reference")


class ReferenceFails(Exception):
    """The kernel file's reference fails at this problem: no candidate can be checked, so
    nothing is timed (the message is one line)."""


@dataclass(frozen=True)
class TaskRef:
    """How a worker process finds the task again: the kernel file, its hash, the problem."""

    kernel_path: str
    source_hash: str
    problem: dict[str, Any]

    def build_input(self, candidate: Candidate) -> BuildInput:
        return BuildInput(self.kernel_path, self.source_hash, self.problem, candidate)

    def run_input(self, candidate: Candidate, config: EvaluatorConfig, anchor: Candidate | None) -> RunInput:
        return RunInput(self.kernel_path, self.source_hash, self.problem, candidate, config, anchor)


@dataclass
class Slot:
    """A place for one measurement, handed out by the recorder."""

    role: str  # SEARCH, BASELINE or WARM
    candidate: Candidate | None = None  # set: measure this (a baseline, a retry); None: ask the strategy
    decisions: dict[str, Any] = field(default_factory=dict)
    token: Any = None  # the strategy's handle of the proposal (an Optuna trial), for a retried slot
    handle: Any = None  # the recorder's own (a lease)


class Later:
    """``Recorder.claim``'s answer when its next places wait for results in flight
    (the lowering starts wait for the baselines): ask again once one is in."""

    def __repr__(self) -> str:
        return "LATER"


LATER = Later()


class Assignment:
    ASSIGNED, DUPLICATE, LOST = "assigned", "duplicate", "lost"


class Recorder(abc.ABC):
    """Where the pipeline's places come from and its results go."""

    @abc.abstractmethod
    def claim(self) -> Slot | Later | None:
        """A place for one more measurement; LATER when the next ones wait for results
        in flight; None when there is none (budget spent, stopping)."""

    def assign(self, slot: Slot, proposal: Proposal) -> str:
        """Bind a proposed candidate to the slot: ASSIGNED, DUPLICATE (another slot has it) or LOST."""
        return Assignment.ASSIGNED

    def release(self, slot: Slot, *, exhausted: bool) -> None:
        """Give a claimed slot back unused (``exhausted``: the strategy has nothing more)."""

    def reuse(self, slot: Slot, known: TrialResult) -> None:
        """A slot whose candidate has a result already (an earlier run's): nothing is measured."""
        self.release(slot, exhausted=False)

    @abc.abstractmethod
    def record(self, slot: Slot, candidate: Candidate, result: TrialResult) -> bool:
        """Keep a result; False if it was refused (a lease lost meanwhile)."""

    @abc.abstractmethod
    def record_confirmed(self, results: Sequence[tuple[Candidate, TrialResult]]) -> None:
        """Keep the tournament's results, all at once (each replaces its candidate's earlier one)."""

    def taken(self) -> set[str]:
        """Candidates other slots hold (other workers of a job); refreshed after a DUPLICATE."""
        return set()

    def stopping(self) -> bool:
        """Whether to abandon what is in flight now (a second SIGTERM)."""
        return False


@dataclass
class TrialRecord:
    candidate: Candidate
    result: TrialResult
    role: str  # SEARCH, BASELINE or WARM
    cached: bool = False  # reused from the store, not measured again


@dataclass
class TuneReport:
    key: Any  # the WorkloadKey
    workload_id: int
    compile_only: bool
    records: list[TrialRecord] = field(default_factory=list)
    anchor: Candidate | None = None
    pruned: int = 0
    searched_before: int = 0  # search candidates earlier runs stored: they count against the budget
    shared: int = 0  # candidates that shared another's measurement (the same generated code)
    confirmed: int = 0  # results re-timed in the final tournament
    interrupted: bool = False
    stored: int = 0  # trials this run committed to the store
    out_of_time: bool = False  # the time budget ended the search before its budget of candidates was spent
    wall_seconds: float = 0.0
    search_seconds: float = 0.0  # building and measuring the candidates (the anchor and the tournament apart)
    tournament_seconds: float = 0.0

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.records:
            out[r.result.status.value] = out.get(r.result.status.value, 0) + 1
        return out

    @property
    def same_code(self) -> int:
        """Records whose generated code an earlier record's is too (compile-only measures
        none, so ``shared`` stays 0 there: tilelang's lowerings of a kernel with nothing to
        specialize build one kernel three times)."""
        codes = [code for r in self.records if (code := r.result.info.get("code_hash"))]
        return len(codes) - len(set(codes))

    @property
    def searched(self) -> int:
        """Search candidates in the report, stored by earlier runs or measured in this one."""
        return sum(r.role == SEARCH for r in self.records)

    @property
    def wrong_fraction(self) -> float | None:
        """Of the candidates the search measured in this run, the share the correctness
        gate stored as WRONG (issue 9's goal: under 2%); None when none was measured."""
        searched = [r for r in self.records if r.role != BASELINE and not r.cached  # run on a GPU, not only built
                    and r.result.status is not Status.BUILT and not r.result.status.is_build_failure]
        return sum(r.result.status is Status.WRONG for r in searched) / len(searched) if searched else None

    @staticmethod
    def best_of(records: Iterable[TrialRecord]) -> TrialRecord | None:
        """The best correct, timed record of ``records`` (TrialResult.rank_key: confirmed first, then by ratio)."""
        ok = [r for r in records if r.result.status is Status.OK and r.result.timing]
        return min(ok, key=lambda r: r.result.rank_key()) if ok else None

    @property
    def best(self) -> TrialRecord | None:
        """The best correct schedule found (the seed schedule included): confirmed first, then by ratio."""
        return self.best_of(self.found())

    def found(self) -> list[TrialRecord]:
        """What the search measured, and the seed: every record but tilelang's own lowerings and the references."""
        return [r for r in self.records if r.role != BASELINE or r.candidate.lowering is Lowering.WS]

    def baseline(self, kind: str) -> TrialRecord | None:
        """Best of one baseline: one of BASELINE_KINDS (the reference with vendor libraries)."""
        return self.best_of(of_kind(self.records, kind))

    def contenders(self, kind: str, margin: float, most: int) -> list[TrialRecord]:
        """One baseline's points that may be its best: within ``margin`` of its best
        search ratio, best first, at most ``most``; and the one of least search time, where
        that is another (a clock that moved between a point and its anchor's timing can hide
        the best: gather_gemm's no_ws ran 527.7 TFLOP/s 3.4% behind its kind's best ratio,
        whose point the tournament put at 452.1, H200 run 34)."""
        ok = sorted((r for r in of_kind(self.records, kind) if r.result.status is Status.OK and r.result.ratio is not None),
                    key=lambda r: r.result.rank_key())  # fmt: skip
        near = [r for r in ok if r.result.ratio <= ok[0].result.ratio * (1 + margin)][:most] if ok else []
        fastest = min((r for r in ok if r.result.timing), key=lambda r: r.result.timing.median_ms, default=None)
        return near + ([fastest] if fastest is not None and all(r is not fastest for r in near) else [])


def of_kind(records: Iterable[TrialRecord], kind: str) -> Iterable[TrialRecord]:
    """The records of one of BASELINE_KINDS: the seed schedule's, or one lowering's."""
    if kind == "seed":
        return (r for r in records if r.role == BASELINE and r.candidate.lowering is Lowering.WS)
    return (r for r in records if r.candidate.lowering.value == kind)


def start_points(records: Iterable[TrialRecord], seeds: Mapping[ParamsKey, str]) -> list[ParamsKey]:
    """Where the lowering starts are measured once the seed schedule's baselines are in:
    the points of ``seeds`` (each measured point's seed candidate, by hash) whose seed is
    one of the START_POINTS fastest (by search ratio), fastest first (points that share
    a seed in ``seeds``' order); all of them, in that order, where none was timed
    (compile-only, a seed wrong everywhere). Points, not the seeds' own parameters: where
    the schedule overrides a kernel parameter (a thread count), several points share one
    seed, and the starts differ between them."""
    timed = sorted((r for r in of_kind(records, "seed") if r.result.status is Status.OK and r.result.ratio is not None),
                   key=lambda r: r.result.rank_key())  # fmt: skip
    leading = list(dict.fromkeys(r.candidate.hash for r in timed if r.candidate.hash in seeds.values()))[:START_POINTS]
    return [p for seed in leading for p, s in seeds.items() if s == seed] or list(seeds)


Listener = Callable[[str, "TrialRecord | None"], None]


@dataclass(frozen=True)
class PipelineOptions:
    max_in_flight: int = 2  # candidates being built or measured at once
    confirm_top: int = 5  # leaders entered into the final tournament, beside the best of each baseline
    # ... and every other point of a baseline within this of its best by search timing
    # (at most confirm_top a kind): search timings of near points often swap in the
    # tournament, and a baseline must not lose by the one point picked. Two no_ws points
    # 1.6% apart by search ratio were 2.9% apart the other way in the tournament (H200 run 34).
    confirm_margin: float = 0.05
    evaluator: EvaluatorConfig = field(default_factory=EvaluatorConfig)


class Pipeline:
    """Moves candidates through build and run, for one task and one recorder."""

    def __init__(
        self,
        ref: TaskRef,
        *,
        builder: Builder,
        runner: Runner | None,
        strategy: SearchStrategy,
        recorder: Recorder,
        report: TuneReport,
        known: dict[str, StoredTrial],
        options: PipelineOptions = PipelineOptions(),
        listener: Listener | None = None,
    ) -> None:
        self.ref, self.builder, self.runner, self.strategy = ref, builder, runner, strategy
        self.recorder, self.report, self.options = recorder, report, options
        self.known = known
        self.listener = listener or (lambda event, record: None)
        self.anchor: Candidate | None = None
        self._in_flight: dict[Future, _Work] = {}
        self._proposed: set[str] = set(known)
        self._results: dict[str, TrialResult] = {}  # candidate hash -> its result, this run
        self._measured: dict[str, TrialResult] = {}  # generated-code hash -> its measurement
        self._waiting: dict[str, list[_Work]] = {}  # generated-code hash -> built candidates sharing a run in flight
        self._time_budget = math.inf  # seconds of search (run)
        self._search_started: float | None = None  # when the first search place was asked for
        for trial in known.values():
            code = trial.result.info.get("code_hash")
            if code and trial.result.status is not Status.BUILT and "shared_with" not in trial.result.info:
                self._measured.setdefault(code, trial.result)

    # --- the anchor -----------------------------------------------------------------
    def choose_anchor(self, candidates: Iterable[Candidate]) -> Candidate | None:
        """The first of ``candidates`` that runs correctly alone (the runner compiles it:
        one kernel, from tilelang's cache after its first build): every later
        measurement is side by side with it. None without a runner."""
        if self.runner is None:
            return None
        for candidate in candidates:
            result = self.runner.submit(self.ref.run_input(candidate, self.options.evaluator, None)).result()
            if result.status is Status.OK:
                self.anchor = candidate
                self.report.anchor = candidate
                return candidate
            if candidate.lowering is Lowering.REFERENCE and not candidate.params:
                # Every check runs it: 108 candidates of a backward pass each failed on the reference's
                # CUDA out of memory (an H100, run 42), and none was timed.
                larger = " (a smaller --shape fits)" if "out of memory" in result.message.lower() else ""
                raise ReferenceFails(f"the kernel file's reference fails at this problem, and every candidate's check runs it: "
                                     f"{result.status.value}: {result.message}{larger}")  # fmt: skip
        return None

    # --- the loop -------------------------------------------------------------------
    def run(self, time_budget: float | None = None) -> None:
        """Claim, propose, build, run and record until the recorder has no more
        places and nothing is in flight. ``time_budget`` is the search's own clock, in
        seconds: it starts when the recorder hands out the first search place, after the
        baselines and warm starts (a grid of 90 kernel-parameter points has some 400 of
        them, which a clock from the start spent before any search), and past it no
        search place is taken, while whatever is in flight is measured and recorded (as
        Optuna's timeout lets a running trial finish). The builder's and runner's
        timeouts bound the wait."""
        start = time.monotonic()
        self._time_budget = math.inf if time_budget is None else time_budget
        try:
            self._loop()
        finally:
            self.report.search_seconds += time.monotonic() - start

    def _loop(self) -> None:
        claiming: bool | Later = True
        while True:
            if self.recorder.stopping():
                break
            while claiming is True and len(self._in_flight) < self.options.max_in_flight:
                claiming = self._claim_one()
            if self._in_flight:
                done, _ = wait(list(self._in_flight), timeout=POLL_SECONDS, return_when=FIRST_COMPLETED)
                for fut in done:
                    self._advance(fut, self._in_flight.pop(fut))
            elif claiming is LATER:
                time.sleep(POLL_SECONDS)  # what the places wait for is in another worker's hands
            else:
                break
            if claiming is LATER:
                claiming = True

    def _searching(self) -> bool:
        """Whether the search's clock leaves time for one more place; the first asking starts it."""
        if self._search_started is None:
            self._search_started = time.monotonic()
        return time.monotonic() - self._search_started < self._time_budget

    def abandon(self) -> list[Slot]:
        """Stop now: cancel what is in flight and hand its slots to the caller."""
        slots = [work.slot for work in self._in_flight.values()]
        for fut in self._in_flight:
            fut.cancel()
        self._in_flight.clear()
        return slots

    def _claim_one(self) -> bool | Later:
        slot = self.recorder.claim()
        if slot is None:
            return False
        if isinstance(slot, Later):
            return LATER
        if slot.candidate is None and not self._searching():
            self.report.out_of_time = True
            self.recorder.release(slot, exhausted=True)
            return False
        if slot.candidate is not None and (done := self._result_of(slot.candidate.hash)) is not None:
            self.recorder.reuse(slot, done)
            return True
        # A slot whose candidate this run proposed but never recorded (its lease expired
        # while the trial was in flight, and the queue handed it out again) is measured anew.
        proposal, exhausted = self._proposal(slot)
        if proposal is None:
            self.recorder.release(slot, exhausted=exhausted)
            return False
        self._proposed.add(proposal.candidate.hash)
        self._in_flight[self.builder.submit(self.ref.build_input(proposal.candidate))] = _Work(slot, proposal)
        return True

    def _result_of(self, digest: str) -> TrialResult | None:
        """What this run recorded for a candidate, else what the store held before it."""
        known = self.known.get(digest)
        return self._results.get(digest) or (known.result if known else None)

    def _proposal(self, slot: Slot) -> tuple[Proposal | None, bool]:
        """The slot's own candidate, else the strategy's next unseen one; (None, True) when it has none."""
        if slot.candidate is not None:
            return Proposal(slot.candidate, dict(slot.decisions), token=slot.token), False
        taken = self.recorder.taken()
        # Skipping what is known, proposed or taken is bounded by how much is (and what is
        # taken grows as other workers of a job take more); beyond that, a run of refusals
        # means the strategy has nothing new.
        tries = 0
        while tries < len(self.known) + len(self._proposed) + len(taken) + MAX_REFUSALS:
            tries += 1
            proposals = self.strategy.propose(1)
            if not proposals:
                return None, True
            proposal = proposals[0]
            digest = proposal.candidate.hash
            if digest in self.known:  # measured before (an earlier run or job): the strategy learns it
                self.strategy.skip(proposal, self.known[digest].result)
                continue
            if digest in self._proposed:  # a baseline or warm start of this run (the seed point is the seed)
                done = self._results.get(digest)
                self.strategy.skip(proposal, done)  # None: being measured already in this run
                continue
            if digest in taken:
                self.strategy.skip(proposal, None)  # another trial of the job has it
                continue
            outcome = self.recorder.assign(slot, proposal)
            if outcome == Assignment.ASSIGNED:
                return proposal, False
            if outcome == Assignment.DUPLICATE:
                taken = self.recorder.taken()
                self.strategy.skip(proposal, None)
                continue
            self.strategy.skip(proposal, None)  # the lease was lost before the trial started
            return None, False
        return None, True

    def _advance(self, fut: Future, work: _Work) -> None:
        if work.build is None:
            build: BuildResult = fut.result()
            work.build = build
            if not build.ok or self.runner is None:
                self._finish(work, TrialResult(work.proposal.candidate.hash, build.status, build.message, build_seconds=build.seconds,
                                               info=_code_info(build)))  # fmt: skip
                return
            code = build.code_hash
            if code and code in self._measured:
                self._finish(work, _shared(self._measured[code], work))
                return
            if code and code in self._waiting:
                self._waiting[code].append(work)
                return
            if code:
                self._waiting[code] = []
            run_input = self.ref.run_input(work.proposal.candidate, self.options.evaluator, self.anchor)
            self._in_flight[self.runner.submit(run_input)] = work
            return
        result: TrialResult = fut.result()
        result = dataclasses.replace(result, build_seconds=work.build.seconds, info={**result.info, **_code_info(work.build)})
        self._finish(work, result)
        code = work.build.code_hash
        if code:
            if result.status is not Status.CRASH and result.status is not Status.TIMEOUT:
                self._measured[code] = result  # a crash may be the worker's, not the code's: not shared
            for other in self._waiting.pop(code, []):
                self._finish(other, _shared(result, other))

    def _finish(self, work: _Work, result: TrialResult) -> None:
        proposal, slot = work.proposal, work.slot
        # The role and the sampler's decisions travel with the result, for resuming.
        result = dataclasses.replace(result, info={**result.info, "role": slot.role, "decisions": proposal.decisions})
        if not self.recorder.record(slot, proposal.candidate, result):
            return
        self._results[proposal.candidate.hash] = result
        if result.info.get("shared_with"):
            self.report.shared += 1
        if slot.role == SEARCH:
            self._notify(proposal, result)
        self._add(TrialRecord(proposal.candidate, result, slot.role))

    def _add(self, record: TrialRecord) -> None:
        self.report.records.append(record)
        self.listener("trial", record)

    def _notify(self, proposal: Proposal, result: TrialResult) -> None:
        self.strategy.notify(proposal, result)

    # --- the final tournament ---------------------------------------------------------
    def confirm(self) -> list[TrialRecord]:
        """Re-time the leaders and the best of every baseline (and its near rivals), all together."""
        if self.runner is None or not self.options.confirm_top:
            return []
        report = self.report
        leaders = sorted((r for r in report.found() if r.result.status is Status.OK and r.result.timing),
                         key=lambda r: r.result.rank_key())[: self.options.confirm_top]  # fmt: skip
        o = self.options
        baselines = [r for kind in BASELINE_KINDS for r in report.contenders(kind, o.confirm_margin, o.confirm_top)]
        chosen = {r.candidate.hash: r for r in leaders + baselines}
        if len(chosen) < 2 and not leaders:
            return []
        self.listener("confirm", None)
        anchor = self.anchor or next(iter(chosen.values())).candidate
        inputs = [self.ref.run_input(r.candidate, self.options.evaluator, anchor) for r in chosen.values()]
        out = []
        position = {r.candidate.hash: i for i, r in enumerate(report.records)}
        start = time.monotonic()
        results = self.runner.tournament(inputs)
        report.tournament_seconds += time.monotonic() - start
        for result in results:
            record = chosen[result.candidate_hash]
            if result.status is not Status.OK:
                continue
            confirmed = dataclasses.replace(
                result, build_seconds=record.result.build_seconds,
                info={**record.result.info, **result.info, "search_ratio": record.result.ratio,
                      "search_median_ms": record.result.timing.median_ms if record.result.timing else None},
            )  # fmt: skip
            out.append(TrialRecord(record.candidate, confirmed, record.role, record.cached))
            report.records[position[record.candidate.hash]] = out[-1]
        # One transaction for the lot: the tournament ends together, and a result is not worth a commit each.
        self.recorder.record_confirmed([(r.candidate, r.result) for r in out])
        report.confirmed = len(out)
        return out


@dataclass
class _Work:
    slot: Slot
    proposal: Proposal
    build: BuildResult | None = None


def _code_info(build: BuildResult) -> dict[str, Any]:
    return {"code_hash": build.code_hash} if build.code_hash else {}


def _shared(result: TrialResult, work: _Work) -> TrialResult:
    """Another candidate's measurement, for a candidate that compiled to the same code."""
    assert work.build is not None
    return dataclasses.replace(
        result, candidate_hash=work.proposal.candidate.hash, build_seconds=work.build.seconds, confirmed=False,
        info={**result.info, **_code_info(work.build), "shared_with": result.candidate_hash},
    )  # fmt: skip
