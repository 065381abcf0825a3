"""What a worker measures with: its builder and runner (made once, shared by its
jobs), and how a job's kernel file becomes the space and the first candidates
it measures (``JobEngine``).

The kernel file is loaded in the worker process (its ``kernel()`` builds the
schedule space) and compiled and run in the builder's and runner's own spawned
processes: never in the API server.
"""

from __future__ import annotations

import logging
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from ..builder import Builder
from ..candidate import Candidate, sha256_hex
from ..pipeline import TaskRef, TrialRecord
from ..runner import EvaluatorConfig, Runner
from ..store import Store, StoreError
from ..store.queue import JobRecord
from ..workload import Environment, WorkloadKey

_log = logging.getLogger("ws_tuner.worker")


@dataclass(frozen=True)
class WorkerOptions:
    gpu: int | None = None
    compile_only: bool = False  # time nothing (a worker on a machine without a GPU compiles only anyway)
    jobs: int = 1  # compile processes
    compile_timeout: float = 300.0
    run_timeout: float = 60.0
    exit_when_idle: bool = False  # leave once no job this worker could run is unfinished (batch use, tests)


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
    # Schedules measured after the seed schedule's baselines, as warm starts, planned from the
    # records given (tune.lowering_starts_after).
    starts: Callable[[Sequence[TrialRecord]], list[Candidate]] = field(default=lambda records: [])
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
        from ..tune import lowering_starts_after, nearest_best

        # Uploaded source is code: it runs in spawned processes only (here, and in
        # the builder's and runner's pools), never in this one, which holds the
        # database credentials.
        task = Task.isolated(str(kernel_path), dict(job.problem), job.params)
        space = task.space()
        timed = self.runner is not None

        return JobEngine(
            task.spec.name, str(task.spec.path), task.spec.source_hash, task.problem, space,
            lambda: task.baselines_at(task.measured_points(timed=timed), timed=timed),
            anchors=lambda: task.anchors(space.served_points()),
            starts=lambda records: lowering_starts_after(task, records, timed=timed),
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
