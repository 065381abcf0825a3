"""The ws-tune command line, run as a real subprocess: results, and bad input
as one line with exit code 2 and nothing half-written."""

from __future__ import annotations

import re

import subprocess
import sys
from pathlib import Path

import pytest

SHAPE = "M=4096,N=4096,K=4096"


def ws_tune(*args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    full_env = {**os.environ, "WS_TUNE_DB": "", **(env or {})}
    return subprocess.run([sys.executable, "-m", "ws_tuner", *args], capture_output=True, text=True, timeout=600, cwd=cwd, env=full_env)


def assert_one_line_error(proc: subprocess.CompletedProcess, needle: str, code: int = 2) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error:") and needle in lines[0], lines[0]
    assert "Traceback" not in proc.stderr + proc.stdout


@pytest.mark.parametrize(
    "args, needle",
    [
        (["{data}/bad_syntax.py", "--shape", SHAPE], "cannot import"),
        (["{data}/raises_on_import.py", "--shape", SHAPE], "fails when imported"),
        (["{data}/no_contract.py", "--shape", SHAPE], "lacks PARAMS, kernel"),
        (["{data}/missing.py", "--shape", SHAPE], "does not exist"),
        (["{example}", "--shape", "M=4096,N=4096"], "missing K"),
        (["{example}", "--shape", "M=4096,N=lots,K=4096"], "not a number"),
        (["{example}", "--shape", "M=4096,N=4096,K=4096,Q=1"], "unknown problem argument 'Q'"),
        (["{example}", "--shape", "M=4096,N=4096,K=-8"], "must be positive"),
        (["{example}", "--shape", "M=4096,N=4096,K=4096,dtype=float64"], "not one of"),
        (["{example}", "--shape", SHAPE, "--param", "block_Q=64"], "unknown kernel parameter 'block_Q'"),
        (["{example}", "--shape", "M4096"], "KEY=VALUE"),
        (["{example}", "--shape", SHAPE, "--db", "postgresql+psycopg://nobody@127.0.0.1:1/none"], "127.0.0.1:1"),
        (["{example}", "--shape", SHAPE, "--db", "/proc/ws-tune/results.db"], "/proc/ws-tune"),
        (["{example}", "--shape", SHAPE, "--strategy", "annealing"], "unknown strategy"),
        (["{example}", "--shape", "M=100,N=4096,K=4096"], "the kernel serves no kernel-parameter point at this problem (e.g. kernel: M=100 is not"),
        (["{example}"], "--shape is missing M (give M=...,N=...,K=...)"),  # typer's boxed "Missing option" was many lines
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, needle, tmp_path, data_dir, example_path):
    db = tmp_path / "results.db"
    args = [a.format(data=data_dir, example=example_path) for a in args]
    if "--db" not in args:
        args += ["--db", str(db)]
    assert_one_line_error(ws_tune(*args, "--compile-only"), needle)
    assert not db.exists()  # bad input never reaches the database


def test_space_at_a_problem_the_kernel_serves_nowhere_is_an_error(example_path):
    """``ws-tune space`` printed "0 before pruning, 0 after" and exit 0 where check() refuses
    every point (a helper's port at a sequence count its blocks do not divide); a tuning
    refuses the problem, and so does space now, with the kernel's reason."""
    proc = ws_tune("space", str(example_path), "--shape", "M=100,N=4096,K=4096")
    assert proc.returncode == 2, proc.stderr
    assert "error: the kernel serves no kernel-parameter point at this problem (e.g. kernel: M=100 is not a multiple of block_M" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_space_prints_axes_and_counts(example_path):
    # The cooperative form (ping-pong's two consumer roles multiply the space counted whole), one warp split.
    pins = "mma=sync,consumers=cooperative,split=square"
    proc = ws_tune("space", str(example_path), "--shape", SHAPE, "--param", pins, "--sample", "0")
    assert proc.returncode == 0, proc.stderr
    assert "nreg.Consumer" in proc.stdout and "pipelines" in proc.stdout
    # the seed the axes vary, spelled as a candidate's label spells it (a helper found it nowhere)
    seed = re.search(r"^seed schedule at (.*?): (\S+) \| (\S+) \(role:warps", proc.stdout, re.M)
    assert seed and "mma=sync" in seed.group(1) and "Producer:" in seed.group(2) and "Consumer:" in seed.group(2), proc.stdout
    before, after = (int(n.replace(",", "")) for n in re.search(r"candidates: ([\d,]+) before pruning, ([\d,]+) after \(", proc.stdout).groups())
    assert before > after > 10_000
    # The default counts a sample of the 128 kernel-parameter points and says it is an estimate.
    sampled = ws_tune("space", str(example_path), "--shape", SHAPE, "--param", pins, "--sample", "16")
    assert sampled.returncode == 0, sampled.stderr
    found = re.search(r"candidates: ~([\d,]+) before pruning, ~([\d,]+) after \((.*?)\), estimated at 16 of the 128 kernel-parameter points", " ".join(sampled.stdout.split()))
    est_before, est_after = (int(n.replace(",", "")) for n in found.group(1, 2))
    assert 0 < est_after <= est_before and before / 4 <= est_before <= 4 * before
    # with how far to trust it: an interval that holds what was counted, or a word that it is rough
    interval = re.fullmatch(r"95% interval ([\d,]+)-([\d,]+)", found.group(3))
    assert (interval and int(interval.group(1).replace(",", "")) <= est_after <= int(interval.group(2).replace(",", ""))) or found.group(3).startswith("rough: "), found.group(3)


def test_space_of_a_seed_it_cannot_vary_says_why(data_dir):
    proc = ws_tune("space", str(data_dir / "single_shot.py"), "--shape", "M=1024,N=1024")
    assert proc.returncode == 0, proc.stderr
    assert "kept as in the seed: the seed's pipeline layout, depths and stages: none of its pipelines synchronizes a loop" in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("kernel, shape, params, reason", [
    # warps split by hand by thread index, 96 threads in all: role_based says why it skips, as a C++ warning
    ("mhc_pre.py", "tokens=1024", "hidden_block=256,num_stages=1,threads=96",
     "seed: kernel has no WS schedule and tilelang's role_based scheduler skipped the kernel: worker threads must be a multiple of 128"),
    # warps specialized by hand (T.ws) and synchronized by the kernel's own barriers: no schedule to vary
    ("hand_ws_gemm.py", "M=2048,N=2048,K=2048", "block_M=128,block_N=128,block_K=64",
     "seed: the kernel is warp-specialized by hand (T.ws blocks and its own barriers)"),
    # a persistent kernel's grid barrier between its split and combine phases: role_based names the op by its repr
    ("mla_decode_persistent.py", "batch=16,seqlen_kv=2048", "block_N=32,num_split=2",
     "skipped the kernel: cannot schedule hand-written synchronization or TMA control (tl.sync_grid): "),
])  # fmt: skip
def test_a_kernel_without_a_seed_still_gets_its_baselines(tmp_path, data_dir, kernel, shape, params, reason):
    """role_based does not specialize the kernel, so there is no space; tilelang's own
    lowerings are still built (and, on a GPU, timed)."""
    kernel = str(data_dir / kernel)
    space = ws_tune("space", kernel, "--shape", shape, env={"COLUMNS": "250"})
    assert space.returncode == 0, space.stderr
    # tilelang's own reason, once, in ws-tune's line; not its C++ warning once per point
    assert reason in space.stdout
    assert "AutoWarpSpecialization skipped" not in space.stderr
    assert "a tuning: no schedule space (seed: " in space.stderr and "measuring tilelang's own lowerings" in space.stderr  # not just "0 after"
    assert "static pruning" not in space.stdout  # nothing pruned: no empty table
    # no seed, no candidates: not "1 before pruning", a count of kernel-parameter points
    assert re.search(r"candidates: none at the \d+ kernel-parameter points? counted\n(~?\d+) of the \d+ kernel-parameter points have no candidates \(seed: ", space.stdout), space.stdout
    tuned = ws_tune(kernel, "--shape", shape, "--param", params, "--budget", "2", "--jobs", "2", "--db", str(tmp_path / "r.db"), "--compile-only")
    assert tuned.returncode == 0, tuned.stderr
    assert "no schedule space (seed: " in tuned.stderr and "; --budget 2 is not used" in tuned.stderr
    assert re.search(r"built\s+│\s+3\s", tuned.stdout), tuned.stdout  # tilelang's default, no_ws and role_based lowerings
    assert "pruned" not in tuned.stdout  # no space, no search: nothing drawn to be pruned


def test_a_space_without_a_seed_gives_the_commonest_reason(data_dir):
    """tilelang's Hadamard transform: role_based skips 32- and 64-thread blocks (whole
    warpgroups only) and finds no handoff at 128 threads and up. The line quotes the reason
    of most points (12 of 18) and counts the rest, not the first point's alone."""
    space = ws_tune("space", str(data_dir / "hadamard.py"), "--shape", "batch=64,dim=32768", env={"COLUMNS": "400"})
    assert space.returncode == 0, space.stderr
    assert ("a tuning: no schedule space (seed: kernel has no WS schedule and tilelang's role_based scheduler skipped the kernel: "
            "no cross-role on-chip handoff to pipeline; 6 of the 18 points for other reasons): measuring tilelang's own lowerings and the vendors' (") in space.stderr  # fmt: skip


@pytest.mark.slow
def test_compile_only_says_which_points_it_built_and_what_is_one_kernel(tmp_path, data_dir):
    """A per-token FP8 cast (no loop, nothing to specialize) over 12 kernel-parameter points:
    compile-only builds tilelang's three lowerings at the first, which are one kernel, and
    says both rather than '0 sharing' and nothing of the other 11 points."""
    tuned = ws_tune(str(data_dir / "token_cast_fp8.py"), "--shape", "M=8192,N=8192", "--budget", "2", "--jobs", "1",
                    "--db", str(tmp_path / "r.db"), "--compile-only", env={"COLUMNS": "300"})  # fmt: skip
    assert tuned.returncode == 0, tuned.stderr
    assert re.search(r"built\s+│\s+3\s", tuned.stdout), tuned.stdout
    assert "(0 reused from the store, 2 sharing another's generated code)" in tuned.stdout
    # and which (a helper could not tell)
    one = [line for line in tuned.stdout.splitlines() if line.startswith("one kernel: ")]
    assert len(one) == 1 and all(f"[{kind}] blk_m=1" in one[0] for kind in ("default", "no_ws", "role_based")) and one[0].count(" = ") == 2, tuned.stdout
    assert "the baselines were built at 1 of 12 kernel-parameter points (blk_m=1, threads=128)" in tuned.stdout


@pytest.mark.slow
def test_a_tuning_says_why_its_candidates_failed(tmp_path, data_dir):
    """RMSNorm at two stages: tilelang 0.1.15's layout inference refuses its own default and
    role_based lowerings. The outcome table only counts them; the lines under it give the
    message, and whose failure it is."""
    tuned = ws_tune(str(data_dir / "rmsnorm.py"), "--shape", "M=1024,N=1024", "--param", "blk_m=1,blk_k=512,num_stages=2,threads=256",
                    "--budget", "2", "--jobs", "1", "--db", str(tmp_path / "r.db"), "--compile-only", env={"COLUMNS": "400"})  # fmt: skip
    assert tuned.returncode == 0, tuned.stderr
    # tilelang's own lowerings fail, and the line says it is theirs
    assert re.search(r"^compile_error in tilelang's own lowering \(tilelang cannot build it; not a ws-tune schedule\): 2 x Check failed: .*InputShape\(\).* \(e\.g\. \[default\] blk_k=512",
                     tuned.stdout, re.M), tuned.stdout  # fmt: skip
    assert "AutoWarpSpecialization skipped" not in tuned.stderr  # role_based's reason is in the seed line, once


def test_failure_lines_give_each_status_its_most_common_message():
    from ws_tuner.cli.common import failure_lines

    failed = [("wrong", "max rel err 0.5", "a", "ws"), ("compile_error", "nvcc: out of memory", "b", "ws"), ("wrong", "max rel err 0.5", "c", "ws"),
              ("wrong", "nan in output", "d", "ws"), ("crash", "", "e", "ws"), ("ok", "confirmed", "f", "ws"), (None, "pending", "g", "ws"),
              ("compile_error", "Downcast from tirx.Sub to ir.IntImm failed.", "[no_ws] h", "no_ws"),
              ("wrong", "relative error 0.249 > 0.01", "[role_based] i", "role_based")]  # fmt: skip
    assert failure_lines(failed) == [
        "compile_error: 1 x nvcc: out of memory (e.g. b)",
        # tilelang's own lowering failing is told apart from ws-tune's schedules failing
        "compile_error in tilelang's own lowering (tilelang cannot build it; not a ws-tune schedule): 1 x Downcast from tirx.Sub to ir.IntImm failed. "
        "[seen where tilelang's software pipeliner stages a loop whose bounds are computed at run time: a causal, windowed or variable-length key loop] (e.g. [no_ws] h)",
        "wrong: 2 x max rel err 0.5 (e.g. a); 1 other message(s)",
        # one it built, that computes garbage (a TMA load that loses the layout ldmatrix reads, H100 run 43)
        "wrong in tilelang's own lowering (tilelang builds it wrong; not a ws-tune schedule): 1 x relative error 0.249 > 0.01 (e.g. [role_based] i)",
    ]


def test_when_no_variant_survives_the_reason_is_the_seeded_points(tmp_path, data_dir):
    """Sparse attention at 16 query heads per block and 128 threads: no seeded point has a
    variant left, the 16-row chained MMA cannot be split; the line says that, not why other
    points have no seed or stand for another (the most pruned). (At 64 and 32 threads the
    seed's own narrower Worker is varied.)"""
    tuned = ws_tune(str(data_dir / "nsa_fwd.py"), "--shape", "batch=1,seq_len=1024", "--param", "num_stages=1,threads=128", "--budget", "2",
                    "--jobs", "1", "--db", str(tmp_path / "r.db"), "--compile-only")  # fmt: skip
    assert tuned.returncode == 0, tuned.stderr
    assert "no variant of the seed survives static pruning (e.g. mma: role Worker's 4 warps would split its 16x64 accumulator 1x4" in tuned.stderr


def test_the_reason_nothing_survives_comes_from_the_points_the_kernel_serves(tmp_path, data_dir):
    """The indexer top-k at topk=16 without its MMA refusal: check() refuses 6 of the 8 points
    (block_K past topk: the most pruned), the 2 it serves lose every variant to the MMA split rule.
    The line gave the refusal of points the kernel does not serve."""
    source = (data_dir / "indexer_topk.py").read_text()
    refusal = "    if not any(warps % m == 0 and params"
    assert refusal in source
    file = tmp_path / "indexer_topk.py"
    file.write_text(source.replace(refusal, "    if False and not any(warps % m == 0 and params"))
    proc = ws_tune("space", str(file), "--shape", "seq_len=64,topk=16,heads=8")
    assert proc.returncode == 0, proc.stderr
    assert "a tuning: no variant of the seed survives static pruning (e.g. mma: role Worker's" in proc.stderr, proc.stderr
    assert "at the 2 kernel-parameter points the kernel serves" in proc.stderr


def test_a_root_scope_pipeline_and_an_int_choice_of_zero_are_accepted(data_dir):
    proc = ws_tune("space", str(data_dir / "flash_fwd.py"), "--shape", "S=1024,causal=0")
    assert proc.returncode == 0, proc.stderr
    assert "stage.consumer.k/v" in proc.stdout and "depth.k" in proc.stdout


@pytest.mark.slow
def test_compile_only_tuning_stores_and_reuses(tmp_path, example_path):
    db = tmp_path / "results.db"

    def tuning(budget: int, *more: str) -> subprocess.CompletedProcess:
        return ws_tune(str(example_path), "--shape", SHAPE, "--budget", str(budget), "--jobs", "2", "--db", str(db), "--compile-only",
                       "--param", "block_M=128,block_N=256,epilogue=direct,persistent=false,swizzle=8", *more)  # fmt: skip

    first = tuning(2)
    assert first.returncode == 0, first.stderr
    assert "compile-only" in first.stdout and "built" in first.stdout
    assert "search draws pruned (static rules, not built)" in first.stdout  # beside the built, not counted among them
    # what the space keeps as in the seed: one line of topics (`ws-tune space` gives each in full)
    kept = [line for line in first.stderr.splitlines() if line.startswith("kept as in the seed: ")]
    assert len(kept) == 1 and kept[0].endswith("; consumers (`ws-tune space` says why)"), first.stderr
    again = tuning(2)
    assert again.returncode == 0, again.stderr
    assert "(7 reused from the store," in again.stdout  # 4 baselines + the lowering start + 2 searched, nothing rebuilt
    assert "time budget" not in again.stdout
    assert "nothing new was searched: earlier runs on this database stored 2 searched candidates, the budget of 2" in " ".join(again.stdout.split())
    assert "nothing new was searched" not in first.stdout
    # Two more search places, but a search of no seconds takes none.
    late = tuning(4, "--time-budget", "0")
    assert late.returncode == 0, late.stderr
    assert "(7 reused from the store," in late.stdout
    assert "the time budget ended the search after 2 searched candidate(s)" in " ".join(late.stdout.split())
    assert "nothing new was searched" not in late.stdout  # the budget was not spent: the time ran out


def test_best_without_results_exits_1(tmp_path, example_path):
    proc = ws_tune("best", str(example_path), "--shape", SHAPE, "--db", str(tmp_path / "r.db"))
    assert_one_line_error(proc, "no timed result stored", code=1)


def test_outdated_schema_names_the_upgrade_command(tmp_path, example_path):
    from sqlalchemy import create_engine, text

    db = tmp_path / "old.db"
    assert ws_tune("db", "upgrade", "--db", str(db)).returncode == 0
    engine = create_engine(f"sqlite:///{db}")
    with engine.begin() as conn:  # pretend the database predates this ws-tune's schema
        conn.execute(text("UPDATE ws_tune_alembic_version SET version_num = 'v0.0.9.a'"))
    engine.dispose()
    proc = ws_tune(str(example_path), "--shape", SHAPE, "--db", str(db), "--compile-only")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "ws-tune db upgrade" in proc.stderr or "revision" in proc.stderr


def test_space_lists_a_long_axis_in_part_and_names_it_whole(data_dir):
    """FlashAttention's backward: one Load role over four pipelines has 65 stage choices, which
    ran to dozens of lines, and the axis name was cut short of the pipelines it names (a
    helper's port)."""
    proc = ws_tune("space", str(data_dir / "flash_bwd.py"), "--shape", "batch=1,heads=4,seq_len=1024", "--sample", "2", env={"COLUMNS": "120"})
    assert proc.returncode == 0, proc.stderr
    text = "".join(proc.stdout.split())  # the table folds long cells over lines
    assert "stage.Load.q/lse_shared/do/delta" in text and ",...(65inall)" in text, proc.stdout
