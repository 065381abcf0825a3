"""Any kernel files on one Hopper GPU, as a user tunes them (run it on the GPU machine):
for each ``FILE@SHAPE[@PARAMS]``, a TPE tuning over the file's own PARAMS (``PARAMS``
pins some, as ``ws-tune --param`` does) with every baseline timed in the same run
(the seed, tilelang's default and role_based lowerings, the file's vendors), then the
winner and the best of each baseline re-timed by the independent timer (harness.py).

    python benchmarks/kernel_files_h200.py --out OUT [--budget 16] [--time-budget 90] [--jobs 14] \\
        tests/data/fp8_gemm.py@M=4096,N=4096,K=4096 tests/data/rmsnorm.py@M=8192,N=8192@threads=256 ...

Writes OUT/<file's stem>/ (its database and fidelity.json), OUT/kernel_files.json,
OUT/fidelity.json and OUT/summary.md, after each file (a run cut short keeps the rest).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import harness

COLUMNS = [("kernel", "kernel", None), ("problem", "shape", None), ("vendor", "reference_tflops", "reference"),
           ("vendor name", "reference_vendor", None), ("tilelang default", "default_tflops", "default"), ("no WS", "no_ws_tflops", "no_ws"),
           ("role_based", "role_based_tflops", "role_based"), ("seed", "seed_tflops", "seed"), ("ws-tune", "ws_tune_tflops", "ws"),
           ("vs tilelang", "vs_tilelang", None), ("vs vendor", "vs_reference", None), ("trials", "trials", None),
           ("WRONG", "wrong_fraction", None), ("winner", "winner", None)]  # fmt: skip
HEADER = ["Kernel files tuned as a user would, TFLOP/s as `ws-tune (confirmed, steady state) / independent (triton do_bench",
          "after a 300 ms pre-heat)`; ratios are ws-tune's, from the final tournament."]  # fmt: skip


def main() -> None:
    from ws_tuner.kernel import load_kernel

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--time-budget", type=float, default=None, help="seconds of search per file, after its baselines (as ws-tune tune --time-budget)")
    ap.add_argument("--jobs", type=int, default=14)
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("runs", nargs="+", metavar="FILE@SHAPE[@PARAMS]")
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    fidelity: list[dict[str, Any]] = []
    for run in args.runs:
        file, shape, pins = (run.split("@") + [""])[:3]
        spec = load_kernel(file)
        done = len(rows), len(fidelity)

        def publish(these: list[dict[str, Any]], timed: list[dict[str, Any]], kernel: str = spec.name) -> None:
            del rows[done[0]:], fidelity[done[1]:]
            rows.extend({"kernel": kernel, **r} for r in these)
            fidelity.extend({"kernel": kernel, **f} for f in timed)
            harness.report(args.out, "kernel_files.json", rows, fidelity, HEADER, COLUMNS)
            harness.write(args.out, "fidelity.json", fidelity)

        harness.run(Path(file), {shape: shape}, spec.parse_params(pins), out=args.out / spec.name, budget=args.budget,
                    jobs=args.jobs, gpu=args.gpu, time_budget=args.time_budget, publish=publish)  # fmt: skip


if __name__ == "__main__":
    main()
