"""GEMM tuning benchmark for one Hopper GPU (run it on the GPU machine).

For each shape: tune examples/gemm.py (fp16) with TPE, every baseline timed in
the same run (cuBLAS via torch.matmul, tilelang's default lowering and its
role_based schedule, each at its best over the same kernel-parameter grid, and
the kernel's seed schedule); then, optionally, one exhaustive (grid) run of the
focused space at one shape, and a second tuning of one shape to check that two
tunings agree on the winner's speed.

    python benchmarks/gemm_h200.py --out results/ [--shapes 4096x4096x4096 ...] [--budget 150]
        [--exhaustive 4096x4096x4096] [--repeat 4096x4096x4096] [--jobs 14]

Writes <out>/<shape>.json, <out>/summary.md and the SQLite file it tuned into.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from ws_tuner import search
from ws_tuner.builder import LocalBuilder
from ws_tuner.kernel import load_kernel
from ws_tuner.runner import EvaluatorConfig, LocalRunner
from ws_tuner.space import SpaceConfig
from ws_tuner.store import open_store
from ws_tuner.task import Task
from ws_tuner.tune import TuneOptions, Tuner, TuneReport

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "gemm.py"
GRID = {"block_M": (128,), "block_N": (128, 256), "block_K": (64, 128), "swizzle": (0, 8), "epilogue": ("direct", "smem"), "persistent": (False, True)}
EXHAUSTIVE_GRID = {"block_M": (128,), "block_N": (256,), "block_K": (64,), "swizzle": (8,), "epilogue": ("direct", "smem"), "persistent": (False, True)}
DEFAULT_SHAPES = ("4096x4096x4096", "8192x8192x8192", "8192x8192x1024", "2048x8192x8192")


def problem(shape: str) -> dict:
    m, n, k = (int(x) for x in shape.split("x"))
    return {"M": m, "N": n, "K": k, "dtype": "float16", "b_layout": "row"}


def tune(task: Task, db: str, *, strategy: str, budget: int, jobs: int, seed: int, runner: LocalRunner) -> TuneReport:
    store = open_store(db)
    with LocalBuilder(jobs=jobs, timeout=300) as builder:
        tuner = Tuner(task, store=store, builder=builder, runner=runner, strategy=search.create(strategy, seed=seed),
                      options=TuneOptions(budget=budget, jobs=jobs, evaluator=EvaluatorConfig(warmup=5, reps=30, timeout=60)))  # fmt: skip
        report = tuner.run()
    store.close()
    return report


def row(report: TuneReport) -> dict:
    def tf(rec):
        return round(rec.result.tflops, 1) if rec else None

    best = report.best
    base = {k: report.baseline(k) for k in ("reference", "default", "role_based", "seed")}
    tilelang_best = max((tf(base["default"]) or 0), (tf(base["role_based"]) or 0))
    measured = [r for r in report.records if not r.cached]
    return {
        "problem": json.loads(report.key.problem),
        "device": report.key.device,
        "cublas_tflops": tf(base["reference"]),
        "tilelang_default_tflops": tf(base["default"]),
        "role_based_tflops": tf(base["role_based"]),
        "seed_tflops": tf(base["seed"]),
        "ws_tune_tflops": tf(best),
        "vs_tilelang": round(tf(best) / tilelang_best, 3) if best and tilelang_best else None,
        "vs_cublas": round(tf(best) / tf(base["reference"]), 3) if best and base["reference"] else None,
        "spread": round(best.result.timing.spread, 4) if best else None,
        "trials": len(report.records),
        "search_trials": sum(r.role == "search" for r in report.records),
        "wall_s": round(report.wall_seconds, 1),
        "candidates_per_min": round(len(measured) / report.wall_seconds * 60, 1) if report.wall_seconds else None,
        "outcomes": report.counts(),
        "winner": best.candidate.describe() if best else None,
        "winner_hash": best.candidate.hash if best else None,
        "winner_source": best.candidate.schedule.to_source() if best and best.candidate.schedule else None,
        "baseline_params": {k: (v.candidate.param_dict if v else None) for k, v in base.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shapes", nargs="*", default=list(DEFAULT_SHAPES))
    ap.add_argument("--budget", type=int, default=150)
    ap.add_argument("--jobs", type=int, default=14)
    ap.add_argument("--exhaustive", default=None, help="shape for one grid run of configs/space-focused.toml")
    ap.add_argument("--repeat", default=None, help="shape to tune a second time (fresh database, other seed)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    spec = load_kernel(EXAMPLE)
    rows = []
    with LocalRunner(0) as runner:
        for shape in args.shapes:
            task = Task.make(spec, spec.parse_problem(problem(shape)), GRID)
            report = tune(task, str(args.out / "bench.db"), strategy="tpe", budget=args.budget, jobs=args.jobs, seed=0, runner=runner)
            rows.append({"shape": shape, "kind": "tpe", **row(report)})
            (args.out / f"{shape}.json").write_text(json.dumps(rows[-1], indent=2))
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "winner_source"}), flush=True)
        if args.repeat:
            task = Task.make(spec, spec.parse_problem(problem(args.repeat)), GRID)
            report = tune(task, str(args.out / "repeat.db"), strategy="tpe", budget=args.budget, jobs=args.jobs, seed=1, runner=runner)
            rows.append({"shape": args.repeat, "kind": "tpe-repeat", **row(report)})
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "winner_source"}), flush=True)
        if args.exhaustive:
            config = SpaceConfig.from_toml(ROOT / "configs" / "space-focused.toml")
            task = Task.make(spec, spec.parse_problem(problem(args.exhaustive)), EXHAUSTIVE_GRID, config)
            start = time.monotonic()
            report = tune(task, str(args.out / "exhaustive.db"), strategy="grid", budget=10**6, jobs=args.jobs, seed=0, runner=runner)
            rows.append({"shape": args.exhaustive, "kind": "exhaustive", "space": task.space().count().kept, **row(report)})
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "winner_source"}), "in", round(time.monotonic() - start), "s", flush=True)
    (args.out / "rows.json").write_text(json.dumps(rows, indent=2))
    lines = [
        "| shape | kind | cuBLAS | tilelang default | role_based | seed | ws-tune best | vs tilelang | vs cuBLAS | trials | wall s | cand/min | winner |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['shape']} | {r['kind']} | {r['cublas_tflops']} | {r['tilelang_default_tflops']} | {r['role_based_tflops']} | {r['seed_tflops']} "
            f"| {r['ws_tune_tflops']} | {r['vs_tilelang']} | {r['vs_cublas']} | {r['trials']} | {r['wall_s']} | {r['candidates_per_min']} | {r['winner']} |"
        )
    (args.out / "summary.md").write_text("TFLOP/s (fp16 in, fp32 accumulate), medians of 30 CUDA-event timings, L2 flushed\n\n" + "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
