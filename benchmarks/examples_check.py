"""The example kernels' variants on one Hopper GPU: correct or not, and how fast
beside the vendor libraries (run it on the GPU machine; about 4 minutes).

    python benchmarks/examples_check.py --out benchmarks/results/<run>/examples.json [--jobs 14]
        [--kernels attention gemm] [--rounds 3] [--compile-only] [--sweep [--pin mma=async]]

1. Builds the seed schedule of each kernel-side variant (attention: sync or
   async wgmma x cooperative or ping-pong consumers x one block per tile or
   persistent; GEMM: sync or async x one block per tile or persistent, and
   sync ping-pong consumers (128x128 tiles) x one block per tile pair or
   persistent), and tilelang's default and role_based
   lowerings of the plain sync point, in a pool of ``--jobs`` processes.
2. Checks each on the GPU against the kernel file's reference with ws-tune's
   isolated runner: a crash or a hang costs that variant only.
3. Per problem, in a separate process (killed if it hangs): warms the GPU up
   first (the H200 is power-capped and its clock drops by up to 30% under
   load within 0.2 s, TILELANG-WS.md), then times every correct variant and
   every vendor baseline (the kernel file's ``vendors``) with
   triton.testing.do_bench, interleaved over ``--rounds`` rounds so that all
   of them see the same clock; the median of the rounds is reported.

Prints one table per problem and writes every row to ``--out`` as JSON.
``--compile-only`` stops after step 1 (no GPU needed); ``--sweep`` builds
every kernel-parameter point that check() allows instead of the variants.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from ws_tuner.builder import BuildInput, LocalBuilder
from ws_tuner.candidate import Candidate, Lowering
from ws_tuner.kernel import KernelSpec, load_kernel
from ws_tuner.result import Status
from ws_tuner.runner import EvaluatorConfig, LocalRunner, RunInput, gpu_available

ROOT = Path(__file__).resolve().parent.parent
KERNELS = {"attention": ROOT / "examples" / "attention.py", "gemm": ROOT / "examples" / "gemm.py"}
PROBLEMS = {
    "attention": [{"B": 4, "H": 16, "S": 4096, "D": d, "causal": c, "dtype": "float16"} for d in (128, 64) for c in (0, 1)],
    "gemm": [{"M": n, "N": n, "K": n, "dtype": "float16", "b_layout": "row"} for n in (4096, 8192)],
}
GEMM_TILE = {"block_M": 128, "block_N": 256, "block_K": 64, "swizzle": 8, "epilogue": "smem"}
GROUP_TIMEOUT = 120.0  # seconds for the timing of one problem (about 15 when all is well)
PREHEAT_S = 1.0


@dataclass
class Row:
    kernel: str
    problem: dict[str, Any]
    label: str
    kind: str  # "variant", "tilelang" (a lowering of tilelang's own) or "vendor"
    params: dict[str, Any] = field(default_factory=dict)
    status: str = "pending"
    message: str = ""
    max_rel_error: float | None = None
    ms: float | None = None
    ms_rounds: list[float] = field(default_factory=list)
    tflops: float | None = None
    vs_best_vendor: float | None = None
    candidate: dict[str, Any] | None = None  # canonical JSON of what was built

    def key(self) -> tuple[str, str]:
        return self.kernel, json.dumps(self.problem, sort_keys=True)


# --- what to build ----------------------------------------------------------


def variant_params(kernel: str, allowed: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
    """One point per kernel-side variant: the first block sizes check() allows."""
    out = []
    if kernel == "attention":
        for mma, consumers, block_M, persistent in itertools.product(("sync", "async"), ("cooperative", "pingpong"), (128, 192), (False, True)):
            for block_N, stages in ((128, 2), (128, 1), (64, 2)):
                params = {"block_M": block_M, "block_N": block_N, "stages": stages, "mma": mma, "consumers": consumers, "persistent": persistent}
                if allowed(params):
                    out.append(params)
                    break
    else:
        for mma, persistent in itertools.product(("sync", "async"), (False, True)):
            out.append({**GEMM_TILE, "mma": mma, "persistent": persistent})
        for mma, persistent in itertools.product(("sync", "async"), (False, True)):  # one warpgroup holds a ping-pong consumer's whole accumulator: 128x128
            params = {**GEMM_TILE, "block_N": 128, "mma": mma, "consumers": "pingpong", "persistent": persistent}
            if allowed(params):
                out.append(params)
    return out


def sweep_params(spec: KernelSpec, pin: str | None, allowed: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
    grid = spec.parse_params(pin)
    keys = sorted(grid)
    return [p for p in (dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))) if allowed(p)]


def label(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(params.items()))


def plan(kernels: list[str], sweep: bool, pin: str | None = None) -> tuple[list[Row], dict[str, KernelSpec]]:
    from ws_tuner.task import Task

    rows, specs = [], {}
    for kernel in kernels:
        spec = specs[kernel] = load_kernel(KERNELS[kernel])
        for problem in PROBLEMS[kernel]:
            task = Task.make(spec, problem)
            seeds: dict[str, Any] = {}

            def seed(params: dict[str, Any]) -> Any:
                key = label(params)
                if key not in seeds:
                    seeds[key] = task.point_info(params).seed
                return seeds[key]

            def allowed(params: dict[str, Any]) -> bool:
                return spec.check(problem, params, None) is None and spec.check(problem, params, seed(params)) is None

            points = sweep_params(spec, pin, allowed) if sweep else variant_params(kernel, allowed)
            for params in points:
                candidate = Candidate.make(params, seed(params))
                rows.append(Row(kernel, problem, label(params), "variant", params, candidate=candidate.to_json()))
            if not sweep:  # tilelang's own lowerings of the plain (sync, cooperative, one tile per block) kernel
                plain = points[0]
                for lowering in (Lowering.DEFAULT, Lowering.ROLE_BASED):
                    rows.append(Row(kernel, problem, f"tilelang {lowering.value} {label(plain)}", "tilelang", plain,
                                    candidate=Candidate.make(plain, None, lowering).to_json()))  # fmt: skip
                for name in spec.module.vendors(problem) if hasattr(spec.module, "vendors") else ():
                    rows.append(Row(kernel, problem, name, "vendor"))
    return rows, specs


# --- 1. build ----------------------------------------------------------------


def build(rows: list[Row], specs: dict[str, KernelSpec], jobs: int) -> None:
    todo = [r for r in rows if r.candidate is not None]
    inputs = [BuildInput(str(specs[r.kernel].path), specs[r.kernel].source_hash, r.problem, Candidate.from_json(r.candidate)) for r in todo]
    start = time.monotonic()
    with LocalBuilder(jobs=jobs, timeout=900) as builder:
        for row, result in zip(todo, builder.build(inputs)):
            row.status, row.message = result.status.value, result.message
    built = sum(r.status == Status.BUILT.value for r in todo)
    print(f"built {built} of {len(todo)} in {time.monotonic() - start:.0f} s with {jobs} workers", flush=True)


# --- 2. check ----------------------------------------------------------------


def check(rows: list[Row], specs: dict[str, KernelSpec]) -> None:
    todo = [r for r in rows if r.status == Status.BUILT.value]
    config = EvaluatorConfig(checks=2, timeout=60)  # correctness; the timing is step 3
    start = time.monotonic()
    with LocalRunner(0) as runner:
        futures = [runner.submit(RunInput(str(specs[r.kernel].path), specs[r.kernel].source_hash, r.problem, Candidate.from_json(r.candidate), config)) for r in todo]
        for row, future in zip(todo, futures):
            result = future.result()
            row.status, row.message = result.status.value, result.message
            row.max_rel_error = result.info.get("max_rel_error")
    print(f"checked {len(todo)} on the GPU in {time.monotonic() - start:.0f} s", flush=True)


# --- 3. time (in a worker process, one problem at a time) ---------------------


def time_group(kernel_path: str, source_hash: str, problem: dict[str, Any], entries: list[tuple[str, Any]], rounds: int) -> dict[str, Any]:
    """Times the entries (label, candidate JSON or vendor name) interleaved; runs in the worker."""
    import torch
    from triton.testing import do_bench

    from ws_tuner import compiler
    from ws_tuner.task import Task

    task = Task.load(kernel_path, source_hash, problem)
    args = task.spec.inputs(problem, "cuda")
    expected = [e.float() for e in task.spec.reference(problem, args)]
    vendors = task.spec.module.vendors(problem) if hasattr(task.spec.module, "vendors") else {}
    launches, out = {}, {}
    for name, what in entries:
        try:
            if isinstance(what, str):  # a vendor: checked here, as the runner checked the kernels
                fn = vendors[what]
                got = fn(args)
                error = max(((g.float() - e).norm() / e.norm()).item() for g, e in zip(got, expected))
                if not error < task.spec.tolerance:
                    out[name] = {"status": Status.WRONG.value, "message": f"relative error {error:.3g}", "max_rel_error": error}
                    continue
                out[name] = {"max_rel_error": error}
                launches[name] = lambda fn=fn: fn(args)
            else:
                kernel = compiler.compile_kernel(*task.lowered(Candidate.from_json(what)))  # from tilelang's cache
                launches[name] = lambda kernel=kernel: kernel(*args)
        except Exception as exc:  # noqa: BLE001 - an unavailable backend is data
            out[name] = {"status": "failed", "message": f"{type(exc).__name__}: {exc}".splitlines()[0][:300]}
    torch.cuda.synchronize()
    clock = _sm_clock()
    if launches:  # steady state before the first timing: the power cap settles within 0.3 s
        first = next(iter(launches.values()))
        deadline = time.perf_counter() + PREHEAT_S
        while time.perf_counter() < deadline:
            for _ in range(10):
                first()
            torch.cuda.synchronize()
    samples: dict[str, list[float]] = {name: [] for name in launches}
    for _ in range(rounds):
        for name, launch in launches.items():
            samples[name].append(do_bench(launch, warmup=25, rep=100, return_mode="median"))
    for name, times in samples.items():
        out.setdefault(name, {}).update(status=Status.OK.value, ms_rounds=times, ms=statistics.median(times))
    return {"rows": out, "sm_clock_mhz": [clock, _sm_clock()]}


def _sm_clock() -> int | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetClockInfo(pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.NVML_CLOCK_SM))
    except Exception:  # noqa: BLE001 - NVML is optional
        return None


def time_all(rows: list[Row], specs: dict[str, KernelSpec], rounds: int) -> dict[str, Any]:
    import multiprocessing

    from pebble import ProcessPool

    groups: dict[tuple[str, str], list[Row]] = {}
    for row in rows:
        groups.setdefault(row.key(), []).append(row)
    clocks = {}
    start = time.monotonic()
    with ProcessPool(max_workers=1, context=multiprocessing.get_context("spawn")) as pool:
        for (kernel, problem_key), group in groups.items():
            timed = [r for r in group if r.status == Status.OK.value or r.kind == "vendor"]
            entries = [(r.label, r.candidate if r.kind != "vendor" else r.label) for r in timed]
            spec = specs[kernel]
            future = pool.schedule(time_group, args=(str(spec.path), spec.source_hash, group[0].problem, entries, rounds), timeout=GROUP_TIMEOUT)
            try:
                result = future.result()
            except Exception as exc:  # noqa: BLE001 - a hang or a crash ends this problem's timing only
                for row in timed:
                    row.status, row.message = "timing_failed", f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
                continue
            clocks[f"{kernel} {problem_key}"] = result["sm_clock_mhz"]
            flops = spec.flops(group[0].problem)
            for row in timed:
                got = result["rows"].get(row.label, {})
                row.status = got.get("status", row.status)
                row.message = got.get("message", row.message)
                row.max_rel_error = got.get("max_rel_error", row.max_rel_error)
                if row.status == Status.OK.value:
                    row.ms, row.ms_rounds = got["ms"], got["ms_rounds"]
                    row.tflops = flops / (row.ms * 1e-3) / 1e12
            best_vendor = max((r.tflops for r in group if r.kind == "vendor" and r.tflops), default=None)
            for row in group:
                if row.tflops and best_vendor:
                    row.vs_best_vendor = row.tflops / best_vendor
            print(f"timed {kernel} {problem_key}", flush=True)
    print(f"timing took {time.monotonic() - start:.0f} s", flush=True)
    return clocks


# --- report -------------------------------------------------------------------


def print_tables(rows: list[Row]) -> None:
    groups: dict[tuple[str, str], list[Row]] = {}
    for row in rows:
        groups.setdefault(row.key(), []).append(row)
    for (kernel, problem_key), group in groups.items():
        print(f"\n{kernel} {problem_key}")
        print(f"  {'TFLOP/s':>8} {'vs vendor':>9} {'error':>9}  {'status':<13} what")
        for row in sorted(group, key=lambda r: -(r.tflops or 0)):
            tf = f"{row.tflops:8.1f}" if row.tflops else f"{'-':>8}"
            vs = f"{row.vs_best_vendor:9.3f}" if row.vs_best_vendor else f"{'-':>9}"
            err = f"{row.max_rel_error:9.2e}" if row.max_rel_error is not None else f"{'-':>9}"
            note = f"  ({row.message[:90]})" if row.message and row.status not in ("ok", "built") else ""
            print(f"  {tf} {vs} {err}  {row.status:<13} [{row.kind}] {row.label}{note}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="JSON file for every row")
    ap.add_argument("--kernels", nargs="*", default=list(KERNELS), choices=list(KERNELS))
    ap.add_argument("--jobs", type=int, default=14, help="compile workers")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds")
    ap.add_argument("--compile-only", action="store_true", help="build, and stop (no GPU needed)")
    ap.add_argument("--sweep", action="store_true", help="every kernel-parameter point check() allows, not the variants")
    ap.add_argument("--pin", default=None, help="with --sweep: pin kernel parameters, e.g. mma=async,swizzle=8 (one kernel)")
    args = ap.parse_args()
    if not args.compile_only and not gpu_available():
        print("error: no NVIDIA GPU found (use --compile-only)", file=sys.stderr)
        return 2
    start = time.monotonic()
    rows, specs = plan(args.kernels, args.sweep, args.pin)
    build(rows, specs, args.jobs)
    clocks = {}
    if not args.compile_only:
        check(rows, specs)
        clocks = time_all(rows, specs, args.rounds)
    print_tables(rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rows": [asdict(r) for r in rows], "sm_clock_mhz": clocks, "wall_s": round(time.monotonic() - start, 1)}, indent=1))
    print(f"\n{len(rows)} rows in {time.monotonic() - start:.0f} s -> {args.out}")
    bad = [r for r in rows if r.kind == "variant" and r.status not in ("ok", "built", "refused")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
