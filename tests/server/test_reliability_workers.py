"""Reliability scenarios with real worker processes (and a real `ws-tune serve`):

1.  `kill -9` a worker mid-trial: its trials are re-queued once the lease
    expires and finished by another worker; nothing else is lost.
9.  SIGSTOP a worker past the grace period, then SIGCONT: its late result is
    refused by the fencing token; the worker survives.
11. SIGTERM (a deploy): the candidate in flight drains, or is handed back at
    once with --drain-timeout 0; no trial fails either way.
15. The whole service killed (server and its embedded worker) and restarted:
    finished trials are not run again.

Leases are short here (heartbeat 0.3 s, grace 1.5 s) and the dummy runner takes
a fixed time per candidate (--runner-delay) so that a trial is reliably in
flight when the signal lands.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, text
from svc_helpers import EXAMPLES, FAKE_ARGS, GRACE, ROOT, SHAPE, wait_for

from ws_tuner.store.queue import JobQueue


def _slots(db_url: str, job_id: int) -> list[Any]:
    engine = create_engine(db_url)
    try:
        with engine.connect() as connection:
            return connection.execute(
                text("SELECT id, slot, state, attempts, epoch, worker_id, candidate_hash, status, finished_at "
                     "FROM ws_tune_job_trials WHERE job_id = :j ORDER BY id"), {"j": job_id},
            ).fetchall()  # fmt: skip
    finally:
        engine.dispose()


def _running_with_candidate(db_url: str, job_id: int, worker_pid_log: Any = None) -> list[Any]:
    return [s for s in _slots(db_url, job_id) if s.state == "running" and s.candidate_hash]


def _assert_complete(db_url: str, queue: JobQueue, job_id: int, budget: int) -> list[Any]:
    job = wait_for(lambda: (j := queue.get_job(job_id)).state in ("succeeded", "failed", "cancelled") and j, 60, 0.1, "the job")
    assert job.state == "succeeded", job
    slots = _slots(db_url, job_id)
    assert len(slots) == budget and {s.state for s in slots} == {"done"}, slots  # none failed, none stuck
    assert len({s.candidate_hash for s in slots}) == budget  # nothing measured twice
    assert queue.store.status_counts(workload_id=job.workload_id) == {"ok": budget}  # every result stored, once
    return slots


@pytest.mark.timeout(120)
def test_kill_9_mid_trial(db_url: str, make_job: Callable, spawn_worker: Callable, queue_of: Callable) -> None:
    queue = queue_of(db_url)
    job = make_job(db_url, budget=6)
    victim = spawn_worker(db_url, *FAKE_ARGS, "--runner-delay", "1.0", "--exit-when-idle")
    held = wait_for(lambda: _running_with_candidate(db_url, job.id), 30, what="a trial in flight")
    os.kill(victim.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    victim.wait(10)
    at_kill = _slots(db_url, job.id)
    lost = {s.id for s in at_kill if s.state == "running"}
    started = {s.id for s in at_kill if s.state == "running" and s.candidate_hash}  # a candidate was in flight
    assert started and {h.id for h in held} <= lost | {s.id for s in at_kill if s.state == "done"}

    rescuer = spawn_worker(db_url, *FAKE_ARGS, "--exit-when-idle")
    # Re-queued once the heartbeat is older than the grace period (on the DB clock), not before.
    wait_for(lambda: all(s.state != "running" or s.attempts > 1 for s in _slots(db_url, job.id) if s.id in lost), 30, 0.05,
             "the lost trials to be re-queued")  # fmt: skip
    assert time.monotonic() - killed_at < 30
    slots = _assert_complete(db_url, queue, job.id, budget=6)
    # A candidate in flight is retried (attempt 2 of at most 1 + max_retry); a slot
    # claimed but not yet proposed is simply claimed again.
    assert all(s.attempts == 2 for s in slots if s.id in started)
    assert all(s.attempts == 1 for s in slots if s.id in lost - started)
    assert all(s.attempts == 1 for s in slots if s.id not in lost)  # no other trial was touched
    assert rescuer.wait(30) == 0


@pytest.mark.postgres
@pytest.mark.timeout(120)
def test_sigstop_past_grace_is_fenced(pg_url: str, make_job: Callable, spawn_worker: Callable, queue_of: Callable) -> None:
    """PostgreSQL only: a process stopped inside a SQLite write transaction keeps the
    file's write lock, and every other process waits for it (SQLite is the
    one-machine set-up). PostgreSQL aborts a transaction left idle that long
    (idle_in_transaction_session_timeout, set by the queue), so the others go on."""
    db_url = pg_url
    queue = queue_of(db_url)
    job = make_job(db_url, budget=4)
    sleeper = spawn_worker(db_url, *FAKE_ARGS, "--runner-delay", "1.0", "--exit-when-idle", log_name="sleeper.log")
    held = wait_for(lambda: _running_with_candidate(db_url, job.id), 30, what="a trial in flight")
    os.kill(sleeper.pid, signal.SIGSTOP)
    try:
        helper = spawn_worker(db_url, *FAKE_ARGS, "--exit-when-idle")
        # The stopped worker's trials expire; the helper re-runs them and finishes the job.
        job_done = wait_for(lambda: (j := queue.get_job(job.id)).state == "succeeded" and j, 60, 0.1, "the helper")
    finally:
        os.kill(sleeper.pid, signal.SIGCONT)
    assert helper.wait(30) == 0
    assert sleeper.wait(30) == 0  # it survived its lost lease
    log = sleeper.log_path.read_text()
    assert "result refused, the lease expired meanwhile" in log, log[-3000:]
    slots = _assert_complete(db_url, queue, job.id, budget=4)
    for stale in held:
        now = next(s for s in slots if s.id == stale.id)
        assert now.epoch > stale.epoch and now.worker_id != stale.worker_id  # recorded under the new lease only
    assert job_done.search_counts == {"done": 4}


def _worker_id(proc: subprocess.Popen) -> str:
    """The worker's id prefix, from its first log line."""
    line = wait_for(lambda: next((ln for ln in proc.log_path.read_text().splitlines() if " started" in ln), None), 30)
    return line.split("worker ", 1)[1].split()[0]


