"""Reliability scenarios 7 and 8, on PostgreSQL and SQLite: races decided by the
database, each contender on its own connection pool (as separate workers are).

7. Two workers racing to claim one job, 1000 times: exactly one claim every round.
8. Two sweepers failing the same stale trial: both finish without error, and
   the trial is retried exactly once (or, past max_retry, failed exactly once).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from svc_helpers import fake_key

from ws_tuner.candidate import Candidate, Lowering
from ws_tuner.store.queue import JobQueue

ROUNDS = 1000


def _race(*contenders: Callable[[], Any]) -> list[Any]:
    """Run the callables at the same instant in threads; their results, or their exceptions."""
    barrier = threading.Barrier(len(contenders))
    results: list[Any] = [None] * len(contenders)

    def go(i: int) -> None:
        barrier.wait()
        try:
            results[i] = contenders[i]()
        except Exception as exc:  # noqa: BLE001 - reported to the test
            results[i] = exc

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(contenders))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


@pytest.mark.timeout(240)
def test_two_workers_racing_for_one_job(db_url: str, make_job: Callable, open_db: Callable) -> None:
    a, b = JobQueue(open_db(db_url)), JobQueue(open_db(db_url))  # two workers, two pools
    job = make_job(db_url, budget=1)

    def claim(queue: JobQueue, worker: str) -> tuple[bool, bool]:
        found = queue.claim_job(worker, "dev")
        lease = queue.claim_slot(found[0].id, worker) if found else None
        return (found is not None and found[1]), lease is not None

    for round_ in range(ROUNDS):
        if round_:
            job = a.create_job(kernel_id=job.kernel_id, kernel="gemm", problem={"M": round_}, problem_checked=True,
                               params=None, strategy="random", seed=0, budget=1)  # fmt: skip
        results = _race(lambda: claim(a, "wa"), lambda: claim(b, "wb"))
        assert not [r for r in results if isinstance(r, Exception)], results
        started = [r[0] for r in results]
        leased = [r[1] for r in results]
        assert sum(leased) == 1, f"round {round_}: {results}"  # exactly one claim
        assert sum(started) == 1, f"round {round_}: {results}"  # and one start
    jobs, count = a.list_jobs(limit=ROUNDS)
    assert count == ROUNDS and all(j.slots_claimed == 1 and j.counts == {"running": 1} for j in jobs)


def _backdate(db_url: str, seconds: int = 600) -> None:
    """Make every RUNNING trial look abandoned (its worker died long ago)."""
    ago = "now() - interval '10 minutes'" if db_url.startswith("postgresql") else "datetime('now', '-600 seconds')"
    engine = create_engine(db_url)
    try:
        with engine.begin() as connection:
            connection.execute(text(f"UPDATE ws_tune_job_trials SET heartbeat_at = {ago} WHERE state = 'running'"))
    finally:
        engine.dispose()


@pytest.mark.parametrize("attempts_before", [1, 3], ids=["retried", "quarantined"])
def test_two_sweepers_race_over_a_stale_trial(attempts_before: int, db_url: str, make_job: Callable, open_db: Callable) -> None:
    store = open_db(db_url)
    a, b = JobQueue(store), JobQueue(open_db(db_url))
    job = make_job(db_url, budget=40)
    a.claim_job("dead-worker", "dev")
    workload = store.workload_id(fake_key())
    for round_ in range(20):
        lease = a.claim_slot(job.id, "dead-worker")
        assert lease is not None
        candidate = Candidate.make({"round": round_}, None, Lowering.DEFAULT)
        assert a.assign_candidate(lease, candidate, workload_id=workload) == "assigned"
        if attempts_before > 1:  # it already killed workers twice: this is its last chance gone
            _set_attempts(db_url, lease.id, attempts_before)
        _backdate(db_url)
        reports = _race(lambda: a.sweep(grace=15, max_retry=2), lambda: b.sweep(grace=15, max_retry=2))
        assert not [r for r in reports if isinstance(r, Exception)], reports  # both sweepers "exit 0"
        trial = next(t for t in a.job_trials(job.id, limit=500)[0] if t.id == lease.id)
        if attempts_before == 1:
            assert sum(r.requeued for r in reports) == 1 and sum(r.failed for r in reports) == 0
            assert (trial.state, trial.epoch, trial.worker_id) == ("queued", lease.epoch + 1, None)
            retry = a.claim_slot(job.id, "next-worker")  # the retry: the same candidate, a new epoch
            assert retry is not None and retry.id == lease.id and retry.candidate == candidate and retry.epoch == lease.epoch + 2
            assert retry.attempts == 2
            # The dead worker's late result is refused (fencing); the retry's is recorded.
            from ws_tuner.result import Status, Timing, TrialResult

            result = TrialResult(candidate.hash, Status.OK, timing=Timing(1.0, 1.0, 1.0, 1))
            assert not a.finish_slot(lease, workload_id=workload, candidate=candidate, result=result)
            assert a.finish_slot(retry, workload_id=workload, candidate=candidate, result=result)
        else:
            assert sum(r.failed for r in reports) == 1 and sum(r.requeued for r in reports) == 0
            assert (trial.state, trial.status) == ("failed", "crash") and "quarantined" in (trial.message or "")
            stored = store.get_trial(workload_id=workload, candidate_hash=candidate.hash)
            assert stored is not None and stored.result.status.value == "crash"


def _set_attempts(db_url: str, trial_id: int, attempts: int) -> None:
    engine = create_engine(db_url)
    try:
        with engine.begin() as connection:
            connection.execute(text("UPDATE ws_tune_job_trials SET attempts = :a WHERE id = :i"), {"a": attempts, "i": trial_id})
    finally:
        engine.dispose()


def test_a_claim_whose_answer_was_lost_expires_and_is_requeued(db_url: str, make_job: Callable, open_db: Callable) -> None:
    """A slot claimed in a transaction whose answer never reached the worker (the
    connection cut after the commit) is leased to it unknowingly: its heartbeats must
    not keep that slot alive, or the job never completes."""
    queue = JobQueue(open_db(db_url))
    job = make_job(db_url, budget=2)
    queue.register_worker("w1", host="h", pid=1, gpu=None, device="dev")
    queue.claim_job("w1", "dev")
    known = queue.claim_slot(job.id, "w1")
    orphan = queue.claim_slot(job.id, "w1")  # the answer "lost": the worker holds only `known`
    assert known is not None and orphan is not None
    _backdate(db_url)
    assert queue.heartbeat("w1", {known.id}) == {known.id}
    assert queue.sweep(grace=15, max_retry=2).requeued == 1  # the orphan, not the slot the worker stamped
    assert queue.claim_slot(job.id, "w2") is not None  # another worker can take it


def test_a_lost_lease_cannot_be_heartbeaten_back(db_url: str, make_job: Callable, open_db: Callable) -> None:
    queue = JobQueue(open_db(db_url))
    job = make_job(db_url, budget=2)
    queue.register_worker("w1", host="h", pid=1, gpu=None, device="dev")
    queue.claim_job("w1", "dev")
    lease = queue.claim_slot(job.id, "w1")
    assert lease is not None and queue.heartbeat("w1", {lease.id}) == {lease.id}
    _backdate(db_url)
    assert queue.sweep(grace=15, max_retry=2).requeued == 1
    assert queue.heartbeat("w1", {lease.id}) == set()  # the worker learns it lost the lease
    assert queue.worker_stopped("w1") == 0  # and has nothing to hand back
    assert [w.state for w in queue.list_workers()] == ["stopped"]


@pytest.mark.postgres
def test_a_stalled_transaction_does_not_block_the_others(pg_url: str, make_job: Callable, open_db: Callable) -> None:
    """A worker frozen inside a transaction (SIGSTOP) holds its row locks only until
    PostgreSQL ends the idle transaction; then the others proceed."""
    import time

    frozen = JobQueue(open_db(pg_url), stalled_transaction_timeout=1.0)
    job = make_job(pg_url, budget=3)
    connection = frozen.store.engine.connect()
    connection.execute(text("UPDATE ws_tune_jobs SET seed = 1 WHERE id = :j"), {"j": job.id})  # holds the job's row lock
    started = time.monotonic()
    other = JobQueue(open_db(pg_url))
    assert other.cancel_job(job.id).state == "cancelled"  # waits for the lock, then gets it
    assert 0.8 < time.monotonic() - started < 10
    with pytest.raises(Exception):  # the frozen session was terminated by the server
        connection.execute(text("SELECT 1"))
    connection.invalidate()
    connection.close()


@pytest.mark.postgres
def test_a_worker_frozen_inside_its_heartbeat_does_not_hold_up_the_sweep(pg_url: str, make_job: Callable, open_db: Callable) -> None:
    """A worker frozen inside its heartbeat's transaction (SIGSTOP, a black-holed
    connection) keeps its own row locked until PostgreSQL ends that transaction. The
    sweeper must still re-queue its stale slots meanwhile (it used to wait for the row,
    hit lock_timeout and roll the re-queues back with it), and mark it lost later."""
    queue = JobQueue(open_db(pg_url))
    job = make_job(pg_url, budget=2)
    queue.register_worker("w1", host="h", pid=1, gpu=None, device="dev")
    queue.claim_job("w1", "dev")
    assert queue.claim_slot(job.id, "w1") is not None
    _backdate(pg_url)
    frozen = create_engine(pg_url)
    try:
        with frozen.begin() as connection:  # its last heartbeat that reached the database
            connection.execute(text("UPDATE ws_tune_workers SET heartbeat_at = now() - interval '10 minutes' WHERE id = 'w1'"))
        with frozen.connect() as connection:  # the next one, frozen half-way: the row stays locked
            connection.execute(text("UPDATE ws_tune_workers SET heartbeat_at = now() WHERE id = 'w1'"))
            report = queue.sweep(grace=15, max_retry=2)
            assert (report.requeued, report.lost_workers) == (1, 0)
            connection.rollback()  # PostgreSQL ends it (idle_in_transaction_session_timeout)
        assert queue.sweep(grace=15, max_retry=2).lost_workers == 1  # once the row is free
    finally:
        frozen.dispose()


def test_the_worker_that_finishes_a_job_closes_it_before_any_sweep(db_url: str, make_job: Callable, open_db: Callable) -> None:
    """The worker that records a job's last result closes the job itself and then runs
    its final tournament, which it skips if a sweep closed the job first: sweeps (every
    worker's heartbeat, the server's) leave a finished job to its worker for the grace
    period, and close it after that (its worker died before closing it)."""
    from ws_tuner.result import Status, Timing, TrialResult

    store = open_db(db_url)
    queue = JobQueue(store)
    job = make_job(db_url, budget=1)
    queue.claim_job("w1", "dev")
    lease = queue.claim_slot(job.id, "w1")
    assert lease is not None
    workload = store.workload_id(fake_key())
    candidate = Candidate.make({"only": 1}, None, Lowering.DEFAULT)
    assert queue.assign_candidate(lease, candidate, workload_id=workload) == "assigned"
    result = TrialResult(candidate.hash, Status.OK, timing=Timing(1.0, 1.0, 1.0, 1))
    assert queue.finish_slot(lease, workload_id=workload, candidate=candidate, result=result)
    assert queue.sweep(grace=15, max_retry=2).finished_jobs == 0  # a sweeper between the last result and its worker
    assert queue.complete_job_if_done(job.id)  # the worker: its tournament follows

    second = make_job(db_url, budget=1, problem={"M": 2})
    queue.claim_job("w2", "dev")
    lease = queue.claim_slot(second.id, "w2")
    assert lease is not None and queue.finish_slot(lease, workload_id=workload, candidate=candidate, result=result)
    _backdate_all(db_url)  # its worker died before closing it
    assert queue.sweep(grace=15, max_retry=2).finished_jobs == 1
    assert queue.get_job(second.id).state == "succeeded"


def _backdate_all(db_url: str) -> None:
    """Make every trial and job look last touched ten minutes ago."""
    ago = "now() - interval '10 minutes'" if db_url.startswith("postgresql") else "datetime('now', '-600 seconds')"
    engine = create_engine(db_url)
    try:
        with engine.begin() as connection:
            connection.execute(text(f"UPDATE ws_tune_job_trials SET heartbeat_at = {ago}"))
            connection.execute(text(f"UPDATE ws_tune_jobs SET updated_at = {ago}"))
    finally:
        engine.dispose()
