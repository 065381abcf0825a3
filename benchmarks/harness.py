"""What the GPU benchmarks share: a tuning, its summary row, and an independent
re-timing of its winner and baselines (run them on the GPU machine).

The independent check does not use ws-tune's timer: in this process, for each
kernel in turn (order reversed every round), a 300 ms pre-heat of that kernel
alone, then triton's ``do_bench`` (L2 flushed, median) and a plain
back-to-back loop of launches timed by two CUDA events. Its figures go to
``fidelity.json`` beside ws-tune's confirmed ones.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from ws_tuner import search
from ws_tuner.builder import LocalBuilder
from ws_tuner.candidate import Candidate, Lowering
from ws_tuner.pipeline import TrialRecord, TuneReport
from ws_tuner.runner import EvaluatorConfig, LocalRunner, RunInput
from ws_tuner.store import open_store
from ws_tuner.task import Task
from ws_tuner.tune import TuneOptions, Tuner

KINDS = ("ws", "seed", "default", "no_ws", "role_based", "reference")
TILELANG = ("default", "no_ws", "role_based")  # tilelang's own lowerings


def tune(task: Task, db: str, *, strategy: str, budget: int, jobs: int, seed: int, runner: LocalRunner,
         time_budget: float | None = None) -> TuneReport:  # fmt: skip
    store = open_store(db)
    try:
        with LocalBuilder(jobs=jobs, timeout=300) as builder:
            tuner = Tuner(task, store=store, builder=builder, runner=runner, strategy=search.create(strategy, seed=seed),
                          options=TuneOptions(budget=budget, time_budget=time_budget, jobs=jobs, evaluator=EvaluatorConfig(timeout=60)))  # fmt: skip
            return tuner.run()
    finally:
        store.close()


def leaders(report: TuneReport) -> dict[str, TrialRecord]:
    """The winner and the best of every baseline, by kind."""
    found = {"ws": report.best, **{k: report.baseline(k) for k in KINDS[1:]}}
    return {k: r for k, r in found.items() if r is not None}


def summary_row(report: TuneReport) -> dict[str, Any]:
    """ws-tune's own figures of one tuning: confirmed, steady state, side by side."""
    best = leaders(report)

    def tf(kind: str) -> float | None:
        return round(best[kind].result.tflops, 1) if kind in best else None

    def vs(kind: str) -> float | None:
        # Both were timed in the final tournament beside the same anchor: compare ratios.
        if "ws" not in best or kind not in best or not best["ws"].result.ratio or not best[kind].result.ratio:
            return None
        return round(best[kind].result.ratio / best["ws"].result.ratio, 3)

    tilelang = max((k for k in TILELANG if k in best), key=lambda k: best[k].result.tflops, default=None)
    measured = [r for r in report.records if not r.cached]
    ws = best.get("ws")
    return {
        "problem": json.loads(report.key.problem),
        "device": report.key.device,
        "ws_tune_tflops": tf("ws"),
        "tilelang_best_tflops": tf(tilelang) if tilelang else None,
        "tilelang_best": tilelang,
        "reference_tflops": tf("reference"),
        "reference_vendor": best["reference"].candidate.param_dict.get("vendor") if "reference" in best else None,
        "seed_tflops": tf("seed"),
        "default_tflops": tf("default"),
        "no_ws_tflops": tf("no_ws"),
        "role_based_tflops": tf("role_based"),
        "vs_tilelang": vs(tilelang) if tilelang else None,
        "vs_reference": vs("reference"),
        "confirmed": {k: r.result.confirmed for k, r in best.items()},
        "winner_ratio_ci": ws.result.info.get("ratio_ci") if ws else None,
        "winner_time_ci": ws.result.info.get("time_ci") if ws else None,
        "anchor": report.anchor.describe() if report.anchor else None,
        "trials": len(report.records),
        "searched": report.searched,
        "out_of_time": report.out_of_time,  # the time budget ended the search before its budget was spent
        "measured": len(measured),
        "shared": report.shared,
        "wrong_fraction": round(report.wrong_fraction, 4) if report.wrong_fraction is not None else None,
        "wall_s": round(report.wall_seconds, 1),
        "search_s": round(report.search_seconds, 1),
        "tournament_s": round(report.tournament_seconds, 1),
        # Built, checked and timed per minute while searching (the anchor and the tournament apart).
        "candidates_per_min": round(len(measured) / report.search_seconds * 60, 1) if report.search_seconds else None,
        "candidates_per_min_overall": round(len(measured) / report.wall_seconds * 60, 1) if report.wall_seconds else None,
        "outcomes": report.counts(),
        "discarded": _sum_dicts(r.result.info.get("discarded", {}) for r in measured),
        "winner": ws.candidate.describe() if ws else None,
        "winner_hash": ws.candidate.hash if ws else None,
        "winner_source": ws.candidate.schedule.to_source() if ws and ws.candidate.schedule else None,
    }


