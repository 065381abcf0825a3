import torch, sys
from ws_tuner.kernel import load_kernel
from ws_tuner.task import Task
from ws_tuner import compiler
from ws_tuner.candidate import Lowering
spec = load_kernel("tests/data/gdn_state.py")
problem = spec.parse_problem(sys.argv[1])
task = Task.make(spec, problem)
for params in ({"block_DV": 32, "num_stages": 0, "threads": 128}, {"block_DV": 32, "num_stages": 1, "threads": 256}):
    func, cfg = compiler.lower_for(task.primfunc(params), Lowering.DEFAULT, None)
    kernel = compiler.compile_kernel(func, cfg)
    args = spec.inputs(problem, "cuda")
    for i in spec.outputs:
        args[i].fill_(float("nan"))
    kernel(*args)
    torch.cuda.synchronize()
    ref = spec.reference(problem, args)
    for i, r in zip(spec.outputs, ref):
        out = args[i].float()
        err = ((out - r).norm() / r.norm()).item()
        print(params, "output", i, tuple(out.shape), "nan", out.isnan().sum().item(), "rel err", err, "ref max", r.abs().max().item(), "out max", out.abs().nan_to_num().max().item())
        if i == 5:
            per = [((out[:, c] - r[:, c]).norm() / r[:, c].norm()).item() for c in range(out.shape[1])]
            print("  h per chunk", [round(x, 4) for x in per[:6]], "...", [round(x, 4) for x in per[-3:]])
