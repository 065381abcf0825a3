"""Energy per FLOP under the H200's power cap, and the floors that bound any schedule
(run it on the GPU machine).

At the 700 W cap a kernel's steady-state speed is the cap divided by its energy per
FLOP: every kernel of issue 9's tables ran at 686-693 W, at clocks from 1395 to
1950 MHz. So what bounds a schedule is the energy of the work it cannot avoid. This
script measures, side by side in one process, the energy per FLOP (NVML's energy
counter over a steady-state loop of back-to-back launches) of:

- the kernels of the tables: ws-tune's winner (the seed at the winning point),
  tilelang's default and role_based lowerings, the vendor (cuBLAS, cuDNN);
- ablations of ws-tune's attention winner, each with one part of the softmax's
  work removed (its output is wrong; only its energy counts): the rescale of O by
  alpha every step (what FlashAttention-4's conditional rescaling skips), and the
  exponentials (the MUFU's share);
- floors that do a subset of that work at the same tile shapes, written here in
  plain TileLang (tilelang's default lowering): for GEMM the same main loop with
  the operands read once into shared memory (tensor cores and shared-memory reads
  only) and with every block reading one tile's operands (no DRAM traffic); for
  attention the two MMAs of each step with no softmax (S cast to P), with and
  without the K/V loads.

A floor's figure at the cap, ``cap_w / (pJ/FLOP)``, is the most that any kernel
doing at least that work at that tile can reach; the speed targets are compared
with it in ``energy.json`` and the summary.

    python benchmarks/energy_floor.py --out OUT [--seconds 2] [--only gemm|attention]
"""

# No "from __future__ import annotations": T.prim_func reads the tensor shapes of its
# signature from the enclosing function's variables.
import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import harness

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ws_tuner.measure import REASON_SW_POWER_CAP  # noqa: E402

CAP_W = 700.0
GEMM = {"M": 4096, "N": 4096, "K": 4096, "dtype": "float16", "b_layout": "row"}
ATTENTION = {f"S=8192,D={d}": {"B": 4, "H": 16, "S": 8192, "D": d, "dtype": "float16", "causal": 0} for d in (128, 64)}
# Run 18's winner at 4096^3 (every GEMM winner: this tile, persistent, TMA-store epilogue, swizzle 8).
# The kernels of the tables, each a point and how it is lowered ("ws": the seed schedule
# at that point): run 18's GEMM winner at 4096^3 (every GEMM winner: this tile,
# persistent, TMA-store epilogue, swizzle 8) and tilelang's lowerings of it (the default
# one cannot build the persistent form); run 20's attention winners (async, per-lane
# softmax, ex2.approx.ftz) and tilelang's best points there.
_GEMM = "block_M=128,block_N=256,block_K=64,swizzle=8,epilogue=smem,mma=sync,consumers=cooperative,split=rows"
GEMM_KERNELS = {"ws": (_GEMM + ",persistent=True", "ws"), "default": (_GEMM + ",persistent=False", "default"),
                "role_based": (_GEMM + ",persistent=True", "role_based")}
_ATT = "block_N=128,stages=2,consumers=cooperative,q_buffers=1,store=consumer,exp=ftz,order=shifted"
ATTENTION_KERNELS = {
    128: {"ws": (_ATT + ",block_M=128,mma=async,persistent=True,reduce=lane", "ws"),
          "default": (_ATT + ",block_M=192,mma=sync,persistent=False,reduce=lane", "default"),
          "role_based": (_ATT + ",block_M=128,mma=sync,persistent=True,reduce=row", "role_based")},
    64: {"ws": (_ATT + ",block_M=192,mma=async,persistent=False,reduce=lane", "ws"),
         "default": (_ATT + ",block_M=192,mma=sync,persistent=False,reduce=row", "default"),
         "role_based": (_ATT + ",block_M=192,mma=sync,persistent=False,reduce=lane", "role_based")},
}  # fmt: skip


# --- floors, in plain TileLang ------------------------------------------------------------


