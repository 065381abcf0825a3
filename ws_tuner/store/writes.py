"""Trial writes: the candidate insert and the trial upsert, built once per dialect
(building and keying a statement cost about as much as running it), run as Core
statements with bound values, one by one or many in one transaction.

The rules (``Store.commit_trial``): one row per (workload, candidate); a later
result replaces an earlier one, except that a BUILT result never replaces a final
outcome. Candidates are immutable and shared across workloads: inserted once,
never updated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from sqlalchemy import bindparam, func, or_, select
from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from ..candidate import Candidate, canonical_json
from ..result import Status, TrialResult
from .engine import Sql, utc
from .models import CandidateModel, TrialModel
from .records import StoredTrial, dumps, stored_result

_candidates, _trials = CandidateModel.__table__, TrialModel.__table__
_VALUES = (
    "status",
    "message",
    "build_seconds",
    "median_ms",
    "p20_ms",
    "p80_ms",
    "reps",
    "tflops",
    "gbps",
    "ratio",
    "confirmed",
    "info",
)


@dataclass(frozen=True)
class _Statements:
    insert_candidate: Any
    upsert_trial: Any  # RETURNING the stored row (none when a BUILT result was refused)
    upsert_trials: Any  # the same without RETURNING, for many rows at once


@cache
def _statements(dialect: str) -> _Statements:
    sql = Sql(dialect)
    candidate = (
        sql.upsert(_candidates)
        .values(hash=bindparam("hash"), lowering=bindparam("lowering"), params=bindparam("params"),
                schedule=bindparam("schedule"))
        .on_conflict_do_nothing(index_elements=["hash"])
    )  # fmt: skip
    candidate_id = select(_candidates.c.id).where(_candidates.c.hash == bindparam("hash")).scalar_subquery()
    insert = sql.upsert(_trials).values(
        workload_id=bindparam("workload_id"),
        candidate_id=candidate_id,
        **{name: bindparam(name) for name in _VALUES},
    )
    # A single atomic upsert rather than read-then-write: two workers committing
    # the same trial cannot both insert.
    upsert = insert.on_conflict_do_update(
        index_elements=["workload_id", "candidate_id"],
        # ON CONFLICT skips ORM onupdate hooks, so updated_at is set here.
        set_={
            **{name: insert.excluded[name] for name in _VALUES},
            "updated_at": func.now(),
        },
        where=or_(
            insert.excluded.status != Status.BUILT.value,
            _trials.c.status == Status.BUILT.value,
        ),
    )
    return _Statements(candidate, upsert.returning(*_trials.c), upsert)


def _rows(workload_id: int, candidate: Candidate, result: TrialResult) -> tuple[dict[str, Any], dict[str, Any]]:
    """The candidate's row and the trial's bound values."""
    if result.candidate_hash != candidate.hash:
        raise ValueError(f"result is for candidate {result.candidate_hash}, not {candidate.hash}")
    timing = result.timing
    schedule = candidate.schedule
    cand = {
        "hash": candidate.hash,
        "lowering": candidate.lowering.value,
        "params": canonical_json(candidate.param_dict),
        "schedule": canonical_json(schedule.to_json()) if schedule is not None else None,
    }
    trial = {
        "workload_id": workload_id,
        "hash": candidate.hash,
        "status": Status(result.status).value,
        "message": result.message,
        "build_seconds": result.build_seconds,
        "median_ms": timing.median_ms if timing else None,
        "p20_ms": timing.p20_ms if timing else None,
        "p80_ms": timing.p80_ms if timing else None,
        "reps": timing.reps if timing else None,
        "tflops": result.tflops,
        "gbps": result.gbps,
        "ratio": result.ratio,
        "confirmed": result.confirmed,
        "info": dumps(result.info),
    }
    return cand, trial


def upsert_trial(
    db: Session | Connection,
    sql: Sql,
    *,
    workload_id: int,
    candidate: Candidate,
    result: TrialResult,
) -> StoredTrial | None:
    """One trial inside the caller's transaction; what is stored afterwards, or None
    when a BUILT result was refused (the caller re-reads the row if it needs it)."""
    cand, trial = _rows(workload_id, candidate, result)
    statements = _statements(sql.dialect)
    db.execute(statements.insert_candidate, cand)
    row = db.execute(statements.upsert_trial, trial).first()
    if row is None:
        return None
    # The candidate row holds this candidate (same hash): no need to read it back.
    return StoredTrial(
        candidate,
        stored_result(candidate.hash, row),
        row.workload_id,
        utc(row.created_at),
        utc(row.updated_at),
    )


def upsert_trials(
    db: Session | Connection,
    sql: Sql,
    *,
    workload_id: int,
    items: Sequence[tuple[Candidate, TrialResult]],
) -> None:
    """Many trials inside the caller's transaction, each statement sent once for all
    of them (executemany); nothing is read back."""
    if not items:
        return
    rows = [_rows(workload_id, candidate, result) for candidate, result in items]
    # Candidates in hash order: two batches sharing candidates lock them in one order (no deadlock).
    candidates = sorted({cand["hash"]: cand for cand, _ in rows}.values(), key=lambda c: c["hash"])
    statements = _statements(sql.dialect)
    db.execute(statements.insert_candidate, candidates)
    # Trials too (a stable sort: a candidate given twice keeps its later result).
    db.execute(
        statements.upsert_trials,
        sorted((trial for _, trial in rows), key=lambda t: t["hash"]),
    )
