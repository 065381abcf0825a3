"""Builder: verify a candidate's schedule, then compile it, in a process pool.

MaterializeWSSchedule runs first (milliseconds), so a broken schedule is
rejected with the verifier's message and never reaches nvcc. Compiles run in
spawned worker processes with a per-candidate timeout; a worker that hangs
or dies is replaced by the pool. Outcomes are data: BUILT, REJECTED,
COMPILE_ERROR or COMPILE_TIMEOUT, each with its message.
"""

from __future__ import annotations

import abc
import os
import signal
import time
from contextlib import suppress
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import Any

from pebble import ProcessExpired, ProcessPool

from .candidate import Candidate, Lowering
from .result import Status
from .rules import kb_over
from .sandbox import close_pool, spawn_context


@dataclass(frozen=True)
class BuildInput:
    """A candidate of a kernel file at a problem: what a worker process needs to rebuild it."""

    kernel_path: str
    source_hash: str
    problem: dict[str, Any]
    candidate: Candidate

    def task(self) -> Any:
        from .task import Task

        return Task.load(self.kernel_path, self.source_hash, self.problem)


@dataclass(frozen=True)
class BuildResult:
    candidate: Candidate
    status: Status
    message: str = ""
    seconds: float = 0.0
    code_hash: str | None = None  # of the generated code: candidates alike in it are one kernel
    log: tuple[tuple[str, ...], ...] = ()  # what the compiler logged, for the tuning's process to say

    def say_log(self) -> None:
        """Pass on the compiler's log here: once per text for all workers, not once per worker."""
        if self.log:
            from . import compiler

            for lines in self.log:
                compiler.pass_on(lines)

    @property
    def ok(self) -> bool:
        return self.status is Status.BUILT


class Builder(abc.ABC):
    """Builds candidates; ``submit`` returns at once so compiles overlap other work."""

    @abc.abstractmethod
    def submit(self, build_input: BuildInput) -> "Future[BuildResult]": ...

    def build(self, inputs: list[BuildInput]) -> list[BuildResult]:
        return [f.result() for f in [self.submit(i) for i in inputs]]

    def close(self) -> None:
        """Release workers; the default has none."""

    def __enter__(self) -> "Builder":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def build_one(build_input: BuildInput) -> BuildResult:
    """Verify and compile one candidate, in whatever process this runs in."""
    from . import compiler

    start = time.perf_counter()
    with compiler.held_log() as log:
        status, message, code_hash = _build(build_input)
    return BuildResult(build_input.candidate, status, message, time.perf_counter() - start, code_hash, tuple(map(tuple, log)))


def _build(build_input: BuildInput) -> tuple[Status, str, str | None]:
    """The outcome: status, message and the generated code's hash."""
    from . import compiler
    from .kernel import KernelFileError

    if build_input.candidate.lowering is Lowering.REFERENCE:
        return Status.BUILT, "the kernel file's reference: nothing to build", None
    try:
        task = build_input.task()
        func, pass_configs = task.lowered(build_input.candidate)
        if build_input.candidate.schedule is not None:
            compiler.verify(func)
        kernel = compiler.compile_kernel(func, pass_configs)
    except compiler.ScheduleRejected as exc:
        return Status.REJECTED, str(exc), None
    except (compiler.CompilerError, KernelFileError) as exc:
        return Status.COMPILE_ERROR, str(exc), None
    smem, limit = compiler.shared_memory(kernel), task.space_config.smem_limit
    if smem is not None and smem > limit:
        # The smem rule's sharing is a bound: tilelang's planner may pack worse, and such a
        # kernel would fail at launch (one from tilelang's cache says it by ws-tune's record).
        # tilelang's own lowerings too: at a point whose tiles overflow, none can launch.
        return Status.REJECTED, f"smem: tilelang's planner gives the block {kb_over(smem, limit)}", None
    return Status.BUILT, "", compiler.code_hash(kernel)


class LocalBuilder(Builder):
    """A pool of spawned compile workers on this machine.

    Spawned, not forked: the parent holds TVM's threads, and a fork of a
    threaded process can deadlock in the child. Kernel-file code runs there,
    so they start with a clean environment (sandbox.py).
    """

    def __init__(self, jobs: int = 1, timeout: float = 300.0):
        self.jobs, self.timeout = jobs, timeout
        threads = max(1, (os.cpu_count() or 1) // jobs)
        self._pool = ProcessPool(
            max_workers=jobs, context=spawn_context(), initializer=_init_worker, initargs=(threads,)
        )

    def submit(self, build_input: BuildInput) -> "Future[BuildResult]":
        started = time.perf_counter()
        inner = self._pool.schedule(build_one, args=(build_input,), timeout=self.timeout)
        outer: Future[BuildResult] = Future()

        def outcome(fut: Future) -> BuildResult:
            elapsed = time.perf_counter() - started
            try:
                return fut.result()
            except TimeoutError:
                return BuildResult(build_input.candidate, Status.COMPILE_TIMEOUT, f"compile exceeded {self.timeout:g} s; worker killed", elapsed)
            except ProcessExpired as exc:
                return BuildResult(build_input.candidate, Status.COMPILE_ERROR, f"compiler process died (exit code {exc.exitcode})", elapsed)
            except Exception as exc:  # noqa: BLE001 - anything the worker raised becomes data
                return BuildResult(build_input.candidate, Status.COMPILE_ERROR, f"{type(exc).__name__}: {exc}".splitlines()[0], elapsed)

        def finish(fut: Future) -> None:
            result = outcome(fut)
            result.say_log()
            with suppress(InvalidStateError):  # abandoned (an interrupted tuning): nobody waits for it
                outer.set_result(result)

        inner.add_done_callback(finish)
        return outer

    def close(self) -> None:
        close_pool(self._pool, drain_s=5)  # an interrupted tuning's compiles are not waited for


def _init_worker(threads: int) -> None:
    """Share the cores among the workers: TVM's pool would take all of them in each."""
    # A terminal's Ctrl-C reaches the whole process group: the parent decides what
    # stops (it stops the pool); a worker dying mid-message would only add tracebacks.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.setdefault("TVM_NUM_THREADS", str(threads))
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))


class InProcessBuilder(Builder):
    """Builds in the caller's process: for benchmarks of the passes themselves."""

    def submit(self, build_input: BuildInput) -> "Future[BuildResult]":
        fut: Future[BuildResult] = Future()
        result = build_one(build_input)
        result.say_log()
        fut.set_result(result)
        return fut