def _sum_dicts(dicts: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = out.get(k, 0) + v
    return out


@dataclass
class Entry:
    label: str  # e.g. "ws", "seed", "ws-repeat"
    record: TrialRecord
    run_input: RunInput
    flops: float


def entries(report: TuneReport, task: Task, prefix: str = "") -> list[Entry]:
    out = []
    for kind, record in leaders(report).items():
        ri = RunInput(str(task.spec.path), task.spec.source_hash, task.problem, record.candidate)
        out.append(Entry(prefix + kind, record, ri, task.spec.flops(task.problem)))
    return out


def independent(items: list[Entry], *, gpu: int = 0, rounds: int = 3, preheat_s: float = 0.3) -> dict[str, dict[str, float]]:
    """Re-time each entry with triton's do_bench and a back-to-back loop, interleaved, in steady state."""
    import torch
    from triton.testing import do_bench

    from ws_tuner import gpu as ws_gpu

    torch.cuda.set_device(gpu)
    launches = {}
    for item in items:
        task, launch = ws_gpu.launcher(item.run_input)
        args = task.spec.inputs(task.problem, "cuda")
        launches[item.label] = (lambda launch=launch, args=args: launch(args))
    bench: dict[str, list[float]] = {k: [] for k in launches}
    loop: dict[str, list[float]] = {k: [] for k in launches}
    for label in interleaved(list(launches), rounds):
        fn = launches[label]
        preheat(fn, preheat_s)
        bench[label].append(do_bench(fn, warmup=25, rep=100, return_mode="median"))
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        n = max(int(0.1 / (bench[label][-1] * 1e-3)), 10)
        start.record()
        for _ in range(n):
            fn()
        stop.record()
        torch.cuda.synchronize()
        loop[label].append(start.elapsed_time(stop) / n)
    return {k: {"do_bench_ms": statistics.median(bench[k]), "loop_ms": statistics.median(loop[k])} for k in launches}


def interleaved(labels: list[str], rounds: int) -> Iterator[str]:
    """The labels ``rounds`` times, the order reversed every other round: each kernel is timed
    before and after each other one, so that a drifting clock favours none."""
    for r in range(rounds):
        yield from labels if r % 2 == 0 else labels[::-1]


def preheat(fn: Callable[[], Any], seconds: float) -> None:
    """Run the kernel alone until its clock has settled at its own level."""
    import torch

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(10):
            fn()
        torch.cuda.synchronize()


def settled(fns: dict[str, Callable[[], Any]], *, rounds: int = 3, preheat_s: float = 0.3, gpu: int = 0) -> dict[str, dict[str, Any]]:
    """Triton's do_bench of each function after its pre-heat, interleaved over ``rounds``
    (order reversed every other round): the median ms, and NVML's SM clock (MHz) and power (W)
    read after each round's timing."""
    import pynvml
    from triton.testing import do_bench

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(gpu)
    ms: dict[str, list[float]] = {k: [] for k in fns}
    clocks: dict[str, list[tuple[int, int]]] = {k: [] for k in fns}
    for label in interleaved(list(fns), rounds):
        preheat(fns[label], preheat_s)
        ms[label].append(do_bench(fns[label], warmup=25, rep=100, return_mode="median"))
        clocks[label].append((pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM), round(pynvml.nvmlDeviceGetPowerUsage(handle) / 1000)))
    return {k: {"do_bench_ms": round(statistics.median(ms[k]), 4), "sm_mhz_power_w": clocks[k]} for k in fns}


