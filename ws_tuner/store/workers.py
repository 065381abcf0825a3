"""The service's workers in SQL: registered, heartbeating, leaving.

A worker's heartbeat stamps it and every slot it holds (database clock); the
sweeper (sweeper.py) re-queues the slots of a worker whose heartbeat stopped.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import select, update

from .jobs import RUNNING
from .leases import hand_back
from .models import JobTrialModel, WorkerModel
from .records import WorkerRecord, worker_record
from .repository import OnStore

# Worker states.
W_RUNNING, W_DRAINING, W_STOPPED, W_LOST = "running", "draining", "stopped", "lost"
ALIVE = (W_RUNNING, W_DRAINING)


class Workers(OnStore):
    def register_worker(self, worker_id: str, *, host: str, pid: int, gpu: int | None, device: str) -> None:
        with self.store.session_scope() as session:
            session.add(WorkerModel(id=worker_id, host=host[:256], pid=pid, gpu=gpu, device=device[:256], state=W_RUNNING))

    def heartbeat(self, worker_id: str, held: Iterable[int], *, state: str = W_RUNNING) -> set[int]:
        """Stamp the worker and the slots it knows it holds (``held``); returns those it
        still holds (one missing from the answer was taken away: lease lost). Only
        those: a slot claimed in a transaction whose answer was lost (the connection
        cut after the commit) is leased to the worker without its knowing, and must
        expire for the sweeper to re-queue it, not be kept alive for ever."""
        held = list(held)
        with self.store.session_scope() as session:
            now = self.sql.now()
            session.execute(update(WorkerModel).where(WorkerModel.id == worker_id).values(heartbeat_at=now, state=state))
            if not held:
                return set()
            rows = session.scalars(
                update(JobTrialModel)
                .where(JobTrialModel.worker_id == worker_id, JobTrialModel.state == RUNNING, JobTrialModel.id.in_(held))
                .values(heartbeat_at=now)
                .returning(JobTrialModel.id)
            ).all()
            return set(rows)

    def worker_stopped(self, worker_id: str) -> int:
        """The worker is leaving: re-queue whatever it still holds; returns how many."""
        with self.store.session_scope() as session:
            now = self.sql.now()
            released = hand_back(session, self.sql, JobTrialModel.worker_id == worker_id)
            session.execute(
                update(WorkerModel).where(WorkerModel.id == worker_id).values(state=W_STOPPED, stopped_at=now, heartbeat_at=now, job_id=None)
            )
            return released

    def list_workers(self, *, alive_within: float | None = None) -> list[WorkerRecord]:
        query = select(WorkerModel).order_by(WorkerModel.started_at.desc())
        if alive_within is not None:
            query = query.where(WorkerModel.state.in_(ALIVE), WorkerModel.heartbeat_at >= self.sql.ago(alive_within))
        with self.store.session_scope(read_only=True) as session:
            return [worker_record(w) for w in session.scalars(query.limit(1000))]
