"""A job's trial slots and the leases workers hold on them, in SQL.

* A job's budget is a number of search *slots*. ``claim_slot`` takes one
  atomically (``UPDATE ... SET slots_claimed = slots_claimed + 1 WHERE
  slots_claimed < budget``), so any number of workers sharing a job never
  measure more than ``budget`` search candidates.
* A slot being worked on is RUNNING with an owner, a heartbeat stamped by the
  database clock, and an ``epoch`` (fencing token). ``finish_slot`` records
  the result only under the epoch the slot was claimed with, and writes the
  trial (``ws_tune_trials``, an upsert) in the same transaction: a measured
  trial is recorded exactly once, or not at all if the lease was lost.
* A slot handed back (``release_slot``, or a worker leaving) is re-queued for
  any worker with a new epoch; the attempt does not count as a failure.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from sqlalchemy import and_, delete, false, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from ..candidate import Candidate
from ..result import Status, TrialResult
from .engine import Sql, utc
from .jobs import BASELINE, DONE, QUEUED, RUNNING, SEARCH
from .models import JobModel, JobTrialModel
from .records import JobTrialRecord, SlotLease, job_trial_record, slot_lease
from .repository import OnStore
from .writes import upsert_trials

# assign_candidate outcomes.
ASSIGNED, DUPLICATE, LOST = "assigned", "duplicate", "lost"


def hand_back(session: Session, sql: Sql, *where: Any) -> int:
    """Re-queue the RUNNING slots matching ``where`` for any worker, under a new
    epoch (the old lease's result is refused); the attempt does not count as a
    failure. Returns how many."""
    return session.execute(
        update(JobTrialModel)
        .where(JobTrialModel.state == RUNNING, *where)
        .values(state=QUEUED, worker_id=None, epoch=JobTrialModel.epoch + 1,
                attempts=sql.greatest(JobTrialModel.attempts - 1, 0))
    ).rowcount  # fmt: skip


def _fence(lease: SlotLease) -> Any:
    """The slot, still held under the lease's epoch."""
    return and_(JobTrialModel.id == lease.id, JobTrialModel.epoch == lease.epoch, JobTrialModel.state == RUNNING)


class Leases(OnStore):
    """Slots: claimed under a lease, bound to a candidate, finished or handed back."""

    def claim_slot(self, job_id: int, worker_id: str, *, search: bool = True) -> SlotLease | None:
        """A slot of the job for this worker: a queued one (a retry, a handed-back
        or baseline slot) first, else (``search``) a new search slot while the budget
        lasts. None when the job has nothing to claim (or is no longer running)."""
        with self.store.session_scope() as session:
            now = self.sql.now()
            queued = session.scalar(
                self.sql.skip_locked(
                    select(JobTrialModel.id)
                    .join(JobModel, JobModel.id == JobTrialModel.job_id)
                    .where(JobTrialModel.job_id == job_id, JobTrialModel.state == QUEUED, JobModel.state == RUNNING)
                    .order_by(JobTrialModel.id)
                    .limit(1),
                    of=JobTrialModel,
                )
            )
            if queued is not None:
                session.execute(
                    update(JobTrialModel)
                    .where(JobTrialModel.id == queued)
                    .values(state=RUNNING, worker_id=worker_id, epoch=JobTrialModel.epoch + 1,
                            attempts=JobTrialModel.attempts + 1, heartbeat_at=now)
                )  # fmt: skip
                row = session.get(JobTrialModel, queued, populate_existing=True)
                assert row is not None
                return slot_lease(row)
            if not search:
                return None
            job = session.execute(
                select(JobModel.time_budget, JobModel.state).where(JobModel.id == job_id)
            ).first()
            if job is None or job.state != RUNNING:
                return None
            if job.time_budget is not None:
                # The search's own clock, as the CLI's (Pipeline.run): it starts with the job's first search slot.
                first = session.scalar(select(func.min(JobTrialModel.created_at)).where(JobTrialModel.job_id == job_id, JobTrialModel.kind == SEARCH))
                elapsed = 0.0 if first is None else (self.sql.clock(session) - utc(first)).total_seconds()
                if elapsed >= job.time_budget:
                    session.execute(update(JobModel).where(JobModel.id == job_id).values(exhausted=True, updated_at=self.sql.now()))
                    return None
            claimed = session.scalar(
                update(JobModel)
                .where(JobModel.id == job_id, JobModel.state == RUNNING,
                       JobModel.slots_claimed < JobModel.budget, JobModel.exhausted == false())
                .values(slots_claimed=JobModel.slots_claimed + 1, updated_at=now)
                .returning(JobModel.slots_claimed)
            )  # fmt: skip
            if claimed is None:
                return None
            row = JobTrialModel(
                job_id=job_id, slot=claimed - 1, kind=SEARCH, state=RUNNING, attempts=1, epoch=1,
                worker_id=worker_id, heartbeat_at=now, created_at=now,  # milliseconds on SQLite too: the search's clock
            )  # fmt: skip
            session.add(row)
            session.flush()
            session.refresh(row)
            return slot_lease(row)

    def assign_candidate(
        self,
        lease: SlotLease,
        candidate: Candidate,
        decisions: dict[str, Any] | None = None,
        optuna_trial: int | None = None,
        *,
        workload_id: int | None = None,
    ) -> str:
        """Bind the proposed candidate to the slot: ASSIGNED, DUPLICATE (another slot
        of the job has it) or LOST (the lease expired). The workload is where a
        crash is recorded if the candidate ends up quarantined."""
        values = {
            "candidate_hash": candidate.hash,
            "candidate": candidate.canonical(),
            "decisions": json.dumps(decisions or {}, sort_keys=True, default=str),
            "optuna_trial": optuna_trial,
            "workload_id": workload_id,
        }
        with self.store.session_scope() as session:
            taken = session.scalar(
                select(JobTrialModel.id).where(JobTrialModel.job_id == lease.job_id, JobTrialModel.candidate_hash == candidate.hash)
            )
            if taken is not None:
                return DUPLICATE if taken != lease.id else ASSIGNED
            try:
                with session.begin_nested():
                    result = session.execute(update(JobTrialModel).where(_fence(lease)).values(**values))
            except IntegrityError:  # lost a race for the same candidate with another slot
                return DUPLICATE
            return ASSIGNED if result.rowcount == 1 else LOST

    def job_candidate_hashes(self, job_id: int) -> set[str]:
        """The candidates the job's slots hold (any state)."""
        with self.store.session_scope(read_only=True) as session:
            rows = session.scalars(
                select(JobTrialModel.candidate_hash).where(JobTrialModel.job_id == job_id, JobTrialModel.candidate_hash.is_not(None))
            )
            return set(rows)

    def finish_slot(self, lease: SlotLease, *, workload_id: int, candidate: Candidate, result: TrialResult) -> bool:
        """Record the slot's result, fenced by its epoch: the slot is closed and the
        trial upserted in one transaction. False (nothing written) if the lease was lost."""
        timing = result.timing
        with self.store.session_scope() as session:
            now = self.sql.now()
            closed = session.execute(
                update(JobTrialModel)
                .where(_fence(lease))
                .values(
                    state=DONE, status=Status(result.status).value, message=(result.message or "")[:4000],
                    median_ms=timing.median_ms if timing else None, tflops=result.tflops, gbps=result.gbps, ratio=result.ratio,
                    workload_id=workload_id, finished_at=now, heartbeat_at=now,
                    candidate_hash=candidate.hash, candidate=candidate.canonical(),
                )
            )  # fmt: skip
            if closed.rowcount != 1:
                return False
            upsert_trials(session, self.sql, workload_id=workload_id, items=[(candidate, result)])
            return True

    def release_slot(self, lease: SlotLease, *, exhausted: bool = False) -> bool:
        """Hand a slot back. Normally it is re-queued for any worker (the attempt
        does not count as a failure); ``exhausted``: the search space ran dry, so
        the slot is dropped and the job claims no more."""
        with self.store.session_scope() as session:
            if exhausted:
                session.execute(update(JobModel).where(JobModel.id == lease.job_id).values(exhausted=True, updated_at=self.sql.now()))
                result = session.execute(delete(JobTrialModel).where(_fence(lease), JobTrialModel.candidate_hash.is_(None)))
                if result.rowcount == 1:
                    return True
            return hand_back(session, self.sql, _fence(lease)) == 1

    def slots_pending(self, job_id: int, candidate_hashes: Iterable[str]) -> bool | None:
        """Whether slots of the job for these candidates are queued or in flight (the seed
        schedule's baselines, which the lowering starts wait for); None when the job is no
        longer running."""
        with self.store.session_scope(read_only=True) as session:
            if session.scalar(select(JobModel.state).where(JobModel.id == job_id)) != RUNNING:
                return None
            open_slot = select(JobTrialModel.id).where(JobTrialModel.job_id == job_id, JobTrialModel.state.in_([QUEUED, RUNNING]),
                                                       JobTrialModel.candidate_hash.in_(list(candidate_hashes)))  # fmt: skip
            return session.scalar(open_slot.limit(1)) is not None

    def add_baseline_slots(self, job_id: int, candidates: Iterable[Candidate], *, kind: str = BASELINE) -> int:
        """Queue the baselines (or the warm start) of a job: not counted in its search budget."""
        added = 0
        with self.store.session_scope() as session:
            for candidate in candidates:
                stmt = self.sql.upsert(JobTrialModel).values(
                    job_id=job_id, slot=None, kind=kind, state=QUEUED, attempts=0, epoch=0,
                    candidate_hash=candidate.hash, candidate=candidate.canonical(), decisions="{}",
                )  # fmt: skip
                added += session.execute(stmt.on_conflict_do_nothing(index_elements=["job_id", "candidate_hash"])).rowcount
        return added

    def job_trials(
        self, job_id: int, *, state: str | None = None, limit: int = 100, offset: int = 0
    ) -> tuple[list[JobTrialRecord], int]:
        query = select(JobTrialModel).where(JobTrialModel.job_id == job_id)
        count = select(func.count()).select_from(JobTrialModel).where(JobTrialModel.job_id == job_id)
        if state is not None:
            query = query.where(JobTrialModel.state == state)
            count = count.where(JobTrialModel.state == state)
        with self.store.session_scope(read_only=True) as session:
            rows = session.scalars(query.order_by(JobTrialModel.id).limit(limit).offset(offset)).all()
            return [job_trial_record(r) for r in rows], int(session.scalar(count) or 0)
