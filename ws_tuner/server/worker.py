"""The worker loop: claim a job, claim its trial slots one by one, propose,
build, run, record; heartbeat all along; drain on SIGTERM.

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
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TypeVar

from ..builder import Builder, BuildInput, BuildResult
from ..candidate import Candidate, Lowering, sha256_hex
from ..result import Status, TrialResult
from ..runner import EvaluatorConfig, RunInput, Runner
from ..search import Proposal, SearchStrategy
from ..store import Store, StoreError, StoredTrial
from ..store.queue import ASSIGNED, BASELINE, DUPLICATE, SEARCH, W_DRAINING, W_RUNNING, JobQueue, JobRecord, SlotLease, study_name
from ..store.registry import Registry
from ..workload import Environment, WorkloadKey
from .config import Settings

_log = logging.getLogger("ws_tuner.worker")
T = TypeVar("T")

MAX_PROPOSALS_PER_SLOT = 200  # refused proposals in a row before the space counts as exhausted
MAX_JOB_CRASHES = 3  # internal errors on one job before the worker fails it rather than retrying
GOODBYE_S = 3.0  # seconds for handing back leases and signing off, once leaving (the sweeper does it otherwise)


@dataclass(frozen=True)
class WorkerOptions:
    gpu: int | None = None
    runner: str = "auto"  # auto (GPU if present, else compile-only), local, dummy, none
    builder: str = "local"  # local, verify-only, fake
    space: str = "kernel"  # kernel, fake (a synthetic space for tests)
    jobs: int = 1  # compile processes
    compile_timeout: float = 300.0
    run_timeout: float = 60.0
    runner_delay: float = 0.0  # seconds per candidate of the dummy runner (tests)
    exit_when_idle: bool = False  # leave once no job this worker could run is unfinished (tests, batch use)


# --- stages -------------------------------------------------------------------


@dataclass
class JobEngine:
    """What one job needs from the engine: the space, and inputs for the stages."""

    kernel: str
    kernel_path: str
    source_hash: str
    problem: dict[str, Any]
    space: Any
    baselines: Callable[[], list[Candidate]] = field(default=lambda: [])
    evaluator: EvaluatorConfig = field(default_factory=EvaluatorConfig)

    def build_input(self, candidate: Candidate) -> BuildInput:
        return BuildInput(self.kernel_path, self.source_hash, self.problem, candidate)

    def run_input(self, candidate: Candidate) -> RunInput:
        return RunInput(self.kernel_path, self.source_hash, self.problem, candidate, self.evaluator)


class Stages:
    """The builder and runner of a worker (made once, shared by its jobs)."""

    def __init__(self, options: WorkerOptions) -> None:
        self.options = options
        self.builder = self._builder()
        self.runner = self._runner()
        self.environment = self._environment()

    def _builder(self) -> Builder:
        kind = self.options.builder
        if kind == "fake":
            from .fakes import FakeBuilder

            return FakeBuilder()
        if kind == "verify-only":
            from ..testing import VerifyOnlyBuilder

            return VerifyOnlyBuilder()
        if kind == "local":
            from ..builder import LocalBuilder

            return LocalBuilder(jobs=self.options.jobs, timeout=self.options.compile_timeout)
        raise ValueError(f"unknown builder {kind!r}; choose local, verify-only or fake")

    def _runner(self) -> Runner | None:
        kind = self.options.runner
        if kind == "dummy":
            if self.options.space == "fake":
                from .fakes import FastDummyRunner, fake_latency

                return FastDummyRunner(delay=self.options.runner_delay, latency=fake_latency)
            from ..testing import DummyRunner  # the engine's own double: the same workload key as its tests

            return DummyRunner(delay=self.options.runner_delay)
        if kind == "none":
            return None
        from ..runner import LocalRunner, gpu_available

        if kind == "auto" and not gpu_available():
            _log.warning("no NVIDIA GPU found: this worker compiles only (nothing is timed)")
            return None
        if kind in ("auto", "local"):
            return LocalRunner(self.options.gpu or 0)
        raise ValueError(f"unknown runner {kind!r}; choose auto, local, dummy or none")

    def _environment(self) -> Environment:
        if self.runner is not None:
            return self.runner.environment()
        if self.options.space == "fake":
            from .fakes import FastDummyRunner

            env = FastDummyRunner().environment()
            return Environment(env.arch, "compile-only", env.tilelang_version, env.cuda_version, "none")
        from ..tune import compile_only_environment

        return compile_only_environment()

    def engine(self, job: JobRecord, kernel_path: Path) -> JobEngine:
        evaluator = EvaluatorConfig(timeout=self.options.run_timeout)
        if self.options.space == "fake":
            from .fakes import FakeSpace, fake_baselines

            return JobEngine(job.kernel, str(kernel_path), job.kernel_sha256, dict(job.problem), FakeSpace(),
                             baselines=fake_baselines, evaluator=evaluator)  # fmt: skip
        from ..task import Task

        # Uploaded source is code: it runs in spawned processes only (here, and in
        # the builder's and runner's pools), never in this one, which holds the
        # database credentials.
        task = Task.isolated(str(kernel_path), dict(job.problem), job.params)
        spec, problem = task.spec, task.problem
        space = task.space()
        timed = self.runner is not None

        def baselines() -> list[Candidate]:
            points = [p for p in space.param_points() if not isinstance(space.shape(p), str)]
            out: list[Candidate] = []
            for params in points if timed else points[:1]:
                out += task.baselines(dict(params))
            if timed:
                out.append(Candidate.make({}, None, Lowering.REFERENCE))
            return out

        return JobEngine(spec.name, str(spec.path), spec.source_hash, problem, space, baselines, evaluator)

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


@dataclass
class _Work:
    lease: SlotLease
    proposal: Proposal
    build: BuildResult | None = None


class Worker:
    def __init__(self, store: Store, settings: Settings, options: WorkerOptions = WorkerOptions(), *, stages: Stages | None = None) -> None:
        self.store, self.settings, self.options = store, settings, options
        self.queue = JobQueue(store, stalled_transaction_timeout=max(5.0, 4 * settings.grace))
        self.registry = Registry(store)
        self.stages = stages or Stages(options)
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
            from ..store.queue import optuna_storage

            self._optuna = self._db("open Optuna storage", optuna_storage, self.store.url, timeouts=self.store.timeouts)
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
        strategy = search.create(job.strategy, seed=seed, storage=storage, study_name=study_name(job.id))
        history = [(t.result.info.get("decisions", {}), t.result) for t in known.values()]
        self._db("start the sampler", strategy.pre_tuning, engine.space, history)
        try:
            if started and job.baselines:
                self._db("queue baselines", self.queue.add_baseline_slots, job.id, engine.baselines())
            _JobRun(self, job, engine, strategy, workload_id, known).run()
        finally:
            strategy.post_tuning()
        if self._db("complete job", self.queue.complete_job_if_done, job.id):
            _log.info("job %d succeeded", job.id)

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


class _JobRun:
    """One worker's part of one job: a small pipeline of leased slots."""

    def __init__(
        self, worker: Worker, job: JobRecord, engine: JobEngine, strategy: SearchStrategy, workload_id: int,
        known: dict[str, StoredTrial],
    ) -> None:  # fmt: skip
        self.w, self.job, self.engine, self.strategy = worker, job, engine, strategy
        self.workload_id, self.known = workload_id, known
        stages = worker.stages
        self.builder, self.runner = stages.builder, stages.runner
        self.max_in_flight = max(worker.options.jobs, 1) + (1 if self.runner is not None else 0)
        self.in_flight: dict[Future, _Work] = {}
        self.taken: set[str] = set()  # candidates of other slots of the job, as last read

    def run(self) -> None:
        w = self.w
        claiming = True
        while True:
            if w._stop.is_set():
                claiming = False
                if w._stop_at is not None and time.monotonic() - w._stop_at > w.settings.drain_timeout:
                    w._abort.set()
            if w._abort.is_set():
                break
            while claiming and len(self.in_flight) < self.max_in_flight:
                claiming = self._claim_one()
            if not self.in_flight:
                break
            done, _ = wait(list(self.in_flight), timeout=0.5, return_when=FIRST_COMPLETED)
            for fut in done:
                self._advance(fut, self.in_flight.pop(fut))
        if self.in_flight:  # aborted: what is still in flight goes back to the queue
            w._hand_back([work.lease for work in self.in_flight.values()])
            self.in_flight.clear()

    def _claim_one(self) -> bool:
        """Claim a slot and start building its candidate; False when the job has nothing more."""
        w = self.w
        lease = w._db("claim a trial", w.queue.claim_slot, self.job.id, w.id)
        if lease is None:
            return False
        w._leases[lease.id] = lease
        proposal, exhausted = self._proposal(lease)
        if proposal is None:
            # The space ran dry: drop the slot, the job claims no more. Otherwise
            # (aborting, or the lease was lost meanwhile) the slot goes back.
            w._db("release", w.queue.release_slot, lease, exhausted=exhausted)
            w._leases.pop(lease.id, None)
            return False
        fut = self.builder.submit(self.engine.build_input(proposal.candidate))
        self.in_flight[fut] = _Work(lease, proposal)
        return True

    def _proposal(self, lease: SlotLease) -> tuple[Proposal | None, bool]:
        """The slot's candidate: its own (a retry or a baseline), else a fresh
        proposal; (None, True) when the space is exhausted."""
        w = self.w
        if lease.candidate is not None:
            return Proposal(lease.candidate, dict(lease.decisions), token=lease.optuna_trial), False
        # Skipping what is known or taken is bounded by how much is known or taken;
        # beyond that, a run of refusals means the strategy has nothing new.
        for _ in range(len(self.known) + self.job.budget + MAX_PROPOSALS_PER_SLOT):
            if w._abort.is_set():
                return None, False
            proposals = w._db("propose", self.strategy.propose, 1)
            if not proposals:
                return None, True
            proposal = proposals[0]
            candidate = proposal.candidate
            if candidate.hash in self.known:  # measured before (an earlier run or job)
                self._notify(proposal, self.known[candidate.hash].result)
                continue
            if candidate.hash in self.taken:  # another slot of this job has it (seen before)
                self._notify(proposal, TrialResult(candidate.hash, Status.REJECTED, "duplicate of another trial of the job"))
                continue
            number = getattr(proposal.token, "number", None)
            outcome = w._db("assign", w.queue.assign_candidate, lease, candidate, proposal.decisions, number,
                            workload_id=self.workload_id)  # fmt: skip
            if outcome == ASSIGNED:
                return proposal, False
            if outcome == DUPLICATE:  # another slot of this job holds it: learn what else is taken
                self.taken = w._db("taken candidates", w.queue.job_candidate_hashes, self.job.id)
                self._notify(proposal, TrialResult(candidate.hash, Status.REJECTED, "duplicate of another trial of the job"))
                continue
            # LOST: the slot is someone else's now; the proposal is told as failed.
            self._notify(proposal, TrialResult(candidate.hash, Status.REJECTED, "lease lost before the trial started"))
            return None, False
        return None, True

    def _advance(self, fut: Future, work: _Work) -> None:
        if work.build is None:
            build: BuildResult = fut.result()
            if build.ok and self.runner is not None:
                work.build = build
                self.in_flight[self.runner.submit(self.engine.run_input(work.proposal.candidate))] = work
                return
            self._finish(work, TrialResult(work.proposal.candidate.hash, build.status, build.message, build_seconds=build.seconds))
            return
        result: TrialResult = fut.result()
        self._finish(work, dataclasses.replace(result, build_seconds=work.build.seconds))

    def _finish(self, work: _Work, result: TrialResult) -> None:
        w, lease = self.w, work.lease
        role = "baseline" if lease.kind == BASELINE else "search"
        info = {**result.info, "role": role, "decisions": work.proposal.decisions, "job": self.job.id, "worker": w.id}
        result = dataclasses.replace(result, info=info)
        recorded = w._db("record a trial", w.queue.finish_slot, lease, workload_id=self.workload_id,
                         candidate=work.proposal.candidate, result=result)  # fmt: skip
        w._leases.pop(lease.id, None)
        if not recorded:
            w.rejected += 1
            _log.warning("trial %d (job %d): result refused, the lease expired meanwhile (epoch %d)", lease.id, self.job.id, lease.epoch)
            return
        w.finished += 1
        if lease.kind == SEARCH:
            self._notify(work.proposal, result)

    def _notify(self, proposal: Proposal, result: TrialResult) -> None:
        try:
            self.w._db("tell the sampler", self.strategy.notify, proposal, result)
        except Exception as exc:  # noqa: BLE001 - a sampler bookkeeping error must not lose the job
            _log.warning("sampler could not take a result: %s", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)


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
