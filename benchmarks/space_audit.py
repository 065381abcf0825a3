"""The schedule space of every kernel file, on a CPU: how big it is, and what
becomes of a bounded random sample of its points (no GPU needed).

    python benchmarks/space_audit.py [--samples 200] [--survivors 50] [--compile 0] [--jobs 2] [--points N] [--out FILE] [FILE ...]

Per kernel file (default: examples/ and tests/data/), at one problem:
1. the space's size before and after static pruning (``ScheduleSpace.count``);
2. whether the seed's own point rebuilds the seed's schedule and hash;
3. ``--samples`` points drawn one decision at a time, uniformly (as a sampler
   starts): each is pruned by a static rule, with its reason, or is a
   candidate; and ``--survivors`` points drawn among the choices that survive
   the static rules (``ScheduleSpace.random_point``). Every distinct
   candidate goes through tilelang's real MaterializeWSSchedule verifier;
4. ``--compile`` of the verified candidates (the seed's last) are built as
   ``ws-tune --compile-only`` builds them: the verifier, then lowering and
   nvcc for sm_90a, in a pool of ``--jobs`` processes.

The fraction the verifier rejects is what the space generates and should
not: the goal is none.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ws_tuner import compiler
from ws_tuner.builder import BuildInput, LocalBuilder
from ws_tuner.candidate import Candidate
from ws_tuner.kernel import KernelFileError, KernelSpec, load_kernel
from ws_tuner.result import Status
from ws_tuner.task import Task

ROOT = Path(__file__).resolve().parent.parent
# Problems for the examples (the benchmarks' own); other files get 1024 for each required size.
PROBLEMS = {
    "attention.py": {"B": 4, "H": 16, "S": 4096, "D": 128, "causal": 0, "dtype": "float16"},
    "gemm.py": {"M": 4096, "N": 4096, "K": 4096},
    # 64 query heads per KV head: 64-row MMAs a warpgroup can take (at 16, only one warp can: mma_reason)
    "nsa_fwd.py": {"heads": 256, "groups": 64},
    # both phases of stream-K (a partial wave shared out by K-iterations, then a whole wave)
    "streamk_gemm.py": {"M": 2048, "N": 2048, "K": 2048},
    # a sliding window: the key loop starts where the block's window does
    "sink_attn.py": {"window": 128},
    # the masked index slots point past every query: more keys than queries
    "sparse_mla.py": {"seq": 512, "seq_kv": 1024, "topk": 512},
    # topk blocks of 128 keys to pick from
    "block_sparse_mqa.py": {"seq": 512, "seq_kv": 8192},
    # index lists a short sequence can fill
    "vs_sparse_attn.py": {"seq": 2048, "slash": 8, "vertical": 256},
    "varlen_attn.py": {"batch": 4, "heads": 4, "max_seqlen": 1024, "causal": 1},
    "mla_paged.py": {"batch": 16, "seqlen": 2048},
    "wy_fast.py": {"B": 1, "S": 4096, "H": 4},
    # groups of unequal sizes, not multiples of a block
    "grouped_gemm.py": {"G": 4, "skew": 1},
    # 64 query heads per KV head (at DeepSeek's 16, one warp's rows: role_based needs whole warpgroups)
    "nsa_decode.py": {"heads": 256, "groups": 64},
    # more keys than queries, and 16 heads of 256: the gathered keys' pipeline fits beside Q and dO
    "sparse_mla_bwd.py": {"seq": 256, "seq_kv": 512, "topk": 256, "heads": 16, "dim": 256},
    "gqa_fwd.py": {"batch": 1, "heads": 32, "seq_len": 4096, "groups": 8},
    "gqa_fwd_pipelined.py": {"batch": 1, "heads": 32, "seq_len": 4096, "groups": 8},
    "gqa_bwd_varlen.py": {"batch": 4, "heads": 32, "seq_len": 1024, "causal": 1},
    "kda_bwd_dv.py": {"B": 1, "S": 8192, "H": 16},
    # kernels of a chunked recurrence or a convolution launch B * H (or N * H * W) blocks along
    # y: 1024 of each is over CUDA's 65535, so every point is refused (compiler.grid_reason)
    "conv2d.py": {"N": 32, "C": 128, "H": 32, "W": 32, "F": 256},
    "gdn_chunk_o_bwd.py": {"B": 1, "S": 4096, "H": 8},
    "gdn_delta_bwd.py": {"B": 1, "S": 4096, "H": 8},
    "gdn_state.py": {"B": 8, "S": 4096, "H": 16},
    "kda_bwd_dqkwg.py": {"B": 1, "S": 4096, "H": 64},
    "kda_chunk_o.py": {"B": 1, "S": 4096, "H": 64},
    "kda_delta_bwd.py": {"B": 1, "S": 4096, "H": 64},
    "kda_state.py": {"B": 1, "S": 4096, "H": 64},
    "linear_attn.py": {"B": 8, "S": 4096, "H": 16},
    "retention_fwd.py": {"B": 8, "S": 4096, "H": 32},
    "kda_intra_token.py": {"B": 1, "S": 2048, "H": 16},
    # B * H blocks in the grid's y: 1024 of each is over CUDA's 65535
    "kda_bwd_gla_da.py": {"B": 1, "S": 8192, "H": 16},
    "kda_decode.py": {"batch": 64, "num_slots": 48},
    "sink_gqa_varlen.py": {"batch": 4, "heads": 32, "q_seqlen": 1024, "k_seqlen": 1024, "groups": 8, "is_causal": True, "window": 128},
    "sink_gqa_bwd_varlen.py": {"batch": 4, "heads": 32, "q_seqlen": 1024, "k_seqlen": 1024, "groups": 8, "is_causal": True, "window": 128},
    # the example's main(): 8 sequences of a cache up to 8192 keys, a fifth of its 32-key blocks selected
    "sparse_gqa_decode.py": {"batch": 8, "max_cache_seqlen": 8192},
    "gemm_intrinsics.py": {"M": 4096, "N": 4096, "K": 4096},
}


def kernel_files(*, seeded: bool = True) -> list[Path]:
    """The kernel files of examples/ and tests/data/ (their helper modules and broken files
    apart) with a schedule space; with ``seeded=False`` those without a seed to vary too,
    found without deriving any seed (a tilelang PrimFunc and role_based's pass per file)."""
    paths = sorted((ROOT / "examples").glob("*.py")) + sorted((ROOT / "tests" / "data").glob("*.py"))
    return [p for p in paths if (task := task_for(p)) is not None and (not seeded or has_seed(task))]


def has_seed(task: Task) -> bool:
    """Whether some point of the kernel's has a seed (NSA decoding has none at 32 or 64 threads)."""
    space = task.space()
    return any(not isinstance(space.shape(p), str) for p in space.param_points())


def task_for(path: Path, shape: str | None = None) -> Task | None:
    """The file's task at ``shape`` (as ``ws-tune --shape`` takes it), else at its audit
    problem, or None where it is not a usable kernel file."""
    try:
        spec = load_kernel(path)
    except KernelFileError:
        return None
    if shape is not None:  # a shape the file refuses raises its one-line message
        return Task.make(spec, spec.parse_problem(shape))
    try:
        return Task.make(spec, spec.parse_problem(problem_for(spec)))
    except KernelFileError:
        return None


def problem_for(spec: KernelSpec) -> dict[str, Any]:
    given = PROBLEMS.get(spec.path.name, {})
    return {k: given.get(k, 1024 if v is None else v) for k, v in spec.problem_defaults.items()}


@dataclass
class Audit:
    kernel: str
    problem: dict[str, Any]
    total: int = 0  # points before static pruning
    kept: int = 0  # after it
    estimated: bool = False  # the two counted at a sample of the kernel-parameter points, scaled
    points_counted: int = 0  # of them (a sample draws whole groups: ScheduleSpace.param_groups)
    pruned_by: dict[str, int] = field(default_factory=dict)  # the whole space: rule -> points
    points_pruned_by: dict[str, int] = field(default_factory=dict)  # kernel-parameter points with no candidates: "seed" or "kernel" -> points
    seed_point_is_seed: bool | None = None  # at every kernel-parameter point with a seed (None: no point counted has one)
    sampled: int = 0
    sample_pruned: dict[str, int] = field(default_factory=dict)  # rule -> sampled points
    survivors: int = 0  # points drawn among the static rules' survivors
    distinct: int = 0  # distinct candidates among the sampled points and survivors
    verified: int = 0
    rejected: list[str] = field(default_factory=list)  # the verifier's messages
    built: int = 0
    compile_failed: list[str] = field(default_factory=list)
    limits: list[str] = field(default_factory=list)  # what the space keeps as in the seed, and why
    seconds: float = 0.0

    @property
    def rejected_fraction(self) -> float | None:
        return len(self.rejected) / self.distinct if self.distinct else None

    def row(self) -> dict[str, Any]:
        return {**asdict(self), "rejected_fraction": self.rejected_fraction}


def audit(task: Task, *, samples: int, survivors: int = 0, compile_n: int = 0, jobs: int = 1, seed: int = 0, points: int | None = None,
          sample_counted: bool = False) -> Audit:  # fmt: skip
    """Counts, the seed point, a verified sample and a few nvcc builds of one task's space.
    ``points``: count and check the seed point at that many kernel-parameter points,
    drawn at random (the counts are then estimates), instead of at all of them.
    ``sample_counted``: draw the sample at those points too, whose seeds the count has
    derived, not over the whole grid (a seed is a tilelang PrimFunc, up to a second each:
    most of a large grid's audit)."""
    start = time.perf_counter()
    space = task.space()
    out = Audit(task.spec.path.name, task.problem)
    count = space.count(sample=points, seed=seed)
    out.total, out.kept, out.pruned_by, out.estimated, out.points_counted = count.total, count.kept, dict(count.pruned), count.estimated, count.params_counted
    out.points_pruned_by = dict(count.points_pruned)
    counted = space.param_sample(points, seed)
    checked = [_seed_point_is_seed(space, params) for params in counted]
    out.seed_point_is_seed = None if all(c is None for c in checked) else all(c is not False for c in checked)
    rng = random.Random(seed)
    within = counted if sample_counted else None
    candidates: dict[str, Candidate] = {}
    for _ in range(samples):
        at = {f"param.{k}": v for k, v in rng.choice(within)} if within else {}
        cand = space.candidate(space.sample(lambda name, options, at=at: at[name] if name in at else rng.choice(tuple(options))))
        out.sampled += 1
        if isinstance(cand, str):
            kind = cand.split(":", 1)[0]
            out.sample_pruned[kind] = out.sample_pruned.get(kind, 0) + 1
        else:
            candidates.setdefault(cand.hash, cand)
    for _ in range(survivors):
        # (where no counted point has a seed of its own, the survivors come from the whole grid)
        point = space.random_point(rng, within=within) or (space.random_point(rng) if within else None)
        if point is None:
            break
        cand = space.candidate(point)
        assert isinstance(cand, Candidate), cand  # random_point draws survivors only
        out.survivors += 1
        candidates.setdefault(cand.hash, cand)
    out.distinct = len(candidates)
    passed = []
    for cand in candidates.values():
        func, _ = task.lowered(cand)
        try:
            compiler.verify(func)
            passed.append(cand)
        except compiler.ScheduleRejected as exc:
            out.rejected.append(f"{cand.describe()}: {exc}")
    out.verified = len(passed)
    if compile_n and passed:
        seeds = {space.seed_candidate(c.params).hash for c in passed}
        chosen = sorted(passed, key=lambda c: (c.hash in seeds, c.hash))[:compile_n]
        with LocalBuilder(jobs=jobs, timeout=900) as builder:
            results = builder.build([BuildInput(str(task.spec.path), task.spec.source_hash, task.problem, c) for c in chosen])
        out.built = sum(r.status is Status.BUILT for r in results)
        out.compile_failed = [f"{r.candidate.describe()}: {r.status.value}: {r.message}" for r in results if r.status is not Status.BUILT]
    out.limits = space.limits()
    out.seconds = round(time.perf_counter() - start, 1)
    return out


def _seed_point_is_seed(space: Any, params: Any) -> bool | None:
    """Whether rebuilding the seed's own point gives the seed; None where there is no seed."""
    try:
        shape = space.shape(params)
    except compiler.CompilerError:
        return None  # the kernel does not build here: no seed to rebuild
    if isinstance(shape, str):
        return None
    seed = space.seed_candidate(params)
    if shape.schedule(space.seed_point(params)) != seed.schedule:
        return False
    cand = space.candidate(space.seed_point(params))
    return not isinstance(cand, Candidate) or cand.canonical() == seed.canonical()


def table(rows: list[Audit]) -> str:
    head = f"{'kernel':<24}{'points':>10}{'kept':>10}{'seed=seed':>10}{'sampled':>8}{'pruned':>8}{'surv.':>6}{'distinct':>9}{'rejected':>9}{'built':>7}  sample pruned by"
    lines = [head]
    for a in rows:
        pruned = sum(a.sample_pruned.values())
        by = ", ".join(f"{k} {n}" for k, n in sorted(a.sample_pruned.items(), key=lambda kv: -kv[1]))
        built = f"{a.built}/{a.built + len(a.compile_failed)}"
        approx = "~" if a.estimated else ""
        lines.append(f"{a.kernel:<24}{approx + str(a.total):>10}{approx + str(a.kept):>10}{'-' if a.seed_point_is_seed is None else str(a.seed_point_is_seed):>10}{a.sampled:>8}{pruned:>8}{a.survivors:>6}{a.distinct:>9}{len(a.rejected):>9}{built:>7}  {by}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", type=Path, help="kernel files (default: examples/ and tests/data/)")
    ap.add_argument("--samples", type=int, default=200, help="points drawn per kernel file (default: 200)")
    ap.add_argument("--survivors", type=int, default=50, help="points drawn among the survivors of the static rules (default: 50)")
    ap.add_argument("--compile", type=int, default=0, dest="compile_n", help="verified candidates per file built with nvcc (default: 0, none built)")
    ap.add_argument("--jobs", type=int, default=2, help="parallel nvcc builds with --compile (default: 2)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random draws (default: 0)")
    ap.add_argument("--points", type=int, help="count at this many kernel-parameter points, drawn at random, and scale (default: all)")
    ap.add_argument("--out", type=Path, help="write the rows as JSON")
    ap.add_argument("--shape", help="the problem, as ws-tune --shape takes it (default: each file's audit problem; with files named only)")
    args = ap.parse_args(argv)
    if args.shape is not None and not args.files:
        ap.error("--shape needs the kernel files it is a problem of")
    try:
        tasks = [(p, task_for(p, args.shape)) for p in (args.files or kernel_files())]
    except KernelFileError as exc:  # a shape the kernel file refuses
        print(f"space_audit: {exc}", file=sys.stderr)
        return 2
    bad = [str(p) for p, t in tasks if t is None]
    if bad:
        print(f"space_audit: not a usable kernel file: {', '.join(bad)}", file=sys.stderr)
        return 2
    rows = []
    print(table([]), flush=True)  # the header, then a row as each file is done
    for path, task in tasks:
        assert task is not None
        rows.append(audit(task, samples=args.samples, survivors=args.survivors, compile_n=args.compile_n, jobs=args.jobs, seed=args.seed, points=args.points))
        print(table(rows[-1:]).splitlines()[1], flush=True)
        print(f"    at {rows[-1].problem}", flush=True)
        if rows[-1].kept == 0 and set(rows[-1].points_pruned_by) == {"kernel"}:
            print(f"    the kernel's check() refuses every point at {rows[-1].problem}: nothing was audited (--shape gives another problem)", flush=True)
        elif rows[-1].estimated and rows[-1].kept == 0 and rows[-1].survivors:
            print(f"    rough: the counts are scaled from {rows[-1].points_counted} kernel-parameter points, none of which keeps a candidate of its own;"
                  f" {rows[-1].survivors} survivors were drawn over the whole grid", flush=True)  # fmt: skip
        elif rows[-1].seed_point_is_seed is None:
            print("    no kernel-parameter point counted has a seed schedule: nothing to vary (`ws-tune space` says why)", flush=True)
        for message in rows[-1].rejected + rows[-1].compile_failed:
            print(f"    {message}", flush=True)
    if len(rows) > 1:  # all of them together, without the notes between
        print(table(rows))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps([a.row() for a in rows], indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
