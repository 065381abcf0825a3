"""Launch a kernel file's seed schedule and its vendor baselines under a profiler
(run it on the GPU machine, under Nsight Compute):

    ncu --clock-control none --profile-from-start off --section SpeedOfLight ... \\
        python benchmarks/profile_kernels.py examples/attention.py \\
            --shape B=4,H=16,S=4096,D=128,causal=0 --param block_M=128,block_N=128,stages=2,mma=async,consumers=cooperative \\
            [--lowering role_based]

Everything is built and warmed up first; only the profiled launches (each
kernel ``--launches`` times, seed first, then every vendor) fall between
cudaProfilerStart and cudaProfilerStop, so ncu sees those kernels alone.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import harness
import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--shape", required=True)
    ap.add_argument("--param", required=True, help="one kernel-parameter point, every parameter pinned")
    ap.add_argument("--launches", type=int, default=1)
    ap.add_argument("--lowering", nargs="*", default=[], choices=["default", "role_based"],
                    help="tilelang's own lowerings of the same point, profiled after the seed (the point must be plain: sync, cooperative)")
    args = ap.parse_args()
    from ws_tuner.kernel import load_kernel

    spec = load_kernel(args.file)
    points = {"seed": (args.param, "ws"), **{lowering: (args.param, lowering) for lowering in args.lowering}}
    launch = harness.launchers(Path(args.file), args.shape, points)
    inputs = spec.inputs(spec.parse_problem(args.shape), "cuda")
    kernels = {name: (lambda fn=fn: fn(inputs)) for name, fn in launch.items()}
    for fn in kernels.values():  # compile, autotune and warm up outside the profiled range
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for name, fn in kernels.items():
        torch.cuda.nvtx.range_push(name)
        for _ in range(args.launches):
            fn()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
    torch.cuda.cudart().cudaProfilerStop()
    print("profiled:", ", ".join(kernels))


if __name__ == "__main__":
    main()
