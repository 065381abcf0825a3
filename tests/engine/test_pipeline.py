"""The measurement pipeline against a recorder that loses leases, as the job queue does."""

from __future__ import annotations

import pytest

from ws_tuner import search
from ws_tuner.pipeline import SEARCH, Pipeline, PipelineOptions, Recorder, Slot, TaskRef, TuneReport
from ws_tuner.result import Status
from ws_tuner.testing import DummyRunner, VerifyOnlyBuilder

PINNED = {"block_K": (64,), "block_M": (128,), "block_N": (128,), "epilogue": ("direct",), "persistent": (False,), "swizzle": (8,)}


class LosingRecorder(Recorder):
    """Refuses the first result of every slot (its lease expired in flight) and hands
    the same candidate out again, as the sweeper re-queues an expired trial."""

    def __init__(self, budget: int) -> None:
        self.budget, self.claimed = budget, 0
        self.requeued: list[Slot] = []
        self.recorded: dict[str, object] = {}
        self.refused: set[str] = set()

    def claim(self) -> Slot | None:
        if self.requeued:
            return self.requeued.pop()
        if self.claimed == self.budget:
            return None
        self.claimed += 1
        return Slot(SEARCH)

    def record(self, slot, candidate, result) -> bool:
        if candidate.hash not in self.refused:
            self.refused.add(candidate.hash)
            self.requeued.append(Slot(SEARCH, candidate, dict(slot.decisions)))
            return False
        self.recorded[candidate.hash] = result
        return True

    def record_confirmed(self, results) -> None:
        pass


@pytest.fixture
def task(gemm_spec):
    from ws_tuner.task import Task

    return Task.make(gemm_spec, gemm_spec.parse_problem("M=4096,N=4096,K=4096"), PINNED)


def test_a_slot_requeued_after_its_lease_expired_is_measured_again(task):
    recorder, runner = LosingRecorder(budget=3), DummyRunner()
    strategy = search.create("random", seed=1)
    strategy.pre_tuning(task.space(), [])
    ref = TaskRef(str(task.spec.path), task.spec.source_hash, task.problem)
    pipeline = Pipeline(ref, builder=VerifyOnlyBuilder(), runner=runner, strategy=strategy, recorder=recorder,
                        report=TuneReport(None, 0, False), known={}, options=PipelineOptions(max_in_flight=1))  # fmt: skip
    pipeline.run()
    assert len(recorder.refused) == 3 and set(recorder.recorded) == recorder.refused
    # Each was measured twice (the refused run, then the requeued slot's), never reported as done without a result.
    assert all(r.status is not Status.REJECTED for r in recorder.recorded.values()), recorder.recorded
    assert sorted(runner.calls) == sorted(2 * list(recorder.refused))
