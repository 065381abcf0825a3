"""The tuning's Optuna study, the record optuna-dashboard reads: where it lives
(the storage a worker gives, else the tuning's database, else memory), its name,
the objective's name, and trials made from measured proposals."""

from __future__ import annotations

import hashlib
import json
import logging
import warnings
from typing import Any

import optuna
from optuna.trial import TrialState

from ..result import Status, TrialResult

# What optuna-dashboard labels the objective with (else "Objective 0").
METRIC_NAME = "time / anchor's time"
PINS_SHOWN = 200


def objective(result: TrialResult) -> float | None:
    """What the sampler minimizes: the ratio to the anchor (it survives a change of
    clock state), else the time; None for a failure."""
    if result.status is not Status.OK or result.timing is None:
        return None
    return result.ratio if result.ratio is not None else result.timing.median_ms


def study_name_of(key: Any, workload_id: int, pinned: dict[str, tuple[Any, ...]] | None = None) -> str:
    """The study of a command-line tuning: one per workload and kernel-parameter grid, so
    that a re-run resumes it (a study's categorical choices cannot change: a run pinned
    with ``--param`` to part of the grid keeps a study of its own)."""
    problem = ",".join(f"{k}={v}" for k, v in json.loads(key.problem).items())
    pins = "".join(f" {k}={'|'.join(map(str, v))}" for k, v in sorted((pinned or {}).items()))
    if len(pins) > PINS_SHOWN:  # Optuna's study names hold 512 characters
        pins = " " + hashlib.sha256(pins.encode()).hexdigest()[:12]
    return f"{key.kernel} {problem} on {key.device} (workload {workload_id}){pins and ' pinned' + pins}"


def distributions(space: Any, decisions: dict[str, Any]) -> dict[str, optuna.distributions.BaseDistribution]:
    """Each decision's choices, by replaying the space's sampler (a define-by-run space)."""
    choices: dict[str, tuple[Any, ...]] = {}

    def record(name: str, options: Any) -> Any:
        choices[name] = tuple(options)
        return decisions[name] if decisions.get(name) in choices[name] else choices[name][0]

    space.sample(record)
    return {k: optuna.distributions.CategoricalDistribution(v) for k, v in choices.items() if k in decisions}


def finished(space: Any, decisions: dict[str, Any], value: float | None) -> optuna.trial.FrozenTrial:
    """A measured proposal as a finished trial: COMPLETE with its objective, or FAIL."""
    state = TrialState.COMPLETE if value is not None else TrialState.FAIL
    return optuna.trial.create_trial(params=decisions, distributions=distributions(space, decisions), value=value, state=state)


class StudyPlace:
    """Where the study lives and what it is called; ``open`` it at the start, ``close`` at the end."""

    def __init__(self, storage: Any = None, study_name: str | None = None) -> None:
        self.storage, self.study_name = storage, study_name
        self.db_url: str | None = None  # a database whose storage this place opens and closes itself
        optuna.logging.set_verbosity(logging.WARNING)
        # group=True and metric names are "experimental" in name only.
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

    def keep_in(self, db_url: str, study_name: str) -> None:
        if self.storage is None:  # a storage given (a service job's) wins
            self.db_url, self.study_name = db_url, study_name

    def open(self) -> tuple[optuna.Study, Any, int]:
        """(the study, its storage, its id), created on first use, its objective named."""
        if self.db_url is not None and self.storage is None:
            from ..store.sampler import optuna_storage

            self.storage = optuna_storage(self.db_url)
        storage = optuna.storages.get_storage(self.storage) if self.storage is not None else optuna.storages.InMemoryStorage()
        study = optuna.create_study(direction="minimize", storage=storage, study_name=self.study_name, load_if_exists=True)
        if study.metric_names != [METRIC_NAME]:
            study.set_metric_names([METRIC_NAME])
        return study, storage, storage.get_study_id_from_name(study.study_name)

    def close(self) -> None:
        if self.db_url is not None and self.storage is not None:
            self.storage.engine.dispose()
            self.storage = None
