"""One tuning job, one worker per GPU (run it on a host with several GPUs).

Registers examples/gemm.py in a fresh SQLite database, submits one job and
starts a production `ws-tune worker --gpu N` per GPU; when they have drained
the job, re-times the job's leaders beside its anchor on every GPU and
compares the ratios: a candidate's ratio to the anchor must not depend on
the GPU it was timed on, and the job ranks by ratios, not by raw times taken
on different GPUs.

    python benchmarks/multi_gpu.py --out OUT [--gpus 0 1] [--shape 8192x8192x8192] [--budget 40]

Writes OUT/multi_gpu.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from ws_tuner.kernel import load_kernel
from ws_tuner.runner import EvaluatorConfig, LocalRunner, RunInput
from ws_tuner.store import open_store
from ws_tuner.store.queue import JobQueue
from ws_tuner.store.registry import Registry

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "gemm.py"
PARAMS = "block_M=128,block_K=64,swizzle=8"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--gpus", type=int, nargs="*", default=[0, 1])
    ap.add_argument("--shape", default="8192x8192x8192")
    ap.add_argument("--budget", type=int, default=40)
    ap.add_argument("--jobs", type=int, default=14)
    ap.add_argument("--timeout", type=float, default=420.0)
    args = ap.parse_args()
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{(args.out / 'multi.db').resolve()}"
    m, n, k = (int(x) for x in args.shape.split("x"))
    problem = {"M": m, "N": n, "K": k, "dtype": "float16", "b_layout": "row"}
    store = open_store(url)
    source = EXAMPLE.read_text()
    kernel = Registry(store).put_kernel("gemm", source, registered=True)
    job = JobQueue(store).create_job(kernel_id=kernel.id, kernel="gemm", problem=problem, problem_checked=True, params=PARAMS,
                                     strategy="tpe", seed=0, budget=args.budget, baselines=True)  # fmt: skip
    env = {**os.environ, "WS_TUNE_KERNEL_CACHE_DIR": str(args.out / "kernel-cache"), "WS_TUNE_LOG_LEVEL": "info"}
    start = time.monotonic()
    workers = [
        subprocess.Popen([sys.executable, "-m", "ws_tuner", "worker", "--gpu", str(g), "--db", url, "--jobs", str(args.jobs),
                          "--exit-when-idle", "--heartbeat", "2", "--grace", "60"],
                         # Run from OUT: `-m` puts the working directory first on sys.path, and a
                         # checkout's ws_tuner/ (without server/) must not shadow the installed package.
                         env=env, cwd=args.out, stdout=open(args.out / f"worker-{g}.log", "wb"), stderr=subprocess.STDOUT)
        for g in args.gpus
    ]  # fmt: skip
    for w in workers:
        w.wait(timeout=args.timeout)
    wall = time.monotonic() - start
    queue = JobQueue(store)
    done = queue.get_job(job.id)
    gpu_of = {w.id: w.gpu for w in queue.list_workers()}
    trials = store.trials_by_hash(workload_id=done.workload_id)
    timed = [t for t in trials.values() if t.result.timing and t.result.ratio is not None]
    by_gpu: dict[str, int] = {}
    for t in trials.values():
        g = str(gpu_of.get(t.result.info.get("worker")))
        by_gpu[g] = by_gpu.get(g, 0) + 1
    anchor_hash = timed[0].result.info["anchor"]
    anchor = trials[anchor_hash].candidate  # the seed at the first point: one of the job's baselines
    leaders = sorted((t for t in timed if t.result.info.get("role") == "search"), key=lambda t: t.result.ratio)[:5]
    spec = load_kernel(EXAMPLE)
    rows = []
    ratios: dict[str, dict[int, float | None]] = {t.candidate.hash: {} for t in leaders}
    for g in args.gpus:
        with LocalRunner(g) as runner:
            for t in leaders:
                ri = RunInput(str(spec.path), spec.source_hash, done.problem, t.candidate, EvaluatorConfig(), anchor)
                ratios[t.candidate.hash][g] = runner.submit(ri).result().ratio
    for t in leaders:
        r = ratios[t.candidate.hash]
        values = [v for v in r.values() if v]
        rows.append({
            "candidate": t.candidate.describe(), "hash": t.candidate.hash, "job_ratio": round(t.result.ratio, 4),
            "job_gpu": gpu_of.get(t.result.info.get("worker")), "job_median_ms": t.result.timing.median_ms,
            **{f"gpu{g}_ratio": round(v, 4) if v else None for g, v in r.items()},
            "spread": round(max(values) / min(values) - 1, 4) if values else None,
        })  # fmt: skip
    by_ms = min(timed, key=lambda t: t.result.timing.median_ms)
    summary = {
        "job": {"state": done.state, "budget": args.budget, "trials": len(trials), "wall_s": round(wall, 1), "trials_per_gpu": by_gpu,
                "best_by_ratio": done.best_candidate, "best_by_raw_time": by_ms.candidate.hash,
                "confirmed": sum(t.result.confirmed for t in trials.values())},
        "anchor": anchor.describe(),
        "leaders": rows,
        "largest_cross_gpu_spread": max((r["spread"] for r in rows if r["spread"] is not None), default=None),
    }  # fmt: skip
    (args.out / "multi_gpu.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
