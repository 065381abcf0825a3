"""The sweeper: what lost workers leave behind, put right. Any worker's heartbeat
and the server run it; it is safe from any number of processes at once.

* ``sweep`` re-queues RUNNING slots whose heartbeat is older than the grace
  period (or fails them for good after ``max_retry`` retries). Two sweepers
  racing over one stale slot retry it once: the rows are locked (``FOR UPDATE
  SKIP LOCKED`` on PostgreSQL; SQLite's write transactions are ``BEGIN
  IMMEDIATE`` and so serialized) and each update re-checks the state.
* ``fail_orphan_trials`` fails the sampler trials (Optuna's) that a lost worker
  asked for and never told.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, exists, or_, select, update

from ..candidate import Candidate
from ..result import Status, TrialResult
from .jobs import FAILED, FINAL_JOB_STATES, QUEUED, RUNNING, finished_jobs, succeed
from .models import JobModel, JobTrialModel, WorkerModel
from .repository import OnStore
from .sampler import study_name
from .workers import ALIVE, W_LOST
from .writes import upsert_trials

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SweepReport:
    requeued: int = 0
    failed: int = 0
    finished_jobs: int = 0
    lost_workers: int = 0


class Sweeper(OnStore):
    def sweep(self, *, grace: float, max_retry: int) -> SweepReport:
        """Re-queue slots whose heartbeat is older than ``grace`` seconds (DB clock);
        a slot already tried ``1 + max_retry`` times fails for good (quarantined:
        its candidate keeps killing workers) and its trial is recorded as a crash.
        Then close finished jobs."""
        requeued = failed = 0
        with self.store.session_scope() as session:
            cutoff = self.sql.ago(grace)
            stale_clause = and_(JobTrialModel.state == RUNNING, JobTrialModel.heartbeat_at < cutoff)
            stale = session.execute(
                self.sql.skip_locked(
                    select(JobTrialModel.id, JobTrialModel.attempts, JobTrialModel.candidate, JobTrialModel.workload_id)
                    .where(stale_clause)
                    .order_by(JobTrialModel.id)
                    .limit(1000)
                )
            ).all()
            now = self.sql.now()
            for row in stale:
                stale_row = update(JobTrialModel).where(JobTrialModel.id == row.id, stale_clause)
                if row.attempts <= max_retry or row.candidate is None:
                    # No candidate yet: the worker died before proposing; nothing to blame.
                    extra = {"attempts": 0} if row.candidate is None else {}
                    requeued += session.execute(
                        stale_row.values(state=QUEUED, worker_id=None, epoch=JobTrialModel.epoch + 1, **extra)
                    ).rowcount
                    continue
                message = f"worker lost {row.attempts} times while running this candidate; quarantined"
                done = session.execute(
                    stale_row.values(state=FAILED, status=Status.CRASH.value, message=message, finished_at=now,
                                     worker_id=None, epoch=JobTrialModel.epoch + 1)
                ).rowcount  # fmt: skip
                failed += done
                if done and row.candidate and row.workload_id is not None:
                    candidate = Candidate.from_json(json.loads(row.candidate))
                    result = TrialResult(candidate.hash, Status.CRASH, message, info={"quarantined": True})
                    upsert_trials(session, self.sql, workload_id=row.workload_id, items=[(candidate, result)])
            # Skip a worker row another transaction holds: a worker frozen inside its heartbeat
            # (a black-holed connection) keeps it locked until PostgreSQL ends that transaction,
            # and waiting for it would hit lock_timeout and roll back the re-queues above too.
            # It is marked lost by a later sweep.
            lost_clause = and_(WorkerModel.state.in_(ALIVE), WorkerModel.heartbeat_at < cutoff)
            lost_ids = session.scalars(self.sql.skip_locked(select(WorkerModel.id).where(lost_clause))).all()
            lost = session.execute(
                update(WorkerModel).where(WorkerModel.id.in_(lost_ids), lost_clause).values(state=W_LOST)
            ).rowcount if lost_ids else 0  # fmt: skip
            # Only jobs quiet for the grace period: the worker that finishes a job's last slot
            # closes it itself and then runs its final tournament, which it skips when a sweep
            # got there first (under load, in the moment between the two). A job left finished
            # by a worker that died is still closed, a grace period later.
            recent = exists().where(JobTrialModel.job_id == JobModel.id, JobTrialModel.heartbeat_at >= cutoff)
            quiet = and_(finished_jobs(), JobModel.updated_at < cutoff, ~recent)
            finished = session.execute(succeed(quiet, now)).rowcount
        if requeued or failed:
            _log.warning("sweeper: re-queued %d stale trial(s), quarantined %d", requeued, failed)
        return SweepReport(requeued, failed, finished, lost)

    def sampled_jobs(self, *, finished_within: float = 3600.0) -> list[int]:
        """Jobs whose sampler lives in Optuna's storage (not grid) that are running
        or finished lately: those whose studies may hold orphaned trials."""
        query = select(JobModel.id).where(
            JobModel.strategy != "grid",
            or_(JobModel.state == RUNNING,
                and_(JobModel.state.in_(FINAL_JOB_STATES), JobModel.finished_at >= self.sql.ago(finished_within))),
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