def launchers(path: Path, problem: dict[str, Any] | str, points: dict[str, tuple[str, str]], *, vendors: bool = True) -> dict[str, Callable[[list[Any]], Any]]:
    """``launch(args)`` of each label's (kernel-parameter point, lowering) built through
    ws-tune ("ws": the seed schedule at the point), and of the kernel file's vendors: for
    benchmarks that time or profile fixed kernels with a timer of their own."""
    from ws_tuner import gpu
    from ws_tuner.kernel import load_kernel

    spec = load_kernel(path)
    problem = spec.parse_problem(problem)
    out: dict[str, Callable[[list[Any]], Any]] = {}
    for label, (point, lowering) in points.items():
        task = Task.make(spec, problem, spec.parse_params(point))
        params = next(iter(task.space().param_points()))
        candidate = task.space().seed_candidate(params) if lowering == "ws" else Candidate.make(dict(params), lowering=Lowering(lowering))
        if isinstance(candidate, str):
            raise SystemExit(f"no seed at {point}: {candidate}")
        try:
            out[label] = gpu.launcher(RunInput(str(spec.path), spec.source_hash, task.problem, candidate))[1]
        except Exception as exc:  # noqa: BLE001 - a baseline that does not build is reported, not fatal
            print(f"{label}: {str(exc).splitlines()[0][:200]}", flush=True)
    return out | ({name: spec.vendor(problem, name) for name in spec.vendor_names(problem)} if vendors else {})


def fidelity_rows(items: list[Entry], times: dict[str, dict[str, float]]) -> list[dict[str, Any]]:
    rows = []
    for item in items:
        r = item.record.result
        t = times[item.label]
        indep = item.flops / (t["do_bench_ms"] * 1e-3) / 1e12
        rows.append({
            "problem": item.run_input.problem,
            "kind": item.label,
            "candidate": item.record.candidate.describe(),
            "candidate_hash": item.record.candidate.hash,
            "confirmed": r.confirmed,
            "ws_tune_tflops": round(r.tflops, 1),
            "independent_tflops": round(indep, 1),
            "loop_tflops": round(item.flops / (t["loop_ms"] * 1e-3) / 1e12, 1),
            "agreement": round(r.tflops / indep, 4),
            "sm_clock_median_mhz": r.info.get("sm_clock_median_mhz"),
            "power_w": r.info.get("power_w"),
        })  # fmt: skip
    return rows


def tuning_key(row: dict[str, Any]) -> str:
    """Which tuning a row belongs to: its problem, and its kernel where rows of several
    kernels share a table (two kernel files tuned at M=N=K=4096 are two tunings)."""
    return json.dumps([row.get("kernel"), row["problem"]], sort_keys=True)


def order_agrees(rows: list[dict[str, Any]], tie: float = 0.01) -> bool:
    """Whether ws-tune and the independent timer order the winner against every
    baseline of its tuning alike. Kernels within ``tie`` of each other by either
    timer have no order to disagree on; a baseline that is the winner itself
    (the seed at the winning point) neither."""
    by_problem: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_problem.setdefault(tuning_key(row), []).append(row)
    for group in by_problem.values():
        ws = next((r for r in group if r["kind"] == "ws"), None)
        for other in (r for r in group if ws and r["kind"] in KINDS[1:] and r["candidate_hash"] != ws["candidate_hash"]):
            ours = ws["ws_tune_tflops"] / other["ws_tune_tflops"] - 1
            theirs = ws["independent_tflops"] / other["independent_tflops"] - 1
            if ours * theirs < 0 and min(abs(ours), abs(theirs)) > tie:
                return False
    return True


