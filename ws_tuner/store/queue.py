"""The service's job queue: jobs (jobs.py), their trial slots and leases
(leases.py), workers (workers.py) and the sweeper (sweeper.py) over one store's
database, as the worker loop and the API use them, with the queue's vocabulary.

Every method is one short transaction (``Store.session_scope``); database
failures surface as ``StoreError``. Records come back as frozen dataclasses.
"""

from __future__ import annotations

from .engine import abort_stalled_transactions
from .jobs import (
    BASELINE, CANCELLED, DONE, FAILED, FINAL_JOB_STATES, JOB_STATES, QUEUED, RUNNING, SEARCH, SLOT_STATES,
    SUCCEEDED, TERMINAL_SLOT_STATES, WARM, JobConflict, JobNotFound, Jobs,
)  # fmt: skip
from .leases import ASSIGNED, DUPLICATE, LOST, Leases
from .records import JobRecord, JobTrialRecord, NewJob, SlotLease, WorkerRecord
from .repository import Store
from .sampler import optuna_storage, study_name
from .sweeper import Sweeper, SweepReport
from .workers import W_DRAINING, W_LOST, W_RUNNING, W_STOPPED, Workers

__all__ = [
    "ASSIGNED", "BASELINE", "CANCELLED", "DONE", "DUPLICATE", "FAILED", "FINAL_JOB_STATES", "JOB_STATES", "LOST",
    "QUEUED", "RUNNING", "SEARCH", "SLOT_STATES", "SUCCEEDED", "TERMINAL_SLOT_STATES", "WARM", "W_DRAINING",
    "W_LOST", "W_RUNNING", "W_STOPPED", "JobConflict", "JobNotFound", "JobQueue", "JobRecord", "JobTrialRecord", "NewJob",
    "SlotLease", "SweepReport", "WorkerRecord", "optuna_storage", "study_name",
]  # fmt: skip


class JobQueue(Jobs, Leases, Workers, Sweeper):
    """Jobs, slots and workers in the store's database (shares its engine)."""

    def __init__(self, store: Store, *, stalled_transaction_timeout: float | None = 60.0) -> None:
        super().__init__(store)
        # Also for the engines that share the database (Optuna's): None on SQLite.
        self.stalled_transaction_timeout = stalled_transaction_timeout if self.sql.pg else None
        if self.stalled_transaction_timeout:
            abort_stalled_transactions(store.engine, self.stalled_transaction_timeout)
