"""``ws-tune FILE`` (tune) and ``ws-tune space``: search, build, time, store; and what a space holds."""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Optional

import typer
from rich.table import Table

from ..candidate import Candidate
from ..pipeline import BASELINE_KINDS
from ..space import STAGE_SAMPLE, SpaceCount
from .common import (
    DbOpt,
    ParamOpt,
    ShapeOpt,
    SpaceOpt,
    _fail,
    _task,
    app,
    err,
    failure_lines,
    handles_errors,
    out,
    rate_text,
)
from .progress import TuneProgress, counting

# --- tune -------------------------------------------------------------------


@app.command()
@handles_errors
def tune(
    file: Path = typer.Argument(..., help="Kernel file (see docs/kernel-files.md)"),
    shape: Optional[str] = ShapeOpt,
    param: Optional[str] = ParamOpt,
    space_config: Optional[Path] = SpaceOpt,
    budget: int = typer.Option(64, "--budget", "-n", help="Search candidates to measure (baselines and warm starts come on top)"),
    time_budget: Optional[float] = typer.Option(None, "--time-budget", help="Seconds of search: its clock starts after the baselines and warm starts, which are measured in full"),
    strategy: str = typer.Option("tpe", "--strategy", help="grid, random or tpe"),
    compile_only: bool = typer.Option(False, "--compile-only", help="Verify and compile; time nothing"),
    db: Optional[str] = DbOpt,
    jobs: int = typer.Option(max((os.cpu_count() or 2) - 1, 1), "--jobs", "-j", help="Parallel compile workers"),
    gpu: int = typer.Option(0, "--gpu", help="GPU index to time on"),
    seed: int = typer.Option(0, "--seed", help="Sampler seed"),
    compile_timeout: float = typer.Option(300.0, "--compile-timeout", help="Seconds per compile"),
    run_timeout: float = typer.Option(60.0, "--run-timeout", help="Seconds per GPU check + timing"),
    baselines: bool = typer.Option(True, "--baselines/--no-baselines", help="Measure tilelang's own lowerings too"),
) -> None:
    """Tune FILE at one problem: search schedules, build, time, store."""
    from .. import search
    from ..builder import LocalBuilder
    from ..runner import EvaluatorConfig, LocalRunner, gpu_available
    from ..store import open_store
    from ..tune import TuneOptions, Tuner

    if budget < 0 or jobs < 1:
        raise _fail("--budget must be >= 0 and --jobs >= 1")
    if strategy not in search.KINDS:
        raise _fail(f"unknown strategy {strategy!r}; choose one of {', '.join(search.KINDS)}")
    task = _task(file, shape, param, space_config)
    # Kernel or shape errors surface here, before the database is touched. One
    # survivor is enough: counting the whole space takes seconds.
    count = SpaceCount()
    sp = task.space()
    if next(sp.walk(count), None) is None:
        if not sp.served_points():
            raise _fail(_unserved(count))
        err.print(_nothing_to_search(task) + (f"; --budget {budget} is not used" if budget else ""))
        budget = 0  # nothing to search: the strategy's draws would all be pruned (and counted as such)
    store = open_store(db)  # a database error is the one line, before any note
    # what runs, first: the notes and progress lines below name no kernel, and a log may hold several tunings
    err.print(f"tuning {task.spec.name} at {json.dumps(task.problem)}: a search budget of {budget} ({strategy})", markup=False, highlight=False)
    _print_limits(sp, brief=True)
    if not compile_only and not gpu_available():
        err.print("no NVIDIA GPU found: compile-only (schedules are verified and compiled, not timed)")
        compile_only = True
    options = TuneOptions(budget=budget, time_budget=time_budget, jobs=jobs, baselines=baselines,
                          evaluator=EvaluatorConfig(timeout=run_timeout))  # fmt: skip
    runner = None if compile_only else LocalRunner(gpu)
    with LocalBuilder(jobs=jobs, timeout=compile_timeout) as builder, TuneProgress(err, budget, _gbps(task), task.describe) as progress:
        tuner = Tuner(task, store=store, builder=builder, runner=runner, strategy=search.create(strategy, seed=seed),
                      options=options, listener=progress)  # fmt: skip
        try:
            report = tuner.run()
        finally:
            if runner:
                runner.close()
    if report.interrupted:
        # What was measured is in the store; the table of a cut-short tuning would mislead.
        err.print(progress.interrupted_line(report.stored))
        raise typer.Exit(130)
    _print_report(report, task)
    if 0 < budget <= report.searched_before:
        # Without this a resumed tuning looks like one whose search found nothing.
        out.print(f"nothing new was searched: earlier runs on this database stored {report.searched_before} searched candidates, "
                  f"the budget of {budget}; a larger --budget searches on from them")  # fmt: skip


