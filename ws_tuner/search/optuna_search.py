"""Optuna-driven search (random, TPE) over the space's define-by-run decisions.

Two studies. The *study* (in the given storage, the tuning's database; else in
memory) is the record: one trial per measured proposal plus the history it
was warm-started from, its objective named, so that optuna-dashboard's
history and importance views show the tuning as it was. The *scratch* study
(in memory, this process's) is where the sampler draws: it mirrors the study's
trials (other workers' too: their running ones are constant-liar guesses) and
also holds what the study must not, the points the space's static rules refuse
(told PRUNED, so that TPE steers away from them: sparse spaces, such as
attention's, refuse most random points) and repeats of measured points.

A proposal becomes a trial of the study only when the pipeline keeps it: when
a recorder asks for its trial number (a job slot holds it) or when its result
is told. Measured ones are told their ratio to the tuning's anchor
(``objective``); failed ones FAIL, so the sampler learns nothing false.
"""

from __future__ import annotations

import datetime
import random
from typing import Any

import optuna
from optuna.trial import TrialState

from ..result import TrialResult
from ..space import ScheduleSpace
from .base import Proposal, SearchStrategy
from .study import StudyPlace, finished, objective

# A sampler stuck in a pruned or fully measured corner gives up after this many tries per proposal.
MAX_PRUNED_IN_A_ROW = 200
REPEATS_BEFORE_EXPLORING = 5


class _Pending:
    """A proposal's handle: its scratch trial now, its trial in the study once kept."""

    def __init__(self, search: OptunaSearch, scratch: optuna.Trial, params: dict[str, Any]) -> None:
        self.search, self.scratch, self.params = search, scratch, params
        self.proposed_at = datetime.datetime.now()  # Optuna's clock is local time
        self.trial: optuna.Trial | None = None

    @property
    def number(self) -> int:
        """The trial number in the study (created on first use, RUNNING)."""
        return self.kept().number

    def kept(self) -> optuna.Trial:
        if self.trial is None:
            self.trial = self.search._keep(self)
        return self.trial


