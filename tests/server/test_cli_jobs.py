"""``ws-tune jobs list|show|watch|cancel`` as real subprocesses against a real
uvicorn server (and a worker of test doubles in a thread): what they print,
their exit codes, and one-line errors for a server that is absent or refuses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

from svc_helpers import ROOT, SHAPE

GOOD = {"kernel": "gemm", "problem": SHAPE, "budget": 12, "strategy": "random"}


def jobs(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k not in ("WS_TUNE_URL", "WS_TUNE_TOKEN")} | (env or {})
    return subprocess.run([sys.executable, "-m", "ws_tuner", "jobs", *args], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env={**full_env, "COLUMNS": "200"})  # fmt: skip


def one_line(proc: subprocess.CompletedProcess, needle: str, code: int) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], proc.stderr


def test_watch_list_and_show_a_job_to_its_end(tmp_path: Path, live_server: Callable, make_token: Callable, worker_thread: Callable) -> None:
    db = f"sqlite:///{tmp_path / 's.db'}"
    live = live_server(db)
    with live.client(make_token(db, "jobs:write")) as client:
        job = client.post("/jobs", json=GOOD).json()
    worker_thread(db)
    watched = jobs("watch", str(job["id"]), "--interval", "0.2", env={"WS_TUNE_URL": live.url})
    assert watched.returncode == 0, watched.stderr
    assert watched.stdout.startswith(f"job {job['id']} succeeded: search 12/12; best ") and " ms" in watched.stdout
    assert f"job {job['id']} " in watched.stderr.splitlines()[0]  # plain lines on a pipe, one per change

    listed = jobs("list", "--url", live.url)
    assert listed.returncode == 0, listed.stderr
    row = next(ln for ln in listed.stdout.splitlines() if f" {job['id']} " in ln)
    assert "succeeded" in row and "gemm" in row and "12/12" in row

    shown = jobs("show", str(job["id"]), "--url", live.url, "--trials", "3")
    assert shown.returncode == 0, shown.stderr
    assert "trials (3 of 12)" in shown.stdout and shown.stdout.count(" default ") == 3  # each trial's lowering


def test_cancel_needs_the_token_and_then_cancels(tmp_path: Path, live_server: Callable, make_token: Callable) -> None:
    db = f"sqlite:///{tmp_path / 's.db'}"
    live = live_server(db)
    token = make_token(db, "jobs:write")
    with live.client(token) as client:
        job = client.post("/jobs", json=GOOD).json()
    one_line(jobs("cancel", str(job["id"]), "--url", live.url), "401", 2)
    cancelled = jobs("cancel", str(job["id"]), "--url", live.url, env={"WS_TUNE_TOKEN": token})
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.startswith(f"job {job['id']} cancelled")
    watched = jobs("watch", str(job["id"]), "--url", live.url)
    assert watched.returncode == 1 and "cancelled" in watched.stdout


def test_a_missing_job_and_an_absent_server_are_one_line(tmp_path: Path, live_server: Callable) -> None:
    live = live_server(f"sqlite:///{tmp_path / 's.db'}")
    one_line(jobs("show", "999", "--url", live.url), "404 job 999 not found", 1)
    one_line(jobs("list", "--url", "http://127.0.0.1:1"), "cannot reach the ws-tune server at http://127.0.0.1:1", 2)
    one_line(jobs("list", "--url", "127.0.0.1:8000"), "is not an http:// or https:// address", 2)
