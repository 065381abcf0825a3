"""Runner: check and time built candidates on a GPU, isolated in a worker process.

One worker process per GPU (spawned; the tuner itself never creates a CUDA
context). A candidate that hangs is killed at its timeout; one that crashes
the process (an illegal memory access leaves the context unusable, so the
worker exits on purpose) is recorded with its message; either way the pool
starts a fresh worker and tuning goes on.
"""

from __future__ import annotations

import abc
import os
import tempfile
from concurrent.futures import Future
from dataclasses import dataclass, field

from pebble import ProcessExpired, ProcessPool

from .builder import BuildInput
from .candidate import Candidate
from .measure import MeasureConfig
from .result import Status, TrialResult
from .sandbox import close_pool, spawn_context
from .workload import Environment


@dataclass(frozen=True)
class EvaluatorConfig:
    """How a candidate is checked and timed (the protocol itself: measure.py)."""

    checks: int = 1  # correctness runs, each on fresh random inputs
    timeout: float = 60.0  # seconds for check + timing of one candidate
    protocol: MeasureConfig = field(default_factory=MeasureConfig)


@dataclass(frozen=True)
class RunInput(BuildInput):
    """A built candidate to check and time beside its anchor, with the protocol."""

    config: EvaluatorConfig = field(default_factory=EvaluatorConfig)
    anchor: Candidate | None = None  # timed side by side with the candidate; None: the candidate alone


class Runner(abc.ABC):
    @abc.abstractmethod
    def environment(self) -> Environment:
        """The device and toolchain results will be measured with."""

    @abc.abstractmethod
    def submit(self, run_input: RunInput) -> "Future[TrialResult]": ...

    @abc.abstractmethod
    def tournament(self, run_inputs: list[RunInput]) -> list[TrialResult]:
        """Time these again, all interleaved in one steady state (the leaders and
        the baselines, beside the anchor of the first), results marked confirmed."""

    def close(self) -> None:
        """Release the workers."""

    def __enter__(self) -> "Runner":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LocalRunner(Runner):
    """One isolated worker process on one local GPU.

    Between candidates the worker keeps the GPU loaded for ``gpu.KEEP_WARM_S`` so that
    the next one is timed at a steady clock: time nothing else on that GPU while the
    runner lives (close it first; run 28's do_bench read 2.2x low beside it)."""

    def __init__(self, gpu: int = 0):
        self.gpu = gpu
        fd, self._side_file = tempfile.mkstemp(prefix="ws-tune-runner-", suffix=".txt")
        os.close(fd)
        self._pool = ProcessPool(
            max_workers=1,
            context=spawn_context(),  # kernel-file code runs there: a clean environment
            initializer=_init,
            initargs=(gpu, self._side_file),
        )

    def environment(self) -> Environment:
        from . import gpu

        return gpu.environment(self.gpu)

    def submit(self, run_input: RunInput) -> "Future[TrialResult]":
        inner = self._pool.schedule(_evaluate, args=(run_input,), timeout=run_input.config.timeout)
        return self._wrap(inner, run_input.candidate, run_input.config.timeout)

    def tournament(self, run_inputs: list[RunInput]) -> list[TrialResult]:
        config = run_inputs[0].config
        timeout = config.timeout + 2 * config.protocol.tournament.max_seconds
        try:
            return self._pool.schedule(_tournament, args=(run_inputs,), timeout=timeout).result()
        except (TimeoutError, ProcessExpired) as exc:
            return [TrialResult(ri.candidate.hash, Status.CRASH, f"tournament failed: {exc}") for ri in run_inputs]

    def _wrap(self, inner: Future, candidate: Candidate, timeout: float) -> "Future[TrialResult]":
        outer: Future[TrialResult] = Future()

        def finish(fut: Future) -> None:
            try:
                outer.set_result(fut.result())
            except TimeoutError:
                outer.set_result(TrialResult(candidate.hash, Status.TIMEOUT, f"no result within {timeout:.0f} s (hang or deadlock); worker killed"))
            except ProcessExpired as exc:
                outer.set_result(TrialResult(candidate.hash, Status.CRASH, self._death_message(exc)))
            except Exception as exc:  # noqa: BLE001
                outer.set_result(TrialResult(candidate.hash, Status.CRASH, f"{type(exc).__name__}: {exc}".splitlines()[0]))

        inner.add_done_callback(finish)
        return outer

    def _death_message(self, exc: ProcessExpired) -> str:
        try:
            with open(self._side_file) as f:
                reason = f.read().strip()
            open(self._side_file, "w").close()
        except OSError:
            reason = ""
        return f"runner process died (exit code {exc.exitcode})" + (f": {reason}" if reason else "")

    def close(self) -> None:
        close_pool(self._pool, drain_s=10)  # a run still going (a hung kernel) is stopped, not waited for
        try:
            os.unlink(self._side_file)
        except OSError:
            pass


# Module-level trampolines: spawned workers import these by name, and importing
# gpu.py (torch) in the tuner's process is exactly what the isolation avoids.
def _init(gpu: int, side_file: str) -> None:
    from . import gpu as g

    g.init_worker(gpu, side_file)


def _evaluate(run_input: RunInput) -> TrialResult:
    from . import gpu as g

    return g.evaluate(run_input)


def _tournament(run_inputs: list[RunInput]) -> list[TrialResult]:
    from . import gpu as g

    return g.tournament(run_inputs)


def gpu_available() -> bool:
    """Whether an NVIDIA GPU is visible, asked without creating a CUDA context here."""
    import shutil
    import subprocess

    if not shutil.which("nvidia-smi"):
        return False
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return False
    return out.returncode == 0 and "GPU" in out.stdout
