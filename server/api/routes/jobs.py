"""Tuning jobs: submit, list, inspect, list trials, cancel."""

from __future__ import annotations

import asyncio
from dataclasses import asdict
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Path, Query, Response, status

from ....store import StoredTrial
from ....store.queue import FAILED, JobConflict, JobNotFound, JobRecord, JobTrialRecord, NewJob
from ... import kernels as kernel_files
from ...deps import JobsWriter, ServicesDep, check_upload
from ...schemas import (
    READ_ERRORS,
    WRITE_ERRORS,
    Digits,
    JobBest,
    JobCreate,
    JobProgress,
    JobPublic,
    JobsPublic,
    JobTrialPublic,
    JobTrialsPublic,
    SlotCounts,
    TrialTiming,
    errors,
)
from ...security import ADMIN, KERNELS_UPLOAD, Principal
from ...state import Services

router = APIRouter(prefix="/jobs", tags=["jobs"])

JobId = Annotated[int, Path(ge=1, le=2**31 - 1, description="Job id"), Digits]
Limit = Annotated[int, Query(ge=1, le=500), Digits]
Offset = Annotated[int, Query(ge=0, le=2**31 - 1), Digits]
JobState = Literal["queued", "running", "succeeded", "failed", "cancelled"]
SlotState = Literal["queued", "running", "done", "failed", "cancelled"]


def _slot_counts(counts: dict[str, int]) -> dict[str, int]:
    return {state: counts.get(state, 0) for state in ("queued", "running", "done", FAILED, "cancelled")}


def job_public(job: JobRecord) -> JobPublic:
    search = job.search_counts
    others = {state: n - search.get(state, 0) for state, n in job.counts.items()}
    finished = search.get("done", 0) + search.get(FAILED, 0)
    progress = JobProgress(
        budget=job.budget, claimed=job.slots_claimed, **_slot_counts(search), baselines=SlotCounts(**_slot_counts(others)),
        fraction=round(min(finished / job.budget, 1.0), 4) if job.budget else 1.0,
    )  # fmt: skip
    return JobPublic(
        id=job.id, state=job.state, kernel=job.kernel, kernel_sha256=job.kernel_sha256,  # type: ignore[arg-type]
        problem=job.problem, problem_checked=job.problem_checked, params=job.params, strategy=job.strategy,
        seed=job.seed, budget=job.budget, time_budget=job.time_budget, baselines=job.baselines, device=job.device,
        workload_id=job.workload_id, error=job.error, progress=progress,
        best=JobBest(candidate_hash=job.best_candidate, median_ms=job.best_ms) if job.best_ms is not None else None,
        created_at=job.created_at, updated_at=job.updated_at, started_at=job.started_at, finished_at=job.finished_at,
    )  # fmt: skip


def _trial_public(t: JobTrialRecord, stored: StoredTrial | None) -> JobTrialPublic:
    what: dict[str, Any] = {}
    if stored is not None:  # the candidate and its full result, as the store keeps them for the job's workload
        candidate, result = stored.candidate, stored.result
        what = dict(lowering=candidate.lowering.value, params=candidate.param_dict, ratio=result.ratio, confirmed=result.confirmed,
                    schedule=candidate.schedule.to_json() if candidate.schedule else None, build_seconds=result.build_seconds,
                    timing=TrialTiming(**asdict(result.timing)) if result.timing else None)  # fmt: skip
    return JobTrialPublic(
        id=t.id, slot=t.slot, kind=t.kind, state=t.state, attempts=t.attempts, worker_id=t.worker_id,
        candidate_hash=t.candidate_hash, status=t.status, message=t.message, median_ms=t.median_ms, tflops=t.tflops,
        gbps=t.gbps, created_at=t.created_at, finished_at=t.finished_at, **what,
    )  # fmt: skip


def _unprocessable(detail: str) -> HTTPException:
    return HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail)


@router.post("", status_code=status.HTTP_201_CREATED, response_model=JobPublic, responses=errors(*WRITE_ERRORS))
async def create_job(body: JobCreate, services: ServicesDep, principal: JobsWriter) -> Response:
    """Submit a tuning job: a registered kernel by name, or an uploaded source (inline,
    needing the kernels:upload scope, or by sha256, under the name it was uploaded
    with), a problem, a budget. The job belongs to the token that submits it.
    (Also called by the submission fast path, middleware.SubmitFastPath.)"""
    new = await asyncio.get_running_loop().run_in_executor(services.submitter, _checked_job, body, services, principal)
    job = await services.new_jobs(new)  # with the submissions that arrive meanwhile: one INSERT, one commit
    # Built from the record just written, so already valid: serialized once, without
    # FastAPI validating the model a second time against response_model (the hot path
    # of submission; response_model still documents it).
    return Response(job_public(job).model_dump_json(), status_code=status.HTTP_201_CREATED, media_type="application/json")


