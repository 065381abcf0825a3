"""The GPU, behind one module. Everything here runs inside a runner worker
process (runner.py), never in the tuner: a hang, a deadlock or an illegal
memory access must take down that worker only.

A candidate is checked first (fresh random inputs, outputs poisoned with NaN,
compared with the kernel file's reference), then timed by measure.py's
protocol beside its anchor: ``CudaBench`` gives that protocol CUDA-event
timings with the L2 flushed before each launch, and the SM clock, power and
clock event reasons read through NVML while the launches run. Between
candidates a ``Heater`` keeps the GPU loaded, so that the next one starts in
the clock state of sustained work rather than after an idle gap.
"""

from __future__ import annotations

import functools
import math
import os
import subprocess
import threading
import time
from typing import Any, Callable, Sequence

from . import measure
from .candidate import Candidate, Lowering, canonical_json
from .measure import ClockReading, Sample
from .result import Status, Timing, TrialResult
from .workload import Environment

# Errors after which the CUDA context is unusable: the worker must exit.
STICKY_ERRORS = ("illegal memory access", "unspecified launch failure", "misaligned address", "illegal instruction", "hardware stack error", "device-side assert")
L2_FLUSH_BYTES = 256 * 1024 * 1024  # several times the H200's 60 MB L2
EXIT_STICKY = 86  # a worker that exits with this left its reason in the side file
KEEP_WARM_S = 3.0  # the heater's load after a candidate, waiting for the next one
CANDIDATE, ANCHOR = "candidate", "anchor"

_state: dict[str, Any] = {}


class StickyCudaError(Exception):
    """The context is broken; the runner must replace this process."""


def init_worker(gpu: int, side_file: str) -> None:
    """Pool initializer: pin the worker to one GPU before CUDA starts."""
    os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)
    _state.update(gpu=gpu, side_file=side_file)


def _torch() -> Any:
    import torch

    return torch


def environment(gpu: int = 0) -> Environment:
    """The visible GPU and toolchain, read through nvidia-smi: no CUDA context
    is created, so the tuner's own process may call this."""
    from . import compiler

    cap = _smi("compute_cap", gpu)  # "9.0"
    major, _, minor = cap.partition(".")
    arch = f"sm_{major}{minor}{'a' if major == '9' else ''}" if cap != "unknown" else "unknown"
    return Environment(
        arch=arch,
        device=_smi("name", gpu),
        tilelang_version=compiler.tilelang_version(),
        cuda_version=compiler.cuda_version(),
        driver_version=_smi("driver_version", gpu),
    )


def _smi(field: str, gpu: int) -> str:
    """One nvidia-smi field of one GPU (by its physical index)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader,nounits", "-i", str(gpu)],
            capture_output=True, text=True, timeout=20,
        )  # fmt: skip
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


# --- NVML: the clock, power and clock event reasons ----------------------------------


class Nvml:
    """SM clock, power and clock event reasons of this process's GPU, through NVML
    (no CUDA context needed; about 0.1 ms a reading)."""

    def __init__(self) -> None:
        import pynvml

        self._nv = pynvml
        pynvml.nvmlInit()
        self._handle = self._find(pynvml)
        self._reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or pynvml.nvmlDeviceGetCurrentClocksThrottleReasons

    def _find(self, pynvml: Any) -> Any:
        # CUDA_VISIBLE_DEVICES renumbers devices for CUDA, not for NVML: find ours by PCI address.
        try:
            props = _torch().cuda.get_device_properties(0)
            return pynvml.nvmlDeviceGetHandleByPciBusId(f"{props.pci_domain_id:08X}:{props.pci_bus_id:02X}:{props.pci_device_id:02X}.0")
        except (AttributeError, pynvml.NVMLError):
            return pynvml.nvmlDeviceGetHandleByIndex(int(_state.get("gpu", 0)))

    def read(self, t: float, *, processes: bool = False) -> ClockReading:
        nv, h = self._nv, self._handle
        reasons = int(self._reasons(h))
        if processes and len(nv.nvmlDeviceGetComputeRunningProcesses(h)) > 1:
            reasons |= measure.REASON_OTHER_PROCESS  # our own context is the one expected
        return ClockReading(t, float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)), nv.nvmlDeviceGetPowerUsage(h) / 1000.0, reasons)

    def energy_j(self) -> float:
        """The GPU's energy counter (since the driver loaded), in joules."""
        return self._nv.nvmlDeviceGetTotalEnergyConsumption(self._handle) / 1000.0