def _print_report(report: Any, task: Any) -> None:
    counts = report.counts()
    where = "built for sm_90a, not timed" if report.compile_only else f"on {report.key.device}"
    table = Table(title=f"{task.spec.name} {report.key.problem} {where}")
    table.add_column("outcome")
    table.add_column("count", justify="right")
    for status, n in sorted(counts.items()):
        table.add_row(status, str(n))
    if report.pruned:
        table.add_row("search draws pruned (static rules, not built)", str(report.pruned))  # not among the caption's candidates
    if report.wrong_fraction is not None:  # schedules the correctness gate caught: the space should not make them
        table.add_row("WRONG (of the searched)", f"{report.wrong_fraction:.1%}")
    cached = sum(r.cached for r in report.records)
    same = report.same_code if report.compile_only else report.shared
    table.caption = (f"{len(report.records)} candidates in {report.wall_seconds:.1f} s ({cached} reused from the store, "
                     f"{same} sharing another's generated code)")  # fmt: skip
    out.print(table)
    for line in same_code_lines(report.records, task.describe):
        out.print(line)
    for line in failure_lines([(r.result.status.value, r.result.message, task.describe(r.candidate), r.candidate.lowering.value) for r in report.records]):
        out.print(line)
    if report.out_of_time:
        out.print(f"the time budget ended the search after {report.searched} searched candidate(s); every baseline was measured")
    if report.compile_only:
        out.print("compile-only: nothing was timed; run on a Hopper GPU to rank the built candidates.")
        served, built = task.space().served_points(), task.measured_points(timed=False)
        if len(served) > len(built):  # that they build is all compile-only shows: one point says it
            at = "; ".join(", ".join(f"{k}={v}" for k, v in p) for p in built)
            out.print(f"the baselines were built at {len(built)} of {len(served)} kernel-parameter points ({at}); a GPU run measures them at every one, --param pins another")
        return
    best = report.best
    rows = [("ws-tune best", best)] + [(k, report.baseline(k)) for k in BASELINE_KINDS]
    # Nothing searched (a kernel without a schedule space): the baselines, ranked among themselves.
    lead = best or report.best_of(rec for _, rec in rows if rec is not None)
    out.print(speed_table(rows, lead, _gbps(task)))
    for line in faster_baselines(rows, best, describe=task.describe):
        out.print(line)
    if best is None and lead is not None:
        name = next(n for n, rec in rows if rec is lead)
        out.print(f"no schedule of the space was measured: the fastest kernel is {name} ({task.describe(lead.candidate)})")
    if report.anchor is not None:
        out.print(f"ratios are to the anchor {task.describe(report.anchor)} (candidate {report.anchor.hash}), timed side by side in steady state")
    if best is not None:
        out.print(f"best: {task.describe(best.candidate)}  (candidate {best.candidate.hash})")
        source = task.source(best.candidate)
        if source is not None:
            out.print(source)


def same_code_lines(records: list[Any], describe: Callable[[Any], str], most: int = 3) -> list[str]:
    """Which candidates compiled to one kernel (the caption only counts them): a line per
    group, the largest ``most`` groups, so that a user knows whose results are one."""
    groups: dict[str, list[Any]] = {}
    for r in records:
        if code := r.result.info.get("code_hash"):
            groups.setdefault(code, []).append(r.candidate)
    shared = sorted((g for g in groups.values() if len(g) > 1), key=len, reverse=True)
    lines = [f"one kernel: {' = '.join(map(describe, g))}" for g in shared[:most]]
    return lines + [f"(and {len(shared) - most} more such groups)"] * (len(shared) > most)


def _gbps(task: Any) -> Callable[[float], float | None] | None:
    """Median ms -> GB/s, where the kernel file says what a call moves (``bytes_moved``)."""
    if task.spec.bytes_moved(task.problem) is None:
        return None
    return lambda ms: task.spec.gbps(task.problem, ms)


def speed_table(rows: list[tuple[str, Any]], best: Any, gbps: Callable[[float], float | None] | None = None) -> Table:
    """TFLOP/s (and GB/s, given ``gbps``), time and ratio of each row's result; confirmed
    ones were re-timed together in the final tournament."""
    speed = Table(title="speed (steady state; confirmed = re-timed together in the final tournament)")
    columns = ["schedule", "TFLOP/s"] + ["GB/s"] * (gbps is not None) + ["median ms", "\u00b1 (95%)", "vs anchor", "confirmed", "best / this"]
    for col in columns:
        speed.add_column(col, justify="left" if col == "schedule" else "right")
    for name, rec in rows:
        if rec is None:
            speed.add_row(name, *["-"] * (len(columns) - 1))
            continue
        r = rec.result
        ci = r.info.get("ratio_ci") if rec is not best else r.info.get("time_ci", r.info.get("ratio_ci"))
        vs_best = _relative(best.result, r) if best else None
        moved = [rate_text(gbps(r.timing.median_ms))] if gbps is not None else []
        speed.add_row(name, rate_text(r.tflops), *moved, f"{r.timing.median_ms:.4f}", f"{ci:.1%}" if ci is not None else "-",
                      f"{r.ratio:.3f}" if r.ratio is not None else "-", "yes" if r.confirmed else "no",
                      f"{vs_best:.3f}x" if vs_best else "-")  # fmt: skip
    return speed


