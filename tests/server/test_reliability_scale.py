"""Reliability scenario 6: 8 worker processes share one job of 500 trials, on
PostgreSQL and on SQLite (WAL): exactly 500 terminal trials, no candidate twice,
and the store holds exactly the 500 measured results.

The workers are real `ws-tune worker` processes; the space, builder and runner
are the package's fast test doubles, so the test measures the queue. By
default the job uses the grid strategy (every worker walks the same order, so
the duplicate-candidate guard is exercised on nearly every claim); the
``slow``-marked variant shares the job's Optuna study (random sampler, RDB
storage on the same database), which costs about a minute per database on two
cores, mostly in Optuna's own storage round trips.
"""

from __future__ import annotations

import time
from typing import Callable

import pytest
from sqlalchemy import create_engine, text
from svc_helpers import FAKE_ARGS, wait_for

WORKERS, TRIALS = 8, 500


def _rows(db_url: str, sql: str, **params: object) -> list:
    engine = create_engine(db_url)
    try:
        with engine.connect() as connection:
            return connection.execute(text(sql), params).fetchall()
    finally:
        engine.dispose()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("strategy", ["grid", pytest.param("random", marks=pytest.mark.slow)])
def test_eight_workers_five_hundred_trials(
    strategy: str, db_url: str, make_job: Callable, spawn_worker: Callable, queue_of: Callable
) -> None:
    job = make_job(db_url, budget=TRIALS, strategy=strategy)
    queue = queue_of(db_url)
    started = time.monotonic()
    # Leases generous enough for eight processes on two cores: no trial should be re-queued here.
    procs = [spawn_worker(db_url, *FAKE_ARGS, "--exit-when-idle", heartbeat=1.0, grace=20.0) for _ in range(WORKERS)]
    done = wait_for(lambda: (j := queue.get_job(job.id)).state != "running" and j.state != "queued" and j, 240, 0.5, "the job")
    codes = [p.wait(timeout=60) for p in procs]
    elapsed = time.monotonic() - started

    assert done.state == "succeeded", done
    assert codes == [0] * WORKERS, [p.log_path.read_text()[-2000:] for p in procs]
    slots = _rows(db_url, "SELECT slot, state, candidate_hash, worker_id, kind FROM ws_tune_job_trials WHERE job_id = :j", j=job.id)
    assert len(slots) == TRIALS and {s.state for s in slots} == {"done"} and {s.kind for s in slots} == {"search"}
    assert sorted(s.slot for s in slots) == list(range(TRIALS))  # every slot once
    assert len({s.candidate_hash for s in slots}) == TRIALS  # no candidate twice
    assert done.slots_claimed == TRIALS and done.search_counts == {"done": TRIALS}
    trials = _rows(db_url, "SELECT COUNT(*), COUNT(DISTINCT candidate_id) FROM ws_tune_trials WHERE workload_id = :w", w=done.workload_id)
    assert trials[0] == (TRIALS, TRIALS)  # measured results stored once each
    shared = {s.worker_id for s in slots}
    assert len(shared) >= 2, "the job was not shared"
    print(f"\n{WORKERS} workers x {TRIALS} trials ({strategy}) on {db_url.split(':')[0]}: {elapsed:.1f} s, "
          f"{len(shared)} workers took part")  # fmt: skip
