"""The worker's recorder driving the measurement pipeline over a job's leased
slots, on a real store (SQLite and PostgreSQL) with the worker's test doubles."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from svc_helpers import fast_settings

from ws_tuner import search
from ws_tuner.pipeline import Pipeline, PipelineOptions, TuneReport
from ws_tuner.result import Status
from ws_tuner.server.recorder import JobRecorder, Retrying
from ws_tuner.server.worker import Worker
from ws_tuner.store import StoreError
from ws_tuner.store.queue import JobQueue
from ws_tuner.testing.service import FakeBuilder, test_stages
from ws_tuner.workload import WorkloadKey


class LeaseExpiringBuilder(FakeBuilder):
    """Builds instantly, but the first build takes so long that the slot's lease
    expires and the sweeper re-queues it meanwhile."""

    def __init__(self, queue: JobQueue) -> None:
        super().__init__()
        self.queue = queue
        self.submitted: list[str] = []

    def submit(self, build_input):  # type: ignore[no-untyped-def]
        self.submitted.append(build_input.candidate.hash)
        if len(self.submitted) == 1:
            time.sleep(0.05)  # the database clock moves past the slot's heartbeat
            assert self.queue.sweep(grace=0.0, max_retry=5).requeued == 1
        return super().submit(build_input)


def test_a_refused_result_is_measured_again_when_its_slot_comes_back(
    db_url: str, make_job: Callable, open_db: Callable, tmp_path: Path
) -> None:
    """The lease of a slot in flight expires (its result is refused) and the same
    worker claims the re-queued slot: the candidate is measured again and the
    slot closes with a measurement, not with "measured already"."""
    job = make_job(db_url, budget=1, strategy="grid")
    store = open_db(db_url)
    worker = Worker(store, fast_settings(db_url, tmp_path), stages=test_stages())
    job, _ = worker.queue.claim_job(worker.id, worker.device)
    engine = worker.stages.engine(job, tmp_path / "gemm.py")
    key = WorkloadKey.make(engine.kernel, engine.source_hash, engine.problem, worker.stages.environment)
    workload_id = store.workload_id(key)
    strategy = search.create("grid")
    strategy.pre_tuning(engine.space, [])
    builder = LeaseExpiringBuilder(worker.queue)
    pipeline = Pipeline(
        engine.ref, builder=builder, runner=worker.stages.runner, strategy=strategy,
        recorder=JobRecorder(worker, job, workload_id), report=TuneReport(key, workload_id, compile_only=False),
        known={}, options=PipelineOptions(max_in_flight=1, confirm_top=0),
    )  # fmt: skip
    pipeline.run()

    assert len(builder.submitted) == 2 and len(set(builder.submitted)) == 1  # one candidate, built twice
    assert (worker.leases.rejected, worker.leases.finished) == (1, 1)
    trials, count = worker.queue.job_trials(job.id)
    assert count == 1 and trials[0].state == "done" and trials[0].status == Status.OK.value
    assert store.status_counts(workload_id=workload_id) == {Status.OK.value: 1}


def test_a_leaving_worker_makes_no_new_database_call() -> None:
    """Once aborting, a retried call fails without trying: against a silent database each
    try costs its own timeouts, and a leaving worker has many calls on its way out."""
    abort = threading.Event()
    retry = Retrying(abort)
    calls: list[str] = []

    def call(what: str) -> str:
        calls.append(what)
        return what

    assert retry.call("record", call, "before") == "before"
    abort.set()
    with pytest.raises(StoreError, match="not attempted"):
        retry.call("record", call, "after")
    assert calls == ["before"]
