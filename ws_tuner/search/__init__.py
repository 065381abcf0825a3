"""Search strategies: which candidates to measure next.

``create(kind)`` resolves a strategy by name, as MetaSchedule's ``X.create`` does.
"""

from __future__ import annotations

from .base import Proposal, SearchStrategy
from .grid import GridSearch
from .optuna_search import OptunaSearch
from .study import study_name_of

KINDS = ("grid", "random", "tpe")


def create(kind: str, *, seed: int = 0, storage: str | None = None, study_name: str | None = None) -> SearchStrategy:
    if kind == "grid":
        return GridSearch(storage=storage, study_name=study_name)
    if kind in ("random", "tpe"):
        return OptunaSearch(kind, seed=seed, storage=storage, study_name=study_name)
    raise ValueError(f"unknown search strategy {kind!r}; choose one of {', '.join(KINDS)}")


__all__ = ["KINDS", "GridSearch", "OptunaSearch", "Proposal", "SearchStrategy", "create", "study_name_of"]