def _nvml() -> Nvml | None:
    if "nvml" not in _state:
        try:
            _state["nvml"] = Nvml()
        except Exception:  # noqa: BLE001 - no NVML (a driver without it): time without clocks, and say so in info
            _state["nvml"] = None
    return _state["nvml"]


# --- the bench ------------------------------------------------------------------------


class CudaBench:
    """``measure.Bench`` on this process's GPU: named launches, CUDA events, NVML."""

    POLL_S = 0.001  # between clock readings while a sample runs

    def __init__(self, nvml: Nvml | None) -> None:
        torch = _torch()
        self.nvml = nvml
        self.kernels: dict[str, Callable[[], Any]] = {}
        self._flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
        self._idle_since = -math.inf  # host time the GPU ran out of our work; -inf: never loaded

    def now(self) -> float:
        return time.monotonic()

    def idle_seconds(self) -> float:
        return max(self.now() - self._idle_since, 0.0)

    def _read(self, **kw: Any) -> list[ClockReading]:
        return [self.nvml.read(self.now(), **kw)] if self.nvml else []

    def heat(self, kernels: Sequence[str], seconds: float) -> list[ClockReading]:
        torch = _torch()
        readings: list[ClockReading] = []
        end = self.now() + seconds
        queued: Any = None
        while True:
            for name in kernels:
                self._flush.zero_()  # the same load as a sample's
                self.kernels[name]()
            done = torch.cuda.Event()
            done.record()
            # One round stays queued ahead, so the GPU never waits for Python.
            if queued is not None:
                queued.synchronize()
            queued = done
            readings += self._read()
            if self.now() >= end:
                break
        _sync_or_raise(queued.synchronize)
        self._idle_since = self.now()
        return readings

    def sample(self, kernel: str, reps: int) -> Sample:
        torch = _torch()
        launch = self.kernels[kernel]
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        readings = self._read(processes=True)
        for start, end in zip(starts, ends):
            self._flush.zero_()  # evict the inputs from L2: each launch reads HBM, as in a real model
            start.record()
            launch()
            end.record()
        while not ends[-1].query():  # the clock while the launches run
            readings += self._read()
            time.sleep(self.POLL_S)
        _sync_or_raise(torch.cuda.synchronize)
        readings += self._read()
        self._idle_since = self.now()
        return Sample(kernel, tuple(s.elapsed_time(e) for s, e in zip(starts, ends)), tuple(readings))


class Heater:
    """Keeps the GPU loaded between candidates (for up to ``KEEP_WARM_S``), with
    the kernels just measured: a GPU left idle climbs back to its boost clock
    within a second, and the next candidate would have to pay ``cold_heat_s``."""

    def __init__(self, bench: CudaBench) -> None:
        self.bench = bench
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, kernels: Sequence[str], seconds: float = KEEP_WARM_S) -> None:
        self.stop()
        if not kernels:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, args=(tuple(kernels), seconds), name="ws-tune-heater", daemon=True)
        self._thread.start()

    def _run(self, kernels: tuple[str, ...], seconds: float) -> None:
        end = time.monotonic() + seconds
        try:
            while not self._stop.is_set() and time.monotonic() < end:
                self.bench.heat(kernels, 0.01)
        except Exception:  # noqa: BLE001 - the next candidate meets any real error itself
            return

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None


def _bench() -> tuple[CudaBench, Heater]:
    if "bench" not in _state:
        bench = CudaBench(_nvml())
        _state["bench"] = (bench, Heater(bench))
    return _state["bench"]


# --- kernels --------------------------------------------------------------------------


