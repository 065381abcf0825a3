"""Exhaustive search: every surviving point, in enumeration order."""

from __future__ import annotations

from typing import Any, Iterator

from ..result import TrialResult
from ..space import ScheduleSpace
from .base import Proposal, SearchStrategy


class GridSearch(SearchStrategy):
    def pre_tuning(self, space: ScheduleSpace, history: list[tuple[dict[str, Any], TrialResult]]) -> None:
        super().pre_tuning(space, history)
        self._points: Iterator[Proposal] = (Proposal(c) for c in space.candidates())

    def propose(self, n: int) -> list[Proposal]:
        out = []
        for proposal in self._points:
            out.append(proposal)
            if len(out) == n:
                break
        return out
