"""The service's job queue: jobs, their trial slots, and workers, in SQL.

Contracts (the worker loop and the API rely on these):

* A job's budget is a number of search *slots*. ``claim_slot`` takes one
  atomically (``UPDATE ... SET slots_claimed = slots_claimed + 1 WHERE
  slots_claimed < budget``), so any number of workers sharing a job never
  measure more than ``budget`` search candidates.
* A slot being worked on is RUNNING with an owner, a heartbeat stamped by the
  database clock, and an ``epoch`` (fencing token). ``finish_slot`` records
  the result only under the epoch the slot was claimed with, and writes the
  trial (``ws_tune_trials``, an upsert) in the same transaction: a measured
  trial is recorded exactly once, or not at all if the lease was lost.
* ``sweep`` re-queues RUNNING slots whose heartbeat is older than the grace
  period (or fails them for good after ``max_retry`` retries). Two sweepers
  racing over one stale slot retry it once: the rows are locked (``FOR UPDATE
  SKIP LOCKED`` on PostgreSQL; SQLite's write transactions are ``BEGIN
  IMMEDIATE`` and so serialized) and each update re-checks the state.
* Jobs are claimed with ``FOR UPDATE SKIP LOCKED`` on PostgreSQL and under
  ``BEGIN IMMEDIATE`` on SQLite. Several workers may work on one job.
* Every method is one short transaction (``Store.session_scope``); database
  failures surface as ``StoreError``. Records come back as frozen dataclasses.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import and_, delete, exists, false, func, insert, or_, select, true, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from ..candidate import Candidate, canonical_json
from ..result import Status, TrialResult
from .guard import DbTimeouts, guard_postgresql
from .models import JobModel, JobTrialModel, KernelModel, WorkerModel
from .repository import Store, StoreError, _upsert_trial, _utc, mask_url

_log = logging.getLogger(__name__)

# Job states.
QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED = "queued", "running", "succeeded", "failed", "cancelled"
JOB_STATES = (QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED)
FINAL_JOB_STATES = (SUCCEEDED, FAILED, CANCELLED)
# Slot states (queued and running are open; the rest are terminal).
DONE = "done"
SLOT_STATES = (QUEUED, RUNNING, DONE, FAILED, CANCELLED)
TERMINAL_SLOT_STATES = (DONE, FAILED, CANCELLED)
# Slot kinds: a search slot counts against the budget; baselines and the warm
# start (the best schedules of the nearest stored problem) come on top.
SEARCH, BASELINE, WARM = "search", "baseline", "warm"
# Worker states.
W_RUNNING, W_DRAINING, W_STOPPED, W_LOST = "running", "draining", "stopped", "lost"
# assign_candidate outcomes.
ASSIGNED, DUPLICATE, LOST = "assigned", "duplicate", "lost"


class JobNotFound(LookupError):
    pass


class JobConflict(RuntimeError):
    """The job is not in a state that allows the operation (e.g. cancelling a finished job)."""


@dataclass(frozen=True)
class JobRecord:
    id: int
    state: str
    kernel: str
    kernel_id: int
    kernel_sha256: str
    problem: dict[str, Any]
    problem_checked: bool
    params: str | None
    strategy: str
    seed: int
    budget: int
    time_budget: float | None
    baselines: bool
    device: str | None
    workload_id: int | None
    slots_claimed: int
    exhausted: bool
    error: str | None
    created_by: int | None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    counts: dict[str, int] = field(default_factory=dict)  # slot state -> how many (search and baseline)
    search_counts: dict[str, int] = field(default_factory=dict)  # the same, search slots only
    best_ms: float | None = None
    best_candidate: str | None = None


@dataclass(frozen=True)
class SlotLease:
    """A slot held by a worker: valid while ``epoch`` is the slot's epoch."""

    id: int
    job_id: int
    slot: int | None
    kind: str
    epoch: int
    attempts: int
    candidate: Candidate | None = None
    decisions: dict[str, Any] = field(default_factory=dict)
    optuna_trial: int | None = None


