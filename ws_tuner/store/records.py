"""What the store hands out: frozen records, never ORM objects (so nothing outside
the store can lazily touch the database), and the mappers from table rows to them.
Times come back as aware UTC, stamped by the database clock."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..candidate import Candidate
from ..result import Status, Timing, TrialResult
from ..workload import WorkloadKey
from .engine import utc
from .models import CandidateModel, JobModel, JobTrialModel, TrialModel, WorkerModel, WorkloadModel


def opt_utc(value: datetime | None) -> datetime | None:
    return utc(value) if value is not None else None


def dumps(data: Any) -> str:
    """JSON text to store. Sorted keys: equal payloads store equal text. default=str
    keeps odd values (numpy scalars, paths) in `info` from failing a commit over a diagnostic."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)


# --- results ------------------------------------------------------------------


@dataclass(frozen=True)
class StoredTrial:
    """One stored outcome, detached from the database."""

    candidate: Candidate
    result: TrialResult
    workload_id: int
    created_at: datetime  # UTC, stamped by the database clock
    updated_at: datetime

    @property
    def status(self) -> Status:
        return self.result.status


def stored_result(candidate_hash: str, trial: Any) -> TrialResult:
    """A trial row (ORM object or Core row) as the result it stores."""
    timing = None
    if trial.median_ms is not None:
        timing = Timing(trial.median_ms, trial.p20_ms or 0.0, trial.p80_ms or 0.0, trial.reps or 0)
    return TrialResult(
        candidate_hash=candidate_hash, status=Status(trial.status), message=trial.message,
        build_seconds=trial.build_seconds, timing=timing, tflops=trial.tflops, gbps=trial.gbps, info=json.loads(trial.info),
        ratio=trial.ratio, confirmed=bool(trial.confirmed),
    )  # fmt: skip


def stored_trial(trial: TrialModel, candidate: CandidateModel) -> StoredTrial:
    data = {
        "lowering": candidate.lowering,
        "params": json.loads(candidate.params),
        "schedule": json.loads(candidate.schedule) if candidate.schedule else None,
    }
    return StoredTrial(
        Candidate.from_json(data), stored_result(candidate.hash, trial), trial.workload_id, utc(trial.created_at),
        utc(trial.updated_at),
    )


def workload_key(row: WorkloadModel) -> WorkloadKey:
    return WorkloadKey(
        kernel=row.kernel,
        source_hash=row.source_hash,
        problem=row.problem,
        arch=row.arch,
        device=row.device,
        tilelang_version=row.tilelang_version,
        cuda_version=row.cuda_version,
        driver_version=row.driver_version,
    )


# --- the job queue -------------------------------------------------------------


@dataclass(frozen=True)
class NewJob:
    """A job to create (``Jobs.create_jobs``); ``kernel_sha256`` is looked up when not given."""

    kernel_id: int
    kernel: str
    problem: dict[str, Any]
    problem_checked: bool
    params: str | None
    strategy: str
    seed: int
    budget: int
    time_budget: float | None = None
    baselines: bool = False
    device: str | None = None
    created_by: int | None = None
    kernel_sha256: str | None = None


@dataclass(frozen=True)
class JobRecord:
    id: int
    state: str
    kernel: str
    kernel_id: int
    kernel_sha256: str
    problem: dict[str, Any]
    problem_checked: bool
    params: str | None
    strategy: str
    seed: int
    budget: int
    time_budget: float | None
    baselines: bool
    device: str | None
    workload_id: int | None
    slots_claimed: int
    exhausted: bool
    error: str | None
    created_by: int | None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    counts: dict[str, int] = field(default_factory=dict)  # slot state -> how many (search and baseline)
    search_counts: dict[str, int] = field(default_factory=dict)  # the same, search slots only
    best_ms: float | None = None
    best_candidate: str | None = None


def job_record(job: JobModel, kernel_sha256: str, **tallies: Any) -> JobRecord:
    """``tallies``: counts, search_counts, best_ms, best_candidate (absent: none yet)."""
    return JobRecord(
        id=job.id, state=job.state, kernel=job.kernel, kernel_id=job.kernel_id, kernel_sha256=kernel_sha256,
        problem=json.loads(job.problem), problem_checked=bool(job.problem_checked), params=job.params,
        strategy=job.strategy, seed=job.seed, budget=job.budget, time_budget=job.time_budget,
        baselines=bool(job.baselines), device=job.device, workload_id=job.workload_id,
        slots_claimed=job.slots_claimed, exhausted=bool(job.exhausted), error=job.error,
        created_by=job.created_by, created_at=utc(job.created_at), updated_at=utc(job.updated_at),
        started_at=opt_utc(job.started_at), finished_at=opt_utc(job.finished_at), **tallies,
    )  # fmt: skip


@dataclass(frozen=True)
class SlotLease:
    """A slot held by a worker: valid while ``epoch`` is the slot's epoch."""

    id: int
    job_id: int
    slot: int | None
    kind: str
    epoch: int
    attempts: int
    candidate: Candidate | None = None
    decisions: dict[str, Any] = field(default_factory=dict)
    optuna_trial: int | None = None


def slot_lease(row: JobTrialModel) -> SlotLease:
    return SlotLease(
        id=row.id, job_id=row.job_id, slot=row.slot, kind=row.kind, epoch=row.epoch, attempts=row.attempts,
        candidate=Candidate.from_json(json.loads(row.candidate)) if row.candidate else None,
        decisions=json.loads(row.decisions) if row.decisions else {},
        optuna_trial=row.optuna_trial,
    )  # fmt: skip


@dataclass(frozen=True)
class JobTrialRecord:
    id: int
    job_id: int
    slot: int | None
    kind: str
    state: str
    attempts: int
    epoch: int
    worker_id: str | None
    candidate_hash: str | None
    status: str | None
    message: str | None
    median_ms: float | None
    tflops: float | None
    gbps: float | None
    created_at: datetime
    finished_at: datetime | None


def job_trial_record(r: JobTrialModel) -> JobTrialRecord:
    return JobTrialRecord(
        id=r.id, job_id=r.job_id, slot=r.slot, kind=r.kind, state=r.state, attempts=r.attempts,
        epoch=r.epoch, worker_id=r.worker_id, candidate_hash=r.candidate_hash, status=r.status,
        message=r.message, median_ms=r.median_ms, tflops=r.tflops, gbps=r.gbps, created_at=utc(r.created_at),
        finished_at=opt_utc(r.finished_at),
    )  # fmt: skip


@dataclass(frozen=True)
class WorkerRecord:
    id: str
    host: str
    pid: int
    gpu: int | None
    device: str
    state: str
    job_id: int | None
    started_at: datetime
    heartbeat_at: datetime
    stopped_at: datetime | None


def worker_record(w: WorkerModel) -> WorkerRecord:
    return WorkerRecord(
        id=w.id, host=w.host, pid=w.pid, gpu=w.gpu, device=w.device, state=w.state, job_id=w.job_id,
        started_at=utc(w.started_at), heartbeat_at=utc(w.heartbeat_at), stopped_at=opt_utc(w.stopped_at),
    )  # fmt: skip
