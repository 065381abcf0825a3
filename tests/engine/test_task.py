"""Task.isolated: the space of a kernel file whose code never runs in this process."""

from __future__ import annotations

import itertools
import sys

import pytest

from ws_tuner.kernel import KernelFileError
from ws_tuner.task import Task


def test_isolated_task_sees_the_same_space_without_importing_the_file(tmp_path, example_path):
    marked = tmp_path / "gemm_marked.py"
    marker = tmp_path / "imported.txt"
    marked.write_text(f"open({str(marker)!r}, 'a').write('x')\n" + example_path.read_text())
    task = Task.isolated(str(marked), "M=4096,N=4096,K=4096", "block_K=64,persistent=false,mma=sync")
    assert marker.read_text() == "x"  # imported once, by the spawned process
    assert task.spec.module is None and not [m for m in sys.modules if m.startswith("ws_tune_kernel_gemm_marked")]
    from ws_tuner.kernel import load_kernel

    local = Task.make(load_kernel(marked), task.problem, task.param_grid)
    assert marker.read_text() == "xx"
    mine, theirs = task.space().count(), local.space().count()
    assert (mine.total, mine.kept, dict(mine.pruned)) == (theirs.total, theirs.kept, dict(theirs.pruned))
    params = next(p for p in task.space().param_points() if not isinstance(task.space().shape(p), str))
    assert task.baselines(dict(params)) == local.baselines(dict(params))
    assert next(iter(task.space().candidates())) == next(iter(local.space().candidates()))


def test_isolated_task_reports_bad_input_as_one_line(data_dir, example_path):
    with pytest.raises(KernelFileError, match="lacks"):
        Task.isolated(str(data_dir / "no_contract.py"), "M=1")
    with pytest.raises(KernelFileError, match="missing K"):
        Task.isolated(str(example_path), "M=4096,N=4096")


def test_tilelang_lowerings_are_baselines_only_where_the_kernel_allows_any_order(example_path):
    from ws_tuner.candidate import Lowering
    from ws_tuner.kernel import load_kernel

    spec = load_kernel(example_path)
    assert spec.scheduled_only == {"mma": ("async",), "consumers": ("pingpong",)}
    task = Task.make(spec, spec.parse_problem("M=4096,N=4096,K=4096"), spec.parse_params("block_M=128,block_N=128,block_K=64,swizzle=8,epilogue=smem,persistent=true,split=square"))
    lowerings = {(p["mma"], p["consumers"]): {c.lowering for c in task.baselines(p)} for p in map(dict, task.space().param_points())}
    assert lowerings == {("sync", "cooperative"): {Lowering.WS, Lowering.DEFAULT, Lowering.NO_WS, Lowering.ROLE_BASED}, ("async", "cooperative"): {Lowering.WS},
                         ("sync", "pingpong"): {Lowering.WS}, ("async", "pingpong"): {Lowering.WS}}  # fmt: skip


def test_a_malformed_scheduled_only_is_one_line(tmp_path, example_path):
    from ws_tuner.kernel import load_kernel

    bad = tmp_path / "gemm_bad.py"
    bad.write_text(example_path.read_text().replace('SCHEDULED_ONLY = {"mma": ["async"], "consumers": ["pingpong"]}', 'SCHEDULED_ONLY = ["async"]'))
    with pytest.raises(KernelFileError, match="SCHEDULED_ONLY must be a dict of lists"):
        load_kernel(bad)


