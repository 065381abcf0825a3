"""Every tuning is an Optuna study in the tuning's own database, fit for
optuna-dashboard: the objective named, one trial per measured proposal (points
the static rules refuse and repeats are not trials of it), importances computable.
Real store (SQLite and PostgreSQL), real space and verifier, the runner double."""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState

from ws_tuner import search
from ws_tuner.search.study import METRIC_NAME
from ws_tuner.store.sampler import optuna_storage
from ws_tuner.testing import DummyRunner, VerifyOnlyBuilder
from ws_tuner.tune import SEARCH, TuneOptions, Tuner

# Free enough that random sampling refuses many points (register file, shared memory, warpgroups).
AXES = {"block_K": (64,), "block_M": (128,), "block_N": (128, 256), "epilogue": ("direct",), "persistent": (False,), "swizzle": (0, 8)}


@pytest.fixture
def task(gemm_spec):
    from ws_tuner.task import Task

    return Task.make(gemm_spec, gemm_spec.parse_problem("M=4096,N=4096,K=4096"), AXES)


def _tune(task, store, strategy: str, budget: int):
    tuner = Tuner(task, store=store, builder=VerifyOnlyBuilder(), runner=DummyRunner(), strategy=search.create(strategy, seed=3),
                  options=TuneOptions(budget=budget, confirm_top=0))  # fmt: skip
    return tuner.run()


def _study(store, report) -> optuna.Study:
    storage = optuna_storage(store.url)
    names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
    [name] = [n for n in names if f"(workload {report.workload_id})" in n]
    return optuna.load_study(study_name=name, storage=storage)


@pytest.mark.parametrize("strategy", ["tpe", "random", "grid"])
def test_a_cli_tuning_is_a_named_study_of_its_measurements(task, store, strategy: str) -> None:
    report = _tune(task, store, strategy, budget=14)
    searched = [r for r in report.records if r.role == SEARCH]
    assert len(searched) == 14
    assert report.pruned > 0 or strategy == "grid"  # the sampler did meet refused points ...
    study = _study(store, report)
    states = [t.state for t in study.trials]
    assert TrialState.PRUNED not in states and TrialState.FAIL not in states  # ... and none of them is a trial of the study
    assert len(study.trials) == 14 and all(s is TrialState.COMPLETE for s in states)
    assert study.metric_names == [METRIC_NAME]
    assert "gemm" in study.study_name and "M=4096" in study.study_name
    assert sorted(t.value for t in study.trials) == sorted(r.result.ratio for r in searched)
    for trial in study.trials:  # what optuna-dashboard's history shows: decisions and when they ran
        assert trial.params and trial.datetime_start <= trial.datetime_complete
    importances = optuna.importance.get_param_importances(study)
    assert importances and abs(sum(importances.values()) - 1.0) < 1e-6


def test_a_rerun_resumes_its_study(task, store) -> None:
    first = _tune(task, store, "tpe", budget=6)
    assert len(_study(store, first).trials) == 6
    second = _tune(task, store, "tpe", budget=10)  # four more
    study = _study(store, second)
    assert second.workload_id == first.workload_id
    assert len(study.trials) == 10 and {t.state for t in study.trials} == {TrialState.COMPLETE}
