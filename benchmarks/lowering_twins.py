"""tilelang's own lowerings and ws-tune's schedules of the same structure, side by side
(run it on the GPU machine): for each ``FILE@SHAPE@PARAMS`` (one kernel-parameter
point), the default and role_based lowerings, the seed schedule and the lowering start
(``ScheduleSpace.lowering_candidate``) in each pipeline layout and packing, timed by the independent timer
(harness.py: do_bench and a back-to-back loop after a pre-heat, interleaved rounds).
What a gap between a lowering and its twin comes from is read off the generated code.

    python benchmarks/lowering_twins.py --out OUT/twins.json \\
        tests/data/blockscaled_fp8_gemm.py@M=4096,N=4096,K=4096@block_M=128,block_N=128,num_stages=4,threads=256
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import harness

from ws_tuner.candidate import Candidate, Lowering
from ws_tuner.kernel import load_kernel
from ws_tuner.runner import RunInput
from ws_tuner.space import MERGED, SEPARATE
from ws_tuner.task import Task


def entries(file: str, shape: str, pins: str) -> list[harness.Entry]:
    spec = load_kernel(file)
    task = Task.make(spec, spec.parse_problem(shape), spec.parse_params(pins))
    space = task.space()
    params = next(p for p in space.param_points() if space.serves(p))
    found: dict[str, Candidate] = {"default": Candidate.make(dict(params), lowering=Lowering.DEFAULT),
                                   "role_based": Candidate.make(dict(params), lowering=Lowering.ROLE_BASED)}  # fmt: skip
    seed = space.seed_candidate(params)
    if isinstance(seed, Candidate):
        found["seed"] = seed
        for layout, packing in itertools.product((SEPARATE, MERGED), space.shape(params).lowering_packings()):
            start = space.lowering_candidate(params, layout, packing)
            if start is not None and start.hash not in {c.hash for c in found.values()}:
                found[f"start_{layout}" + ("" if packing == "warpgroup" else f"_{packing}")] = start
    label = f"{spec.name} {' '.join(f'{k}={v}' for k, v in params)}"
    return [harness.Entry(f"{label} | {kind}", None, RunInput(str(spec.path), spec.source_hash, task.problem, cand), spec.flops(task.problem))
            for kind, cand in found.items()]  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("points", nargs="+", metavar="FILE@SHAPE@PARAMS")
    args = ap.parse_args()
    rows = []
    for point in args.points:
        items = entries(*(point.split("@") + ["", ""])[:3])
        times = harness.independent(items, rounds=args.rounds)
        for item in items:
            t = times[item.label]
            rows.append({"point": item.label.split(" | ")[0], "kind": item.label.split(" | ")[1], "candidate": item.run_input.candidate.describe(),
                         "do_bench_tflops": round(item.flops / (t["do_bench_ms"] * 1e-3) / 1e12, 1),
                         "loop_tflops": round(item.flops / (t["loop_ms"] * 1e-3) / 1e12, 1)})  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
