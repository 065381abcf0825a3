"""``ws-tune best`` and ``ws-tune export``: what the store holds for a kernel at a problem."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer

from .common import (
    EXIT_NOT_FOUND,
    DbOpt,
    ShapeOpt,
    _fail,
    _task,
    app,
    err,
    handles_errors,
    out,
    speed_text,
)

# --- best / export -------------------------------------------------------------


FileArg = typer.Argument(..., help="Kernel file that was tuned (e.g. examples/gemm.py)")
DeviceOpt = typer.Option(None, "--device", help="Device whose results to read, e.g. 'NVIDIA H200' (default: this machine's GPU)")


def _stored(file: Path, shape: Optional[str], db: Optional[str], device: Optional[str], k: int) -> tuple[Any, Any, list[Any]]:
    """The ``k`` fastest stored results of FILE at the problem on the device; none is exit code 1, with why."""
    from .. import lookup
    from ..store import open_store

    task = _task(file, shape, None)
    store = open_store(db)
    asked = lookup.workload_key(task, device=device)
    key, top = lookup.fastest_on_device(store, asked, k=k)
    if not top:
        raise _fail(_nothing_timed(store, task, asked, f"ws-tune {file}" + (f" --shape {shape}" if shape else "")), EXIT_NOT_FOUND)
    if key != asked:
        err.print(f"note: {key.device} was timed with tilelang {key.tilelang_version}, CUDA {key.cuda_version}, driver {key.driver_version} "
                  f"(here: {asked.tilelang_version}, {asked.cuda_version}, {asked.driver_version})", markup=False, highlight=False)  # fmt: skip
    return task, key, top


def _nothing_timed(store: Any, task: Any, key: Any, command: str) -> str:
    from ..workload import COMPILE_ONLY_DEVICE, untimed_note

    stored = [k.device for _, k in store.find_workloads(kernel=key.kernel, source_hash=key.source_hash, problem=key.problem)]
    on = "this machine (no GPU)" if key.device == COMPILE_ONLY_DEVICE else key.device
    run = f"; run `{command}` first" if key.device != COMPILE_ONLY_DEVICE else ""
    return f"no timed result stored for {task.spec.name} at {key.problem} on {on}{untimed_note(key.device, stored)}{run}"


@app.command()
@handles_errors
def best(file: Path = FileArg, shape: Optional[str] = ShapeOpt, db: Optional[str] = DbOpt, device: Optional[str] = DeviceOpt) -> None:
    """Print the best stored schedule of FILE at a problem, as TileLang code and JSON (exit 1: none stored)."""
    task, key, top = _stored(file, shape, db, device, k=1)
    trial = top[0]
    r = trial.result
    state = "confirmed in the final tournament" if r.confirmed else "not confirmed (search timing only)"
    vs = f", {r.ratio:.3f}x the anchor's time" if r.ratio is not None else ""
    speed = speed_text(r.tflops, task.spec.gbps(task.problem, r.timing.median_ms))
    out.print(f"# {task.describe(trial.candidate)}  {speed}, {r.timing.median_ms:.4f} ms{vs}; {state}")
    source = task.source(trial.candidate)
    if source is not None:
        out.print(source)
    out.print(json.dumps(trial.candidate.to_json(), indent=2))


@app.command()
@handles_errors
def export(
    file: Path = FileArg,
    shape: Optional[str] = ShapeOpt,
    db: Optional[str] = DbOpt,
    device: Optional[str] = DeviceOpt,
    output: Path = typer.Option(Path("ws-tune-export.json"), "--output", "-o", help="JSON file to write (replaced atomically)"),
    top: int = typer.Option(10, "--top", min=1, help="How many of the fastest results to include"),
) -> None:
    """Write the JSON artifact of FILE's tuning at a problem: the workload key and the fastest
    schedules with their timings and TileLang code (exit 1, nothing written: none stored)."""
    task, key, trials = _stored(file, shape, db, device, k=top)
    artifact = {
        "workload": key.to_json(),
        "results": [
            {
                "candidate": t.candidate.to_json(),
                "hash": t.candidate.hash,
                "median_ms": t.result.timing.median_ms if t.result.timing else None,
                "spread": t.result.timing.spread if t.result.timing else None,
                "tflops": t.result.tflops,
                "gbps": task.spec.gbps(task.problem, t.result.timing.median_ms) if t.result.timing else None,
                "ratio": t.result.ratio,
                "confirmed": t.result.confirmed,
                "sm_clock_median_mhz": t.result.info.get("sm_clock_median_mhz"),
                "power_w": t.result.info.get("power_w"),
                "source": task.source(t.candidate),
            }
            for t in trials
        ],
    }
    tmp = output.with_suffix(output.suffix + ".tmp")
    tmp.write_text(json.dumps(artifact, indent=2))
    tmp.replace(output)  # atomic: a reader never sees half a file
    out.print(f"wrote {len(trials)} results to {output}")
