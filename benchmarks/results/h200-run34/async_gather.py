"""DeepSeek-V4's sparse attention at 64-key blocks, its keys gathered 2 deep by the Load role
through registers (as MaterializeWSSchedule lowers a T.Parallel gather) or by cp.async (the
loop annotated ``parallel_prefer_async``: tilelang's LowerTileOp issues cp_async_gs_conditional,
then commits and waits before the role arrives on the pipeline's barrier), against tilelang's
default lowering. Each kernel is checked against the reference, then timed by triton's do_bench
after a 300 ms pre-heat, the SM clock and power read by NVML after each. Exploration for run
33's README, again in run 34 with the barriers apart and a 3-warp Load role.

    python3 -u async_gather.py OUT        (--compile instead of OUT: compile only, on a CPU)
"""

import json
import sys
from pathlib import Path

import torch

from tilelang import tvm
from tvm.tirx import stmt_functor

from ws_tuner import compiler
from ws_tuner.candidate import Candidate, Lowering
from ws_tuner.kernel import load_kernel
from ws_tuner.schedule import Role
from ws_tuner.space import Point
from ws_tuner.task import Task

ROOT = Path(__file__).resolve().parents[3]
SHAPE = "batch=1,seq=4096,seq_kv=8192,heads=128,dim=512,topk=1024"


def prefer_async(func, op: str):
    def annotate(node):
        if isinstance(node, tvm.tirx.For) and node.annotations and str(node.annotations.get("tl.ws_op_id", "")) == op:
            return tvm.tirx.For(node.loop_var, node.min, node.extent, node.kind, node.body, node.thread_binding, {**node.annotations, "parallel_prefer_async": True})
        return None

    return func.with_body(stmt_functor.ir_transform(func.body, None, annotate, ["tirx.For"]))


def main() -> None:
    spec = load_kernel(ROOT / "tests" / "data" / "sparse_attn_v4.py")
    task = Task.make(spec, spec.parse_problem(SHAPE), spec.parse_params("block_N=64,num_stages=1,threads=128"))
    space = task.space()
    params = next(iter(space.param_points()))
    shape = space.shape(params)
    one = space.candidate(Point(params, "2xWG+warp@first", shape.layouts()[0], (2,), (), (0, 0, 0), ("parallel_1",)))
    assert isinstance(one, Candidate), one

    def loaders(warps, nregs):  # the Load role `warps` wide, the Store role's warp after it
        ranges = {"Load": (0, warps), "Store": (warps, warps + 1)}
        return Candidate.make(one.param_dict, one.schedule.with_(roles=tuple(Role(r.name, *ranges.get(r.name, (r.warp_lo, r.warp_hi)), n) for r, n in zip(one.schedule.roles, nregs))))

    kernels = []
    for label, cand, asynchronous in [("Load 1 warp, registers", one, False), ("Load 1 warp, cp.async", one, True),
                                      ("Load 2 warps, cp.async", loaders(2, (0, 0, 0)), True), ("Load 2 warps @72, cp.async", loaders(2, (208, 72, 72)), True),
                                      ("Load 3 warps, cp.async", loaders(3, (0, 0, 0)), True), ("Load 3 warps @72, cp.async", loaders(3, (208, 72, 72)), True)]:  # fmt: skip
        func, configs = task.lowered(cand)
        kernels.append((label, cand.describe(), prefer_async(func, "parallel_1") if asynchronous else func, configs))
    for lowering in (Lowering.DEFAULT, Lowering.NO_WS):
        c = Candidate.make({"block_N": 64, "num_stages": 2, "threads": 256}, None, lowering)
        kernels.append((f"tilelang {lowering.value}", c.describe(), *task.lowered(c)))
    if sys.argv[1] == "--compile":  # on a CPU: every kernel compiles, its barriers apart
        for label, _, func, configs in kernels:
            compiler.compile_kernel(func, configs)
            print(label, "compiled", flush=True)
        return
    import pynvml  # the GPU machine's: not needed to compile
    from triton.testing import do_bench

    args = spec.inputs(task.problem, "cuda")
    expected = spec.reference(task.problem, args)[0].float()
    pynvml.nvmlInit()
    gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
    rows = []
    for label, what, func, configs in kernels:
        row = {"label": label, "candidate": what}
        try:
            kernel = compiler.compile_kernel(func, configs)
            args[3].fill_(float("nan"))
            spec.launch(kernel, args)
            torch.cuda.synchronize()
            row["error"] = float(torch.linalg.vector_norm(args[3].float() - expected) / torch.linalg.vector_norm(expected))
            ms = do_bench(lambda: spec.launch(kernel, args), warmup=300, rep=500)
            row.update(do_bench_tflops=round(spec.flops(task.problem) / ms / 1e9, 1),
                       sm_mhz=pynvml.nvmlDeviceGetClockInfo(gpu, pynvml.NVML_CLOCK_SM), power_w=pynvml.nvmlDeviceGetPowerUsage(gpu) / 1000)  # fmt: skip
        except Exception as exc:  # noqa: BLE001
            row["failed"] = str(exc).splitlines()[0][:300]
        print(json.dumps(row), flush=True)
        rows.append(row)
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    (out / "async_gather.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
