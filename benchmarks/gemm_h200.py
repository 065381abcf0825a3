"""GEMM tuning benchmark for one Hopper GPU (run it on the GPU machine).

For each shape: tune examples/gemm.py (fp16) with TPE, every baseline timed in
the same run (cuBLAS through the kernel file's vendors, tilelang's default
lowering and its role_based schedule, each at its best over the same
kernel-parameter grid, and the kernel's seed schedule); the final tournament
re-times the leaders and the best baselines side by side. Optionally a second
tuning of one shape (fresh database, other seed) to check that two tunings
agree. Then every winner and baseline is re-timed by an independent timer
(harness.py) in this process.

    python benchmarks/gemm_h200.py --out OUT [--shapes 4096x4096x4096 ...] [--budget 100] [--repeat 4096x4096x4096] [--jobs 14] [--gpu 0]

Writes OUT/gemm.json, OUT/fidelity.json, OUT/summary.md and the SQLite files it tuned into.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import harness

ROOT = Path(__file__).resolve().parent.parent
# block_K 128 with the seed's 3 stages needs 288 KB of shared memory: every baseline there fails to launch.
# block_N 128 lost to 256 at every shape of run 5.
# split "rows" (one m64n256 wgmma per warpgroup) won 3 of 4 shapes of run 16, within the tournament's interval.
GRID = {"block_M": (128,), "block_N": (256,), "block_K": (64,), "swizzle": (0, 8), "epilogue": ("direct", "smem"),
        "persistent": (False, True), "mma": ("sync", "async"), "split": ("square", "rows")}  # fmt: skip
DEFAULT_SHAPES = ("4096x4096x4096", "8192x8192x8192", "8192x8192x1024", "2048x8192x8192")
COLUMNS = [("shape", "shape", None), ("run", "run", None), ("cuBLAS", "reference_tflops", "reference"),
           ("tilelang default", "default_tflops", "default"), ("no WS", "no_ws_tflops", "no_ws"), ("role_based", "role_based_tflops", "role_based"),
           ("seed", "seed_tflops", "seed"), ("ws-tune", "ws_tune_tflops", "ws"), ("vs tilelang", "vs_tilelang", None),
           ("vs cuBLAS", "vs_reference", None), ("trials", "trials", None), ("shared", "shared", None),
           ("WRONG", "wrong_fraction", None), ("cand/min", "candidates_per_min", None), ("winner", "winner", None)]  # fmt: skip


def problem(shape: str) -> dict:
    m, n, k = (int(x) for x in shape.split("x"))
    return {"M": m, "N": n, "K": k, "dtype": "float16", "b_layout": "row"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shapes", nargs="*", default=list(DEFAULT_SHAPES))
    ap.add_argument("--budget", type=int, default=100)
    ap.add_argument("--jobs", type=int, default=14)
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--repeat", default=None, help="shape to tune a second time (fresh database, other seed)")
    ap.add_argument("--time-budget", type=float, default=None,
                    help="seconds of search per shape (as ws-tune tune --time-budget: the clock starts after the "
                         "grid's baselines, which are measured in full; the tournament comes on top)")
    ap.add_argument("--grid", default=None, help="kernel-parameter grid as JSON (default: GRID)")
    args = ap.parse_args()
    grid = {k: tuple(v) for k, v in json.loads(args.grid).items()} if args.grid else GRID
    harness.run(ROOT / "examples" / "gemm.py", {s: problem(s) for s in args.shapes}, grid, out=args.out, budget=args.budget,
                jobs=args.jobs, gpu=args.gpu, repeat=args.repeat, time_budget=args.time_budget,
                publish=lambda rows, fidelity: harness.report(
                    args.out, "gemm.json", [{**r, "cublas_tflops": r["reference_tflops"]} for r in rows], fidelity,
                    ["fp16 GEMM, TFLOP/s as `ws-tune (confirmed, steady state) / independent (triton do_bench after a 300 ms pre-heat)`;",
                     "ratios are ws-tune's, from the final tournament (all side by side, each in its own settled clock state)."],
                    COLUMNS))  # fmt: skip

if __name__ == "__main__":
    main()
