"""Test doubles for the service: a synthetic space, a builder that builds
nothing, a fast dummy runner, and the ``Stages`` that put them in a worker.
Tests start such workers in a thread (``test_stages``) or as a process through
the test-only entry point ``python -m ws_tuner.testing.worker``; the
production ``ws-tune worker`` has none of this.

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

from pathlib import Path

from ..builder import Builder, BuildInput, BuildResult
from ..candidate import Candidate, Lowering
from ..result import Status
from ..runner import EvaluatorConfig, Runner, RunInput
from ..server.stages import JobEngine, Stages, WorkerOptions
from ..store.queue import JobRecord
from ..workload import Environment
from . import DUMMY_DEVICE, DummyRunner, OutOfMemoryRunner, VerifyOnlyBuilder

# A device name no real GPU has: results of test doubles can never be mistaken
# for (or reused as) a real compile-only or timed tuning's.
COMPILE_ONLY_DOUBLE = "compile-only (test double)"

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

    def gbps(self, run_input: RunInput, ms: float) -> float | None:
        return None  # loading the kernel file would import tilelang; the fake space's points move nothing


class TestStages(Stages):
    """A worker's stages made of test doubles; with ``fake_space`` the job's
    kernel file is not even loaded (the synthetic space stands in for it)."""

    def __init__(self, builder: Builder, runner: Runner | None, options: WorkerOptions, *, fake_space: bool) -> None:
        env = runner.environment() if runner else Environment("sm_90a", COMPILE_ONLY_DOUBLE, "none", "none", "none")
        super().__init__(builder, runner, env, options)
        self.fake_space = fake_space

    def engine(self, job: JobRecord, kernel_path: Path) -> JobEngine:
        if not self.fake_space:
            return super().engine(job, kernel_path)
        return JobEngine(job.kernel, str(kernel_path), job.kernel_sha256, dict(job.problem), FakeSpace(), baselines=fake_baselines,
                         anchors=lambda: fake_baselines()[:1], evaluator=EvaluatorConfig(timeout=self.options.run_timeout))  # fmt: skip


def test_stages(*, builder: str = "fake", runner: str = "dummy", space: str = "fake", runner_delay: float = 0.0,
                options: WorkerOptions = WorkerOptions()) -> TestStages:  # fmt: skip
    """Stages by name: builder fake|verify-only, runner dummy|oom|none (oom: every run out of
    GPU memory), space fake|kernel."""
    builders: dict[str, Callable[[], Builder]] = {"fake": FakeBuilder, "verify-only": VerifyOnlyBuilder}
    if builder not in builders or runner not in ("dummy", "oom", "none") or space not in ("fake", "kernel"):
        raise ValueError(f"unknown test stages {builder}/{runner}/{space}")
    fake_space = space == "fake"
    dummy: Runner | None = None
    if runner == "dummy":
        # The engine's own double on a real kernel: the same workload key as its tests.
        dummy = FastDummyRunner(delay=runner_delay, latency=fake_latency) if fake_space else DummyRunner(delay=runner_delay)
    elif runner == "oom":
        dummy = OutOfMemoryRunner()
    return TestStages(builders[builder](), dummy, options, fake_space=fake_space)


test_stages.__test__ = False  # type: ignore[attr-defined]  # a factory, not a pytest test
TestStages.__test__ = False  # type: ignore[attr-defined]