class OptunaSearch(SearchStrategy):
    def __init__(self, kind: str, *, seed: int = 0, storage: Any = None, study_name: str | None = None):
        self.kind, self.seed = kind, seed
        self.place = StudyPlace(storage, study_name)

    def keep_study_in(self, db_url: str, study_name: str) -> None:
        self.place.keep_in(db_url, study_name)

    def post_tuning(self) -> None:
        self.place.close()

    def pre_tuning(self, space: ScheduleSpace, history: list[tuple[dict[str, Any], TrialResult]]) -> None:
        super().pre_tuning(space, history)
        self._rng = random.Random(self.seed + 1)  # the explorer's
        sampler = (
            optuna.samplers.RandomSampler(seed=self.seed)
            if self.kind == "random"
            else optuna.samplers.TPESampler(seed=self.seed, multivariate=True, group=True, constant_liar=True, n_startup_trials=10)
        )
        self.study, self._storage, self._study_id = self.place.open()
        self._scratch_storage = optuna.storages.InMemoryStorage()
        self._scratch = optuna.create_study(direction="minimize", sampler=sampler, storage=self._scratch_storage)
        self._scratch_id = self._scratch_storage.get_study_id_from_name(self._scratch.study_name)
        self._mirror: dict[int, int | None] = {}  # study trial number -> its running scratch twin (None: nothing left to mirror)
        self._seen: set[str] = set()
        self._values: dict[str, float] = {}  # candidate hash -> objective
        self.pruned = 0  # sampled points the static rules refused
        known = {tuple(sorted(t.params.items())) for t in self.study.get_trials(deepcopy=False)}
        for decisions, result in history:
            self._seen.add(result.candidate_hash)
            value = objective(result)
            if value is not None:
                self._values[result.candidate_hash] = value
            if decisions and tuple(sorted(decisions.items())) not in known:
                self.study.add_trial(finished(space, decisions, value))

    def _sync(self) -> None:
        """Mirror the study's trials (every worker's) into the scratch study."""
        for t in self.study.get_trials(deepcopy=False):
            if t.number not in self._mirror:
                if t.state is TrialState.WAITING:
                    continue
                template = optuna.trial.create_trial(state=t.state, values=t.values, params=t.params, distributions=t.distributions)
                scratch_id = self._scratch_storage.create_new_trial(self._scratch_id, template_trial=template)
                self._mirror[t.number] = scratch_id if t.state is TrialState.RUNNING else None
            elif (scratch_id := self._mirror[t.number]) is not None and t.state.is_finished():
                self._scratch_storage.set_trial_state_values(scratch_id, t.state, t.values)
                self._mirror[t.number] = None

    def _keep(self, pending: _Pending) -> optuna.Trial:
        """The proposal's trial in the study: RUNNING, with the proposal's decisions."""
        template = optuna.trial.create_trial(state=TrialState.RUNNING, params=pending.params, distributions=pending.scratch.distributions)
        template.datetime_start = pending.proposed_at
        trial = optuna.Trial(self.study, self._storage.create_new_trial(self._study_id, template_trial=template))
        self._mirror[trial.number] = None  # its scratch twin is the proposal's own trial, told with the study's
        return trial

    def propose(self, n: int) -> list[Proposal]:
        """Up to ``n`` new candidates; empty once no unseen point can be found."""
        self._sync()
        out: list[Proposal] = []
        misses = 0
        while len(out) < n and misses < MAX_PRUNED_IN_A_ROW:
            # A converged TPE keeps proposing its favourite; after a few misses, explore: a random
            # point that passes the static rules (most random decisions are pruned in a sparse space).
            if misses >= REPEATS_BEFORE_EXPLORING:
                point = self.space.random_point(self._rng)
                if point is None:
                    break
                self._scratch.enqueue_trial(self.space.decisions(point), skip_if_exists=False)
            trial = self._scratch.ask()
            point = self.space.sample(lambda name, options, trial=trial: trial.suggest_categorical(name, list(options)))
            candidate = self.space.candidate(point)
            if isinstance(candidate, str):  # PRUNED, not FAIL: TPE counts pruned trials among the bad ones and learns to avoid them
                self._scratch.tell(trial, state=TrialState.PRUNED)
                self.pruned += 1
                misses += 1
                continue
            if candidate.hash in self._seen:  # measured already: tell the sampler what it was
                self._tell_scratch(trial, self._values.get(candidate.hash))
                misses += 1
                continue
            self._seen.add(candidate.hash)
            misses = 0
            out.append(Proposal(candidate, dict(trial.params), token=_Pending(self, trial, dict(trial.params))))
        return out

    def _tell_scratch(self, trial: optuna.Trial, value: float | None) -> None:
        if value is None:
            self._scratch.tell(trial, state=TrialState.FAIL)
        else:
            self._scratch.tell(trial, value)

    def notify(self, proposal: Proposal, result: TrialResult) -> None:
        token = proposal.token
        if token is None:
            return
        value = objective(result)
        if value is not None:
            self._values[result.candidate_hash] = value
        # A retried job slot carries the study's trial number (another worker's proposal).
        trial = token.kept() if isinstance(token, _Pending) else token
        if value is not None:
            self.study.tell(trial, value)
        else:
            self.study.tell(trial, state=TrialState.FAIL)
        if isinstance(token, _Pending):
            self._tell_scratch(token.scratch, value)

    def skip(self, proposal: Proposal, known: TrialResult | None) -> None:
        """A proposal the pipeline did not measure (known, taken, or in flight already):
        only the scratch study learns it, from ``known``'s value if any."""
        token = proposal.token
        if isinstance(token, _Pending) and token.trial is None:
            self._tell_scratch(token.scratch, objective(known) if known is not None else None)
        elif known is not None:
            self.notify(proposal, known)
        elif token is not None:  # kept already (a slot took its number), then lost to another: not measured, not failed
            self.study.tell(token.kept() if isinstance(token, _Pending) else token, state=TrialState.PRUNED)
            if isinstance(token, _Pending):
                self._scratch.tell(token.scratch, state=TrialState.PRUNED)
