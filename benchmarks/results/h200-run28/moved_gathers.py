"""Sparse MLA with its gathers in the Load warpgroup, against the seed (the gathers with
the consumers), on one H200: each candidate built (verifier + nvcc), checked against the
reference and timed by ws-tune's runner (steady state), then re-timed by triton's
do_bench in this process. Exploration for run 28's README; the tuned figure is
kernel_files_h200.py's.

    python3 -u moved_gathers.py OUT
"""

import json
import sys
from pathlib import Path

from triton.testing import do_bench

from ws_tuner import compiler
from ws_tuner.builder import BuildInput, LocalBuilder
from ws_tuner.kernel import load_kernel
from ws_tuner.runner import EvaluatorConfig, LocalRunner, RunInput
from ws_tuner.space import SEED, Point
from ws_tuner.task import Task

ROOT = Path(__file__).resolve().parents[3]
SHAPE = "batch=1,seq=4096,seq_kv=8192,heads=128,topk=2048"


def main() -> None:
    spec = load_kernel(ROOT / "tests" / "data" / "sparse_mla.py")
    task = Task.make(spec, spec.parse_problem(SHAPE), {**spec.params, "block_I": (64,), "num_stages": (1,)})  # one WS structure at both
    space = task.space()
    cands = []
    for params in space.param_points():
        shape = space.shape(params)
        if isinstance(shape, str):
            continue
        cands.append(("seed", space.seed_candidate(params)))
        for move in shape.analysis.movable:
            plan = shape.plan(SEED, (move.op,))
            for depth in (2,):  # depth 1 ran 198-239 (run 28 call 6, run 29 call 1)
                for nregs in ((232, 40), (216, 72), (208, 88), (200, 104), (192, 120), (184, 136), (0, 0)):  # the gathers want more than a TMA producer's budget
                    depths = tuple(depth if name == move.pipeline else 1 for name in plan.varied)
                    for split in ("2xWG+warpgroup@first", "2xWG+warpgroup@last"):  # one warp: 56-192 (run 28 call 6, run 29 call 2)
                        c = space.candidate(Point(params, split, SEED, depths, (), nregs, (move.op,)))
                        if not isinstance(c, str):
                            cands.append((f"gathers in Load, depth {depth}, {split}, nreg {nregs}", c))
    for stages in (1, 2):  # tilelang's own lowerings, at both pipeline depths of the kernel
        cands += [(f"tilelang {c.lowering.value}", c) for c in task.baselines({"block_I": 64, "num_stages": stages, "threads": 256})[1:]]
    seen, unique = set(), []
    for label, c in cands:
        if c.hash not in seen:
            seen.add(c.hash)
            unique.append((label, c))
    print(len(unique), "candidates", flush=True)
    with LocalBuilder(jobs=15, timeout=600) as builder:
        builds = builder.build([BuildInput(str(spec.path), spec.source_hash, task.problem, c) for _, c in unique])
    rows = []
    with LocalRunner(0) as runner:
        for (label, c), b in zip(unique, builds):
            row = {"label": label, "candidate": c.describe(), "status": b.status.value, "message": b.message[:200]}
            if b.ok:
                r = runner.submit(RunInput(str(spec.path), spec.source_hash, task.problem, c, EvaluatorConfig(timeout=60))).result()
                row.update(status=r.status.value, message=r.message[:200], ws_tune_tflops=r.tflops)
            print(json.dumps(row), flush=True)
            rows.append(row)
    # do_bench once the runner is gone: its process holds the GPU busy while it lives
    args = spec.inputs(task.problem, "cuda")
    for (label, c), row in zip(unique, rows):
        if row["status"] == "ok":
            func, configs = task.lowered(c)
            kernel = compiler.compile_kernel(func, configs)
            ms = do_bench(lambda: spec.launch(kernel, args), warmup=300, rep=500)
            row["do_bench_tflops"] = round(spec.flops(task.problem) / ms / 1e9, 1)
            print(label, row["candidate"], round(row["ws_tune_tflops"], 1), row["do_bench_tflops"], flush=True)
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    (out / "moved_gathers.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":  # the builder spawns processes that import this file
    main()