def _compiled(run_input: Any, candidate: Candidate | None = None) -> tuple[Any, Callable[[list[Any]], Any]]:
    """(task, launch) for a candidate; kernels come from tilelang's cache after the builder."""
    from . import compiler

    task = run_input.task()
    candidate = candidate or run_input.candidate
    if candidate.lowering is Lowering.REFERENCE:
        vendor = candidate.param_dict.get("vendor")
        if vendor is None:
            return task, lambda args: task.spec.reference(task.problem, args)
        fn = task.spec.vendor(task.problem, vendor)
        return task, lambda args: fn(args)
    # The candidate hash does not cover the problem: fp16 and bf16 share one.
    key = (run_input.source_hash, canonical_json(run_input.problem), candidate.hash)
    if key not in _state:
        func, configs = task.lowered(candidate)
        _state[key] = compiler.compile_kernel(func, configs)
    kernel = _state[key]
    return task, lambda args: task.spec.launch(kernel, args)


def launcher(run_input: Any) -> tuple[Any, Callable[[list[Any]], Any]]:
    """(task, launch(args)) of a run input's candidate, compiled or loaded from
    tilelang's cache: for benchmarks that time kernels with a timer of their own."""
    return _compiled(run_input)


def evaluate(run_input: Any) -> TrialResult:
    """Check, then time beside the anchor, one candidate. Sticky CUDA errors end the process."""
    candidate: Candidate = run_input.candidate
    try:  # the kernel file's code and the compiler first: no CUDA needed to fail here
        task, launch = _compiled(run_input)
        anchor = _anchor(run_input)
    except Exception as exc:  # noqa: BLE001
        return TrialResult(candidate.hash, Status.COMPILE_ERROR, str(exc).splitlines()[0][:600])
    bench, heater = _bench()
    heater.stop()
    try:
        return _evaluate(run_input, bench, task, launch, anchor)
    except StickyCudaError as exc:
        _die(str(exc))
        raise  # unreachable
    finally:
        heater.start([k for k in (ANCHOR, CANDIDATE) if k in bench.kernels][:1])


def _evaluate(run_input: Any, bench: CudaBench, task: Any, launch: Callable[[list[Any]], Any], anchor: Callable[[list[Any]], Any] | None) -> TrialResult:
    candidate: Candidate = run_input.candidate
    info: dict[str, Any] = {}
    try:
        for _ in range(max(run_input.config.checks, 1)):
            errors = _check(task, launch, candidate)
            info["max_rel_error"] = max(info.get("max_rel_error", 0.0), *errors)
            wrong = task.spec.wrong(errors)
            if wrong:
                return TrialResult(candidate.hash, Status.WRONG, wrong, info=info)
        args = task.spec.inputs(task.problem, "cuda")
        bench.kernels[CANDIDATE] = functools.partial(launch, args)
        kernels = [CANDIDATE]
        if anchor is not None:
            bench.kernels[ANCHOR] = functools.partial(anchor, args)  # the same inputs: the same work
            kernels.insert(0, ANCHOR)
        else:
            bench.kernels.pop(ANCHOR, None)
        comparison = measure.compare(bench, kernels, kernels[0], run_input.config.protocol, run_input.config.protocol.search)
    except StickyCudaError:
        raise
    except measure.MeasurementError as exc:
        return TrialResult(candidate.hash, Status.LAUNCH_ERROR, f"no steady-state sample: {exc}", info=info)
    except Exception as exc:  # noqa: BLE001 - a failed launch is data
        _raise_if_sticky(exc)
        return TrialResult(candidate.hash, Status.LAUNCH_ERROR, _short(exc), info=info)
    stats = comparison.stats[CANDIDATE]
    info.update(stats.info(), **comparison.info())
    if anchor is not None:
        info.update(anchor=run_input.anchor.hash, anchor_ms=round(comparison.stats[ANCHOR].median_ms, 6))
    # The anchor beside itself is 1.0, not unknown: without a ratio it and every baseline that
    # compiles to its code stayed out of the final tournament (run 29: role_based unconfirmed).
    itself = run_input.anchor is not None and run_input.anchor.hash == candidate.hash
    return _result(task, candidate, stats, info, ratio=stats.ratio if anchor is not None else 1.0 if itself else None)


def _anchor(run_input: Any) -> Callable[[list[Any]], Any] | None:
    anchor = run_input.anchor
    if anchor is None or anchor.hash == run_input.candidate.hash:
        return None
    return _compiled(run_input, anchor)[1]


