"""The worker loop: claim a job and drive the measurement pipeline
(pipeline.py, the same as the CLI's) over its slots; heartbeat all along;
drain on SIGTERM. The job's ``JobRecorder`` is what differs from the CLI:
places are leased slots, results finish them. After the job's last slot the
worker that completes it runs the final tournament of its leaders.

How the promises are kept (the store's ``queue.py`` holds the SQL):

* Budget: a slot is claimed in the database *before* a candidate is proposed,
  so workers sharing a job never measure more than its budget.
* Sharing: the job's sampler state lives in Optuna's RDB storage on the same
  database (study ``job-<id>``); each worker samples with its own seed, and a
  candidate another slot already holds is refused by a unique key and told to
  the sampler as a failure, so no candidate is measured twice in a job.
* Crashes: a slot in flight is leased (heartbeat on the DB clock, epoch as a
  fencing token). A worker killed mid-trial loses that trial only; any
  worker's or the server's sweeper re-queues it after the grace period, and a
  result arriving after its lease expired is refused (``finish_slot``).
* Outages: database errors are retried with backoff, so a worker rides out a
  restart of PostgreSQL and then records what it measured (or learns that it
  lost the lease).
* SIGTERM: no new slots are claimed; the candidates in flight finish within
  ``drain_timeout`` or are handed back (re-queued, not failed). A second
  signal hands them back at once. Either way the worker is gone within the
  drain time even while the database does not answer: database calls in
  flight are cut, and the goodbyes to the database are given a few seconds.

The kernel file is loaded here, in the worker process (its ``kernel()`` builds
the schedule space), and compiled and run in the builder's and runner's own
spawned processes: never in the API server.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import threading
import time
import uuid
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TypeVar

from ..builder import Builder
from ..candidate import Candidate, sha256_hex
from ..pipeline import Assignment, Pipeline, PipelineOptions, Recorder, Slot, TaskRef, TrialRecord, TuneReport
from ..result import Status, TrialResult
from ..runner import EvaluatorConfig, Runner
from ..search import Proposal, SearchStrategy
from ..store import Store, StoreError
from ..store.queue import ASSIGNED, BASELINE, DUPLICATE, SEARCH, WARM, W_DRAINING, W_RUNNING, JobQueue, JobRecord, SlotLease, study_name
from ..store.registry import Registry
from ..workload import Environment, WorkloadKey
from .config import Settings

_log = logging.getLogger("ws_tuner.worker")
T = TypeVar("T")

CONFIRM_TOP = 5  # leaders of a job re-timed in its final tournament, beside the best of each baseline
ROLES = {BASELINE: "baseline", WARM: "warm", SEARCH: "search"}  # slot kind -> the role its result records
MAX_JOB_CRASHES = 3  # internal errors on one job before the worker fails it rather than retrying
GOODBYE_S = 3.0  # seconds for handing back leases and signing off, once leaving (the sweeper does it otherwise)


@dataclass(frozen=True)
class WorkerOptions:
    gpu: int | None = None
    compile_only: bool = False  # time nothing (a worker on a machine without a GPU compiles only anyway)
    jobs: int = 1  # compile processes
    compile_timeout: float = 300.0
    run_timeout: float = 60.0
    exit_when_idle: bool = False  # leave once no job this worker could run is unfinished (batch use, tests)


# --- stages -------------------------------------------------------------------


@dataclass
class JobEngine:
    """What one job needs from the engine: the space, and what to measure first."""

    kernel: str
    kernel_path: str
    source_hash: str
    problem: dict[str, Any]
    space: Any
    baselines: Callable[[], list[Candidate]] = field(default=lambda: [])
    anchors: Callable[[], list[Candidate]] = field(default=lambda: [])
    # The best schedules of the nearest stored problem: (store, key, workload id) -> candidates.
    warm: Callable[[Store, WorkloadKey, int], list[Candidate]] = field(default=lambda store, key, workload_id: [])
    evaluator: EvaluatorConfig = field(default_factory=EvaluatorConfig)

    @property
    def ref(self) -> TaskRef:
        return TaskRef(self.kernel_path, self.source_hash, self.problem)


class Stages:
    """The builder and runner of a worker (made once, shared by its jobs), and
    how a job's kernel file becomes a ``JobEngine``."""

    def __init__(self, builder: Builder, runner: Runner | None, environment: Environment, options: WorkerOptions) -> None:
        self.builder, self.runner, self.environment, self.options = builder, runner, environment, options

    @classmethod
    def local(cls, options: WorkerOptions) -> "Stages":
        """This machine's compiler and GPU (none: compile-only)."""
        from ..builder import LocalBuilder
        from ..runner import LocalRunner, gpu_available
        from ..tune import compile_only_environment

        builder = LocalBuilder(jobs=options.jobs, timeout=options.compile_timeout)
        runner: Runner | None = None
        if not options.compile_only:
            if gpu_available():
                runner = LocalRunner(options.gpu or 0)
            else:
                _log.warning("no NVIDIA GPU found: this worker compiles only (nothing is timed)")
        return cls(builder, runner, runner.environment() if runner else compile_only_environment(), options)

    def engine(self, job: JobRecord, kernel_path: Path) -> JobEngine:
        from ..task import Task
        from ..tune import nearest_best

        # Uploaded source is code: it runs in spawned processes only (here, and in
        # the builder's and runner's pools), never in this one, which holds the
        # database credentials.
        task = Task.isolated(str(kernel_path), dict(job.problem), job.params)
        space = task.space()
        timed = self.runner is not None

        def points() -> list[Any]:
            return [p for p in space.param_points() if not isinstance(space.shape(p), str)]

        def baselines() -> list[Candidate]:
            valid = points()
            out: list[Candidate] = []
            for params in valid if timed else valid[:1]:
                out += task.baselines(dict(params))
            return out + (task.vendor_baselines() if timed else [])

        return JobEngine(
            task.spec.name, str(task.spec.path), task.spec.source_hash, task.problem, space, baselines,
            anchors=lambda: task.anchors(points()),
            warm=lambda store, key, workload_id: nearest_best(store, key, workload_id, task),
            evaluator=EvaluatorConfig(timeout=self.options.run_timeout),
        )  # fmt: skip

    def close(self) -> None:
        self.builder.close()
        if self.runner is not None:
            self.runner.close()


