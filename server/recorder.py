"""What differs between a service job and a CLI run, for the measurement pipeline
(pipeline.py): places are the job's leased slots, results finish them
(``JobRecorder``); and the worker's database calls, retried through outages
(``Retrying``), with the leases it holds (``LeaseBook``).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import threading
from typing import TYPE_CHECKING, Any, Callable, Sequence, TypeVar, cast

from ..candidate import Candidate
from ..pipeline import LATER, Assignment, Later, Recorder, Slot
from ..result import TrialResult
from ..search import Proposal, SearchStrategy
from ..store import StoreError
from ..store.queue import ASSIGNED, BASELINE, DUPLICATE, SEARCH, WARM, JobRecord, SlotLease

if TYPE_CHECKING:
    from .worker import Worker

_log = logging.getLogger("ws_tuner.worker")
T = TypeVar("T")

ROLES = {BASELINE: "baseline", WARM: "warm", SEARCH: "search"}  # slot kind -> the role its result records


def is_db_error(exc: BaseException) -> bool:
    """Whether ``exc`` is the database failing (worth a retry), not a bug."""
    if isinstance(exc, StoreError):
        return True
    from sqlalchemy.exc import DBAPIError, OperationalError

    if isinstance(exc, (DBAPIError, OperationalError)):
        return True
    try:
        from optuna.exceptions import StorageInternalError
    except ImportError:  # pragma: no cover
        return False
    return isinstance(exc, StorageInternalError)


class Retrying:
    """Database calls retried with backoff through outages (a restart of
    PostgreSQL), until ``abort`` is set: then a failing call gives up at once,
    and no new call is made at all. Each attempt on a silent database costs its
    own timeouts (a pooled connection's check, then a new connection's), so a
    worker leaving would otherwise spend them once per call still on its way
    out (every result in a batch, the sampler's tell of each); what it holds
    is handed back by its goodbye instead, bounded as a whole.

    ``retry.call("what", fn, ...)`` retries one call; ``retry(target).method(...)``
    retries every method call on ``target`` (a queue, a store), named for the log."""

    def __init__(self, abort: threading.Event) -> None:
        self.abort = abort

    def call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        delay = 0.2
        while True:
            if self.abort.is_set():
                raise StoreError(f"{what}: not attempted, the worker is leaving")
            try:
                return fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - StoreError, or Optuna's wrapping of a driver error
                if not is_db_error(exc):
                    raise
                if self.abort.is_set():
                    raise StoreError(f"{what}: gave up on the database while aborting: {exc}") from None
                _log.warning("database unavailable (%s): %s; retrying in %.1f s", what, str(exc).splitlines()[0][:300], delay)
                self.abort.wait(delay)
                delay = min(delay * 2, 5.0)

    def __call__(self, target: T) -> T:
        return cast(T, _Retried(self, target))


class _Retried:
    def __init__(self, retry: Retrying, target: Any) -> None:
        self._retry, self._target = retry, target

    def __getattr__(self, name: str) -> Any:
        return functools.partial(self._retry.call, name.replace("_", " "), getattr(self._target, name))


class LeaseBook:
    """The slots a worker holds, and how their results fared."""

    def __init__(self) -> None:
        self._held: dict[int, SlotLease] = {}
        self._lock = threading.Lock()  # the heartbeat thread reads while the loop writes
        self.finished = 0  # slots recorded
        self.rejected = 0  # results refused because the lease was lost

    def hold(self, lease: SlotLease) -> None:
        with self._lock:
            self._held[lease.id] = lease

    def drop(self, lease_id: int) -> None:
        with self._lock:
            self._held.pop(lease_id, None)

    def close(self, lease_id: int, *, recorded: bool) -> None:
        """The slot's result was recorded, or refused."""
        self.drop(lease_id)
        if recorded:
            self.finished += 1
        else:
            self.rejected += 1

    def held(self) -> list[SlotLease]:
        with self._lock:
            return list(self._held.values())

    def ids(self) -> set[int]:
        with self._lock:
            return set(self._held)


class JobRecorder(Recorder):
    """The worker's recorder: places are the job's slots, claimed and leased in the
    database (so workers sharing a job never measure more than its budget), and
    results finish them, fenced by the lease's epoch.

    ``starts`` (a job with baselines) plans the lowering starts from the stored results
    of the ``awaited`` candidates (the seed schedule's baselines): no search slot is taken
    until their slots are finished, by any worker, and this worker has queued the starts
    (each worker does, on its first claim after that: queueing is idempotent, and no
    worker that died meanwhile can leave a job without them)."""

    def __init__(self, worker: Worker, job: JobRecord, workload_id: int, starts: Callable[[], list[Candidate]] | None = None,
                 awaited: Sequence[str] = ()) -> None:  # fmt: skip
        self.worker, self.job, self.workload_id = worker, job, workload_id
        self.queue = worker.retry(worker.queue)
        self.leases = worker.leases
        self.starts, self.awaited = starts, list(awaited)
        self._taken: set[str] = set()
        self._stale = True  # the candidates other slots hold are read again when needed

    def claim(self) -> Slot | Later | None:
        if self.worker.draining:
            return None
        lease = self.queue.claim_slot(self.job.id, self.worker.id, search=self.starts is None)
        if lease is None and self.starts is not None:
            pending = self.queue.slots_pending(self.job.id, self.awaited)
            if pending is None:  # the job is no longer running
                return None
            if pending:
                return LATER
            self.queue.add_baseline_slots(self.job.id, self.starts(), kind=WARM)
            self.starts = None
            return self.claim()
        if lease is None:
            return None
        self.leases.hold(lease)
        return Slot(ROLES.get(lease.kind, SEARCH), lease.candidate, dict(lease.decisions), token=lease.optuna_trial, handle=lease)

    def assign(self, slot: Slot, proposal: Proposal) -> str:
        number = getattr(proposal.token, "number", None)
        outcome = self.queue.assign_candidate(slot.handle, proposal.candidate, proposal.decisions, number, workload_id=self.workload_id)
        if outcome == DUPLICATE:
            self._stale = True
        return {ASSIGNED: Assignment.ASSIGNED, DUPLICATE: Assignment.DUPLICATE}.get(outcome, Assignment.LOST)

    def taken(self) -> set[str]:
        if self._stale:
            self._taken = self.queue.job_candidate_hashes(self.job.id)
            self._stale = False
        return self._taken

    def release(self, slot: Slot, *, exhausted: bool) -> None:
        self.queue.release_slot(slot.handle, exhausted=exhausted)
        self.leases.drop(slot.handle.id)

    def reuse(self, slot: Slot, known: TrialResult) -> None:
        assert slot.candidate is not None
        self.record(slot, slot.candidate, known)  # a baseline an earlier job measured: the slot closes with it

    def record(self, slot: Slot, candidate: Candidate, result: TrialResult) -> bool:
        lease = slot.handle
        result = dataclasses.replace(result, info={**result.info, "job": self.job.id, "worker": self.worker.id})
        recorded = self.queue.finish_slot(lease, workload_id=self.workload_id, candidate=candidate, result=result)
        self.leases.close(lease.id, recorded=recorded)
        if not recorded:
            _log.warning("trial %d (job %d): result refused, the lease expired meanwhile (epoch %d)", lease.id, self.job.id, lease.epoch)
        return recorded

    def record_confirmed(self, results: Sequence[tuple[Candidate, TrialResult]]) -> None:
        self.worker.retry(self.worker.store).commit_trials(workload_id=self.workload_id, items=results)

    def stopping(self) -> bool:
        return self.worker.abandoning()


class RetryingStrategy(SearchStrategy):
    """A job's strategy, its database calls (Optuna's storage is the job's
    database) retried through outages; a sampler bookkeeping error is logged,
    never allowed to lose the job."""

    def __init__(self, inner: SearchStrategy, retry: Retrying) -> None:
        self.inner, self.retry = inner, retry

    def pre_tuning(self, space: Any, history: list[tuple[dict[str, Any], TrialResult]]) -> None:
        self.retry.call("start the sampler", self.inner.pre_tuning, space, history)

    def propose(self, n: int) -> list[Proposal]:
        return self.retry.call("propose", self.inner.propose, n)

    def notify(self, proposal: Proposal, result: TrialResult) -> None:
        self._tell(self.inner.notify, proposal, result)

    def skip(self, proposal: Proposal, known: TrialResult | None) -> None:
        self._tell(self.inner.skip, proposal, known)

    def _tell(self, method: Any, *args: Any) -> None:
        try:
            self.retry.call("tell the sampler", method, *args)
        except Exception as exc:  # noqa: BLE001
            _log.warning("sampler could not take a result: %s", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)

    def post_tuning(self) -> None:
        self.inner.post_tuning()
