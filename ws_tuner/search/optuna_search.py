"""Optuna-driven search (random, TPE) over the space's define-by-run decisions.

Ask/tell in batches: the tuner asks for a batch, builds and runs it while
asking for the next. Points the space's static rules refuse are told as
PRUNED, so that TPE steers away from them (sparse spaces, such as attention's,
refuse most random points); failed measurements as FAIL, so the sampler
learns nothing false from them; measured ones as their ratio to the tuning's
anchor (``objective``).
"""

from __future__ import annotations

import logging
import random
import warnings
from typing import Any

import optuna

from ..result import Status, TrialResult
from ..space import ScheduleSpace
from .base import Proposal, SearchStrategy

# A sampler stuck in a pruned or fully measured corner gives up after this many tries per proposal.
MAX_PRUNED_IN_A_ROW = 200
REPEATS_BEFORE_EXPLORING = 5


def objective(result: TrialResult) -> float | None:
    """What the sampler minimizes: the ratio to the anchor (it survives a change of
    clock state), else the time; None for a failure."""
    if result.status is not Status.OK or result.timing is None:
        return None
    return result.ratio if result.ratio is not None else result.timing.median_ms


class OptunaSearch(SearchStrategy):
    def __init__(self, kind: str, *, seed: int = 0, storage: str | None = None, study_name: str | None = None):
        self.kind, self.seed = kind, seed
        self.storage, self.study_name = storage, study_name
        optuna.logging.set_verbosity(logging.WARNING)
        # group=True is "experimental" in name only; it is what define-by-run spaces need.
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

    def pre_tuning(self, space: ScheduleSpace, history: list[tuple[dict[str, Any], TrialResult]]) -> None:
        super().pre_tuning(space, history)
        self._rng = random.Random(self.seed + 1)  # the explorer's
        self._sampler = (
            optuna.samplers.RandomSampler(seed=self.seed)
            if self.kind == "random"
            else optuna.samplers.TPESampler(seed=self.seed, multivariate=True, group=True, constant_liar=True, n_startup_trials=10)
        )
        self.study = optuna.create_study(
            direction="minimize", sampler=self._sampler, storage=self.storage, study_name=self.study_name, load_if_exists=True
        )
        self._seen: set[str] = set()
        self._values: dict[str, float] = {}  # candidate hash -> measured median ms
        self.pruned = 0  # sampled points the static rules refused
        known = {tuple(sorted(t.params.items())) for t in self.study.trials}
        for decisions, result in history:
            if not decisions or tuple(sorted(decisions.items())) in known:
                continue
            self._add_history(decisions, result)

    def _add_history(self, decisions: dict[str, Any], result: TrialResult) -> None:
        distributions = {k: optuna.distributions.CategoricalDistribution(v) for k, v in self._choices(decisions).items()}
        value = objective(result)
        self.study.add_trial(
            optuna.trial.create_trial(
                params=decisions,
                distributions=distributions,
                value=value,
                state=optuna.trial.TrialState.COMPLETE if value is not None else optuna.trial.TrialState.FAIL,
            )
        )
        self._seen.add(result.candidate_hash)
        if value is not None:
            self._values[result.candidate_hash] = value

    def _choices(self, decisions: dict[str, Any]) -> dict[str, tuple[Any, ...]]:
        """Each decision's choice list, by replaying the space's sampler."""
        choices: dict[str, tuple[Any, ...]] = {}

        def record(name: str, options: Any) -> Any:
            choices[name] = tuple(options)
            return decisions[name] if decisions.get(name) in choices[name] else choices[name][0]

        self.space.sample(record)
        return {k: v for k, v in choices.items() if k in decisions}

    def propose(self, n: int) -> list[Proposal]:
        """Up to ``n`` new candidates; empty once no unseen point can be found."""
        out: list[Proposal] = []
        misses = 0
        while len(out) < n and misses < MAX_PRUNED_IN_A_ROW:
            # A converged TPE keeps proposing its favourite; after a few misses, explore: a random
            # point that passes the static rules (most random decisions are pruned in a sparse space).
            if misses >= REPEATS_BEFORE_EXPLORING:
                point = self.space.random_point(self._rng)
                if point is None:
                    break
                self.study.enqueue_trial(self.space.decisions(point), skip_if_exists=False)
            try:
                proposal = self._ask()
            except optuna.exceptions.UpdateFinishedTrialError:
                proposal = None  # a shared study's sweeper closed the trial while this process stalled: ask again
            if proposal is None:
                misses += 1
                continue
            misses = 0
            out.append(proposal)
        return out

    def _ask(self) -> Proposal | None:
        """One trial of the study as a new candidate; None (the trial told) when pruned or seen."""
        trial = self.study.ask()
        point = self.space.sample(lambda name, options: trial.suggest_categorical(name, list(options)))
        candidate = self.space.candidate(point)
        if isinstance(candidate, str):  # PRUNED, not FAIL: TPE counts pruned trials among the bad ones and learns to avoid them
            self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            self.pruned += 1
            return None
        if candidate.hash in self._seen:  # measured already: tell the sampler what it was
            known = self._values.get(candidate.hash)
            if known is None:
                self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
            else:
                self.study.tell(trial, known)
            return None
        self._seen.add(candidate.hash)
        return Proposal(candidate, dict(trial.params), token=trial)

    def notify(self, proposal: Proposal, result: TrialResult) -> None:
        if proposal.token is None:
            return
        value = objective(result)
        if value is not None:
            self._values[result.candidate_hash] = value
            self.study.tell(proposal.token, value)
        else:
            self.study.tell(proposal.token, state=optuna.trial.TrialState.FAIL)
