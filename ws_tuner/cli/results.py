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
    handles_errors,
    out,
)

# --- best / export -------------------------------------------------------------


def _stored(file: Path, shape: str, db: Optional[str], device: Optional[str], k: int) -> tuple[Any, Any, list[Any]]:
    from .. import lookup
    from ..store import open_store

    task = _task(file, shape, None)
    store = open_store(db)
    key = lookup.workload_key(task, device=device)
    return task, key, lookup.fastest_compilable(store, key, k=k)


@app.command()
@handles_errors
def best(
    file: Path = typer.Argument(...),
    shape: str = ShapeOpt,
    db: Optional[str] = DbOpt,
    device: Optional[str] = typer.Option(None, "--device", help="Device name (default: this machine's GPU, else compile-only)"),
) -> None:
    """Print the best stored schedule of FILE at a problem, as TileLang code and JSON."""
    task, key, top = _stored(file, shape, db, device, k=1)
    if not top:
        raise _fail(f"no timed result stored for {task.spec.name} at {key.problem} on {key.device}; run `ws-tune {file} --shape {shape}` first", EXIT_NOT_FOUND)
    trial = top[0]
    r = trial.result
    state = "confirmed in the final tournament" if r.confirmed else "not confirmed (search timing only)"
    vs = f", {r.ratio:.3f}x the anchor's time" if r.ratio is not None else ""
    out.print(f"# {trial.candidate.describe()}  {r.tflops:.0f} TFLOP/s, {r.timing.median_ms:.4f} ms{vs}; {state}")
    if trial.candidate.schedule is not None:
        out.print(trial.candidate.schedule.to_source())
    out.print(json.dumps(trial.candidate.to_json(), indent=2))


@app.command()
@handles_errors
def export(
    file: Path = typer.Argument(...),
    shape: str = ShapeOpt,
    db: Optional[str] = DbOpt,
    device: Optional[str] = typer.Option(None, "--device"),
    output: Path = typer.Option(Path("ws-tune-export.json"), "--output", "-o"),
    top: int = typer.Option(10, "--top", help="How many of the fastest to include"),
) -> None:
    """Write the JSON artifact of FILE's tuning at a problem: the key and the fastest schedules."""
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
                "ratio": t.result.ratio,
                "confirmed": t.result.confirmed,
                "sm_clock_median_mhz": t.result.info.get("sm_clock_median_mhz"),
                "power_w": t.result.info.get("power_w"),
                "source": t.candidate.schedule.to_source() if t.candidate.schedule else None,
            }
            for t in trials
        ],
    }
    tmp = output.with_suffix(output.suffix + ".tmp")
    tmp.write_text(json.dumps(artifact, indent=2))
    tmp.replace(output)  # atomic: a reader never sees half a file
    out.print(f"wrote {len(trials)} results to {output}")
