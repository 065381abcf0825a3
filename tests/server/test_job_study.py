"""A service job's Optuna study (``job-N``, in the job's database) is a record fit
for optuna-dashboard: one trial per measured search slot, the objective named,
nothing failed that did not fail. Real queue and storage, a worker of test doubles."""

from __future__ import annotations

from typing import Callable

import optuna
import pytest
from optuna.trial import TrialState
from svc_helpers import wait_for

from ws_tuner.search.study import METRIC_NAME
from ws_tuner.store.sampler import optuna_storage, study_name
from ws_tuner.testing.service import FakeSpace


@pytest.mark.parametrize("strategy", ["tpe", "random"])
def test_a_jobs_study_holds_its_measured_trials(db_url: str, make_job: Callable, queue_of: Callable, worker_thread: Callable,
                                                strategy: str) -> None:  # fmt: skip
    job = make_job(db_url, budget=12, strategy=strategy)
    worker = worker_thread(db_url)
    queue = queue_of(db_url)
    wait_for(lambda: queue.get_job(job.id).state == "succeeded", 60, 0.1, "the job")
    worker.stop()
    storage = optuna_storage(db_url)
    try:
        study = optuna.load_study(study_name=study_name(job.id), storage=storage)
        assert study.metric_names == [METRIC_NAME]
        assert len(study.trials) == 12 and {t.state for t in study.trials} == {TrialState.COMPLETE}
        slots, _ = queue.job_trials(job.id, limit=100)
        searched = {t.candidate_hash for t in slots if t.kind == "search"}
        assert {FakeSpace().candidate(t.params).hash for t in study.trials} == searched  # a trial per measured slot
        assert optuna.importance.get_param_importances(study)
    finally:
        storage.engine.dispose()