@dataclass(frozen=True)
class JobTrialRecord:
    id: int
    job_id: int
    slot: int | None
    kind: str
    state: str
    attempts: int
    epoch: int
    worker_id: str | None
    candidate_hash: str | None
    status: str | None
    message: str | None
    median_ms: float | None
    tflops: float | None
    created_at: datetime
    finished_at: datetime | None


@dataclass(frozen=True)
class WorkerRecord:
    id: str
    host: str
    pid: int
    gpu: int | None
    device: str
    state: str
    job_id: int | None
    started_at: datetime
    heartbeat_at: datetime
    stopped_at: datetime | None


@dataclass(frozen=True)
class SweepReport:
    requeued: int = 0
    failed: int = 0
    finished_jobs: int = 0
    lost_workers: int = 0


def _opt_utc(value: datetime | None) -> datetime | None:
    return _utc(value) if value is not None else None


class JobQueue:
    """Jobs, slots and workers in the store's database (shares its engine)."""

    def __init__(self, store: Store, *, stalled_transaction_timeout: float | None = 60.0) -> None:
        self.store = store
        self._pg = store.dialect == "postgresql"
        self.stalled_transaction_timeout = stalled_transaction_timeout if self._pg else None
        if self.stalled_transaction_timeout:
            abort_stalled_transactions(store._engine, self.stalled_transaction_timeout)

    # --- the database clock ---------------------------------------------------
    def _now(self) -> Any:
        # PostgreSQL's now() has microseconds; SQLite's CURRENT_TIMESTAMP only
        # seconds, too coarse for heartbeats, so it gets milliseconds from strftime.
        return func.now() if self._pg else func.strftime("%Y-%m-%d %H:%M:%f", "now")

    def _ago(self, seconds: float) -> Any:
        if self._pg:
            return func.now() - func.make_interval(0, 0, 0, 0, 0, 0, float(seconds))
        return func.strftime("%Y-%m-%d %H:%M:%f", "now", f"-{float(seconds):.3f} seconds")

    def _db_now(self, session: Session) -> datetime:
        value = session.scalar(select(self._now()))
        return _utc(value if isinstance(value, datetime) else datetime.fromisoformat(str(value)))

    # --- jobs -----------------------------------------------------------------
    def create_job(
        self,
        *,
        kernel_id: int,
        kernel: str,
        problem: dict[str, Any],
        problem_checked: bool,
        params: str | None,
        strategy: str,
        seed: int,
        budget: int,
        time_budget: float | None = None,
        baselines: bool = False,
        device: str | None = None,
        created_by: int | None = None,
        kernel_sha256: str | None = None,
    ) -> JobRecord:
        values = dict(
            state=QUEUED, kernel_id=kernel_id, kernel=kernel, problem=canonical_json(problem),
            problem_checked=problem_checked, params=params, strategy=strategy, seed=seed, budget=budget,
            time_budget=time_budget, baselines=baselines, device=device, created_by=created_by,
            slots_claimed=0, exhausted=False,
        )  # fmt: skip
        with self.store.session_scope() as session:
            # One statement: INSERT ... RETURNING hands back the stamped row.
            job = session.scalars(insert(JobModel).values(**values).returning(JobModel)).one()
            sha = kernel_sha256 or session.scalar(select(KernelModel.sha256).where(KernelModel.id == kernel_id))
            return self._records(session, [(job, sha)], counts=False)[0]  # nothing counted yet

    def _job_query(self) -> Any:
        return select(JobModel, KernelModel.sha256).join(KernelModel, JobModel.kernel_id == KernelModel.id)

    def _records(
        self, session: Session, rows: list[Any], *, counts: bool = True
    ) -> list[JobRecord]:
        ids = [job.id for job, _ in rows]
        by_state: dict[int, dict[str, int]] = {i: {} for i in ids}
        search_counts: dict[int, dict[str, int]] = {i: {} for i in ids}
        best: dict[int, float] = {}
        best_hash: dict[int, str] = {}
        if ids and counts:
            q = (
                select(JobTrialModel.job_id, JobTrialModel.kind, JobTrialModel.state, func.count())
                .where(JobTrialModel.job_id.in_(ids))
                .group_by(JobTrialModel.job_id, JobTrialModel.kind, JobTrialModel.state)
            )
            for job_id, kind, state, n in session.execute(q):
                by_state[job_id][state] = by_state[job_id].get(state, 0) + n
                if kind == SEARCH:
                    search_counts[job_id][state] = n
            # The job's best is what its search found (baselines are reported with the trials),
            # ranked as trials are: by the ratio to the anchor (workers on several GPUs
            # time beside the same anchor), then by time.
            rank = func.row_number().over(
                partition_by=JobTrialModel.job_id,
                order_by=(JobTrialModel.ratio.is_(None), JobTrialModel.ratio, JobTrialModel.median_ms, JobTrialModel.id),
            ).label("rank")
            ranked = (
                select(JobTrialModel.job_id, JobTrialModel.candidate_hash, JobTrialModel.median_ms, rank)
                .where(JobTrialModel.job_id.in_(ids), JobTrialModel.status == Status.OK.value,
                       JobTrialModel.median_ms.is_not(None), JobTrialModel.kind == SEARCH)
                .subquery()
            )  # fmt: skip
            for job_id, candidate_hash, ms in session.execute(select(ranked.c.job_id, ranked.c.candidate_hash, ranked.c.median_ms).where(ranked.c.rank == 1)):
                best[job_id] = ms
                best_hash[job_id] = candidate_hash
        return [
            JobRecord(
                id=job.id, state=job.state, kernel=job.kernel, kernel_id=job.kernel_id, kernel_sha256=sha,
                problem=json.loads(job.problem), problem_checked=bool(job.problem_checked), params=job.params,
                strategy=job.strategy, seed=job.seed, budget=job.budget, time_budget=job.time_budget,
                baselines=bool(job.baselines), device=job.device, workload_id=job.workload_id,
                slots_claimed=job.slots_claimed, exhausted=bool(job.exhausted), error=job.error,
                created_by=job.created_by, created_at=_utc(job.created_at), updated_at=_utc(job.updated_at),
                started_at=_opt_utc(job.started_at), finished_at=_opt_utc(job.finished_at),
                counts=by_state[job.id], search_counts=search_counts[job.id], best_ms=best.get(job.id),
                best_candidate=best_hash.get(job.id),
            )  # fmt: skip
            for job, sha in rows
        ]

    def get_job(self, job_id: int) -> JobRecord | None:
        with self.store.session_scope(read_only=True) as session:
            rows = session.execute(self._job_query().where(JobModel.id == job_id)).all()
            found = self._records(session, list(rows))
            return found[0] if found else None

    def list_jobs(self, *, state: str | None = None, limit: int = 50, offset: int = 0) -> tuple[list[JobRecord], int]:
        """Newest first, and the total count matching ``state``."""
        query = self._job_query()
        count = select(func.count()).select_from(JobModel)
        if state is not None:
            query = query.where(JobModel.state == state)
            count = count.where(JobModel.state == state)
        with self.store.session_scope(read_only=True) as session:
            rows = session.execute(query.order_by(JobModel.id.desc()).limit(limit).offset(offset)).all()
            return self._records(session, list(rows)), int(session.scalar(count) or 0)

    def open_jobs(self, device: str) -> int:
        """How many queued or running jobs a worker on ``device`` could take part in."""
        query = select(func.count()).select_from(JobModel).where(
            JobModel.state.in_([QUEUED, RUNNING]), or_(JobModel.device.is_(None), JobModel.device == device)
        )
        with self.store.session_scope(read_only=True) as session:
            return int(session.scalar(query) or 0)

    def job_state(self, job_id: int) -> str | None:
        with self.store.session_scope(read_only=True) as session:
            return session.scalar(select(JobModel.state).where(JobModel.id == job_id))

    def cancel_job(self, job_id: int) -> JobRecord:
        """Cancel a queued or running job: nothing new is claimed, queued slots are
        cancelled; slots in flight finish and are recorded."""
        with self.store.session_scope() as session:
            now = self._now()
            result = session.execute(
                update(JobModel)
                .where(JobModel.id == job_id, JobModel.state.in_([QUEUED, RUNNING]))
                .values(state=CANCELLED, finished_at=now, updated_at=now)
            )
            if result.rowcount == 1:
                session.execute(
                    update(JobTrialModel)
                    .where(JobTrialModel.job_id == job_id, JobTrialModel.state == QUEUED)
                    .values(state=CANCELLED, finished_at=now, worker_id=None)
                )
        job = self.get_job(job_id)
        if job is None:
            raise JobNotFound(f"job {job_id} not found")
        if result.rowcount != 1:
            raise JobConflict(f"job {job_id} is already {job.state}")
        return job

    def fail_job(self, job_id: int, message: str) -> bool:
        """The job cannot be run (its kernel does not load, its problem is invalid)."""
        with self.store.session_scope() as session:
            now = self._now()
            result = session.execute(
                update(JobModel)
                .where(JobModel.id == job_id, JobModel.state.in_([QUEUED, RUNNING]))
                .values(state=FAILED, error=message[:4000], finished_at=now, updated_at=now)
            )
            session.execute(
                update(JobTrialModel)
                .where(JobTrialModel.job_id == job_id, JobTrialModel.state == QUEUED)
                .values(state=CANCELLED, finished_at=now, worker_id=None)
            )
            return result.rowcount == 1

    def set_job_workload(self, job_id: int, workload_id: int) -> None:
        with self.store.session_scope() as session:
            session.execute(
                update(JobModel).where(JobModel.id == job_id, JobModel.workload_id.is_(None)).values(workload_id=workload_id)
            )

    def _finished_jobs_clause(self) -> Any:
        open_slots = exists().where(JobTrialModel.job_id == JobModel.id, JobTrialModel.state.in_([QUEUED, RUNNING]))
        return and_(
            JobModel.state == RUNNING,
            or_(JobModel.slots_claimed >= JobModel.budget, JobModel.exhausted == true()),
            ~open_slots,
        )

    def complete_job_if_done(self, job_id: int) -> bool:
        """Mark the job succeeded once every slot is claimed (or the space ran dry)
        and none is open. Race-safe: exactly one caller sees True."""
        with self.store.session_scope() as session:
            now = self._now()
            result = session.execute(
                update(JobModel)
                .where(JobModel.id == job_id, self._finished_jobs_clause())
                .values(state=SUCCEEDED, finished_at=now, updated_at=now)
                .execution_options(synchronize_session=False)
            )
            return result.rowcount == 1

    # --- claiming ---------------------------------------------------------------
    def claim_job(self, worker_id: str, device: str) -> tuple[JobRecord, bool] | None:
        """The oldest job with work this worker can do, and whether this claim
        started it (queued -> running). The first worker pins the job's device."""
        open_slot = exists().where(JobTrialModel.job_id == JobModel.id, JobTrialModel.state == QUEUED)
        query = (
            select(JobModel.id, JobModel.state)
            .where(
                JobModel.state.in_([QUEUED, RUNNING]),
                or_(JobModel.device.is_(None), JobModel.device == device),
                or_(and_(JobModel.slots_claimed < JobModel.budget, JobModel.exhausted == false()), open_slot),
            )
            .order_by(JobModel.id)
            .limit(1)
            .with_for_update(skip_locked=True)
        )
        with self.store.session_scope() as session:
            row = session.execute(query).first()
            if row is None:
                return None
            now = self._now()
            session.execute(
                update(JobModel)
                .where(JobModel.id == row.id)
                .values(state=RUNNING, device=func.coalesce(JobModel.device, device),
                        started_at=func.coalesce(JobModel.started_at, now), updated_at=now)
            )  # fmt: skip
            session.execute(update(WorkerModel).where(WorkerModel.id == worker_id).values(job_id=row.id))
            claimed = session.execute(self._job_query().where(JobModel.id == row.id).execution_options(populate_existing=True)).all()
            return self._records(session, list(claimed), counts=False)[0], row.state == QUEUED

    def claim_slot(self, job_id: int, worker_id: str) -> SlotLease | None:
        """A slot of the job for this worker: a queued one (a retry, a handed-back
        or baseline slot) first, else a new search slot while the budget lasts.
        None when the job has nothing to claim (or is no longer running)."""
        with self.store.session_scope() as session:
            now = self._now()
            queued = session.scalar(
                select(JobTrialModel.id)
                .join(JobModel, JobModel.id == JobTrialModel.job_id)
                .where(JobTrialModel.job_id == job_id, JobTrialModel.state == QUEUED, JobModel.state == RUNNING)
                .order_by(JobTrialModel.id)
                .limit(1)
                .with_for_update(skip_locked=True, of=JobTrialModel)
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
                return self._lease(row)
            job = session.execute(
                select(JobModel.started_at, JobModel.time_budget, JobModel.state).where(JobModel.id == job_id)
            ).first()
            if job is None or job.state != RUNNING:
                return None
            if job.time_budget is not None and job.started_at is not None:
                if (self._db_now(session) - _utc(job.started_at)).total_seconds() >= job.time_budget:
                    session.execute(update(JobModel).where(JobModel.id == job_id).values(exhausted=True))
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
                worker_id=worker_id, heartbeat_at=now,
            )  # fmt: skip
            session.add(row)
            session.flush()
            session.refresh(row)
            return self._lease(row)

    @staticmethod
    def _lease(row: JobTrialModel) -> SlotLease:
        return SlotLease(
            id=row.id, job_id=row.job_id, slot=row.slot, kind=row.kind, epoch=row.epoch, attempts=row.attempts,
            candidate=Candidate.from_json(json.loads(row.candidate)) if row.candidate else None,
            decisions=json.loads(row.decisions) if row.decisions else {},
            optuna_trial=row.optuna_trial,
        )  # fmt: skip

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
                    result = session.execute(
                        update(JobTrialModel)
                        .where(JobTrialModel.id == lease.id, JobTrialModel.epoch == lease.epoch,
                               JobTrialModel.state == RUNNING)
                        .values(**values)
                    )  # fmt: skip
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
            now = self._now()
            closed = session.execute(
                update(JobTrialModel)
                .where(JobTrialModel.id == lease.id, JobTrialModel.epoch == lease.epoch, JobTrialModel.state == RUNNING)
                .values(
                    state=DONE, status=Status(result.status).value, message=(result.message or "")[:4000],
                    median_ms=timing.median_ms if timing else None, tflops=result.tflops, ratio=result.ratio,
                    workload_id=workload_id, finished_at=now, heartbeat_at=now,
                    candidate_hash=candidate.hash, candidate=candidate.canonical(),
                )
            )  # fmt: skip
            if closed.rowcount != 1:
                return False
            _upsert_trial(session, self.store._insert, workload_id=workload_id, candidate=candidate, result=result)
            return True

    def release_slot(self, lease: SlotLease, *, exhausted: bool = False) -> bool:
        """Hand a slot back. Normally it is re-queued for any worker (the attempt
        does not count as a failure); ``exhausted``: the search space ran dry, so
        the slot is dropped and the job claims no more."""
        with self.store.session_scope() as session:
            fence = and_(JobTrialModel.id == lease.id, JobTrialModel.epoch == lease.epoch, JobTrialModel.state == RUNNING)
            if exhausted:
                session.execute(update(JobModel).where(JobModel.id == lease.job_id).values(exhausted=True))
                result = session.execute(delete(JobTrialModel).where(fence, JobTrialModel.candidate_hash.is_(None)))
                if result.rowcount == 1:
                    return True
            result = session.execute(
                update(JobTrialModel)
                .where(fence)
                .values(state=QUEUED, worker_id=None, epoch=JobTrialModel.epoch + 1,
                        attempts=func.max(JobTrialModel.attempts - 1, 0) if not self._pg
                        else func.greatest(JobTrialModel.attempts - 1, 0))
            )  # fmt: skip
            return result.rowcount == 1

    def add_baseline_slots(self, job_id: int, candidates: Iterable[Candidate], *, kind: str = BASELINE) -> int:
        """Queue the baselines (or the warm start) of a job: not counted in its search budget."""
        added = 0
        with self.store.session_scope() as session:
            for candidate in candidates:
                stmt = self.store._insert(JobTrialModel).values(
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
            records = [
                JobTrialRecord(
                    id=r.id, job_id=r.job_id, slot=r.slot, kind=r.kind, state=r.state, attempts=r.attempts,
                    epoch=r.epoch, worker_id=r.worker_id, candidate_hash=r.candidate_hash, status=r.status,
                    message=r.message, median_ms=r.median_ms, tflops=r.tflops, created_at=_utc(r.created_at),
                    finished_at=_opt_utc(r.finished_at),
                )  # fmt: skip
                for r in rows
            ]
            return records, int(session.scalar(count) or 0)

    # --- workers ----------------------------------------------------------------
    def register_worker(self, worker_id: str, *, host: str, pid: int, gpu: int | None, device: str) -> None:
        with self.store.session_scope() as session:
            session.add(WorkerModel(id=worker_id, host=host[:256], pid=pid, gpu=gpu, device=device[:256], state=W_RUNNING))

    def heartbeat(self, worker_id: str, *, state: str = W_RUNNING) -> set[int]:
        """Stamp the worker and every slot it holds; returns the ids of the slots it
        still holds (a slot missing from the answer was taken away: lease lost)."""
        with self.store.session_scope() as session:
            now = self._now()
            session.execute(update(WorkerModel).where(WorkerModel.id == worker_id).values(heartbeat_at=now, state=state))
            rows = session.scalars(
                update(JobTrialModel)
                .where(JobTrialModel.worker_id == worker_id, JobTrialModel.state == RUNNING)
                .values(heartbeat_at=now)
                .returning(JobTrialModel.id)
            ).all()
            return set(rows)

    def worker_stopped(self, worker_id: str) -> int:
        """The worker is leaving: re-queue whatever it still holds; returns how many."""
        with self.store.session_scope() as session:
            now = self._now()
            released = session.execute(
                update(JobTrialModel)
                .where(JobTrialModel.worker_id == worker_id, JobTrialModel.state == RUNNING)
                .values(state=QUEUED, worker_id=None, epoch=JobTrialModel.epoch + 1,
                        attempts=func.max(JobTrialModel.attempts - 1, 0) if not self._pg
                        else func.greatest(JobTrialModel.attempts - 1, 0))
            ).rowcount  # fmt: skip
            session.execute(
                update(WorkerModel).where(WorkerModel.id == worker_id).values(state=W_STOPPED, stopped_at=now, heartbeat_at=now, job_id=None)
            )
            return released

    def list_workers(self, *, alive_within: float | None = None) -> list[WorkerRecord]:
        query = select(WorkerModel).order_by(WorkerModel.started_at.desc())
        if alive_within is not None:
            query = query.where(WorkerModel.state.in_([W_RUNNING, W_DRAINING]), WorkerModel.heartbeat_at >= self._ago(alive_within))
        with self.store.session_scope(read_only=True) as session:
            return [
                WorkerRecord(
                    id=w.id, host=w.host, pid=w.pid, gpu=w.gpu, device=w.device, state=w.state, job_id=w.job_id,
                    started_at=_utc(w.started_at), heartbeat_at=_utc(w.heartbeat_at), stopped_at=_opt_utc(w.stopped_at),
                )  # fmt: skip
                for w in session.scalars(query.limit(1000))
            ]

    # --- the sweeper ------------------------------------------------------------
    def sweep(self, *, grace: float, max_retry: int) -> SweepReport:
        """Re-queue slots whose heartbeat is older than ``grace`` seconds (DB clock);
        a slot already tried ``1 + max_retry`` times fails for good (quarantined:
        its candidate keeps killing workers) and its trial is recorded as a crash.
        Then close finished jobs. Safe to run from any number of processes at once."""
        requeued = failed = 0
        with self.store.session_scope() as session:
            cutoff = self._ago(grace)
            stale_clause = and_(JobTrialModel.state == RUNNING, JobTrialModel.heartbeat_at < cutoff)
            stale = session.execute(
                select(JobTrialModel.id, JobTrialModel.attempts, JobTrialModel.candidate, JobTrialModel.workload_id)
                .where(stale_clause)
                .order_by(JobTrialModel.id)
                .limit(1000)
                .with_for_update(skip_locked=True)
            ).all()
            now = self._now()
            for row in stale:
                if row.attempts <= max_retry or row.candidate is None:
                    # No candidate yet: the worker died before proposing; nothing to blame.
                    extra = {"attempts": 0} if row.candidate is None else {}
                    requeued += session.execute(
                        update(JobTrialModel)
                        .where(JobTrialModel.id == row.id, stale_clause)
                        .values(state=QUEUED, worker_id=None, epoch=JobTrialModel.epoch + 1, **extra)
                    ).rowcount
                    continue
                message = f"worker lost {row.attempts} times while running this candidate; quarantined"
                done = session.execute(
                    update(JobTrialModel)
                    .where(JobTrialModel.id == row.id, stale_clause)
                    .values(state=FAILED, status=Status.CRASH.value, message=message, finished_at=now,
                            worker_id=None, epoch=JobTrialModel.epoch + 1)
                ).rowcount  # fmt: skip
                failed += done
                if done and row.candidate and row.workload_id is not None:
                    candidate = Candidate.from_json(json.loads(row.candidate))
                    result = TrialResult(candidate.hash, Status.CRASH, message, info={"quarantined": True})
                    _upsert_trial(session, self.store._insert, workload_id=row.workload_id, candidate=candidate, result=result)
            lost = session.execute(
                update(WorkerModel)
                .where(WorkerModel.state.in_([W_RUNNING, W_DRAINING]), WorkerModel.heartbeat_at < cutoff)
                .values(state=W_LOST)
            ).rowcount
            finished = session.execute(
                update(JobModel)
                .where(self._finished_jobs_clause())
                .values(state=SUCCEEDED, finished_at=now, updated_at=now)
                .execution_options(synchronize_session=False)
            ).rowcount
        if requeued or failed:
            _log.warning("sweeper: re-queued %d stale trial(s), quarantined %d", requeued, failed)
        return SweepReport(requeued, failed, finished, lost)


    # --- the sampler's trials ---------------------------------------------------
    def sampled_jobs(self, *, finished_within: float = 3600.0) -> list[int]:
        """Jobs whose sampler lives in Optuna's storage (not grid) that are running
        or finished lately: those whose studies may hold orphaned trials."""
        query = select(JobModel.id).where(
            JobModel.strategy != "grid",
            or_(JobModel.state == RUNNING,
                and_(JobModel.state.in_(FINAL_JOB_STATES), JobModel.finished_at >= self._ago(finished_within))),
        )  # fmt: skip
        with self.store.session_scope(read_only=True) as session:
            return list(session.scalars(query.order_by(JobModel.id).limit(1000)))

    def fail_orphan_trials(self, storage: Any, job_ids: Iterable[int], *, grace: float) -> int:
        """Fail the RUNNING trials of the jobs' Optuna studies that no open slot holds
        and that were asked for more than ``2 * grace`` seconds ago: a worker asked
        the sampler, then died before recording a result (or before giving the
        trial to a slot), and no one else will tell it. Returns how many."""
        from optuna.trial import TrialState

        failed = 0
        cutoff = datetime.now() - timedelta(seconds=2 * grace)  # Optuna stamps datetime_start with the asker's local clock
        for job_id in job_ids:
            try:
                study_id = storage.get_study_id_from_name(study_name(job_id))
            except KeyError:
                continue
            running = [t for t in storage.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,))
                       if t.datetime_start is not None and t.datetime_start < cutoff]  # fmt: skip
            if not running:
                continue
            with self.store.session_scope(read_only=True) as session:
                held = set(session.scalars(
                    select(JobTrialModel.optuna_trial)
                    .where(JobTrialModel.job_id == job_id, JobTrialModel.state.in_([QUEUED, RUNNING]),
                           JobTrialModel.optuna_trial.is_not(None))
                ))  # fmt: skip
            for trial in running:
                if trial.number in held:
                    continue  # a slot will run it (again) and tell the sampler
                try:
                    failed += bool(storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL))
                except Exception as exc:  # noqa: BLE001 - told meanwhile (UpdateFinishedTrialError): fine
                    _log.debug("trial %d of job %d: %s", trial.number, job_id, exc)
        if failed:
            _log.warning("sweeper: failed %d sampler trial(s) left running by lost workers", failed)
        return failed


