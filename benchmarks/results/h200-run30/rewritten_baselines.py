"""tilelang's own lowerings of the kernel as ws-tune rewrites it before role_based (an MMA
operand staged through shared memory, a choice of two tiles joined into one copy), beside the
same lowerings of the kernel as written (``written`` after OUT; the tuning times those) and
ws-tune's seed: how much of a tuning's gain is the
rewrite and how much the schedule. Triton's do_bench after a 300 ms pre-heat of each kernel
alone, three interleaved rounds; NVML's SM clock and power read after each.

    python3 -u benchmarks/results/h200-run30/rewritten_baselines.py OUT [rewritten] [written]
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

CASES = [
    ("tests/data/fused_moe.py", "E=8,tokens=2048,hidden=4096,expert=1024",
     ["block_token=128,block_expert=128,block_hidden=128,threads=256,num_stages=2"]),
    ("tests/data/block_causal_attn.py", "batch=4,heads=16,seq=8192,dim=128,dllm_block=32",
     ["block_size=128,num_stages=2,threads=256"]),
]


def main() -> None:
    import harness
    from ws_tuner import compiler
    from ws_tuner import gpu as ws_gpu
    from ws_tuner.candidate import Candidate, Lowering
    from ws_tuner.kernel import load_kernel
    from ws_tuner.task import Task

    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    as_written = compiler.strip

    def rewritten(func):
        return compiler.rewritten(as_written(func))

    rows = []
    for path, shape, points in CASES:
        spec = load_kernel(path)
        problem = spec.parse_problem(shape)
        flops = spec.flops(problem)
        task = Task.make(spec, problem)
        args = spec.inputs(problem, "cuda")
        fns = {}
        for point in points:
            for mode in sys.argv[2:] or ("rewritten",):  # the tuning timed the kernel as written
                compiler.strip = as_written if mode == "written" else rewritten
                ws_gpu._state.clear()  # compiled kernels are kept by candidate hash, which the rewrite does not change
                labels = {f"{point} {mode} {low}": (point, low) for low in ("default", "no_ws", "role_based")}
                labels[f"{point} seed"] = (point, "ws")
                for label, fn in harness.launchers(Path(path), problem, labels, vendors=False).items():
                    err = ws_gpu._check(task, fn, Candidate.make({}, lowering=Lowering(labels[label][1])))  # ws-tune's own gate
                    ok = err < spec.tolerance
                    print(f"{spec.name} {label}: relative error {err:.2e}{'' if ok else ' WRONG'}", flush=True)
                    if ok:
                        fns[label] = fn
        compiler.strip = as_written
        timed = harness.settled({label: (lambda fn=fn: fn(args)) for label, fn in fns.items()})
        for label, t in timed.items():
            row = {"kernel": spec.name, "problem": shape, "label": label, **t, "tflops": round(flops / t["do_bench_ms"] / 1e9, 1)}
            rows.append(row)
            print(json.dumps(row), flush=True)
        (out / "rewritten_baselines.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