def materialize_kernel(cache_dir: Path, name: str, sha256: str, source: str) -> Path:
    """Write a stored source to ``<cache>/<sha256>/<name>.py`` (atomically, checked):
    the file's stem is the kernel's name and its hash the workload's source hash."""
    data = source.encode("utf-8")
    if sha256_hex(data) != sha256:
        raise StoreError(f"kernel source {sha256[:12]} does not match its hash; the database is corrupt")
    path = cache_dir / sha256 / f"{name}.py"
    if path.is_file() and sha256_hex(path.read_bytes()) == sha256:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return path


# --- the worker ---------------------------------------------------------------


class Worker:
    def __init__(self, store: Store, settings: Settings, options: WorkerOptions = WorkerOptions(), *, stages: Stages | None = None) -> None:
        self.store, self.settings, self.options = store, settings, options
        self.queue = JobQueue(store, stalled_transaction_timeout=max(5.0, 4 * settings.grace))
        self.registry = Registry(store)
        self.stages = stages or Stages.local(options)
        self.id = uuid.uuid4().hex
        self.device = self.stages.environment.device
        self._stop = threading.Event()  # drain: finish what is in flight, claim nothing new
        self._abort = threading.Event()  # hand back what is in flight, now
        self._stop_at: float | None = None
        self._drain_timer: threading.Timer | None = None
        self._leases: dict[int, SlotLease] = {}
        self._hb_stop = threading.Event()
        self._optuna: Any = None
        self._crashes: dict[int, int] = {}  # job id -> internal errors met on it
        self.finished = 0  # slots this worker recorded
        self.rejected = 0  # results refused because the lease was lost

    # --- control ----------------------------------------------------------------
    def drain(self) -> None:
        """Finish the candidates in flight (up to drain_timeout), claim nothing new, exit."""
        if not self._stop.is_set():
            self._stop_at = time.monotonic()
            self._stop.set()
            _log.info("worker %s draining (up to %.0f s)", self.id[:8], self.settings.drain_timeout)
            # Whatever the loop is waiting on (a compile, the database), the drain time holds.
            self._drain_timer = threading.Timer(self.settings.drain_timeout, self.abort)
            self._drain_timer.daemon = True
            self._drain_timer.start()

    def abort(self) -> None:
        """Hand back the candidates in flight and exit; database calls in flight fail at once."""
        self.drain()
        if not self._abort.is_set():
            self._abort.set()
            self.store.interrupt()
            if self._optuna is not None:
                from ..store.guard import interrupt

                interrupt(self._optuna.engine)

    @property
    def draining(self) -> bool:
        return self._stop.is_set()

    # --- database calls, retried through outages ---------------------------------
    def _db(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        delay = 0.2
        while True:
            try:
                return fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - StoreError, or Optuna's wrapping of a driver error
                if not _is_db_error(exc):
                    raise
                if self._abort.is_set():
                    raise StoreError(f"{what}: gave up on the database while aborting: {exc}") from None
                _log.warning("database unavailable (%s): %s; retrying in %.1f s", what, str(exc).splitlines()[0][:300], delay)
                self._abort.wait(delay)
                delay = min(delay * 2, 5.0)

    # --- the loop -------------------------------------------------------------------
    def run(self) -> int:
        """Work until drained (SIGTERM) or, with ``exit_when_idle``, until no job has work.
        Returns the number of jobs worked on."""
        self._db("register", self.queue.register_worker, self.id, host=socket.gethostname(), pid=os.getpid(),
                 gpu=self.options.gpu, device=self.device)  # fmt: skip
        _log.info("worker %s on %s (%s) started", self.id[:8], socket.gethostname(), self.device)
        heartbeat = threading.Thread(target=self._heartbeat_loop, name="ws-tune-heartbeat", daemon=True)
        heartbeat.start()
        jobs = 0
        try:
            while not self._stop.is_set():
                claim = self._db("claim a job", self.queue.claim_job, self.id, self.device)
                if claim is None:
                    # Idle means no job this worker could ever help with is unfinished: a
                    # job whose trials are all leased elsewhere may still need a rescue.
                    if self.options.exit_when_idle and not self._db("open jobs", self.queue.open_jobs, self.device):
                        break
                    self._stop.wait(self.settings.poll_interval)
                    continue
                jobs += 1
                try:
                    self._run_job(*claim)
                except Exception as exc:  # noqa: BLE001 - a bug met on one job must not take the worker down
                    if self._abort.is_set():
                        break  # leaving: what it holds is handed back below
                    self._job_crashed(claim[0], exc)
        finally:
            if self._drain_timer is not None:
                self._drain_timer.cancel()
            self._hb_stop.set()
            self._goodbye()
            heartbeat.join(timeout=1)
            self.stages.close()
            if self._optuna is not None:
                self._optuna.engine.dispose()
            _log.info("worker %s stopped: %d trial(s) recorded, %d late result(s) refused", self.id[:8], self.finished, self.rejected)
        return jobs

    def _goodbye(self) -> None:
        """Hand back the leases and sign off, within GOODBYE_S: a database that does
        not answer must not keep a stopping worker alive (the sweeper re-queues)."""

        def goodbye() -> None:
            if not self._hand_back(list(self._leases.values())):
                return
            try:
                self.queue.worker_stopped(self.id)
            except StoreError as exc:
                _log.warning("could not mark worker %s stopped: %s", self.id[:8], exc)

        thread = threading.Thread(target=goodbye, name="ws-tune-goodbye", daemon=True)
        thread.start()
        thread.join(GOODBYE_S)
        if thread.is_alive():
            _log.warning("worker %s: the database did not answer while leaving; the sweeper will re-queue its trials", self.id[:8])

    def _heartbeat_loop(self) -> None:
        settings = self.settings
        while not self._hb_stop.wait(settings.heartbeat_interval):
            held_before = set(self._leases)
            try:
                held = self.queue.heartbeat(self.id, state=W_DRAINING if self._stop.is_set() else W_RUNNING)
                for lost in sorted(held_before - held):
                    if lost in self._leases:
                        _log.warning("lease of trial %d lost (expired or handed over); its result will be refused", lost)
                self.queue.sweep(grace=settings.grace, max_retry=settings.max_retry)
                if self._optuna is not None:
                    self.queue.fail_orphan_trials(self._optuna, self.queue.sampled_jobs(), grace=settings.grace)
            except StoreError as exc:
                _log.warning("heartbeat: %s", exc)
            except Exception:  # noqa: BLE001 - the heartbeat must not die
                _log.exception("heartbeat round failed")

    def _optuna_storage(self) -> Any:
        if self._optuna is None:
            from ..store.queue import abort_stalled_transactions, optuna_storage

            self._optuna = self._db("open Optuna storage", optuna_storage, self.store.url, timeouts=self.store.timeouts)
            if self.queue.stalled_transaction_timeout:  # a stopped worker inside an Optuna transaction stalls the others too
                abort_stalled_transactions(self._optuna.engine, self.queue.stalled_transaction_timeout)
        return self._optuna

    def _run_job(self, job: JobRecord, started: bool) -> None:
        from .. import search

        _log.info("job %d: %s %s, budget %d (%s)", job.id, job.kernel, job.problem, job.budget, "started" if started else "joined")
        try:
            found = self._db("read kernel source", self.registry.kernel_source, job.kernel_id)
            if found is None:
                raise ValueError(f"kernel source {job.kernel_sha256[:12]} is missing from the database")
            path = materialize_kernel(self.settings.kernel_cache_dir, job.kernel, *found)
            engine = self.stages.engine(job, path)
        except Exception as exc:  # noqa: BLE001 - whatever stops the kernel from loading fails its job, not the worker
            if _is_db_error(exc):
                raise
            message = f"cannot load kernel {job.kernel}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
            _log.error("job %d failed: %s", job.id, message)
            message = message.replace(str(self.settings.kernel_cache_dir), "<kernel cache>")  # the API shows it to anyone who reads
            self._db("fail job", self.queue.fail_job, job.id, message)
            return
        key = WorkloadKey.make(engine.kernel, engine.source_hash, engine.problem, self.stages.environment)
        workload_id = self._db("workload", self.store.workload_id, key)
        self._db("job workload", self.queue.set_job_workload, job.id, workload_id)
        timed = self.stages.runner is not None
        known = {
            h: t for h, t in self._db("stored trials", self.store.trials_by_hash, workload_id=workload_id).items()
            if t.result.status is not Status.BUILT or not timed
        }  # fmt: skip
        seed = (job.seed + zlib.crc32(self.id.encode())) & 0x7FFFFFFF  # workers sample differently
        storage = self._optuna_storage() if job.strategy != "grid" else None
        strategy = _Retrying(search.create(job.strategy, seed=seed, storage=storage, study_name=study_name(job.id)), self)
        strategy.pre_tuning(engine.space, [(t.result.info.get("decisions", {}), t.result) for t in known.values()])
        pipeline = Pipeline(
            engine.ref, builder=self.stages.builder, runner=self.stages.runner, strategy=strategy,
            recorder=JobRecorder(self, job, workload_id), report=TuneReport(key, workload_id, compile_only=not timed),
            known=known,
            options=PipelineOptions(max_in_flight=max(self.options.jobs, 1) + (1 if timed else 0), confirm_top=CONFIRM_TOP,
                                    evaluator=engine.evaluator),
        )  # fmt: skip
        try:
            if started:
                if job.baselines:
                    self._db("queue baselines", self.queue.add_baseline_slots, job.id, engine.baselines())
                self._db("queue the warm start", self.queue.add_baseline_slots, job.id, engine.warm(self.store, key, workload_id), kind=WARM)
            pipeline.choose_anchor(engine.anchors())
            pipeline.run()
            if self._abort.is_set():  # what is still in flight goes back to the queue
                self._hand_back([slot.handle for slot in pipeline.abandon()])
        finally:
            strategy.post_tuning()
        if not self._abort.is_set() and self._db("complete job", self.queue.complete_job_if_done, job.id):
            _log.info("job %d succeeded", job.id)
            if timed:
                self._confirm(pipeline, workload_id)

    def _confirm(self, pipeline: Pipeline, workload_id: int) -> None:
        """The final tournament of the job's leaders and baselines (every worker's),
        run by the one worker that saw the job complete."""
        trials = self._db("stored trials", self.store.trials_by_hash, workload_id=workload_id)
        pipeline.report.records = [TrialRecord(t.candidate, t.result, t.result.info.get("role", SEARCH), cached=True)
                                   for t in trials.values()]  # fmt: skip
        confirmed = pipeline.confirm()
        _log.info("workload %d: %d result(s) confirmed in the final tournament", workload_id, len(confirmed))

    def _job_crashed(self, job: JobRecord, exc: Exception) -> None:
        """An unexpected error while running a job: hand its trials back and try again;
        the third time on the same job, fail the job with the error instead of looping."""
        _log.exception("job %d: internal error", job.id)
        self._hand_back(list(self._leases.values()))
        self._crashes[job.id] = self._crashes.get(job.id, 0) + 1
        if self._crashes[job.id] >= MAX_JOB_CRASHES:
            message = f"worker internal error, {MAX_JOB_CRASHES} times: {type(exc).__name__}: {exc}".splitlines()[0]
            self._db("fail job", self.queue.fail_job, job.id, message)
        else:
            self._stop.wait(min(self.settings.poll_interval * 5, 10.0))

    def _hand_back(self, leases: list[SlotLease]) -> bool:
        """Re-queue these leases; False if the database did not answer (the sweeper will)."""
        reachable = True  # after one failure, leave the rest to the sweeper rather than wait on each
        for lease in leases:
            if reachable:
                try:
                    if self.queue.release_slot(lease):
                        _log.info("handed back trial %d (job %d) for another worker", lease.id, lease.job_id)
                except StoreError as exc:
                    reachable = False
                    _log.warning("could not hand back trial %d: %s (the sweeper will)", lease.id, exc)
            self._leases.pop(lease.id, None)
        return reachable


class JobRecorder(Recorder):
    """The worker's recorder: places are the job's slots, claimed and leased in the
    database (so workers sharing a job never measure more than its budget), and
    results finish them, fenced by the lease's epoch."""

    def __init__(self, worker: "Worker", job: JobRecord, workload_id: int) -> None:
        self.w, self.job, self.workload_id = worker, job, workload_id
        self._taken: set[str] = set()
        self._stale = True  # the candidates other slots hold are read again when needed

    def claim(self) -> Slot | None:
        w = self.w
        if w.draining:
            return None
        lease = w._db("claim a trial", w.queue.claim_slot, self.job.id, w.id)
        if lease is None:
            return None
        w._leases[lease.id] = lease
        return Slot(ROLES.get(lease.kind, SEARCH), lease.candidate, dict(lease.decisions), token=lease.optuna_trial, handle=lease)

    def assign(self, slot: Slot, proposal: Proposal) -> str:
        number = getattr(proposal.token, "number", None)
        outcome = self.w._db("assign", self.w.queue.assign_candidate, slot.handle, proposal.candidate, proposal.decisions, number,
                             workload_id=self.workload_id)  # fmt: skip
        if outcome == DUPLICATE:
            self._stale = True
        return {ASSIGNED: Assignment.ASSIGNED, DUPLICATE: Assignment.DUPLICATE}.get(outcome, Assignment.LOST)

    def taken(self) -> set[str]:
        if self._stale:
            self._taken = self.w._db("taken candidates", self.w.queue.job_candidate_hashes, self.job.id)
            self._stale = False
        return self._taken

    def release(self, slot: Slot, *, exhausted: bool) -> None:
        self.w._db("release", self.w.queue.release_slot, slot.handle, exhausted=exhausted)
        self.w._leases.pop(slot.handle.id, None)

    def reuse(self, slot: Slot, known: TrialResult) -> None:
        assert slot.candidate is not None
        self.record(slot, slot.candidate, known)  # a baseline an earlier job measured: the slot closes with it

    def record(self, slot: Slot, candidate: Candidate, result: TrialResult) -> bool:
        w, lease = self.w, slot.handle
        result = dataclasses.replace(result, info={**result.info, "job": self.job.id, "worker": w.id})
        recorded = w._db("record a trial", w.queue.finish_slot, lease, workload_id=self.workload_id, candidate=candidate, result=result)
        w._leases.pop(lease.id, None)
        if not recorded:
            w.rejected += 1
            _log.warning("trial %d (job %d): result refused, the lease expired meanwhile (epoch %d)", lease.id, self.job.id, lease.epoch)
            return False
        w.finished += 1
        return True

    def record_confirmed(self, candidate: Candidate, result: TrialResult) -> None:
        self.w._db("record a confirmed trial", self.w.store.commit_trial, workload_id=self.workload_id, candidate=candidate, result=result)

    def stopping(self) -> bool:
        w = self.w
        if w._stop_at is not None and time.monotonic() - w._stop_at > w.settings.drain_timeout:
            w._abort.set()
        return w._abort.is_set()


class _Retrying(SearchStrategy):
    """The job's strategy, its database calls (Optuna's storage is the job's
    database) retried through outages; a sampler bookkeeping error is logged,
    never allowed to lose the job."""

    def __init__(self, inner: SearchStrategy, worker: "Worker") -> None:
        self.inner, self.w = inner, worker

    def pre_tuning(self, space: Any, history: list[tuple[dict[str, Any], TrialResult]]) -> None:
        self.w._db("start the sampler", self.inner.pre_tuning, space, history)

    def propose(self, n: int) -> list[Proposal]:
        return self.w._db("propose", self.inner.propose, n)

    def notify(self, proposal: Proposal, result: TrialResult) -> None:
        try:
            self.w._db("tell the sampler", self.inner.notify, proposal, result)
        except Exception as exc:  # noqa: BLE001
            _log.warning("sampler could not take a result: %s", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)

    def post_tuning(self) -> None:
        self.inner.post_tuning()


def _is_db_error(exc: BaseException) -> bool:
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
