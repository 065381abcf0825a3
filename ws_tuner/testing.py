"""Test doubles that ship with the package (as MetaSchedule's ``testing/dummy_object.py``).

``DummyRunner`` stands in for the GPU runner in orchestration tests: it gives
deterministic latencies from a candidate's features, and failures on demand.
``VerifyOnlyBuilder`` runs tilelang's real MaterializeWSSchedule verifier but
skips nvcc, so search and storage tests stay fast and honest on a CPU.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from typing import Callable

from .builder import Builder, BuildInput, BuildResult
from .candidate import Candidate, Lowering
from .result import Status, Timing, TrialResult
from .runner import RunInput, Runner
from .workload import Environment

DUMMY_DEVICE = "Dummy H200 (test double)"


def modeled_latency(candidate: Candidate) -> float:
    """A smooth fake cost (ms) with one optimum, so that samplers have something to learn."""
    if candidate.schedule is None:
        return {"reference": 1.00, "default": 1.20, "role_based": 1.15}.get(candidate.lowering.value, 1.3)
    s = candidate.schedule
    consumer = max(s.roles, key=lambda r: r.warps)
    depth = min(p.depth for p in s.pipelines)
    nreg = consumer.max_nreg or 168
    params = candidate.param_dict
    tile = params.get("block_M", 128) * params.get("block_N", 256)
    return (
        0.8
        + 0.05 * abs(depth - 4)
        + 0.002 * abs(nreg - 232) / 8
        + 0.1 * abs(consumer.warps - 8) / 4
        + 0.05 * abs(tile - 128 * 256) / (128 * 256)
        + (0.0 if params.get("swizzle", 8) else 0.03)
    )


class DummyRunner(Runner):
    def __init__(
        self,
        *,
        latency: Callable[[Candidate], float] = modeled_latency,
        failures: dict[str, Status] | None = None,
        delay: float = 0.0,
        flops: float = 2.0 * 4096**3,
    ):
        self.latency, self.failures, self.delay, self.flops = latency, dict(failures or {}), delay, flops
        self.calls: list[str] = []
        self._lock = threading.Lock()

    def environment(self) -> Environment:
        from . import compiler

        return Environment("sm_90a", DUMMY_DEVICE, compiler.tilelang_version(), compiler.cuda_version(), "dummy")

    def submit(self, run_input: RunInput) -> "Future[TrialResult]":
        fut: Future[TrialResult] = Future()
        fut.set_result(self._run(run_input.candidate))
        return fut

    def _run(self, candidate: Candidate) -> TrialResult:
        with self._lock:
            self.calls.append(candidate.hash)
        if self.delay:
            time.sleep(self.delay)
        status = self.failures.get(candidate.hash)
        if status is not None:
            return TrialResult(candidate.hash, status, f"injected {status.value}")
        ms = self.latency(candidate)
        return TrialResult(candidate.hash, Status.OK, timing=Timing(ms, ms * 0.99, ms * 1.01, 30), tflops=self.flops / (ms * 1e-3) / 1e12)

    def retime(self, run_inputs: list[RunInput], rounds: int = 5) -> list[TrialResult]:
        return [self._run(ri.candidate) for ri in run_inputs]


class VerifyOnlyBuilder(Builder):
    """Real MaterializeWSSchedule verification, in process, without nvcc."""

    def submit(self, build_input: BuildInput) -> "Future[BuildResult]":
        from . import compiler

        fut: Future[BuildResult] = Future()
        start = time.perf_counter()
        candidate = build_input.candidate
        status, message = Status.BUILT, "verified (nvcc skipped by the test double)"
        if candidate.lowering is Lowering.WS:
            try:
                func, _ = build_input.task().lowered(candidate)
                compiler.verify(func)
            except compiler.ScheduleRejected as exc:
                status, message = Status.REJECTED, str(exc)
            except compiler.CompilerError as exc:
                status, message = Status.COMPILE_ERROR, str(exc)
        fut.set_result(BuildResult(candidate, status, message, time.perf_counter() - start))
        return fut