def gemm_floor(M: int, N: int, K: int, *, mode: str, bm: int = 128, bn: int = 256, bk: int = 64, stages: int = 3) -> Any:
    """C = A @ B main loop at one tile; mode "l2": every block reads block (0, 0)'s
    operands (L2-resident, no DRAM traffic); "noload": A and B tiles read once, the
    K loop's MMAs on them (tensor cores and shared-memory reads only)."""
    import tilelang.language as T

    @T.prim_func
    def floor(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"), C: T.Tensor((M, N), "float16")):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=256) as (bx, by):
            A_s = T.alloc_shared((bm, bk), "float16")
            B_s = T.alloc_shared((bk, bn), "float16")
            C_s = T.alloc_shared((bm, bn), "float16")
            acc = T.alloc_fragment((bm, bn), "float32")
            T.use_swizzle(panel_size=8)
            T.clear(acc)
            if mode == "noload":
                T.copy(A[by * bm, 0], A_s)
                T.copy(B[0, bx * bn], B_s)
                for _ in T.serial(K // bk):
                    T.gemm(A_s, B_s, acc)
            else:
                for k in T.Pipelined(K // bk, num_stages=stages):
                    T.copy(A[0, k * bk], A_s)
                    T.copy(B[k * bk, 0], B_s)
                    T.gemm(A_s, B_s, acc)
            T.copy(acc, C_s)
            T.copy(C_s, C[by * bm, bx * bn])

    return floor


def attention_floor(B: int, H: int, S: int, D: int, *, mode: str, bm: int = 128, bn: int = 128) -> Any:
    """The two MMAs of each FlashAttention step, S = Q K^T and O += P V, with P = S
    cast to fp16 and no softmax; mode "noload": K and V read once."""
    import tilelang.language as T

    shape = (B, S, H, D)

    @T.prim_func
    def floor(Q: T.Tensor(shape, "float16"), K: T.Tensor(shape, "float16"), V: T.Tensor(shape, "float16"), O: T.Tensor(shape, "float16")):
        with T.Kernel(T.ceildiv(S, bm), H, B, threads=bm // 64 * 128) as (bx, by, bz):
            Q_s = T.alloc_shared((bm, D), "float16")
            K_s = T.alloc_shared((bn, D), "float16")
            V_s = T.alloc_shared((bn, D), "float16")
            O_s = T.alloc_shared((bm, D), "float16")
            s = T.alloc_fragment((bm, bn), "float32")
            p = T.alloc_fragment((bm, bn), "float16")
            acc = T.alloc_fragment((bm, D), "float32")
            T.copy(Q[bz, bx * bm : (bx + 1) * bm, by, :], Q_s)
            T.clear(acc)
            if mode == "noload":
                T.copy(K[bz, 0:bn, by, :], K_s)
                T.copy(V[bz, 0:bn, by, :], V_s)
                for _ in T.serial(S // bn):
                    T.gemm(Q_s, K_s, s, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                    T.copy(s, p)
                    T.gemm(p, V_s, acc, policy=T.GemmWarpPolicy.FullRow)
            else:
                for k in T.Pipelined(S // bn, num_stages=2):
                    T.copy(K[bz, k * bn : (k + 1) * bn, by, :], K_s)
                    T.copy(V[bz, k * bn : (k + 1) * bn, by, :], V_s)
                    T.gemm(Q_s, K_s, s, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                    T.copy(s, p)
                    T.gemm(p, V_s, acc, policy=T.GemmWarpPolicy.FullRow)
            T.copy(acc, O_s)
            T.copy(O_s, O[bz, bx * bm : (bx + 1) * bm, by, :])

    return floor


def compile_floor(func: Any) -> Callable[..., Any]:
    from ws_tuner import compiler

    return compiler.compile_kernel(func)


# Ablations of examples/attention.py: (text in the kernel, what replaces it), each found exactly once.
ABLATIONS = {
    "ws_no_rescale": ("                part.acc[i, j] *= part.alpha[i]\n", "                pass\n"),
    "ws_no_exp": ('        return T.call_extern("float32", EX2_FTZ, x) if ftz or poly else T.exp2(x)\n', "        return x\n"),
}


def ablated(path: Path, name: str, out: Path) -> Path:
    """A copy of the kernel file with one ablation applied, written under ``out``."""
    text, (old, new) = path.read_text(), ABLATIONS[name]
    if text.count(old) != 1:
        raise SystemExit(f"{name}: the text to ablate occurs {text.count(old)} times in {path}, not once")
    copy = out / f"{path.stem}_{name}.py"
    copy.write_text(text.replace(old, new))
    return copy


# --- kernels of the tables, through ws-tune ----------------------------------------------


# --- the measurement ----------------------------------------------------------------------


def measure(nvml: Any, fn: Callable[[], Any], flops: float, *, seconds: float, preheat: float = 0.5) -> dict[str, Any]:
    """Steady state: ``preheat`` s of back-to-back launches, then ``seconds`` s more
    between two readings of the energy counter, the clock sampled every 10 ms."""
    import torch

    def run_for(duration: float) -> tuple[int, float]:
        n, start = 0, time.monotonic()
        while time.monotonic() - start < duration:
            for _ in range(5):
                fn()
            n += 5
            torch.cuda.synchronize()
        return n, time.monotonic() - start

    run_for(preheat)
    samples: list[Any] = []  # ClockReading
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append(nvml.read(time.monotonic()))
            time.sleep(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0 = nvml.energy_j()
    sampler.start()
    begin.record()
    n, wall = run_for(seconds)
    end.record()
    torch.cuda.synchronize()
    e1 = nvml.energy_j()
    stop.set()
    sampler.join()
    ms = begin.elapsed_time(end) / n
    joules = e1 - e0
    clocks = [s.sm_mhz for s in samples]
    return {
        "tflops": round(flops / (ms * 1e-3) / 1e12, 1),
        "ms": round(ms, 4),
        "launches": n,
        "power_w": round(joules / wall, 1),
        "power_w_nvml": round(statistics.median(s.power_w for s in samples), 1),
        "pj_per_flop": round(joules / (n * flops) * 1e12, 4),
        "sm_clock_mhz": statistics.median(clocks),
        "power_capped": round(sum(1 for s in samples if s.reasons & REASON_SW_POWER_CAP) / len(samples), 2),
        # Work per clock per SM: what a kernel does with the cycles it gets (132 SMs).
        "flop_per_cycle_sm": round(flops / (ms * 1e-3) / (statistics.median(clocks) * 1e6) / 132, 1),
    }


def run_group(nvml: Any, name: str, kernels: dict[str, Callable[[], Any]], flops: float, *, seconds: float,
              out: Path, rows: list[dict[str, Any]]) -> None:  # fmt: skip
    for label, fn in kernels.items():
        row = {"group": name, "kernel": label, **measure(nvml, fn, flops, seconds=seconds)}
        row["at_cap_tflops"] = round(CAP_W / row["pj_per_flop"], 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
        (out / "energy.json").write_text(json.dumps(rows, indent=2) + "\n")


def gemm_group(nvml: Any, seconds: float, out: Path, rows: list[dict[str, Any]]) -> None:
    import torch

    from ws_tuner.kernel import load_kernel

    spec = load_kernel(ROOT / "examples" / "gemm.py")
    problem = spec.parse_problem(GEMM)
    args = spec.inputs(problem, "cuda")
    kernels = {k: (lambda fn=fn: fn(args)) for k, fn in harness.launchers(ROOT / "examples" / "gemm.py", GEMM, GEMM_KERNELS).items()}
    a, b, c = args
    for mode in ("l2", "noload"):
        kern = compile_floor(gemm_floor(GEMM["M"], GEMM["N"], GEMM["K"], mode=mode))
        kernels[f"floor_{mode}"] = lambda kern=kern: kern(a, b, c)
    torch.cuda.synchronize()
    run_group(nvml, "gemm 4096^3", kernels, spec.flops(problem), seconds=seconds, out=out, rows=rows)


def attention_group(nvml: Any, seconds: float, out: Path, rows: list[dict[str, Any]]) -> None:
    from ws_tuner.kernel import load_kernel

    spec = load_kernel(ROOT / "examples" / "attention.py")
    for label, raw in ATTENTION.items():
        problem = spec.parse_problem(raw)
        args = spec.inputs(problem, "cuda")
        kernels = {k: (lambda fn=fn: fn(args)) for k, fn in harness.launchers(ROOT / "examples" / "attention.py", raw, ATTENTION_KERNELS[raw["D"]]).items()}
        for name in ABLATIONS:
            copy = ablated(ROOT / "examples" / "attention.py", name, out)
            fn = harness.launchers(copy, raw, {"ws": ATTENTION_KERNELS[raw["D"]]["ws"]}, vendors=False)["ws"]
            kernels[name] = lambda fn=fn: fn(args)
        for mode in ("loads", "noload"):
            kern = compile_floor(attention_floor(raw["B"], raw["H"], raw["S"], raw["D"], mode=mode))
            kernels[f"floor_mma_{mode}"] = lambda kern=kern: kern(*args)
        run_group(nvml, label, kernels, spec.flops(problem), seconds=seconds, out=out, rows=rows)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--only", choices=["gemm", "attention"], default=None)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    from ws_tuner.gpu import Nvml

    nvml = Nvml()  # SM clock, power, clock event reasons and the energy counter
    rows: list[dict[str, Any]] = []
    if args.only in (None, "gemm"):
        gemm_group(nvml, args.seconds, args.out, rows)
    if args.only in (None, "attention"):
        attention_group(nvml, args.seconds, args.out, rows)


if __name__ == "__main__":
    main()
