"""Progress as the user sees it: a bar with a total, ETA and the best so far on a
terminal, plain lines in a log, the count of a space as it runs, and the line an
interrupted tuning ends with (exit 130, everything measured kept)."""

from __future__ import annotations

import io
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time

import pytest
from rich.console import Console

from test_cli import SHAPE
from ws_tuner.candidate import Candidate, Lowering
from ws_tuner.cli.progress import TuneProgress, counting
from ws_tuner.pipeline import BASELINE, SEARCH, TrialRecord
from ws_tuner.result import Status, Timing, TrialResult


def _record(role: str, status: Status, tflops: float | None = None, cached: bool = False, lowering: Lowering = Lowering.DEFAULT) -> TrialRecord:
    candidate = Candidate.make({"block": role, "tflops": tflops}, None, lowering)
    timing = Timing(median_ms=1.0, p20_ms=0.9, p80_ms=1.1, reps=10) if tflops else None
    return TrialRecord(candidate, TrialResult(candidate.hash, status, timing=timing, tflops=tflops), role, cached=cached)


def test_plain_lines_count_search_against_the_budget_and_baselines_apart():
    sink = io.StringIO()
    with TuneProgress(Console(file=sink, force_terminal=False, width=200), budget=4) as progress:
        progress("trial", _record(BASELINE, Status.OK, 500.0, cached=True))
        progress("anchor", None)
        progress("trial", _record(SEARCH, Status.OK, 620.0))
        progress("trial", _record(SEARCH, Status.WRONG))
        progress("trial", _record(BASELINE, Status.OK, 700.0, lowering=Lowering.REFERENCE))  # cuBLAS: not ws-tune's best
    lines = sink.getvalue().splitlines()
    assert lines[0].startswith("[0/4 search, 1 baseline/warm] baseline, reused: ok") and lines[0].endswith("best so far 500 TFLOP/s")
    assert lines[1] == "timing the anchor"
    assert lines[2].startswith("[1/4 search, 1 baseline/warm] search: ok") and lines[2].endswith("best so far 620 TFLOP/s")
    assert lines[3].startswith("[2/4 search, 1 baseline/warm] search: wrong") and lines[3].endswith("best so far 620 TFLOP/s")
    assert lines[4].startswith("[2/4 search, 2 baseline/warm] baseline: ok") and lines[4].endswith("best so far 620 TFLOP/s")
    assert progress.interrupted_line(2) == "interrupted: 2 stored, re-run to resume"


def test_the_seed_schedules_baseline_is_tagged_as_tilelangs_lowerings_are():
    """In a log every baseline but the seed's carried its tag ([default], [no_ws], ...): the
    seed, a schedule like any candidate's, read as one searched (a helper's port)."""
    from ws_tuner.schedule import Role, Schedule

    seed = Schedule(num_warps=8, roles=(Role("Consumer", 0, 4, 0), Role("Producer", 4, 8, 0)), pipelines=())
    sink = io.StringIO()
    with TuneProgress(Console(file=sink, force_terminal=False, width=300), budget=2) as progress:
        progress("trial", TrialRecord(Candidate.make({"block": 64}, seed), TrialResult("s", Status.BUILT), BASELINE))
        progress("trial", TrialRecord(Candidate.make({"block": 64}, seed.with_(num_warps=8)), TrialResult("t", Status.BUILT), SEARCH))
    lines = sink.getvalue().splitlines()
    assert "baseline: built [seed] block=64 | Consumer:0-4@0" in lines[0], lines
    assert "[seed]" not in lines[1], lines


def test_a_long_candidate_label_is_logged_whole_and_cut_visibly_on_the_bar():
    """A label cut at a fixed width printed "A_sx1,B_sx" for "A_sx1,B_sx5": another schedule."""
    label = {"block": "x" * 120}  # longer than any width the bar gives it
    record = TrialRecord(Candidate.make(label, None, Lowering.DEFAULT), TrialResult("h", Status.BUILT), SEARCH)
    sink = io.StringIO()
    with TuneProgress(Console(file=sink, force_terminal=False, width=400), budget=1) as progress:
        progress("trial", record)
    assert record.candidate.describe() in sink.getvalue()
    progress.live = True  # the bar's description: the first 69 characters and a mark
    progress("trial", record)
    assert progress.bar.tasks[0].description.endswith("…") and len(progress.bar.tasks[0].description) == 14 + 70


