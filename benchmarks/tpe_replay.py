"""How many trials TPE needs to come within 2% of the exhaustive best.

Replays Optuna's samplers against the latencies that an exhaustive (grid) run
measured on the GPU (benchmarks/gemm_h200.py --exhaustive writes them to
exhaustive.db): each sampled point is looked up instead of timed again, so the
sampler sees exactly the numbers the GPU gave. Runs on a CPU.

    python benchmarks/tpe_replay.py benchmarks/results/h200-run4/exhaustive.db --seeds 20
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gemm_h200 as bench  # noqa: E402

from ws_tuner import search  # noqa: E402
from ws_tuner.candidate import Lowering  # noqa: E402
from ws_tuner.kernel import load_kernel  # noqa: E402
from ws_tuner.result import Status, TrialResult  # noqa: E402
from ws_tuner.space import SpaceConfig  # noqa: E402
from ws_tuner.store import open_store  # noqa: E402
from ws_tuner.task import Task  # noqa: E402


def measured(db: str, shape: str) -> dict[str, TrialResult]:
    store = open_store(db)
    (workload_id, _), *_ = [w for w in store.find_workloads(kernel="gemm") if json.loads(w[1].problem) == bench.problem(shape)]
    return {h: t.result for h, t in store.trials_by_hash(workload_id=workload_id).items() if t.candidate.lowering is Lowering.WS}


def trials_to_target(kind: str, seed: int, task: Task, results: dict[str, TrialResult], target_ms: float, limit: int) -> int | None:
    strategy = search.create(kind, seed=seed)
    strategy.pre_tuning(task.space(), [])
    for n in range(1, limit + 1):
        proposals = strategy.propose(1)
        if not proposals:
            return None
        proposal = proposals[0]
        result = results.get(proposal.candidate.hash) or TrialResult(proposal.candidate.hash, Status.COMPILE_ERROR, "not measured")
        strategy.notify(proposal, result)
        if result.status is Status.OK and result.timing.median_ms <= target_ms:
            return n
    return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("db")
    ap.add_argument("--shape", default="4096x4096x4096")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--within", type=float, default=0.02)
    args = ap.parse_args()
    spec = load_kernel(bench.EXAMPLE)
    config = SpaceConfig.from_toml(bench.ROOT / "configs" / "space-focused.toml")
    task = Task.make(spec, spec.parse_problem(bench.problem(args.shape)), bench.EXHAUSTIVE_GRID, config)
    results = measured(args.db, args.shape)
    ok = [r.timing.median_ms for r in results.values() if r.status is Status.OK and r.timing]
    space_size = task.space().count().kept
    best = min(ok)
    target = best * (1 + args.within)
    print(f"exhaustive: {space_size} candidates, {len(ok)} correct and timed; best {best:.4f} ms; target <= {target:.4f} ms "
          f"({sum(t <= target for t in ok)} candidates within {args.within:.0%})")
    for kind in ("tpe", "random"):
        needed = [trials_to_target(kind, s, task, results, target, space_size) for s in range(args.seeds)]
        found = sorted(n for n in needed if n is not None)
        median = statistics.median(found) if found else None
        print(f"{kind:>6}: trials to within {args.within:.0%} over {args.seeds} seeds: median {median}, max {max(found) if found else None}, "
              f"not found {len(needed) - len(found)}; median = {median / space_size:.1%} of the exhaustive count" if median else f"{kind}: never")


if __name__ == "__main__":
    main()
