"""Every kernel file of examples/ and tests/data/, through its schedule space on
the CPU (benchmarks/space_audit.py): the seed's own point is the seed at random
kernel-parameter points, and every candidate of a bounded random sample is
either pruned by a static rule with its reason or accepted by tilelang's real
MaterializeWSSchedule verifier; the fraction rejected is printed (the goal is
none). A few non-seed candidates per file are built as ``--compile-only``
builds them (the verifier, lowering, nvcc for sm_90a). Also: a tuning's WRONG
fraction, as the report and the benchmarks give it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from ws_tuner.candidate import Candidate
from ws_tuner.pipeline import BASELINE, SEARCH, WARM, TrialRecord, TuneReport
from ws_tuner.result import Status, TrialResult
from ws_tuner.workload import Environment, WorkloadKey

ROOT = Path(__file__).resolve().parents[2]
# The static rules of ScheduleSpace.candidate, by the kind a reason starts with.
# "seed": kernel parameters where role_based gives no seed (blocksparse_gemm.py beyond one stage).
RULES = {"kernel", "seed", "same", "depth", "smem", "order", "deadlock", "threads", "mma", "nreg", "alignment", "registers", "spill", "gather", "loop", "tid"}


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


audit_script = _load("space_audit")
# Every kernel file, seeded or not: whether one has a seed is asked in its tests, not at
# collection, which every test worker runs (deriving every file's seed took it 2-3 minutes).
FILES = audit_script.kernel_files(seeded=False)


# Files with no seed to vary at their audit problem (their baselines only): warps split by
# hand by thread index, specialized by hand (T.ws, or mbarriers of their own), or nothing
# to specialize. Every other file must have one: each file's test asks, so that the seeds
# are derived once, in parallel (one test deriving every file's took 100-190 s of CI).
NO_SEED = {"mhc_pre.py", "hand_ws_gemm.py", "sparse_mla_pipelined.py", "token_cast_fp8.py", "hadamard.py", "kda_inter_solve.py", "mla_decode_persistent.py", "kda_decode.py"}


def test_every_kernel_file_is_audited():
    names = {p.name for p in FILES}
    assert {"gemm.py", "attention.py", "flash_fwd.py", "two_consumers.py", "chain_gemm.py", "persistent_epilogue.py", "single_shot.py", "dual_gemm.py",
            "blockscaled_fp8_gemm.py", "dynamic_gemm.py", "w4a16_gemm.py", "gqa_decode.py", "splitk_gemm.py", "flash_bwd.py", "linear_attn.py", "chunk_state.py", "nsa_fwd.py",
            "rmsnorm.py", "streamk_gemm.py", "sink_attn.py", "blocksparse_attn.py", "sparse_mla.py", "fused_moe.py",
            "block_causal_attn.py", "sparse_attn_v4.py", "kda_chunk_o.py", "gemm_sp.py", "block_sparse_mqa.py", "mhc_post.py", "vs_sparse_attn.py", "varlen_attn.py", "mla_paged.py", "lightning_indexer.py", "wy_fast.py", "grouped_gemm.py", "gemv.py", "bitnet_gemm.py", "online_softmax.py", "fp4_gemm.py", "gdn_state.py", "mha_decode_split.py", "gdn_chunk_o_bwd.py", "kda_state.py", "mamba_chunk_scan.py", "gqa_bwd.py",
            "gdn_delta_bwd.py", "retention_fwd.py", "nsa_decode.py", "sink_attn_bwd.py", "seer_attn.py",
            "nsa_bwd.py", "kda_bwd_dqkwg.py", "sparse_mla_bwd.py", "kda_delta_bwd.py", "gqa_fwd.py", "kda_intra_token.py", "sink_gqa_varlen.py", "kda_bwd_gla_da.py", "gqa_fwd_pipelined.py", "gqa_bwd_varlen.py",
            "sink_gqa_bwd_varlen.py", "mha_bwd_wgmma.py", "sparse_gqa_decode.py", "gemm_intrinsics.py"} | NO_SEED <= names
    assert "_gemm.py" not in names and "bad_syntax.py" not in names


@pytest.mark.slow
@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_sampled_candidates_are_pruned_with_a_reason_or_verified_and_build(path, tmp_path, monkeypatch):
    """A file of NO_SEED has no seed; every other one has, and every candidate of a random
    sample is pruned by a static rule or accepted by the verifier, and one verified
    non-seed candidate is lowered and compiled for sm_90a: the
    static rules (the MMA split among them: plain kernels have no check()) leave nothing
    that nvcc or tilelang's lowering refuses. One test per file, so that the test workers
    share the files out; one audit, so that the points' seeds are derived once (two tests
    per file took a third of CI)."""
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tmp_path / "tl-cache"))  # compiles are real
    task = audit_script.task_for(path)
    if path.name in NO_SEED:
        assert not audit_script.has_seed(task), f"{path.name} has a seed now: audit it (take it out of NO_SEED)"
        return
    assert audit_script.has_seed(task), f"{path.name} has no seed at {task.problem} (a file without one belongs in NO_SEED)"
    row = audit_script.audit(task, samples=60, survivors=12, compile_n=1, jobs=1, seed=1, points=12, sample_counted=True)
    print(f"\n{audit_script.table([row])}\n  at {row.problem}; verifier-rejected fraction: {row.rejected_fraction}")
    assert row.seed_point_is_seed is not False  # None: none of the points drawn has a seed
    # (the 12 points counted, where the sample is drawn, may all build others' kernels or have
    # no seed: then the survivors are drawn over the whole grid, and say the space is not empty)
    assert 0 <= row.kept <= row.total
    assert set(row.sample_pruned) <= RULES and set(row.pruned_by) <= RULES
    assert row.distinct >= 1 and row.survivors >= 1
    assert row.rejected == [] and row.rejected_fraction == 0.0
    assert row.built == 1 and row.compile_failed == [], (path.name, row.compile_failed)


def _record(role: str, status: Status, n: int, cached: bool = False) -> list[TrialRecord]:
    return [TrialRecord(Candidate.make({"i": f"{role}{status.value}{i}"}, lowering="default"), TrialResult(f"{role}{i}", status), role, cached) for i in range(n)]


def test_wrong_fraction_counts_the_search_measured_in_this_run():
    key = WorkloadKey.make("k", "0" * 64, {"M": 1}, Environment("sm_90a", "NVIDIA H200", "0", "0", "0"))
    report = TuneReport(key, 0, compile_only=False)
    assert report.wrong_fraction is None  # nothing measured
    report.records += _record(SEARCH, Status.BUILT, 4) + _record(SEARCH, Status.COMPILE_ERROR, 1)
    assert report.wrong_fraction is None  # compile-only: built, never run
    report.records += _record(SEARCH, Status.OK, 45) + _record(WARM, Status.OK, 2) + _record(SEARCH, Status.WRONG, 2) + _record(WARM, Status.WRONG, 1)
    report.records += _record(BASELINE, Status.WRONG, 5)  # a baseline is not the search's
    report.records += _record(SEARCH, Status.WRONG, 7, cached=True)  # an earlier run's
    assert report.wrong_fraction == pytest.approx(3 / 50)
    assert _load("harness").summary_row(report)["wrong_fraction"] == 0.06  # the benchmarks' summary row


def test_the_cli_summary_reports_the_wrong_fraction(capsys):
    from types import SimpleNamespace

    from ws_tuner.cli.tuning import _print_report

    key = WorkloadKey.make("k", "0" * 64, {"M": 1}, Environment("sm_90a", "NVIDIA H200", "0", "0", "0"))
    report = TuneReport(key, 0, compile_only=False)
    report.records += _record(SEARCH, Status.OK, 3) + _record(SEARCH, Status.WRONG, 1)
    _print_report(report, SimpleNamespace(spec=SimpleNamespace(name="k", bytes_moved=lambda problem: None), problem={"M": 1}, describe=Candidate.describe))
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "WRONG (of the searched)" in ln)
    assert "25.0%" in line


def test_an_audit_of_a_kernel_without_a_seed_says_so_rather_than_true():
    """A per-token FP8 cast has nothing to specialize: no seed point to rebuild, which the
    audit gives as None ('-'), not as a rebuilt seed; and --shape reaches its problem."""
    row = audit_script.audit(audit_script.task_for(ROOT / "tests" / "data" / "token_cast_fp8.py", "M=8192,N=8192"), samples=3)
    assert row.problem == {"M": 8192, "N": 8192}
    assert row.seed_point_is_seed is None and row.kept == row.total == 0 and set(row.points_pruned_by) == {"seed"}
    assert audit_script.table([row]).splitlines()[1].split()[3] == "-"


def test_an_audit_of_one_file_prints_its_header_once_then_the_row_and_its_problem(capsys):
    """A helper's one-file audit printed the row above the header, then the whole table again."""
    assert audit_script.main(["--samples", "5", "--survivors", "2", "--points", "2", str(ROOT / "tests" / "data" / "rmsnorm.py")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("kernel ") and sum(ln.startswith("kernel ") for ln in lines) == 1
    assert lines[1].startswith("rmsnorm.py ") and lines[2].startswith("    at {'M': ") and not any(ln.startswith("rmsnorm.py") for ln in lines[2:]), lines


def test_an_audit_at_a_few_points_counts_whole_groups_that_build_their_kernels(capsys):
    """GDN's WY backward builds threads=128's kernels at 21 of its 24 points: counted at two of
    those, drawn alone, the audit printed "~0 kept" beside survivors it had drawn. Two points
    now draw a whole group of the points that differ only in num_stages and threads (eight),
    among them the points that build the group's kernels."""
    assert audit_script.main(["--samples", "0", "--survivors", "2", "--points", "2", "--seed", "0", str(ROOT / "tests" / "data" / "gdn_wy_fast_bwd.py")]) == 0
    out = capsys.readouterr().out
    row = next(line.split() for line in out.splitlines() if line.startswith("gdn_wy_fast_bwd.py"))
    assert row[1].startswith("~") and int(row[2].lstrip("~")) > 0 and "rough:" not in out, out
