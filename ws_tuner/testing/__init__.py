"""Test doubles that ship with the package (as MetaSchedule's ``testing/dummy_object.py``).

``DummyRunner`` stands in for the GPU runner in orchestration tests: it gives
deterministic latencies from a candidate's features, and failures on demand.
``VerifyOnlyBuilder`` runs tilelang's real MaterializeWSSchedule verifier but
skips nvcc, so search and storage tests stay fast and honest on a CPU.
``SimulatedGPU`` is a bench with the clock of a power-capped GPU, for the
timing protocol's tests.
"""

from __future__ import annotations

import math
import threading
import time
from concurrent.futures import Future
from typing import Callable, Sequence

from ..builder import Builder, BuildInput, BuildResult
from ..candidate import Candidate, Lowering
from ..measure import REASON_SW_POWER_CAP, REASON_SW_THERMAL, ClockReading, Sample
from ..result import Status, Timing, TrialResult
from ..runner import RunInput, Runner
from ..workload import Environment

DUMMY_DEVICE = "Dummy H200 (test double)"


def modeled_latency(candidate: Candidate) -> float:
    """A smooth fake cost (ms) with one optimum, so that samplers have something to learn."""
    if candidate.schedule is None:
        return {"reference": 1.00, "default": 1.20, "no_ws": 1.25, "role_based": 1.15}.get(candidate.lowering.value, 1.3)
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
        self.tournaments: list[list[str]] = []
        self._lock = threading.Lock()

    def environment(self) -> Environment:
        from .. import compiler

        return Environment("sm_90a", DUMMY_DEVICE, compiler.tilelang_version(), compiler.cuda_version(), "dummy")

    def submit(self, run_input: RunInput) -> "Future[TrialResult]":
        fut: Future[TrialResult] = Future()
        fut.set_result(self._run(run_input, run_input.anchor))
        return fut

    def gbps(self, run_input: RunInput, ms: float) -> float | None:
        """GB/s as the GPU runner gives it: where the task's kernel file says what a call moves."""
        task = run_input.task()
        return task.spec.gbps(task.problem, ms)

    def _run(self, run_input: RunInput, anchor: Candidate | None, confirmed: bool = False) -> TrialResult:
        candidate = run_input.candidate
        with self._lock:
            self.calls.append(candidate.hash)
        if self.delay:
            time.sleep(self.delay)
        failure = self._failure(candidate)
        if failure is not None:
            return TrialResult(candidate.hash, *failure)
        ms = self.latency(candidate)
        ratio = ms / self.latency(anchor) if anchor is not None else None
        return TrialResult(candidate.hash, Status.OK, timing=Timing(ms, ms * 0.99, ms * 1.01, 30), tflops=self.flops / (ms * 1e-3) / 1e12,
                           gbps=self.gbps(run_input, ms), ratio=ratio, confirmed=confirmed,
                           info={"anchor": anchor.hash} if anchor else {})  # fmt: skip

    def tournament(self, run_inputs: list[RunInput]) -> list[TrialResult]:
        with self._lock:
            self.tournaments.append([ri.candidate.hash for ri in run_inputs])
        return [self._run(ri, ri.anchor or run_inputs[0].candidate, confirmed=True) for ri in run_inputs]

    def _failure(self, candidate: Candidate) -> tuple[Status, str] | None:
        """How this candidate's run fails, or None: the injected ``failures``."""
        status = self.failures.get(candidate.hash)
        return None if status is None else (status, f"injected {status.value}")


class OutOfMemoryRunner(DummyRunner):
    """Every run fails as CUDA does where a problem's tensors do not fit the GPU: the
    reference's check included."""

    def _failure(self, candidate: Candidate) -> tuple[Status, str] | None:
        return Status.LAUNCH_ERROR, "CUDA out of memory. Tried to allocate 16.00 GiB (test double)"


class VerifyOnlyBuilder(Builder):
    """Real MaterializeWSSchedule verification, in process, without nvcc."""

    def submit(self, build_input: BuildInput) -> "Future[BuildResult]":
        from .. import compiler

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


class SimulatedGPU:
    """A ``measure.Bench`` with the clock of a power-capped GPU, in simulated time.

    Idle, the SM clock climbs back to ``boost_mhz``; under load it falls toward the
    running kernel's own settled clock (a kernel that draws more power settles
    lower), both exponentially. A launch of a kernel takes its ``base_ms`` at
    ``boost_mhz``, stretched by boost/clock (compute-bound); ``noise`` adds
    deterministic jitter to times, ``clock_jitter`` to clock readings.
    ``throttle(start, end, factor)`` injects a thermal slowdown. Every launch is logged in ``launches`` (kernel names, in order).
    """

    def __init__(self, kernels: dict[str, tuple[float, float]], *, boost_mhz: float = 1980.0, tau_down: float = 0.07,
                 tau_up: float = 0.5, noise: float = 0.002, clock_jitter: float = 0.0, flush_ms: float = 0.06,
                 seed: int = 0) -> None:  # fmt: skip
        import random

        self.kernels = dict(kernels)  # name -> (base_ms at boost, settled MHz under its load)
        self.boost, self.tau_down, self.tau_up, self.noise, self.flush_ms = boost_mhz, tau_down, tau_up, noise, flush_ms
        self.clock_jitter = clock_jitter  # relative swing of each clock reading (a controller that hunts)
        self.t = 0.0
        self.mhz = boost_mhz
        self._busy_until = -1e9
        self._rng = random.Random(seed)
        self._throttles: list[tuple[float, float, float]] = []
        self.launches: list[str] = []

    # --- what tests control -------------------------------------------------------
    def idle(self, seconds: float) -> None:
        """Leave the GPU without work: the clock climbs back toward boost."""
        self.mhz = self.boost - (self.boost - self.mhz) * math.exp(-seconds / self.tau_up)
        self.t += seconds

    def throttle(self, start: float, end: float, factor: float) -> None:
        self._throttles.append((start, end, factor))

    # --- measure.Bench --------------------------------------------------------------
    def now(self) -> float:
        return self.t

    def idle_seconds(self) -> float:
        return max(self.t - self._busy_until, 0.0)

    def _reading(self) -> ClockReading:
        factor = next((f for s, e, f in self._throttles if s <= self.t < e), 1.0)
        factor *= 1 + self._rng.uniform(-self.clock_jitter, self.clock_jitter)
        reasons = REASON_SW_POWER_CAP if self.mhz < self.boost * 0.99 else 0
        return ClockReading(self.t, self.mhz * factor, 700.0 if reasons else 450.0, reasons | (REASON_SW_THERMAL if factor < 1 else 0))

    def _launch(self, name: str, flush: bool) -> float:
        base_ms, settled = self.kernels[name]
        clock = self._reading().sm_mhz
        ms = base_ms * self.boost / clock * (1 + self._rng.gauss(0.0, self.noise))
        spent = (ms + (self.flush_ms if flush else 0.0)) / 1e3
        self.mhz = settled + (self.mhz - settled) * math.exp(-spent / self.tau_down)
        self.t += spent
        self._busy_until = self.t
        self.launches.append(name)
        return ms

    def heat(self, kernels: Sequence[str], seconds: float) -> list[ClockReading]:
        end, readings = self.t + seconds, []
        while True:
            for name in kernels:
                self._launch(name, flush=True)
            readings.append(self._reading())
            if self.t >= end:
                return readings

    def sample(self, kernel: str, reps: int) -> Sample:
        readings = [self._reading()]
        times = []
        for _ in range(reps):
            times.append(self._launch(kernel, flush=True))
            readings.append(self._reading())
        return Sample(kernel, tuple(times), tuple(readings))
