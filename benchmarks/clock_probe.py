"""How the SM clock of a power-capped GPU moves: a trace for tuning measure.py's settings.

After 2 s idle, runs three loads back to back (a large fp16 GEMM, a short-K GEMM,
a memory copy), then the first again, reading the SM clock, power and clock
event reasons through NVML every ~2 ms. Prints, per phase, the settled clock,
its jitter and how long the clock took to come within 2% of it.

    python benchmarks/clock_probe.py --out OUT
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import pynvml
import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.float16) for _ in range(2))
    a1, b1 = torch.randn(8192, 1024, device="cuda", dtype=torch.float16), torch.randn(1024, 8192, device="cuda", dtype=torch.float16)
    src, dst = torch.empty(2**30, dtype=torch.uint8, device="cuda"), torch.empty(2**30, dtype=torch.uint8, device="cuda")
    loads = {"gemm8192": lambda: a @ b, "gemm_k1024": lambda: a1 @ b1, "copy1GB": lambda: dst.copy_(src)}
    for fn in loads.values():
        fn()
    torch.cuda.synchronize()
    time.sleep(2.0)
    trace = []
    t0 = time.monotonic()
    for name, seconds in (("gemm8192", 1.0), ("gemm_k1024", 0.6), ("copy1GB", 0.6), ("gemm8192", 0.6)):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for _ in range(4):
                loads[name]()
            ev = torch.cuda.Event()
            ev.record()
            while not ev.query():
                trace.append((name, time.monotonic() - t0, pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
                              pynvml.nvmlDeviceGetPowerUsage(h) / 1000, int(pynvml.nvmlDeviceGetCurrentClocksEventReasons(h))))
                time.sleep(0.002)
    torch.cuda.synchronize()
    phases = []
    i = 0
    while i < len(trace):
        j = i
        while j < len(trace) and trace[j][0] == trace[i][0]:
            j += 1
        seg = trace[i:j]
        tail = [m for _, _, m, _, _ in seg[len(seg) // 2:]]
        settled = statistics.median(tail)
        start_t = seg[0][1]
        reach = next((t - start_t for _, t, m, _, _ in seg if abs(m - settled) <= 0.02 * settled), None)
        phases.append({"load": seg[0][0], "start_s": round(start_t, 3), "first_mhz": seg[0][2], "settled_mhz": settled,
                       "jitter_pct": round(100 * statistics.pstdev(tail) / settled, 2), "spread_pct": round(100 * (max(tail) - min(tail)) / settled, 2),
                       "within_2pct_after_s": round(reach, 3) if reach is not None else None, "power_w": round(statistics.median(p for *_, p, _ in seg[len(seg) // 2:]), 1),
                       "reasons": sorted({hex(r) for *_, r in seg}), "readings": len(seg)})
        i = j
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "clock_probe.json").write_text(json.dumps({"phases": phases, "trace": trace}, indent=1))
    for p in phases:
        print(json.dumps(p))


if __name__ == "__main__":
    main()
