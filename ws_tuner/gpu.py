"""The GPU, behind one module. Everything here runs inside a runner worker
process (runner.py), never in the tuner: a hang, a deadlock or an illegal
memory access must take down that worker only.

Timing protocol: fresh random inputs, the outputs poisoned with NaN, one run
checked against the kernel file's reference; then ``warmup`` launches and
``reps`` launches timed with CUDA events, the L2 cache flushed before each;
median and 20th/80th percentiles kept.
"""

from __future__ import annotations

import functools
import os
import statistics
import subprocess
from typing import Any, Callable

from .candidate import Candidate, Lowering, canonical_json
from .result import Status, Timing, TrialResult
from .workload import Environment

# Errors after which the CUDA context is unusable: the worker must exit.
STICKY_ERRORS = ("illegal memory access", "unspecified launch failure", "misaligned address", "illegal instruction", "hardware stack error", "device-side assert")
L2_FLUSH_BYTES = 256 * 1024 * 1024  # several times the H200's 60 MB L2
EXIT_STICKY = 86  # a worker that exits with this left its reason in the side file

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


def clocks() -> dict[str, str]:
    """SM and memory clocks as nvidia-smi reads them now (MHz)."""
    gpu = _state.get("gpu", 0)
    return {"sm_clock_mhz": _smi("clocks.sm", gpu), "mem_clock_mhz": _smi("clocks.mem", gpu), "power_w": _smi("power.draw", gpu)}


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


def _compiled(run_input: Any) -> tuple[Any, Callable[[list[Any]], Any]]:
    """(task, launch) for a candidate; kernels come from tilelang's cache after the builder."""
    from . import compiler

    task = run_input.task()
    candidate: Candidate = run_input.candidate
    if candidate.lowering is Lowering.REFERENCE:
        return task, lambda args: task.spec.reference(task.problem, args)
    # The candidate hash does not cover the problem: fp16 and bf16 share one.
    key = (run_input.source_hash, canonical_json(run_input.problem), candidate.hash)
    if key not in _state:
        func, configs = task.lowered(candidate)
        _state[key] = compiler.compile_kernel(func, configs)
    kernel = _state[key]
    return task, lambda args: kernel(*args)


def evaluate(run_input: Any) -> TrialResult:
    """Check, then time, one candidate. Sticky CUDA errors end the process."""
    try:
        return _evaluate(run_input)
    except StickyCudaError as exc:
        _die(str(exc))
        raise  # unreachable


def _evaluate(run_input: Any) -> TrialResult:
    config = run_input.config
    candidate: Candidate = run_input.candidate
    try:
        task, launch = _compiled(run_input)
    except Exception as exc:  # noqa: BLE001
        return TrialResult(candidate.hash, Status.COMPILE_ERROR, str(exc).splitlines()[0][:600])
    info: dict[str, Any] = {}
    try:
        for _ in range(max(config.checks, 1)):
            error = _check(task, launch, candidate)
            info["max_rel_error"] = max(info.get("max_rel_error", 0.0), error)
            if not error < task.spec.tolerance:  # NaN fails too
                return TrialResult(candidate.hash, Status.WRONG, f"relative error {error:.3g} >= {task.spec.tolerance:g}", info=info)
        args = task.spec.inputs(task.problem, "cuda")
        info.update(clocks())
        timing = time_launches(lambda: launch(args), config.warmup, config.reps, config.flush_l2)
        info.update({f"after_{k}": v for k, v in clocks().items()})
    except StickyCudaError:
        raise
    except Exception as exc:  # noqa: BLE001 - a failed launch is data
        _raise_if_sticky(exc)
        return TrialResult(candidate.hash, Status.LAUNCH_ERROR, _short(exc), info=info)
    tflops = task.spec.flops(task.problem) / (timing.median_ms * 1e-3) / 1e12
    return TrialResult(candidate.hash, Status.OK, "", timing=timing, tflops=tflops, info=info)


def _check(task: Any, launch: Callable[[list[Any]], Any], candidate: Candidate) -> float:
    """Relative error of one run on fresh random inputs, outputs poisoned first."""
    torch = _torch()
    args = task.spec.inputs(task.problem, "cuda")
    outputs = [args[i] for i in task.spec.outputs]
    if candidate.lowering is Lowering.REFERENCE:
        got = [o.float() for o in task.spec.reference(task.problem, args)]
    else:
        for out in outputs:
            out.fill_(float("nan"))  # an element the kernel forgets to write stays NaN
        _sync_or_raise(lambda: launch(args))
        got = [o.float() for o in outputs]
    expected = [e.float() for e in task.spec.reference(task.problem, args)]
    worst = 0.0
    for g, e in zip(got, expected):
        if torch.isnan(g).any():
            return float("nan")
        worst = max(worst, (torch.linalg.vector_norm(g - e) / torch.linalg.vector_norm(e).clamp_min(1e-30)).item())
    return worst


def time_launches(launch: Callable[[], Any], warmup: int, reps: int, flush_l2: bool) -> Timing:
    torch = _torch()
    flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda") if flush_l2 else None
    for _ in range(warmup):
        launch()
    _sync_or_raise(lambda: None)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        if flush is not None:
            flush.zero_()  # evict the inputs from L2 so each rep reads HBM, as in a real model
        starts[i].record()
        launch()
        ends[i].record()
    _sync_or_raise(lambda: None)
    times = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))
    q = statistics.quantiles(times, n=5) if len(times) >= 2 else [times[0]] * 4
    return Timing(median_ms=statistics.median(times), p20_ms=q[0], p80_ms=q[3], reps=reps)


def retime(run_inputs: list[Any], rounds: int) -> list[TrialResult]:
    """Time several candidates again, interleaved round by round, so that
    drift in clocks or temperature falls on all of them alike."""
    launches = []
    for run_input in run_inputs:
        task, launch = _compiled(run_input)
        launches.append((run_input, task, launch, task.spec.inputs(task.problem, "cuda")))
    samples: dict[str, list[float]] = {ri.candidate.hash: [] for ri, *_ in launches}
    for _ in range(rounds):
        for run_input, _, launch, args in launches:
            cfg = run_input.config
            t = time_launches(functools.partial(launch, args), max(cfg.warmup // 2, 1), cfg.reps, cfg.flush_l2)
            samples[run_input.candidate.hash].append(t.median_ms)
    out = []
    for run_input, task, *_ in launches:
        times = sorted(samples[run_input.candidate.hash])
        median = statistics.median(times)
        timing = Timing(median, times[0], times[-1], len(times) * run_input.config.reps)
        tflops = task.spec.flops(task.problem) / (median * 1e-3) / 1e12
        out.append(TrialResult(run_input.candidate.hash, Status.OK, "retimed", timing=timing, tflops=tflops, info=clocks()))
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
