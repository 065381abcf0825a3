"""Is tilelang's lowering with warp specialization off (the new ``no_ws`` baseline) faster
than the best of its default and role_based anywhere issue 9 measures? Each of tilelang's
three lowerings at the parameter points where earlier runs found tilelang's best, built in
parallel, checked against the reference, then timed by triton's do_bench after a 300 ms
pre-heat of each kernel alone, three interleaved rounds, NVML's SM clock and power beside.

    python3 -u benchmarks/results/h200-run30/no_ws_check.py OUT
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

# (file, problem, the params of tilelang's best lowerings there: runs 20 and 25)
POINTS = [
    ("examples/attention.py", "B=4,H=16,S=4096,D=128,causal=0",
     ["block_M=192,block_N=128,consumers=cooperative,exp=ftz,mma=sync,order=shifted,persistent=false,q_buffers=1,reduce=lane,stages=2,store=consumer",
      "block_M=128,block_N=128,consumers=cooperative,exp=ftz,mma=sync,order=shifted,persistent=true,q_buffers=1,reduce=row,stages=2,store=consumer"]),
    ("examples/attention.py", "B=4,H=16,S=4096,D=128,causal=1",
     ["block_M=128,block_N=128,consumers=cooperative,exp=ftz,mma=sync,order=shifted,persistent=false,q_buffers=1,reduce=row,stages=2,store=consumer",
      "block_M=128,block_N=128,consumers=cooperative,exp=ftz,mma=sync,order=shifted,persistent=true,q_buffers=1,reduce=row,stages=2,store=consumer"]),
    ("examples/gemm.py", "M=4096,N=4096,K=4096",
     ["block_K=64,block_M=128,block_N=256,consumers=cooperative,epilogue=smem,mma=sync,persistent=false,split=rows,swizzle=8",
      "block_K=64,block_M=128,block_N=256,consumers=cooperative,epilogue=smem,mma=sync,persistent=true,split=rows,swizzle=8"]),
]
LOWERINGS = ("default", "no_ws", "role_based")


def main() -> None:
    import harness
    from ws_tuner.builder import BuildInput, LocalBuilder
    from ws_tuner.candidate import Candidate, Lowering
    from ws_tuner import gpu
    from ws_tuner.kernel import load_kernel
    from ws_tuner.runner import RunInput
    from ws_tuner.task import Task

    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    jobs = []  # (spec, problem, label, candidate)
    for path, shape, points in POINTS:
        spec = load_kernel(path)
        problem = spec.parse_problem(shape)
        for point in points:
            params = dict(next(iter(Task.make(spec, problem, spec.parse_params(point)).space().param_points())))
            jobs += [(spec, problem, f"{shape} {point} {low}", Candidate.make(params, lowering=Lowering(low))) for low in LOWERINGS]
    with LocalBuilder(jobs=15, timeout=600) as builder:  # fills tilelang's cache; the launches below load from it
        built = builder.build([BuildInput(str(s.path), s.source_hash, p, c) for s, p, _, c in jobs])
    rows = []
    for path, shape, _ in POINTS:
        fns, flops = {}, None
        for (spec, problem, label, cand), b in zip(jobs, built):
            if not label.startswith(shape + " ") or spec.path.name != Path(path).name:
                continue
            if not b.ok:
                print(f"{label}: {b.status.value} {b.message[:160]}", flush=True)
                continue
            task, fn = gpu.launcher(RunInput(str(spec.path), spec.source_hash, problem, cand))
            err = gpu._check(task, fn, cand)  # ws-tune's own gate: fresh inputs, outputs poisoned with NaN
            print(f"{label}: relative error {err:.2e}", flush=True)
            if err < spec.tolerance:
                fns[label] = (fn, spec.inputs(problem, "cuda"))
            flops = spec.flops(problem)
        timed = harness.settled({label: (lambda fn=fn, args=args: fn(args)) for label, (fn, args) in fns.items()})
        for label, t in timed.items():
            row = {"label": label, **t, "tflops": round(flops / t["do_bench_ms"] / 1e9, 1)}
            rows.append(row)
            print(json.dumps(row), flush=True)
        (out / "no_ws_check.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
