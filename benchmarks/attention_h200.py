"""FlashAttention forward tuning benchmark for one Hopper GPU (run it on the GPU machine).

B=4, H=16, S in {4096, 8192}, D in {64, 128}, non-causal and causal, fp16:
tune examples/attention.py with TPE; baselines in the same run: tilelang's
default and role_based lowerings over the same kernel-parameter grid, the
seed, and every torch SDPA backend that runs (the kernel file's vendors);
then the independent re-timing of harness.py.

    python benchmarks/attention_h200.py --out OUT [--budget 40] [--time-budget S] [--jobs 14] [--gpu 0] [--only S=4096,D=128,causal=0 ...]

Writes OUT/attention.json, OUT/fidelity.json, OUT/summary.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import harness

ROOT = Path(__file__).resolve().parent.parent
# The grid of h200-run14 (every problem >= 1.00x SDPA): what earlier runs found to lose
# (ping-pong, block_N 64, one stage, exp2, a second Q buffer, a Storer role, the plain
# order) is left out.
GRID = {"block_M": (128, 192), "block_N": (128,), "stages": (2,), "mma": ("sync", "async"), "consumers": ("cooperative",),
        "persistent": (False, True), "q_buffers": (1,), "store": ("consumer",), "exp": ("ftz",), "reduce": ("row", "lane")}  # fmt: skip
COLUMNS = [("problem", "shape", None), ("SDPA best", "reference_tflops", "reference"), ("backend", "reference_vendor", None),
           ("tilelang default", "default_tflops", "default"), ("no WS", "no_ws_tflops", "no_ws"), ("role_based", "role_based_tflops", "role_based"),
           ("seed", "seed_tflops", "seed"), ("ws-tune", "ws_tune_tflops", "ws"), ("vs tilelang", "vs_tilelang", None),
           ("vs SDPA", "vs_reference", None), ("trials", "trials", None), ("WRONG", "wrong_fraction", None),
           ("cand/min", "candidates_per_min", None), ("winner", "winner", None)]  # fmt: skip


def problems() -> dict[str, dict]:
    return {f"S={s},D={d},causal={c}": {"B": 4, "H": 16, "S": s, "D": d, "dtype": "float16", "causal": c}
            for s in (4096, 8192) for d in (64, 128) for c in (0, 1)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget", type=int, default=40)
    ap.add_argument("--jobs", type=int, default=14)
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--only", nargs="*", default=None, help="problem labels to run (default: all eight)")
    ap.add_argument("--time-budget", type=float, default=None,
                    help="seconds of search per problem (as ws-tune tune --time-budget: the clock starts after the "
                         "grid's baselines, which are measured in full; the tournament comes on top)")
    ap.add_argument("--grid", default=None, help="kernel-parameter grid as JSON (default: GRID)")
    args = ap.parse_args()
    grid = {k: tuple(v) for k, v in json.loads(args.grid).items()} if args.grid else GRID
    chosen = {k: v for k, v in problems().items() if not args.only or k in args.only}
    harness.run(ROOT / "examples" / "attention.py", chosen, grid, out=args.out, budget=args.budget, jobs=args.jobs,
                gpu=args.gpu, time_budget=args.time_budget, publish=lambda rows, fidelity: harness.report(
                    args.out, "attention.json", [{**r, "sdpa_best_tflops": r["reference_tflops"], "sdpa_backend": r["reference_vendor"]} for r in rows],
                    fidelity, ["FlashAttention forward, B=4 H=16 fp16, TFLOP/s as `ws-tune (confirmed, steady state) / independent (do_bench)`;",
                               "ratios are ws-tune's, from the final tournament."], COLUMNS))  # fmt: skip

if __name__ == "__main__":
    main()
