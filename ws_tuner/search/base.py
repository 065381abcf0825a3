"""The search-strategy lifecycle (after MetaSchedule's SearchStrategy):
``pre_tuning`` -> ``propose`` (an empty list means done) -> ``notify`` (or ``skip``) -> ``post_tuning``."""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any

from ..candidate import Candidate
from ..result import TrialResult
from ..space import ScheduleSpace


@dataclass
class Proposal:
    """A candidate the strategy wants measured."""

    candidate: Candidate
    decisions: dict[str, Any] = field(default_factory=dict)  # the sampler's view of the point
    token: Any = None  # strategy-private handle (an Optuna trial)


class SearchStrategy(abc.ABC):
    def keep_study_in(self, db_url: str, study_name: str) -> None:
        """Record the tuning as an Optuna study of this name in this database (unless
        the strategy was given a study already); strategies without a sampler keep none."""

    def pre_tuning(self, space: ScheduleSpace, history: list[tuple[dict[str, Any], TrialResult]]) -> None:
        """Start; ``history`` holds earlier measurements (decisions, result) to warm-start from."""
        self.space = space

    @abc.abstractmethod
    def propose(self, n: int) -> list[Proposal]:
        """Up to ``n`` new proposals; an empty list when the space is exhausted."""

    def notify(self, proposal: Proposal, result: TrialResult) -> None:
        """The outcome of a proposal."""

    def skip(self, proposal: Proposal, known: TrialResult | None) -> None:
        """A proposal the pipeline did not measure: its candidate is known (``known``),
        or taken by another trial or slot (None). Not a result of this proposal's own."""
        if known is not None:
            self.notify(proposal, known)

    def post_tuning(self) -> None:
        """Finish; release what the strategy holds."""