@pytest.mark.timeout(120)
def test_sigterm_drains_or_hands_back(db_url: str, make_job: Callable, spawn_worker: Callable, queue_of: Callable) -> None:
    """Two workers are deployed over at once: one may take 30 s to drain, the
    other none (--drain-timeout 0). Neither leaves a trial leased or failed."""
    queue = queue_of(db_url)
    job = make_job(db_url, budget=6)
    patient = spawn_worker(db_url, *FAKE_ARGS, "--runner-delay", "1.0", "--drain-timeout", "30", log_name="patient.log")
    hasty = spawn_worker(db_url, *FAKE_ARGS, "--runner-delay", "1.0", "--drain-timeout", "0", log_name="hasty.log")
    ids = {"patient": _worker_id(patient), "hasty": _worker_id(hasty)}

    def in_flight(who: str) -> list[Any]:
        return [s for s in _running_with_candidate(db_url, job.id) if s.worker_id.startswith(ids[who])]

    wait_for(lambda: in_flight("patient") and in_flight("hasty"), 30, 0.02, "both workers to have a trial in flight")
    held = {who: in_flight(who) for who in ids}
    for proc in (patient, hasty):
        os.kill(proc.pid, signal.SIGTERM)
    assert patient.wait(30) == 0 and hasty.wait(30) == 0
    after = {s.id: s for s in _slots(db_url, job.id)}
    assert not [s for s in after.values() if s.state in ("running", "failed")], after  # nothing leased, nothing failed
    # The patient one finished what it had in flight...
    assert all(after[h.id].state == "done" and after[h.id].attempts == 1 for h in held["patient"])
    # ...the hasty one handed back what it held when the signal came (read from its
    # log: a trial seen in flight before the kill may have finished before the signal
    # landed), not counted as an attempt.
    handed = [int(m) for m in re.findall(r"handed back trial (\d+)", hasty.log_path.read_text())]
    assert handed, hasty.log_path.read_text()[-3000:]
    assert all(after[i].state == "queued" and after[i].attempts == 0 for i in handed), [after[i] for i in handed]
    assert all(after[h.id].state in ("queued", "done") for h in held["hasty"])
    successor = spawn_worker(db_url, *FAKE_ARGS, "--exit-when-idle")
    _assert_complete(db_url, queue, job.id, budget=6)
    assert successor.wait(30) == 0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.timeout(180)
def test_whole_service_killed_and_restarted(db_url: str, make_token: Callable, tmp_path: Any, queue_of: Callable) -> None:
    token = make_token(db_url, "jobs:write")
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WS_TUNE_HEARTBEAT_INTERVAL": "0.3", "WS_TUNE_GRACE_PERIOD": str(GRACE),
           "WS_TUNE_POLL_INTERVAL": "0.1", "WS_TUNE_KERNEL_CACHE_DIR": str(tmp_path / "kc")}  # fmt: skip
    serve = [sys.executable, "-m", "ws_tuner", "serve", "--db", db_url, "--port", str(port), "--workers", "0",
             "--kernel-dir", str(EXAMPLES), "--no-access-log"]  # fmt: skip
    worker = [sys.executable, "-m", "ws_tuner.testing.worker", "--db", db_url, *FAKE_ARGS, "--runner-delay", "0.4"]

    def start(n: int) -> tuple[subprocess.Popen, subprocess.Popen]:
        log = open(tmp_path / f"serve-{n}.log", "wb")
        # The server and a worker of test doubles (`serve` embeds production workers only),
        # each in a session of its own, killed together below like a machine going down.
        server = subprocess.Popen(serve, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        proc = subprocess.Popen(worker, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_for(lambda: _healthy(port), 30, 0.1, "the server")
        return server, proc

    queue = queue_of(db_url)
    first = start(1)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}/api/v1", headers={"Authorization": f"Bearer {token}"}) as client:
            job = client.post("/jobs", json={"kernel": "gemm", "problem": SHAPE, "budget": 10, "strategy": "random"}).json()
        wait_for(lambda: sum(s.state == "done" for s in _slots(db_url, job["id"])) >= 3, 60, 0.05, "three finished trials")
    finally:
        for proc in first:
            os.killpg(proc.pid, signal.SIGKILL)
        for proc in first:
            proc.wait(10)
    before = {s.id: s for s in _slots(db_url, job["id"]) if s.state == "done"}
    stored_before = {s.candidate_hash: s.finished_at for s in before.values()}

    second = start(2)
    try:
        slots = _assert_complete(db_url, queue, job["id"], budget=10)
    finally:
        for proc in second:
            proc.send_signal(signal.SIGTERM)
        assert [proc.wait(60) for proc in second] == [0, 0]
    for s in slots:
        if s.id in before:  # finished before the crash: not run again
            assert (s.attempts, s.epoch, s.finished_at) == (before[s.id].attempts, before[s.id].epoch, before[s.id].finished_at)
    assert {h: f for h, f in stored_before.items()} == {s.candidate_hash: s.finished_at for s in slots if s.id in before}


def _healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/api/v1/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