def run(kernel_file: Path, problems: dict[str, dict[str, Any]], grid: dict[str, tuple[Any, ...]], *, out: Path, budget: int,
        jobs: int, publish: Callable[[list[dict[str, Any]], list[dict[str, Any]]], None], gpu: int = 0,
        repeat: str | None = None, time_budget: float | None = None) -> None:  # fmt: skip
    """Tune each problem (TPE, one database), optionally a second time (fresh
    database, another seed), re-timing each tuning's winner and baselines
    independently as soon as it ends; ``publish(rows, fidelity)`` gets
    everything so far after each tuning, so a run cut short keeps its results."""
    from ws_tuner.kernel import load_kernel

    out.mkdir(parents=True, exist_ok=True)
    spec = load_kernel(kernel_file)
    rows: list[dict[str, Any]] = []
    fidelity: list[dict[str, Any]] = []
    first: dict[str, TuneReport] = {}
    for label, problem in [*problems.items(), *([(repeat, problems[repeat])] if repeat else [])]:
        again = label in first
        task = Task.make(spec, spec.parse_problem(problem), grid)
        db = out / ("repeat.db" if again else f"{kernel_file.stem}.db")
        with LocalRunner(gpu) as runner:
            report = tune(task, str(db), strategy="tpe", budget=budget, jobs=jobs, seed=1 if again else 0, runner=runner,
                          time_budget=time_budget)  # fmt: skip
        rows.append({"shape": label, "run": "tpe-repeat" if again else "tpe", **summary_row(report)})
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "winner_source"}), flush=True)
        # The runner's process is gone: the independent timer has the GPU to itself.
        if again:  # the repeat's winner, side by side with the first tuning's
            items = [i for i in entries(report, task, "repeat-") if i.label == "repeat-ws"]
            items += [i for i in entries(first[label], task, "first-") if i.label == "first-ws"]
        else:
            items = entries(report, task)
            first[label] = report
        fidelity += fidelity_rows(items, independent(items, gpu=gpu))
        write(out, "fidelity.json", fidelity)
        publish(rows, fidelity)


def table(rows: list[dict[str, Any]], fidelity: list[dict[str, Any]], columns: list[tuple[str, str, str | None]]) -> list[str]:
    """Markdown rows: each column (title, row key, fidelity kind or None) as `ws-tune / independent` where both exist."""
    indep = {(tuning_key(f), f["kind"]): f for f in fidelity}

    def cell(row: dict[str, Any], key: str, kind: str | None) -> str:
        f = indep.get((tuning_key(row), kind)) if kind else None
        return f"{row[key]} / {f['independent_tflops']}" if f and row.get(key) is not None else str(row.get(key))

    lines = ["| " + " | ".join(c[0] for c in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r, key, kind) for _, key, kind in columns) + " |" for r in rows]
    worst = max((abs(f["agreement"] - 1) for f in fidelity), default=0.0)
    lines += ["", f"fidelity: {len(fidelity)} rows, largest gap between ws-tune and do_bench {worst:.1%}; "
              f"winner-vs-baseline order the same in both: {order_agrees(fidelity)}"]  # fmt: skip
    return lines


def report(out: Path, name: str, rows: list[dict[str, Any]], fidelity: list[dict[str, Any]], header: list[str],
           columns: list[tuple[str, str, str | None]]) -> None:
    """Write ``rows`` as ``name`` and the summary table (``header`` first) as summary.md, and print it."""
    write(out, name, rows)
    text = "\n".join(header + [""] + table(rows, fidelity, columns)) + "\n"
    (out / "summary.md").write_text(text)
    print(text)


def write(out: Path, name: str, rows: list[dict[str, Any]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(json.dumps(rows, indent=2) + "\n")


def is_ws(record: TrialRecord) -> bool:
    return record.candidate.lowering is Lowering.WS
