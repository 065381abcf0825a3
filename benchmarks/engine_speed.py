"""Speed of the CPU side of the engine (issue targets, on a 2-core machine):

- enumerate and statically prune >= 10,000 candidates in under 2 s;
- materialize-and-verify (MaterializeWSSchedule) <= 100 ms per GEMM candidate;
- compile throughput with --jobs 2 >= 1.7x the single-process rate.

    python benchmarks/engine_speed.py [--compiles 8]

Compiles go to a fresh tilelang cache, so every one runs nvcc.
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--compiles", type=int, default=8, help="candidates per compile-throughput run")
    args = ap.parse_args()
    os.environ["TILELANG_CACHE_DIR"] = tempfile.mkdtemp(prefix="ws-tune-bench-cache-")

    from ws_tuner import compiler
    from ws_tuner.builder import BuildInput, LocalBuilder
    from ws_tuner.kernel import load_kernel
    from ws_tuner.task import Task

    spec = load_kernel(ROOT / "examples" / "gemm.py")
    problem = spec.parse_problem("M=4096,N=4096,K=4096")

    # 1. Enumeration and static pruning, from a cold space (seeds derived inside the timing).
    task = Task.make(spec, problem)
    start = time.perf_counter()
    candidates = list(itertools.islice(task.space().candidates(), 10_000))
    first_10k = time.perf_counter() - start
    count = task.space().count()
    whole = time.perf_counter() - start - first_10k
    print(f"enumerate+prune: first 10,000 surviving candidates in {first_10k:.2f} s (cold, seeds included); "
          f"whole space {count.total} -> {count.kept} in {whole:.2f} s")

    # 2. Materialize-and-verify per candidate: build the PrimFunc, attach, MaterializeWSSchedule.
    rng = random.Random(0)
    sample = rng.sample(candidates, 60)
    times = []
    for cand in sample:
        t0 = time.perf_counter()
        func, _ = task.lowered(cand)
        compiler.verify(func)
        times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    print(f"materialize+verify: median {statistics.median(times):.1f} ms, p90 {times[int(0.9 * len(times))]:.1f} ms, "
          f"max {times[-1]:.1f} ms per candidate ({len(times)} candidates)")

    # 3. Compile throughput, 1 worker against 2, distinct candidates each (no cache hits).
    pool = [c for c in candidates if c.param_dict["block_K"] == 64][:: max(1, len(candidates) // 400)]
    rates = {}
    for jobs, chunk in ((1, pool[: args.compiles]), (2, pool[args.compiles : 3 * args.compiles])):
        with LocalBuilder(jobs=jobs, timeout=600) as builder:
            builder.build([BuildInput(str(spec.path), spec.source_hash, problem, pool[-1 - jobs])])  # warm the workers
            t0 = time.perf_counter()
            results = builder.build([BuildInput(str(spec.path), spec.source_hash, problem, c) for c in chunk])
            elapsed = time.perf_counter() - t0
        rates[jobs] = len(chunk) / elapsed * 60
        outcomes = {r.status.value: sum(x.status is r.status for x in results) for r in results}
        print(f"compile --jobs {jobs}: {len(chunk)} candidates in {elapsed:.1f} s = {rates[jobs]:.1f}/min {outcomes}")
    print(f"compile speed-up with 2 jobs: {rates[2] / rates[1]:.2f}x")


if __name__ == "__main__":
    main()