def faster_baselines(rows: list[tuple[str, Any]], best: Any, margin: float = 0.01, describe: Callable[[Any], str] = Candidate.describe) -> list[str]:
    """A line for each baseline that beat every searched schedule by more than the
    tournament's resolution (``margin``): the user should take that one instead."""
    lines = []
    for name, rec in rows:
        rel = _relative(best.result, rec.result) if best is not None and rec is not None and rec is not best else None
        if rel is not None and rel < 1 - margin:
            lines.append(f"note: {name} ({describe(rec.candidate)}) is {1 / rel - 1:.1%} faster than the best searched schedule")
    return lines


def _relative(best: Any, other: Any) -> float | None:
    """How much faster the best is than ``other``: by ratios to one anchor when both have one, else by time."""
    if best.ratio and other.ratio:
        return other.ratio / best.ratio
    return other.timing.median_ms / best.timing.median_ms if best.timing and other.timing else None


# --- space ------------------------------------------------------------------
def _kept_interval(count: SpaceCount) -> str:
    """How far a sampled count of the kept candidates can be trusted: its 95% interval, or,
    where it rests on a few groups of points (most of the grid pruned), that it is rough."""
    if count.params_counted >= count.params_total:
        return ""
    groups, few = len(count.kept_by_group), count.groups_with_candidates
    if few < 5:  # an interval from fewer is no interval
        unit = ("group" if count.grouped_by else "point") + "s" * (groups != 1) + " of points" * bool(count.grouped_by)
        return f" (rough: {groups} {unit} drawn, {few} of which keep any candidate)"
    low = max(count.kept - count.kept_margin, round(sum(count.kept_by_group)))  # those counted exist
    return f" (95% interval {low:,}-{count.kept + count.kept_margin:,})"


# Kernel-parameter points counted by default: the seed of each is a tilelang PrimFunc,
# and counting every point of a grid of hundreds takes many minutes.
SPACE_SAMPLE = 48
# Values listed per axis: a role's stage offsets over four pipelines are hundreds of tuples.
AXIS_VALUES_SHOWN = 24


