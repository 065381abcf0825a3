"""The service's jobs in SQL: created by the API, claimed by workers.

* A job's budget is a number of search *slots* (leases.py); a job is done once
  every slot is claimed (or its space ran dry) and none is open.
* Jobs are claimed with ``FOR UPDATE SKIP LOCKED`` on PostgreSQL and under
  ``BEGIN IMMEDIATE`` on SQLite. Several workers may work on one job.
* Every method is one short transaction; database failures surface as
  ``StoreError``. Records come back as frozen dataclasses (records.py).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import and_, bindparam, exists, false, func, insert, or_, select, true, update
from sqlalchemy.orm import Session

from ..candidate import canonical_json
from ..result import Status
from .engine import utc
from .models import JobModel, JobTrialModel, KernelModel, WorkerModel
from .records import JobRecord, NewJob, job_record
from .repository import OnStore

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


class JobNotFound(LookupError):
    pass


class JobConflict(RuntimeError):
    """The job is not in a state that allows the operation (e.g. cancelling a finished job)."""


def finished_jobs() -> Any:
    """Running jobs with every slot claimed (or their space dry) and none open."""
    open_slots = exists().where(JobTrialModel.job_id == JobModel.id, JobTrialModel.state.in_([QUEUED, RUNNING]))
    return and_(
        JobModel.state == RUNNING,
        or_(JobModel.slots_claimed >= JobModel.budget, JobModel.exhausted == true()),
        ~open_slots,
    )


def succeed(where: Any, now: Any) -> Any:
    """The UPDATE that marks the jobs matching ``where`` succeeded."""
    return (
        update(JobModel)
        .where(where)
        .values(state=SUCCEEDED, finished_at=now, updated_at=now)
        .execution_options(synchronize_session=False)
    )


_jobs = JobModel.__table__
_INSERT_JOB = (
    insert(_jobs)
    .values(
        state=QUEUED, slots_claimed=0, exhausted=False,
        **{name: bindparam(name) for name in ("kernel_id", "kernel", "problem", "problem_checked", "params", "strategy",
                                              "seed", "budget", "time_budget", "baselines", "device", "created_by")},
    )
    .returning(_jobs.c.id, _jobs.c.created_at, _jobs.c.updated_at, sort_by_parameter_order=True)
)  # fmt: skip


def _job_query() -> Any:
    return select(JobModel, KernelModel.sha256).join(KernelModel, JobModel.kernel_id == KernelModel.id)


def _tallies(session: Session, ids: list[int]) -> dict[int, dict[str, Any]]:
    """Per job: its slots counted by state (all, and search only) and the best its search found."""
    out: dict[int, dict[str, Any]] = {i: {"counts": {}, "search_counts": {}} for i in ids}
    if not ids:
        return out
    q = (
        select(JobTrialModel.job_id, JobTrialModel.kind, JobTrialModel.state, func.count())
        .where(JobTrialModel.job_id.in_(ids))
        .group_by(JobTrialModel.job_id, JobTrialModel.kind, JobTrialModel.state)
    )
    for job_id, kind, state, n in session.execute(q):
        counts = out[job_id]["counts"]
        counts[state] = counts.get(state, 0) + n
        if kind == SEARCH:
            out[job_id]["search_counts"][state] = n
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
    best = select(ranked.c.job_id, ranked.c.candidate_hash, ranked.c.median_ms).where(ranked.c.rank == 1)
    for job_id, candidate_hash, ms in session.execute(best):
        out[job_id].update(best_ms=ms, best_candidate=candidate_hash)
    return out


def _records(session: Session, rows: list[Any], *, counts: bool = True) -> list[JobRecord]:
    tallies = _tallies(session, [job.id for job, _ in rows]) if counts else {}
    return [job_record(job, sha, **tallies.get(job.id, {})) for job, sha in rows]


def _cancel_queued_slots(session: Session, job_id: int, now: Any) -> None:
    session.execute(
        update(JobTrialModel)
        .where(JobTrialModel.job_id == job_id, JobTrialModel.state == QUEUED)
        .values(state=CANCELLED, finished_at=now, worker_id=None)
    )


class Jobs(OnStore):
    """Jobs: created, listed, claimed, cancelled, failed and completed."""

    def create_job(self, **job: Any) -> JobRecord:
        """One job (the fields of ``NewJob``)."""
        return self.create_jobs([NewJob(**job)])[0]

    def create_jobs(self, jobs: Sequence[NewJob]) -> list[JobRecord]:
        """Queued jobs, in order, made by one statement: a multi-row INSERT ... RETURNING
        (SQLAlchemy's insertmanyvalues, rows matched to their jobs by order), atomic by
        itself, so many submissions share one round trip and one commit."""
        rows = [{**_fields(j), "problem": canonical_json(j.problem)} for j in jobs]  # the sha is the kernel's, not a column
        unknown = {j.kernel_id for j in jobs if j.kernel_sha256 is None}
        with self.store.statement() as connection:
            stamped = connection.execute(_INSERT_JOB, rows).all()
            shas = dict(connection.execute(select(KernelModel.id, KernelModel.sha256).where(KernelModel.id.in_(unknown))).all()) if unknown else {}
        return [
            JobRecord(
                id=s.id, state=QUEUED, kernel_sha256=j.kernel_sha256 or shas[j.kernel_id], **{**row, "problem": json.loads(row["problem"])},
                workload_id=None, slots_claimed=0, exhausted=False, error=None, created_at=utc(s.created_at),
                updated_at=utc(s.updated_at), started_at=None, finished_at=None,
            )
            for j, row, s in zip(jobs, rows, stamped, strict=True)
        ]  # fmt: skip

    def get_job(self, job_id: int) -> JobRecord | None:
        with self.store.session_scope(read_only=True) as session:
            rows = session.execute(_job_query().where(JobModel.id == job_id)).all()
            found = _records(session, list(rows))
            return found[0] if found else None

    def list_jobs(self, *, state: str | None = None, limit: int = 50, offset: int = 0) -> tuple[list[JobRecord], int]:
        """Newest first, and the total count matching ``state``."""
        query = _job_query()
        count = select(func.count()).select_from(JobModel)
        if state is not None:
            query = query.where(JobModel.state == state)
            count = count.where(JobModel.state == state)
        with self.store.session_scope(read_only=True) as session:
            rows = session.execute(query.order_by(JobModel.id.desc()).limit(limit).offset(offset)).all()
            return _records(session, list(rows)), int(session.scalar(count) or 0)

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
            now = self.sql.now()
            result = session.execute(
                update(JobModel)
                .where(JobModel.id == job_id, JobModel.state.in_([QUEUED, RUNNING]))
                .values(state=CANCELLED, finished_at=now, updated_at=now)
            )
            if result.rowcount == 1:
                _cancel_queued_slots(session, job_id, now)
        job = self.get_job(job_id)
        if job is None:
            raise JobNotFound(f"job {job_id} not found")
        if result.rowcount != 1:
            raise JobConflict(f"job {job_id} is already {job.state}")
        return job

    def fail_job(self, job_id: int, message: str) -> bool:
        """The job cannot be run (its kernel does not load, its problem is invalid)."""
        with self.store.session_scope() as session:
            now = self.sql.now()
            result = session.execute(
                update(JobModel)
                .where(JobModel.id == job_id, JobModel.state.in_([QUEUED, RUNNING]))
                .values(state=FAILED, error=message[:4000], finished_at=now, updated_at=now)
            )
            _cancel_queued_slots(session, job_id, now)
            return result.rowcount == 1

    def set_job_workload(self, job_id: int, workload_id: int) -> None:
        with self.store.session_scope() as session:
            session.execute(
                update(JobModel).where(JobModel.id == job_id, JobModel.workload_id.is_(None)).values(workload_id=workload_id)
            )

    def complete_job_if_done(self, job_id: int) -> bool:
        """Mark the job succeeded once every slot is claimed (or the space ran dry)
        and none is open. Race-safe: exactly one caller sees True."""
        with self.store.session_scope() as session:
            return session.execute(succeed(and_(JobModel.id == job_id, finished_jobs()), self.sql.now())).rowcount == 1

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
        )
        with self.store.session_scope() as session:
            row = session.execute(self.sql.skip_locked(query)).first()
            if row is None:
                return None
            now = self.sql.now()
            session.execute(
                update(JobModel)
                .where(JobModel.id == row.id)
                .values(state=RUNNING, device=func.coalesce(JobModel.device, device),
                        started_at=func.coalesce(JobModel.started_at, now), updated_at=now)
            )  # fmt: skip
            session.execute(update(WorkerModel).where(WorkerModel.id == worker_id).values(job_id=row.id))
            claimed = session.execute(_job_query().where(JobModel.id == row.id).execution_options(populate_existing=True)).all()
            return _records(session, list(claimed), counts=False)[0], row.state == QUEUED


def _fields(job: NewJob) -> dict[str, Any]:
    """A new job's columns (every field but the kernel's sha, which lives with the kernel)."""
    return {f.name: getattr(job, f.name) for f in dataclasses.fields(job) if f.name != "kernel_sha256"}
