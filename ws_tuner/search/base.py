"""The search-strategy lifecycle (after MetaSchedule's SearchStrategy):
``pre_tuning`` -> ``propose`` (an empty list means done) -> ``notify`` -> ``post_tuning``."""

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
    def pre_tuning(self, space: ScheduleSpace, history: list[tuple[dict[str, Any], TrialResult]]) -> None:
        """Start; ``history`` holds earlier measurements (decisions, result) to warm-start from."""
        self.space = space

    @abc.abstractmethod
    def propose(self, n: int) -> list[Proposal]:
        """Up to ``n`` new proposals; an empty list when the space is exhausted."""

    def notify(self, proposal: Proposal, result: TrialResult) -> None:
        """The outcome of a proposal."""

    def post_tuning(self) -> None:
        """Finish; release what the strategy holds."""