def study_name(job_id: int) -> str:
    """The Optuna study that holds a job's sampler state."""
    return f"job-{job_id}"


def abort_stalled_transactions(engine: Any, seconds: float) -> None:
    """Have PostgreSQL end a session that sits inside a transaction for ``seconds``.

    Every queue transaction takes milliseconds; one left open means its process is
    stalled (SIGSTOP, a debugger, a frozen VM) while holding row locks (a job's row,
    say) that would stall every other worker until it resumed. The server then
    aborts it, the locks go, and the stalled worker's leases expire as usual. The
    same holds for the Optuna storage's engine (a study's rows)."""
    from sqlalchemy import event

    if getattr(engine, "_ws_tune_stall_guard", None) == seconds:
        return

    def on_connect(dbapi_connection: Any, _record: Any) -> None:
        with dbapi_connection.cursor() as cursor:
            cursor.execute(f"SET idle_in_transaction_session_timeout = {int(seconds * 1000)}")
        dbapi_connection.commit()

    event.listen(engine, "connect", on_connect)
    engine._ws_tune_stall_guard = seconds  # type: ignore[attr-defined]
    engine.dispose()  # pooled connections predate the setting


def optuna_storage(url: str, *, attempts: int = 5, timeouts: DbTimeouts | None = None) -> Any:
    """Optuna's RDB storage on the store's database, so that workers on any host
    share a job's sampler state. On SQLite its connections get the store's
    treatment (WAL, ``BEGIN IMMEDIATE``, a long busy timeout): Optuna's own
    read-then-write transactions otherwise fail at once with "database is
    locked" under concurrent workers. On PostgreSQL, the store's bounds on
    every wait (guard.py). Creating the tables races between workers starting
    together, so it is retried."""
    import optuna
    from sqlalchemy import event, make_url

    from . import repository

    engine_kwargs: dict[str, Any] = {}
    sqlite = url.startswith("sqlite")
    timeouts = timeouts or DbTimeouts()
    if sqlite:
        engine_kwargs["connect_args"] = {"check_same_thread": False, "timeout": repository.SQLITE_BUSY_TIMEOUT_S}
    else:
        engine_kwargs["connect_args"] = timeouts.connect_args(make_url(url).query)
    last: Exception | None = None
    for attempt in range(attempts):
        try:
            storage = optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs)
            break
        except Exception as exc:  # noqa: BLE001 - optuna wraps driver errors variously
            last = exc
            time.sleep(0.2 * (attempt + 1))
    else:
        raise StoreError(f"cannot open Optuna storage at {mask_url(url)}: {' '.join(str(last).split())[:300]}")
    if sqlite:
        event.listen(storage.engine, "connect", repository._sqlite_on_connect)
        event.listen(storage.engine, "begin", repository._sqlite_on_begin)
    else:
        guard_postgresql(storage.engine, timeouts)
    storage.engine.dispose()  # connections made so far lack the listeners
    return storage
