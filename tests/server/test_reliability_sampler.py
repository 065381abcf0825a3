"""Finding 9 of issue 10: the sampler's trials of a lost worker.

A worker asks the job's Optuna study for a trial, then dies before the trial
reaches a slot (or its slot is quarantined): nobody will ever tell the
sampler, and the trial stays RUNNING in the shared study for good. The
server's sweeper fails such orphans once they are older than twice the grace
period; a trial that an open slot holds is left alone (the slot's next worker
tells it).
"""

from __future__ import annotations

from typing import Callable

import optuna
import pytest
from svc_helpers import wait_for

from ws_tuner.candidate import Candidate, Lowering
from ws_tuner.store.queue import JobQueue, optuna_storage, study_name

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.mark.timeout(120)
def test_sweeper_fails_the_sampler_trials_of_lost_workers(
    db_url: str, make_job: Callable, live_server: Callable, open_db: Callable
) -> None:
    job = make_job(db_url, budget=10, strategy="tpe")
    queue = JobQueue(open_db(db_url))
    assert queue.claim_job("lost-worker", "dev") is not None  # the job is running
    storage = optuna_storage(db_url)
    study = optuna.create_study(storage=storage, study_name=study_name(job.id), direction="minimize")
    orphan = study.ask()  # asked, then the worker died before giving it to a slot
    held = study.ask()  # asked and given to a slot: that slot's next worker tells it
    lease = queue.claim_slot(job.id, "lost-worker")
    assert lease is not None
    queue.assign_candidate(lease, Candidate.make({"a": 1}, None, Lowering.DEFAULT), {}, held.number, workload_id=None)
    other = optuna.create_study(storage=storage, study_name="someone-else")
    theirs = other.ask()  # a study that is not a job's: never touched

    live_server(db_url)  # its sweeper: heartbeat 0.3 s, grace 1.5 s
    state = lambda t: storage.get_trial(t._trial_id).state  # noqa: E731
    wait_for(lambda: state(orphan) == optuna.trial.TrialState.FAIL, 30, 0.2, "the orphaned trial to be failed")
    assert state(held) == optuna.trial.TrialState.RUNNING  # its slot was re-queued, not dropped
    assert queue.job_trials(job.id, limit=10)[0][0].state == "queued"
    assert state(theirs) == optuna.trial.TrialState.RUNNING
    storage.engine.dispose()