def test_a_point_is_built_once_and_its_candidates_do_not_touch_it(example_path, monkeypatch):
    """The PrimFunc of a parameter point is kept for its candidates; lowering one
    (a schedule attached, tilelang's own lowering stripped of it) leaves it as built."""
    from ws_tuner import compiler
    from ws_tuner.kernel import load_kernel

    spec = load_kernel(example_path)
    task = Task.make(spec, spec.parse_problem("M=4096,N=4096,K=4096"), spec.parse_params("block_K=64,persistent=false,mma=sync,split=square"))
    built, real = [], type(spec).build
    monkeypatch.setattr(type(spec), "build", lambda self, problem, params: built.append(params) or real(self, problem, params))
    space = task.space()
    params = next(p for p in space.param_points() if not isinstance(space.shape(p), str))
    func = task.primfunc(dict(params))
    seed = compiler.own_schedule(func)
    candidates = [c for c in itertools.islice(space.candidates(), 50) if c.param_dict == dict(params)][:3]
    assert len(candidates) >= 2 and len({c.hash for c in candidates}) == len(candidates)
    lowered = [task.lowered(c)[0] for c in candidates] + [task.lowered(b)[0] for b in task.baselines(dict(params))]
    assert built == [dict(params)]  # one build serves the point's search candidates and its baselines
    assert task.primfunc(dict(params)).same_as(func) and compiler.own_schedule(func) == seed
    assert [compiler.own_schedule(f) for f in lowered[: len(candidates)]] == [c.schedule for c in candidates]


def test_the_kernel_as_ws_tune_rewrites_it_is_a_start_wherever_the_rewrites_change_it(data_dir, example_path, tmp_path, monkeypatch):
    """tilelang's default lowering of block-causal attention with K and V joined into one copy
    each ran 1.45x the kernel as written (H200 run 30): ws-tune measures it as a warm start of
    its own at every point, recorded by the isolated task too, and it builds for sm_90a with no
    pass configs. A kernel that no rewrite changes (the GEMM example) gets none."""
    from ws_tuner import compiler
    from ws_tuner.candidate import Candidate, Lowering
    from ws_tuner.kernel import load_kernel

    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tmp_path / "tl-cache"))  # a real compile
    task = Task.isolated(str(data_dir / "block_causal_attn.py"), "batch=1,heads=2,seq=1024,dim=64", "num_stages=2")
    points = task.measured_points(timed=True)
    rewritten = [c for c in task.lowering_starts(points) if c.lowering is Lowering.REWRITTEN]
    assert [c.params for c in rewritten] == list(points) and len(points) == 3  # block_size 64 at 256 threads is refused
    assert all(c.schedule is None for c in rewritten)
    local = Task.make(load_kernel(data_dir / "block_causal_attn.py"), task.problem, task.param_grid)
    func, configs = local.lowered(rewritten[0])
    assert configs == {} and "T.copy(T.region(K[bz, T.if_then_else(is_noisy_diag != 0" in func.script()
    assert compiler.compile_kernel(func, configs).get_kernel_source()
    # A winner without a schedule still says what to write: the change, named and as a diff.
    lines = local.source(rewritten[0]).splitlines()
    assert lines[1] == "#   - a copy of one of two tiles, chosen by a condition, is one copy with the condition in its index"
    assert sum(line.startswith("-") and line[1:].strip() == "if is_noisy_diag != 0:" for line in lines) == 2  # K's and V's
    assert sum(line.startswith("+") and "T.if_then_else(is_noisy_diag != 0" in line for line in lines) == 2
    assert local.source(Candidate.make(dict(points[0]), None, Lowering.DEFAULT)) is None

    gemm = Task.isolated(str(example_path), "M=4096,N=4096,K=4096", "block_K=64,persistent=false,mma=sync")
    assert not [c for c in gemm.lowering_starts(gemm.measured_points(timed=True)) if c.lowering is Lowering.REWRITTEN]


def test_a_kernel_seeded_at_whole_warpgroups_after_a_rewrite_has_its_rewritten_start(data_dir):
    """KDA's delta-rule backward at 32 threads: role_based seeds it only at 128 threads and
    only once its state tile's store is taken from the fragment (``_seed_narrow``, then
    ``_WHERE_UNSEEDED``). The kernel as launched, with that rewrite, is its rewritten start,
    as at 128 threads (compile-only builds the first seeded point: 32 threads had none)."""
    from ws_tuner.candidate import Lowering
    from ws_tuner.kernel import load_kernel

    spec = load_kernel(data_dir / "kda_delta_bwd.py")
    task = Task.make(spec, spec.parse_problem("B=1,S=1024,H=4"), {"block_DV": (32,), "num_stages": (0,), "threads": (32, 128)})
    points = task.space().served_points()
    assert [dict(p)["threads"] for p in points] == [32, 128]
    starts = [c for c in task.lowering_starts(points) if c.lowering is Lowering.REWRITTEN]
    assert [c.param_dict["threads"] for c in starts] == [32, 128]
    assert "taken from the fragment" in task.source(starts[0]).splitlines()[1]