def _result(task: Any, candidate: Candidate, stats: measure.KernelStats, info: dict[str, Any], **kw: Any) -> TrialResult:
    timing = Timing(stats.median_ms, stats.p20_ms, stats.p80_ms, stats.launches)
    tflops = task.spec.flops(task.problem) / (stats.median_ms * 1e-3) / 1e12
    gbps = task.spec.gbps(task.problem, stats.median_ms)
    return TrialResult(candidate.hash, Status.OK, kw.pop("message", ""), timing=timing, tflops=tflops, gbps=gbps, info=info, **kw)


def poison(out: Any) -> None:
    """Fill an output so that an element the kernel forgets to write shows: NaN, or in an
    integer tensor (an int8 GEMM's int32 C) its type's largest value, far from any result."""
    torch = _torch()
    if out.dtype.is_floating_point or out.dtype.is_complex:
        out.fill_(float("nan"))
    elif out.dtype != torch.bool:
        out.fill_(torch.iinfo(out.dtype).max)


def _check(task: Any, launch: Callable[[list[Any]], Any], candidate: Candidate) -> list[float]:
    """Relative error of each output of one run on fresh random inputs, outputs poisoned first."""
    args = task.spec.inputs(task.problem, "cuda")
    outputs = [args[i] for i in task.spec.outputs]
    if candidate.lowering is Lowering.REFERENCE:
        got = [o.float() for o in launch(args)]
    else:
        for out in outputs:
            poison(out)
        _sync_or_raise(lambda: launch(args))
        got = [o.float() for o in outputs]
    expected = [e.float() for e in task.spec.reference(task.problem, args)]
    return [relative_error(g, e) for g, e in zip(got, expected)]


def relative_error(got: Any, expected: Any) -> float:
    """``|got - expected| / |expected|`` (NaN where the kernel left a poisoned element)."""
    torch = _torch()
    if torch.isnan(got).any():
        return float("nan")
    return (torch.linalg.vector_norm(got - expected) / torch.linalg.vector_norm(expected).clamp_min(1e-30)).item()


def tournament(run_inputs: list[Any]) -> list[TrialResult]:
    """Time the leaders and the baselines again, all interleaved in one steady
    state, until the winner's ratio is known to the tournament's target."""
    bench, heater = _bench()
    heater.stop()
    first = run_inputs[0]
    anchor = first.anchor or first.candidate
    try:
        tasks: dict[str, Any] = {}
        args = first.task().spec.inputs(first.task().problem, "cuda")
        for ri in run_inputs:
            task, launch = _compiled(ri)
            tasks[ri.candidate.hash] = task
            bench.kernels[ri.candidate.hash] = functools.partial(launch, args)
        if anchor.hash not in bench.kernels:
            bench.kernels[anchor.hash] = functools.partial(_compiled(first, anchor)[1], args)
        names = [anchor.hash] + [h for h in tasks if h != anchor.hash]
        comparison = measure.compare(bench, names, anchor.hash, first.config.protocol, first.config.protocol.tournament)
    except StickyCudaError as exc:
        _die(str(exc))
        raise
    finally:
        for name in [n for n in bench.kernels if n not in (ANCHOR, CANDIDATE)]:
            del bench.kernels[name]
        heater.start([k for k in (ANCHOR,) if k in bench.kernels])
    out = []
    for ri in run_inputs:
        stats = comparison.stats[ri.candidate.hash]
        info = {**stats.info(), **comparison.info(), "anchor": anchor.hash, "anchor_ms": round(comparison.stats[anchor.hash].median_ms, 6),
                "entrants": len(names), "winner": comparison.winner.kernel}  # fmt: skip
        out.append(_result(tasks[ri.candidate.hash], ri.candidate, stats, info, ratio=stats.ratio, confirmed=True, message="confirmed in the final tournament"))
    return out


def _sync_or_raise(launch: Callable[[], Any]) -> None:
    torch = _torch()
    try:
        launch()
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001
        _raise_if_sticky(exc)
        raise


def _raise_if_sticky(exc: BaseException) -> None:
    text = str(exc).lower()
    if any(s in text for s in STICKY_ERRORS):
        raise StickyCudaError(_short(exc)) from exc


def _short(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return (lines[0] if lines else type(exc).__name__)[:600]


def _die(message: str) -> None:
    """Leave the reason where the parent looks, and exit without touching CUDA again."""
    try:
        with open(_state["side_file"], "w") as f:
            f.write(message)
    finally:
        os._exit(EXIT_STICKY)