@app.command()
@handles_errors
def space(
    file: Path = typer.Argument(..., help="Kernel file (see docs/kernel-files.md)"), shape: Optional[str] = ShapeOpt, param: Optional[str] = ParamOpt, space_config: Optional[Path] = SpaceOpt,
    sample: int = typer.Option(SPACE_SAMPLE, "--sample", help=f"Count at N kernel-parameter points drawn at random, and at {STAGE_SAMPLE} stage choices where a plan has more, and scale; 0 counts every point"),
) -> None:
    """Print the axes of FILE's schedule space and its size before and after pruning."""
    import time

    if sample < 0:
        raise _fail("--sample must be >= 0")
    task = _task(file, shape, param, space_config)
    sp = task.space()
    start = time.perf_counter()
    with counting(err, "counting the space") as tick:
        count = sp.count(tick, sample=sample or None, stages=STAGE_SAMPLE if sample else None)
    elapsed = time.perf_counter() - start
    seen = f" (decisions of the seeds at the {count.params_counted} points counted)" if count.estimated else ""
    axes = Table(title=f"schedule space of {task.spec.name} at {json.dumps(task.problem)}{seen}")
    axes.add_column("axis", overflow="fold")  # a stage axis names every pipeline of its role: cut, it names none
    axes.add_column("values")
    counted = sp.param_sample(sample or None)  # the points count() drew: the same seed, the same draw
    for name, values in sp.axes(counted).items():
        shown = ", ".join(map(str, values[:AXIS_VALUES_SHOWN]))
        axes.add_row(name, shown if len(values) <= AXIS_VALUES_SHOWN else f"{shown}, ... ({len(values)} in all)")
    out.print(axes)
    # what the axes vary: at the first point counted, in grid order, or the point that builds its kernels
    order = {p: i for i, p in enumerate(sp.param_points())}
    seeded = next((sp.representative(p) for p in sorted(counted, key=order.get) if not isinstance(sp.shape(p), str)), None)
    if seeded is not None:
        at = ", ".join(f"{k}={v}" for k, v in seeded)
        out.print(f"seed schedule at {at}: {sp.shape(seeded).seed.summary()} (role:warps lo-hi, hi excluded, @setmaxnreg, 0 none; pipeline x depth)", markup=False, highlight=False)
    if count.pruned:  # (none where no point has a seed: the lines below say why)
        pruned = Table(title="static pruning")
        pruned.add_column("rule")
        pruned.add_column("pruned", justify="right")
        pruned.add_column("example")
        for kind, n in count.pruned.most_common():
            pruned.add_row(kind, str(n), count.examples[kind])
        out.print(pruned)
    if not count.seeded_points:  # why: the lines below
        out.print(f"candidates: none at the {count.params_counted} kernel-parameter point{'s' * (count.params_counted != 1)} counted")
    elif count.estimated:
        grouped = f" ({len(count.kept_by_group)} of {count.groups_total} groups, each every value of {' and '.join(count.grouped_by)})" if count.grouped_by else ""
        basis = [f"{count.params_counted} of the {count.params_total} kernel-parameter points{grouped}"] * (count.params_counted < count.params_total)
        basis += [f"{STAGE_SAMPLE} random stage choices of each of {count.stages_sampled} plans with more"] * bool(count.stages_sampled)
        out.print(f"candidates: ~{count.total:,} before pruning, ~{count.kept:,} after{_kept_interval(count)}, estimated at {' and '.join(basis)} "
                  f"({elapsed:.2f} s; --sample 0 counts every point)")  # fmt: skip
    else:
        out.print(f"candidates: {count.total:,} before pruning, {count.kept:,} after ({elapsed:.2f} s)")
    approx = "~" * (count.params_counted < count.params_total)  # points scaled from a sample
    for kind, n in count.points_pruned.most_common():
        where = f", those with {count.points_pruned_where[kind]}," if kind in count.points_pruned_where else ""
        out.print(f"{approx}{n} of the {count.params_total} kernel-parameter points{where} have no candidates ({count.examples[kind]})")
    if count.same_points:
        out.print(f"{approx}{count.same_points} of the {count.params_total} kernel-parameter points have no warp-specialized kernel "
                  f"of their own ({count.examples['same']})")  # fmt: skip
    # A kernel with nothing to specialize is still tuned (a sampled count of 0 may have missed survivors: walk to one)
    # (asked only where nothing was kept: which points the kernel serves takes a PrimFunc of each)
    if not count.kept and not (served := len(sp.served_points())):
        raise _fail(_unserved(count))
    if not count.kept and next(sp.walk(), None) is None:
        err.print(f"a tuning: {_nothing_to_search(task)}, at the {served} kernel-parameter point{'s' * (served != 1)} the kernel serves")
    _print_limits(sp)


def _unserved(count: SpaceCount) -> str:
    """Why a problem has no tuning: the kernel's check (or its build) refuses every point."""
    reason = count.examples[count.points_pruned.most_common(1)[0][0]] if count.points_pruned else "the space is empty"
    return f"the kernel serves no kernel-parameter point at this problem (e.g. {reason})"


def _nothing_to_search(task: Any) -> str:
    """Why a space that keeps no candidate keeps none, and what a tuning measures instead,
    at a problem where the kernel serves some point."""
    sp = task.space()
    served = sp.served_points()
    if all(isinstance(sp.shape(p), str) for p in served):  # no seed anywhere: the kernel's own lowerings only
        reasons = Counter(sp.shape(p) for p in served).most_common()
        others = f"; {len(served) - reasons[0][1]} of the {len(served)} points for other reasons" if len(reasons) > 1 else ""
        names = task.spec.vendor_names(task.problem)
        vendors = f" and the vendors' ({', '.join(names)})" if names else ""
        return f"no schedule space ({reasons[0][0]}{others}): measuring tilelang's own lowerings{vendors} only"
    # why the served, seeded points' variants went, not why other points are refused, have no seed or stand for another
    count = sp.count(at=[p for p in served if not isinstance(sp.shape(p), str)])
    reason = next((count.examples[kind] for kind, _ in count.pruned.most_common() if kind not in ("seed", "same")), "the space is empty")
    return f"no variant of the seed survives static pruning (e.g. {reason}): measuring the baselines only"


def _print_limits(sp: Any, brief: bool = False) -> None:
    """What the space cannot vary in this seed (it is still measured as the seed baseline),
    and what it varies that the seed leaves out. ``brief`` (a tuning): one line of their topics; ``ws-tune space`` gives each in full."""
    for title, notes in (("kept as in the seed", sp.limits()), ("varied beyond the seed", sp.widened())):
        if not brief:
            for note in notes:
                err.print(f"{title}: {note}", markup=False, highlight=False)
        elif notes:
            topics = list(dict.fromkeys(head if len(head := note.split(": ", 1)[0]) <= 80 else note for note in notes))
            err.print(f"{title}: {'; '.join(topics)} (`ws-tune space` says why)", markup=False, highlight=False)
