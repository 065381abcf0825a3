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
  flight are cut, no new one is made (``Retrying``), and the goodbye to the
  database (handing back the leases, signing off) is given a few seconds in all.

The pieces: ``stages.py`` (the builder, the runner, a job's engine),
``recorder.py`` (the job's recorder, retried database calls, held leases).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
import zlib
from typing import Any

from ..candidate import Lowering
from ..pipeline import Pipeline, PipelineOptions, ReferenceFails, TrialRecord, TuneReport
from ..result import Status
from ..store import Store, StoreError
from ..store.engine import abort_stalled_transactions, close_for_good
from ..store.queue import SEARCH, WARM, W_DRAINING, W_RUNNING, JobQueue, JobRecord, SlotLease, optuna_storage, study_name
from ..store.registry import Registry
from ..workload import WorkloadKey
from .config import Settings
from .recorder import JobRecorder, LeaseBook, Retrying, RetryingStrategy, is_db_error
from .stages import Stages, WorkerOptions, materialize_kernel

_log = logging.getLogger("ws_tuner.worker")

CONFIRM_TOP = 5  # leaders of a job re-timed in its final tournament, beside the best of each baseline
MAX_JOB_CRASHES = 3  # internal errors on one job before the worker fails it rather than retrying
GOODBYE_S = 3.0  # seconds for handing back leases and signing off, once leaving (the sweeper does it otherwise)


# --- the worker ---------------------------------------------------------------


class Worker:
    """One worker process's loop. Its recorders (recorder.py) use ``retry``,
    ``leases``, ``queue``, ``store``, ``draining`` and ``abandoning``."""

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
        self.retry = Retrying(self._abort)  # database calls ride out outages until aborting
        self.leases = LeaseBook()
        self._hb_stop = threading.Event()
        self._optuna: Any = None
        self._crashes: dict[int, int] = {}  # job id -> internal errors met on it

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
            if self._optuna is not None:  # the sampler has nothing left to do; its storage retries on its own
                close_for_good(self._optuna.engine)

    @property
    def draining(self) -> bool:
        return self._stop.is_set()

    def abandoning(self) -> bool:
        """Whether to hand back what is in flight now: aborted, or the drain time is up."""
        if self._stop_at is not None and time.monotonic() - self._stop_at > self.settings.drain_timeout:
            self.abort()  # not only the flag: the calls waiting on a silent database are cut too
        return self._abort.is_set()

    # --- the loop -------------------------------------------------------------------
    def run(self) -> int:
        """Work until drained (SIGTERM) or, with ``exit_when_idle``, until no job has work.
        Returns the number of jobs worked on."""
        queue = self.retry(self.queue)
        queue.register_worker(self.id, host=socket.gethostname(), pid=os.getpid(), gpu=self.options.gpu, device=self.device)
        _log.info("worker %s on %s (%s) started", self.id[:8], socket.gethostname(), self.device)
        heartbeat = threading.Thread(target=self._heartbeat_loop, name="ws-tune-heartbeat", daemon=True)
        heartbeat.start()
        jobs = 0
        try:
            while not self._stop.is_set():
                claim = queue.claim_job(self.id, self.device)
                if claim is None:
                    # Idle means no job this worker could ever help with is unfinished: a
                    # job whose trials are all leased elsewhere may still need a rescue.
                    if self.options.exit_when_idle and not queue.open_jobs(self.device):
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
            # Timestamped, so that a slow stop's log says whether the loop or the goodbye took the time.
            _log.info("worker %s leaving: handing back %d trial(s) in flight", self.id[:8], len(self.leases.held()))
            self._hb_stop.set()
            self._goodbye()
            heartbeat.join(timeout=1)
            self.stages.close()
            if self._optuna is not None:
                self._optuna.engine.dispose()
            _log.info("worker %s stopped: %d trial(s) recorded, %d late result(s) refused", self.id[:8], self.leases.finished, self.leases.rejected)
        return jobs

    def _goodbye(self) -> None:
        """Hand back the leases and sign off, within GOODBYE_S: a database that does
        not answer must not keep a stopping worker alive (the sweeper re-queues)."""

        def goodbye() -> None:
            if not self._hand_back(self.leases.held()):
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
            held_before = self.leases.ids()
            try:
                held = self.queue.heartbeat(self.id, held_before, state=W_DRAINING if self._stop.is_set() else W_RUNNING)
                for lost in sorted(held_before - held):
                    if lost in self.leases.ids():
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
            self._optuna = self.retry.call("open Optuna storage", optuna_storage, self.store.url, timeouts=self.store.timeouts,
                                           abort=self.retry.abort)
            if self.queue.stalled_transaction_timeout:  # a stopped worker inside an Optuna transaction stalls the others too
                abort_stalled_transactions(self._optuna.engine, self.queue.stalled_transaction_timeout)
        return self._optuna

    def _run_job(self, job: JobRecord, started: bool) -> None:
        from .. import search

        queue, store = self.retry(self.queue), self.retry(self.store)
        _log.info("job %d: %s %s, budget %d (%s)", job.id, job.kernel, job.problem, job.budget, "started" if started else "joined")
        try:
            found = self.retry(self.registry).kernel_source(job.kernel_id)
            if found is None:
                raise ValueError(f"kernel source {job.kernel_sha256[:12]} is missing from the database")
            path = materialize_kernel(self.settings.kernel_cache_dir, job.kernel, *found)
            engine = self.stages.engine(job, path)
        except Exception as exc:  # noqa: BLE001 - whatever stops the kernel from loading fails its job, not the worker
            if is_db_error(exc):
                raise
            message = f"cannot load kernel {job.kernel}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
            _log.error("job %d failed: %s", job.id, message)
            message = message.replace(str(self.settings.kernel_cache_dir), "<kernel cache>")  # the API shows it to anyone who reads
            queue.fail_job(job.id, message)
            return
        key = WorkloadKey.make(engine.kernel, engine.source_hash, engine.problem, self.stages.environment)
        workload_id = store.workload_id(key)
        queue.set_job_workload(job.id, workload_id)
        timed = self.stages.runner is not None
        known = {
            h: t for h, t in store.trials_by_hash(workload_id=workload_id).items()
            if t.result.status is not Status.BUILT or not timed
        }  # fmt: skip
        seed = (job.seed + zlib.crc32(self.id.encode())) & 0x7FFFFFFF  # workers sample differently
        storage = self._optuna_storage()  # the job's study: its sampler's state, and the record optuna-dashboard reads
        strategy = RetryingStrategy(search.create(job.strategy, seed=seed, storage=storage, study_name=study_name(job.id)), self.retry)
        strategy.pre_tuning(engine.space, [(t.result.info.get("decisions", {}), t.result) for t in known.values()])
        baselines = engine.baselines() if job.baselines else []
        # The lowering starts are planned from the seed schedule's baselines, once they are in.
        recorder = JobRecorder(self, job, workload_id, starts=(lambda: engine.starts(self._stored(workload_id))) if job.baselines else None,
                               awaited=[c.hash for c in baselines if c.lowering is Lowering.WS])  # fmt: skip
        pipeline = Pipeline(
            engine.ref, builder=self.stages.builder, runner=self.stages.runner, strategy=strategy, recorder=recorder,
            report=TuneReport(key, workload_id, compile_only=not timed),
            known=known,
            options=PipelineOptions(max_in_flight=max(self.options.jobs, 1) + (1 if timed else 0), confirm_top=CONFIRM_TOP,
                                    evaluator=engine.evaluator),
        )  # fmt: skip
        try:
            # Every worker of the job queues the baselines (idempotent): the starts wait for the seeds'
            # slots, which a worker that joined before the starter queued them would not find.
            queue.add_baseline_slots(job.id, baselines)
            if started:
                queue.add_baseline_slots(job.id, engine.warm(self.store, key, workload_id), kind=WARM)
            try:
                pipeline.choose_anchor(engine.anchors())
            except ReferenceFails as exc:  # nothing of the job can be checked: it fails, not the worker
                _log.error("job %d failed: %s", job.id, exc)
                queue.fail_job(job.id, str(exc))
                return
            pipeline.run()
        finally:
            if self._abort.is_set():
                # Leaving, whether the loop saw it or a refused database call ended it:
                # what is in flight is cancelled (nobody waits for its compile or run),
                # and its leases, still in self.leases, go back in the goodbye, bounded
                # as a whole, not here one database call at a time.
                pipeline.abandon()
            strategy.post_tuning()
        if not self._abort.is_set() and queue.complete_job_if_done(job.id):
            _log.info("job %d succeeded", job.id)
            if timed:
                self._confirm(pipeline, workload_id)

    def _confirm(self, pipeline: Pipeline, workload_id: int) -> None:
        """The final tournament of the job's leaders and baselines (every worker's),
        run by the one worker that saw the job complete."""
        pipeline.report.records = self._stored(workload_id)
        confirmed = pipeline.confirm()
        _log.info("workload %d: %d result(s) confirmed in the final tournament", workload_id, len(confirmed))

    def _stored(self, workload_id: int) -> list[TrialRecord]:
        """The workload's stored trials (every worker's, and earlier jobs' and runs'), as records."""
        trials = self.retry(self.store).trials_by_hash(workload_id=workload_id)
        return [TrialRecord(t.candidate, t.result, t.result.info.get("role", SEARCH), cached=True) for t in trials.values()]

    def _job_crashed(self, job: JobRecord, exc: Exception) -> None:
        """An unexpected error while running a job: hand its trials back and try again;
        the third time on the same job, fail the job with the error instead of looping."""
        _log.exception("job %d: internal error", job.id)
        self._hand_back(self.leases.held())
        self._crashes[job.id] = self._crashes.get(job.id, 0) + 1
        if self._crashes[job.id] >= MAX_JOB_CRASHES:
            message = f"worker internal error, {MAX_JOB_CRASHES} times: {type(exc).__name__}: {exc}".splitlines()[0]
            self.retry(self.queue).fail_job(job.id, message)
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
            self.leases.drop(lease.id)
        return reachable
