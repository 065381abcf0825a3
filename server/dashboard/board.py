"""What the dashboard shows of one workload, from its stored trials: the
leaderboard (the winner and the best of every baseline), the trials in the
order they were stored with the best so far, and the winner's schedule beside
the seed's. Read-only; the same ranking as the command line's report."""

from __future__ import annotations

import difflib
import itertools
from dataclasses import dataclass

from ...candidate import Candidate, Lowering
from ...pipeline import BASELINE, BASELINE_KINDS, SEARCH, TrialRecord, TuneReport
from ...result import Status, TrialResult
from ...store import StoredTrial

# Leaderboard rows: the CLI's speed table.
ROWS = (("ws-tune best", None),) + tuple((kind, kind) for kind in BASELINE_KINDS)


@dataclass(frozen=True)
class Row:
    name: str
    candidate_hash: str | None = None
    label: str | None = None
    tflops: float | None = None
    gbps: float | None = None
    median_ms: float | None = None
    ratio: float | None = None
    confirmed: bool = False


@dataclass(frozen=True)
class Point:
    n: int  # 1-based position among the workload's search trials (the seed and warm starts included)
    role: str
    status: str
    candidate_hash: str
    tflops: float | None
    gbps: float | None
    ratio: float | None
    median_ms: float | None
    best_tflops: float | None  # TFLOP/s of the best trial so far


@dataclass(frozen=True)
class DiffLine:
    op: str  # "same", "changed", "removed" (the seed's only) or "added" (the winner's only)
    seed: str | None
    best: str | None


@dataclass(frozen=True)
class Board:
    rows: list[Row]
    points: list[Point]
    counts: dict[str, int]
    seed_source: str | None
    best_source: str | None
    diff: list[DiffLine]


def board(trials: list[StoredTrial]) -> Board:
    """``trials`` in the order they were stored (``Store.trials_by_hash``)."""
    report = TuneReport(key=None, workload_id=0, compile_only=False)
    report.records = [TrialRecord(t.candidate, t.result, t.result.info.get("role", SEARCH), cached=True) for t in trials]
    rows = [_row(name, report.best if kind is None else report.baseline(kind)) for name, kind in ROWS]
    best = report.best
    # The seed's schedule even when nothing was timed (compile-only): the first WS baseline stored.
    seed = next((r.candidate for r in report.records if r.role == BASELINE and r.candidate.lowering is Lowering.WS), None)
    seed_source, best_source = _source(seed), _source(best.candidate if best else None)
    return Board(rows, _points(report.found()), report.counts(), seed_source, best_source, _diff(seed_source, best_source))


def _row(name: str, record: TrialRecord | None) -> Row:
    if record is None:
        return Row(name)
    r = record.result
    return Row(name, record.candidate.hash, record.candidate.describe(), r.tflops, r.gbps, r.timing.median_ms if r.timing else None,
               r.ratio, r.confirmed)  # fmt: skip


def _points(found: list[TrialRecord]) -> list[Point]:
    out: list[Point] = []
    best: TrialResult | None = None  # ranked as the leaderboard ranks: confirmed first, then ratio, then time
    for n, rec in enumerate(found, 1):
        r = rec.result
        if r.status is Status.OK and r.timing is not None and (best is None or r.rank_key() < best.rank_key()):
            best = r
        out.append(Point(n, rec.role, r.status.value, rec.candidate.hash, r.tflops, r.gbps, r.ratio,
                         r.timing.median_ms if r.timing else None, best.tflops if best else None))  # fmt: skip
    return out


def _source(candidate: Candidate | None) -> str | None:
    if candidate is None or candidate.schedule is None:
        return None
    params = " ".join(f"{k}={v}" for k, v in candidate.params)
    return f"# {params}\n{candidate.schedule.to_source()}" if params else candidate.schedule.to_source()


def _diff(seed: str | None, best: str | None) -> list[DiffLine]:
    if seed is None or best is None:
        return []
    a, b = seed.splitlines(), best.splitlines()
    out: list[DiffLine] = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if op == "equal":
            out += [DiffLine("same", x, y) for x, y in zip(a[i1:i2], b[j1:j2])]
        else:
            for x, y in itertools.zip_longest(a[i1:i2], b[j1:j2]):
                out.append(DiffLine("changed" if x is not None and y is not None else "removed" if y is None else "added", x, y))
    return out

