"""Test doubles for the service, selected by the worker's hidden options
(``--space fake``, ``--builder fake``, ``--runner dummy``).

They exist so that queue and reliability tests (hundreds of trials, several
worker processes, kills and restarts) run in seconds on a CPU: the schedule
space of ``examples/gemm.py`` needs tilelang to enumerate and has over 100k
candidates. Nothing here imports tilelang or torch.
"""

from __future__ import annotations

import itertools
import time
from concurrent.futures import Future
from importlib import metadata
from typing import Any, Callable, Iterator, Sequence

from ..builder import Builder, BuildInput, BuildResult
from ..candidate import Candidate, Lowering
from ..result import Status
from ..testing import DUMMY_DEVICE, DummyRunner
from ..workload import Environment

FAKE_AXES: dict[str, tuple[int, ...]] = {name: tuple(range(12)) for name in ("a", "b", "c", "d")}  # 20,736 points


class FakeSpace:
    """A synthetic space with the interface search strategies use
    (``sample``, ``candidate``, ``candidates``): points are parameter dicts,
    candidates use tilelang's default lowering, so no schedule is involved."""

    def __init__(self, axes: dict[str, tuple[int, ...]] | None = None) -> None:
        self.axes_ = dict(axes or FAKE_AXES)

    def sample(self, choose: Callable[[str, Sequence[Any]], Any]) -> dict[str, Any]:
        return {name: choose(name, values) for name, values in self.axes_.items()}

    def candidate(self, point: dict[str, Any]) -> Candidate:
        return Candidate.make(dict(point), None, Lowering.DEFAULT)

    def random_point(self, rng: Any) -> dict[str, Any]:
        return {name: rng.choice(values) for name, values in self.axes_.items()}

    def decisions(self, point: dict[str, Any]) -> dict[str, Any]:
        return dict(point)

    def candidates(self) -> Iterator[Candidate]:
        names = list(self.axes_)
        for values in itertools.product(*self.axes_.values()):
            yield self.candidate(dict(zip(names, values)))

    def param_points(self) -> Iterator[tuple[tuple[str, Any], ...]]:
        yield ()

    def axes(self) -> dict[str, tuple[Any, ...]]:
        return dict(self.axes_)


def fake_baselines() -> list[Candidate]:
    """Stand-ins for the kernel's own schedule and tilelang's lowerings."""
    return [Candidate.make({}, None, Lowering(name)) for name in ("role_based", "reference")]


def fake_latency(candidate: Candidate) -> float:
    """One optimum at a=b=c=d=5, so samplers have something to find; baselines at 1 ms."""
    if candidate.lowering is not Lowering.DEFAULT:
        return 1.0
    return 0.5 + sum((v - 5) ** 2 for v in candidate.param_dict.values() if isinstance(v, int)) / 100


class FakeBuilder(Builder):
    """Builds nothing, instantly (optionally after ``delay`` seconds)."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay

    def submit(self, build_input: BuildInput) -> "Future[BuildResult]":
        if self.delay:
            time.sleep(self.delay)
        fut: Future[BuildResult] = Future()
        fut.set_result(BuildResult(build_input.candidate, Status.BUILT, "fake build (test double)", 0.0))
        return fut


class FastDummyRunner(DummyRunner):
    """``DummyRunner`` whose environment does not import tilelang (a second of
    start-up per worker process, on a 2-core machine running eight of them)."""

    def environment(self) -> Environment:
        try:
            tilelang = metadata.version("tilelang")
        except metadata.PackageNotFoundError:
            tilelang = "none"
        return Environment("sm_90a", DUMMY_DEVICE, tilelang, "none", "dummy")