def test_no_rewritten_start_where_tilelangs_default_lowering_was_wrong(data_dir):
    """The rewritten kernel goes through tilelang's default pipeline planner as the kernel
    does: where the default lowering at a point was WRONG (Gated DeltaNet's backward past 0
    stages, H200 run 36: the rewritten start WRONG at each such point too), it is not tried."""
    from ws_tuner.candidate import Candidate, Lowering
    from ws_tuner.pipeline import BASELINE, TrialRecord
    from ws_tuner.result import Status, TrialResult
    from ws_tuner.tune import lowering_starts_after

    task = Task.isolated(str(data_dir / "block_causal_attn.py"), "batch=1,heads=2,seq=1024,dim=64", "num_stages=2")
    points = task.measured_points(timed=True)
    wrong = Candidate.make(dict(points[0]), None, Lowering.DEFAULT)
    records = [TrialRecord(wrong, TrialResult(wrong.hash, Status.WRONG, "relative error nan >= 0.01"), BASELINE)]
    rewritten = [c.params for c in lowering_starts_after(task, records, timed=True) if c.lowering is Lowering.REWRITTEN]
    assert rewritten == list(points[1:])


def test_compile_only_builds_the_baselines_where_there_is_a_seed_and_at_the_first_point(data_dir, tmp_path):
    """Compile-only builds the baselines of the first point with a seed, its seed schedule
    with tilelang's lowerings, and those of the file's first point where that has none (NSA's
    backward at 2 stages, its query tile written under the mask bit, which role_based will not
    version): a user's first configuration is built too."""
    from ws_tuner.candidate import Lowering

    source = (data_dir / "nsa_bwd.py").read_text()
    assert '"num_stages": [0, 1, 2]' in source
    path = tmp_path / "nsa_bwd_2_first.py"
    path.write_text(source.replace('"num_stages": [0, 1, 2]', '"num_stages": [2, 0]'))
    task = Task.isolated(str(path), "batch=1,seq_len=1024", "threads=128")
    served = task.space().served_points()
    assert dict(served[0])["num_stages"] == 2 and isinstance(task.space().seed_candidate(served[0]), str)
    seeded, first = task.measured_points(timed=False)
    assert dict(seeded)["num_stages"] == 0 and first == served[0]
    assert Lowering.WS in {c.lowering for c in task.baselines_at([seeded], timed=False)}
    assert {c.lowering for c in task.baselines_at([first], timed=False)} == {Lowering.DEFAULT, Lowering.NO_WS, Lowering.ROLE_BASED}
    (point,) = Task.isolated(str(data_dir / "nsa_bwd.py"), "batch=1,seq_len=1024", "threads=128").measured_points(timed=False)
    assert dict(point)["num_stages"] == 0  # seeded and first: built once


def test_the_anchor_is_a_seed_the_static_rules_keep(data_dir):
    """Every ratio is measured against the anchor. DeepSeek-V4's sparse attention at its first
    point (32-key blocks, 128 threads) has a seed whose accumulators spill; the anchor is the
    seed of the first point whose seed the rules keep, then that first seed (a seed that
    breaks a rule may still run), then the reference."""
    from ws_tuner.candidate import Candidate, Lowering
    from ws_tuner.kernel import load_kernel

    spec = load_kernel(data_dir / "sparse_attn_v4.py")
    task = Task.make(spec, spec.parse_problem("batch=1,seq=64,seq_kv=1024,heads=64,dim=512,topk=256"), spec.params)
    space = task.space()
    points = space.served_points()
    first = space.candidate(space.seed_point(points[0]))
    assert isinstance(first, str) and first.startswith("spill:")  # the premise
    kept, fallback, reference = task.anchors(points)
    assert isinstance(space.candidate(space.seed_point(next(p for p in points if space.seed_candidate(p) == kept))), Candidate)
    assert fallback == space.seed_candidate(points[0]) and reference.lowering is Lowering.REFERENCE
