"""DeepSeek-V4's sparse attention at 64-key blocks, its keys gathered 2 deep by the Load role
in one warp or in two (the Store role's warp beside them in one warpgroup), against
tilelang's own lowerings, on one H200: each candidate built (verifier + nvcc), checked
against the reference and timed by ws-tune's runner (steady state), then re-timed by
triton's do_bench in this process. Exploration for run 33's README.

    python3 -u gather_warps.py OUT
"""

import json
import sys
from pathlib import Path

from triton.testing import do_bench

from ws_tuner import compiler
from ws_tuner.builder import BuildInput, LocalBuilder
from ws_tuner.candidate import Candidate
from ws_tuner.kernel import load_kernel
from ws_tuner.runner import EvaluatorConfig, LocalRunner, RunInput
from ws_tuner.schedule import Role
from ws_tuner.space import Point
from ws_tuner.task import Task

ROOT = Path(__file__).resolve().parents[3]
SHAPE = "batch=1,seq=4096,seq_kv=8192,heads=128,dim=512,topk=1024"


def main() -> None:
    spec = load_kernel(ROOT / "tests" / "data" / "sparse_attn_v4.py")
    task = Task.make(spec, spec.parse_problem(SHAPE), spec.parse_params("block_N=64,num_stages=1,threads=128"))
    space = task.space()
    params = next(iter(space.param_points()))
    shape = space.shape(params)
    one = space.candidate(Point(params, "2xWG+warp@first", shape.layouts()[0], (2,), (), (0, 0, 0), ("parallel_1",)))
    assert isinstance(one, Candidate), one
    cands = [("Load 1 warp, no budgets", one)]
    for nregs in ((0, 0, 0), (184, 136, 136), (208, 72, 72)):
        ranges = {"Load": (0, 2), "Store": (2, 3)}
        roles = tuple(Role(r.name, *ranges.get(r.name, (r.warp_lo, r.warp_hi)), n) for r, n in zip(one.schedule.roles, nregs))
        cands.append((f"Load 2 warps, nreg {nregs}", Candidate.make(one.param_dict, one.schedule.with_(roles=roles))))
    cands += [(f"tilelang {c.lowering.value}", c) for c in task.baselines({"block_N": 64, "num_stages": 2, "threads": 256})[1:]]
    with LocalBuilder(jobs=15, timeout=600) as builder:
        builds = builder.build([BuildInput(str(spec.path), spec.source_hash, task.problem, c) for _, c in cands])
    rows = []
    with LocalRunner(0) as runner:
        for (label, c), b in zip(cands, builds):
            row = {"label": label, "candidate": c.describe(), "status": b.status.value, "message": b.message[:200]}
            if b.ok:
                r = runner.submit(RunInput(str(spec.path), spec.source_hash, task.problem, c, EvaluatorConfig(timeout=60))).result()
                row.update(status=r.status.value, message=r.message[:200], ws_tune_tflops=r.tflops)
            print(json.dumps(row), flush=True)
            rows.append(row)
    args = spec.inputs(task.problem, "cuda")  # do_bench once the runner is gone
    for (label, c), row in zip(cands, rows):
        if row["status"] == "ok":
            kernel = compiler.compile_kernel(*task.lowered(c))
            ms = do_bench(lambda: spec.launch(kernel, args), warmup=300, rep=500)
            row["do_bench_tflops"] = round(spec.flops(task.problem) / ms / 1e9, 1)
            print(label, round(row["ws_tune_tflops"], 1), row["do_bench_tflops"], flush=True)
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    (out / "gather_warps.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":  # the builder spawns processes that import this file
    main()
