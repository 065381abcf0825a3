"""Exhaustive search: every surviving point, in enumeration order; each measured
one is a trial of the tuning's study (study.py), as a sampler's would be."""

from __future__ import annotations

from typing import Any, Iterator

from ..candidate import Candidate
from ..result import TrialResult
from ..space import ScheduleSpace
from .base import Proposal, SearchStrategy
from .study import StudyPlace, finished, objective


class GridSearch(SearchStrategy):
    def __init__(self, *, storage: Any = None, study_name: str | None = None) -> None:
        self.place = StudyPlace(storage, study_name)

    def keep_study_in(self, db_url: str, study_name: str) -> None:
        self.place.keep_in(db_url, study_name)

    def pre_tuning(self, space: ScheduleSpace, history: list[tuple[dict[str, Any], TrialResult]]) -> None:
        super().pre_tuning(space, history)
        self.study = self.place.open()[0]
        self._points = _proposals(space)

    def propose(self, n: int) -> list[Proposal]:
        out = []
        for proposal in self._points:
            out.append(proposal)
            if len(out) == n:
                break
        return out

    def notify(self, proposal: Proposal, result: TrialResult) -> None:
        if proposal.decisions:
            self.study.add_trial(finished(self.space, proposal.decisions, objective(result)))

    def post_tuning(self) -> None:
        self.place.close()


def _proposals(space: Any) -> Iterator[Proposal]:
    """Every candidate with its decisions (what a study's trial records); a space
    that only lists candidates gives them without."""
    if not hasattr(space, "walk"):
        yield from (Proposal(c) for c in space.candidates())
        return
    for point, _ in space.walk():
        candidate = space.candidate(point)
        if isinstance(candidate, Candidate):  # the kernel's check on the whole schedule may still refuse it
            yield Proposal(candidate, space.decisions(point))