def _checked_job(body: JobCreate, services: Services, principal: Principal) -> NewJob:
    """The job the request asks for, every check passed (an uploaded source stored),
    or an HTTPException."""
    settings = services.settings
    if body.budget > settings.max_budget:
        raise _unprocessable(f"budget {body.budget} exceeds this server's limit of {settings.max_budget}")
    if body.source is not None and body.source_sha256 is not None:
        raise _unprocessable("give the kernel's source or its source_sha256, not both")
    if body.source is not None:
        if not principal.allows(KERNELS_UPLOAD):
            raise HTTPException(status.HTTP_403_FORBIDDEN, f"uploading kernel source needs the {KERNELS_UPLOAD!r} scope")
        check_upload(services, body.source, body.kernel)
        signature = None
    elif body.source_sha256 is not None:
        uploaded = services.registry.kernel(body.source_sha256)
        if uploaded is None:
            raise _unprocessable(f"no kernel source with sha256 {body.source_sha256}; upload it first (POST /api/v1/kernels)")
        if uploaded.name != body.kernel:
            # Results are keyed by (name, source): a source runs under its own name only.
            raise _unprocessable(f"kernel source {body.source_sha256[:12]} is named {uploaded.name!r}, not {body.kernel!r}")
        signature = uploaded.problem if uploaded.registered else None
    else:
        registered = services.registered_kernel(body.kernel)
        if registered is None:
            raise _unprocessable(f"unknown kernel {body.kernel!r}: not registered on this server (upload its source instead)")
        signature = registered.problem
    try:
        params = kernel_files.check_params(body.params, signature)
        problem, checked = kernel_files.normalize_problem(body.kernel, body.problem, signature)
    except ValueError as exc:
        raise _unprocessable(str(exc)) from None
    # Everything is checked: only now is anything written.
    if body.source is not None:
        record = services.registry.put_kernel(body.kernel, body.source)
    elif body.source_sha256 is not None:
        record = uploaded
    else:
        record = registered
    assert record is not None
    return NewJob(
        kernel_id=record.id, kernel=body.kernel, problem=problem, problem_checked=checked, params=params,
        strategy=body.strategy, seed=body.seed, budget=body.budget, time_budget=body.time_budget,
        baselines=body.baselines, device=body.device, created_by=principal.token_id, kernel_sha256=record.sha256,
    )  # fmt: skip


@router.get("", response_model=JobsPublic, responses=errors(*READ_ERRORS))
def list_jobs(services: ServicesDep, state: JobState | None = None, limit: Limit = 50, offset: Offset = 0) -> JobsPublic:
    """Jobs, newest first, with their progress."""
    jobs, count = services.queue.list_jobs(state=state, limit=limit, offset=offset)
    return JobsPublic(data=[job_public(j) for j in jobs], count=count)


@router.get("/{job_id}", response_model=JobPublic, responses=errors(*READ_ERRORS, 404))
def get_job(job_id: JobId, services: ServicesDep) -> JobPublic:
    job = services.queue.get_job(job_id)
    if job is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"job {job_id} not found")
    return job_public(job)


@router.get("/{job_id}/trials", response_model=JobTrialsPublic, responses=errors(*READ_ERRORS, 404))
def list_job_trials(
    job_id: JobId, services: ServicesDep, state: SlotState | None = None, limit: Limit = 100, offset: Offset = 0
) -> JobTrialsPublic:
    """The job's trials (search slots and baselines), in claim order: what each
    candidate was (lowering, parameters, schedule) and how it fared."""
    job = services.queue.get_job(job_id)
    if job is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"job {job_id} not found")
    trials, count = services.queue.job_trials(job_id, state=state, limit=limit, offset=offset)
    stored = services.store.trials_by_hash(workload_id=job.workload_id) if job.workload_id is not None else {}
    return JobTrialsPublic(data=[_trial_public(t, stored.get(t.candidate_hash or "")) for t in trials], count=count)


@router.post("/{job_id}/cancel", response_model=JobPublic, responses=errors(*WRITE_ERRORS, 404, 409))
def cancel_job(job_id: JobId, services: ServicesDep, principal: JobsWriter) -> JobPublic:
    """Cancel a queued or running job of this token (an admin token: any job);
    candidates already in flight finish and are kept."""
    job = services.queue.get_job(job_id)
    if job is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"job {job_id} not found")
    if not principal.allows(ADMIN) and (principal.token_id is None or job.created_by != principal.token_id):
        raise HTTPException(status.HTTP_403_FORBIDDEN, f"job {job_id} belongs to another token; only it or an admin may cancel it")
    try:
        return job_public(services.queue.cancel_job(job_id))
    except JobNotFound as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(exc)) from None
    except JobConflict as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, str(exc)) from None
