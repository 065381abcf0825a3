"""Run 22: tilelang's default lowering of tests/data/dual_gemm.py and ws-tune's lowering
start at the same points (the same generated code but for barrier names), timed side
by side by triton's do_bench (harness.independent) and by energy_floor.measure.

    python benchmarks/results/h200-run22/new-kernel/twins.py OUT
"""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import energy_floor  # noqa: E402
import harness  # noqa: E402

from ws_tuner import gpu  # noqa: E402
from ws_tuner.candidate import Candidate, Lowering  # noqa: E402
from ws_tuner.kernel import load_kernel  # noqa: E402
from ws_tuner.runner import RunInput  # noqa: E402
from ws_tuner.task import Task  # noqa: E402

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
spec = load_kernel(ROOT / "tests" / "data" / "dual_gemm.py")
problem = spec.parse_problem("M=4096,N=4096,K=4096")
items, launches = [], {}
for stages in (2, 3):
    task = Task.make(spec, problem, spec.parse_params(f"block_M=128,block_N=128,block_K=64,num_stages={stages}"))
    params = next(iter(task.space().param_points()))
    for label, cand in ((f"default_st{stages}", Candidate.make(dict(params), lowering=Lowering.DEFAULT)),
                        (f"start_st{stages}", task.space().lowering_candidate(params, "separate"))):  # the per-buffer start (run 22)
        ri = RunInput(str(spec.path), spec.source_hash, task.problem, cand)
        items.append(harness.Entry(label, None, ri, spec.flops(problem)))
        launches[label] = gpu.launcher(ri)[1]
times = harness.independent(items, rounds=4)
args = spec.inputs(problem, "cuda")
nvml = gpu.Nvml()
rows = []
for rnd in range(2):
    for label, fn in launches.items():
        row = {"kernel": label, "round": rnd, "do_bench_tflops": round(spec.flops(problem) / (times[label]["do_bench_ms"] * 1e-3) / 1e12, 1),
               **energy_floor.measure(nvml, lambda fn=fn: fn(args), spec.flops(problem), seconds=1.5)}
        rows.append(row)
        print(json.dumps(row), flush=True)
(out / "twins.json").write_text(json.dumps(rows, indent=2) + "\n")