def test_the_terminal_bar_has_total_eta_and_best():
    sink = io.StringIO()
    with TuneProgress(Console(file=sink, force_terminal=True, width=200), budget=40) as progress:
        progress("trial", _record(SEARCH, Status.OK, 612.0))
        progress.bar.refresh()
    screen = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", sink.getvalue())
    assert "1/40" in screen and "ETA" in screen and "best so far 612 TFLOP/s" in screen


@pytest.mark.parametrize("terminal", [False, True])
def test_counting_reports_running_counts(terminal):
    sink = io.StringIO()
    with counting(Console(file=sink, force_terminal=terminal, width=200), "counting the space", interval=0.0) as tick:
        for seen in (1000, 2000, 3000):
            tick(seen, seen // 10)
            time.sleep(0.01)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", sink.getvalue())
    assert "counting the space" in text and "3,000 seen, 300 kept" in text


def _run_in_pty(args: list[str], timeout: float = 300) -> tuple[int, str]:
    """Run ``ws-tune`` with stderr and stdout on a pseudo-terminal, as a user's shell would."""
    main, sub = pty.openpty()
    env = {**os.environ, "WS_TUNE_DB": "", "COLUMNS": "160", "TERM": "xterm"}
    proc = subprocess.Popen([sys.executable, "-m", "ws_tuner", *args], stdin=sub, stdout=sub, stderr=sub, env=env, close_fds=True)
    os.close(sub)
    chunks, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([main], [], [], 1.0)
        if ready:
            try:
                data = os.read(main, 65536)
            except OSError:  # the terminal closed with the process
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    os.close(main)
    return proc.wait(timeout=30), re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode(errors="replace"))


def test_space_shows_its_count_running_on_a_terminal(data_dir):
    code, screen = _run_in_pty(["space", str(data_dir / "flash_fwd.py"), "--shape", "S=1024,causal=0"])
    assert code == 0, screen
    assert re.search(r"counting the space\s+[\d,]+ seen, [\d,]+ kept", screen), screen


@pytest.mark.slow
def test_ctrl_c_keeps_what_was_stored_and_says_how_to_resume(tmp_path, example_path):
    """A real compile-only tuning (nvcc), interrupted as a terminal's Ctrl-C does: SIGINT to the process group."""
    from ws_tuner.store import Store

    db = tmp_path / "r.db"
    args = [str(example_path), "--shape", SHAPE, "--budget", "50", "--jobs", "1", "--db", str(db), "--compile-only",
            "--param", "block_M=128,block_N=256,epilogue=direct,persistent=false,swizzle=8"]  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-m", "ws_tuner", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "WS_TUNE_DB": ""}, start_new_session=True)  # fmt: skip
    try:
        seen = []
        for line in proc.stderr:  # plain lines: stderr is a pipe
            seen.append(line)
            if re.match(r"\[\d+/50 search, \d+ baseline/warm\] \w+: built", line):
                break
        else:
            pytest.fail(f"no trial line before the end: {proc.wait()} {''.join(seen)}")
        os.killpg(proc.pid, signal.SIGINT)
        stdout, rest = proc.communicate(timeout=300)
    finally:  # a failed wait must not leave the tuning and its compile workers running
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, (stdout, rest)
    match = re.search(r"^interrupted: (\d+) stored, re-run to resume$", rest, re.M)
    assert match, rest
    assert "Traceback" not in rest + stdout
    store = Store(f"sqlite:///{db}")
    try:
        ((workload_id, _),) = store.find_workloads(kernel="gemm")
        assert len(store.trials_by_hash(workload_id=workload_id)) == int(match.group(1)) >= 1
    finally:
        store.close()


def test_a_memory_bound_kernels_few_tflops_do_not_read_zero():
    from ws_tuner.cli.common import rate_text

    assert [rate_text(x) for x in (659.04, 4.2718, 0.51234)] == ["659", "4.27", "0.512"]
