"""The dashboard: its page (/dashboard, assets bundled: it works offline) and the
read-only JSON it draws from besides the jobs API (/api/v1/workloads)."""

from __future__ import annotations

import json
from pathlib import Path as FilePath
from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query, status
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from ...workload import WorkloadKey
from ..deps import ServicesDep
from ..kernels import NAME_PATTERN
from ..schemas import READ_ERRORS, Digits, errors
from ..state import Services
from .board import board
from .schemas import DiffLine, LeaderboardRow, TrialPoint, WorkloadPublic, WorkloadsPublic, WorkloadSummary

STATIC = FilePath(__file__).resolve().parent / "static"
PAGE = "/dashboard"

router = APIRouter(prefix="/workloads", tags=["workloads"])
page = APIRouter(include_in_schema=False)
WorkloadId = Annotated[int, Path(ge=1, le=2**31 - 1, description="Workload id"), Digits]


def _summary(services: Services, workload_id: int, key: WorkloadKey) -> WorkloadSummary:
    top = services.store.top_k(workload_id=workload_id, k=1)
    return WorkloadSummary(
        id=workload_id, kernel=key.kernel, problem=json.loads(key.problem), device=key.device, arch=key.arch,
        source_hash=key.source_hash, tilelang_version=key.tilelang_version, cuda_version=key.cuda_version,
        driver_version=key.driver_version, trials=sum(services.store.status_counts(workload_id=workload_id).values()),
        best_tflops=top[0].result.tflops if top else None, best_gbps=top[0].result.gbps if top else None,
        best_candidate_hash=top[0].candidate.hash if top else None,
    )  # fmt: skip


@router.get("", response_model=WorkloadsPublic, responses=errors(*READ_ERRORS))
def list_workloads(
    services: ServicesDep,
    kernel: Annotated[str | None, Query(pattern=NAME_PATTERN, max_length=256)] = None,
    limit: Annotated[int, Query(ge=1, le=500), Digits] = 50,
    offset: Annotated[int, Query(ge=0, le=2**31 - 1), Digits] = 0,
) -> WorkloadsPublic:
    """Tuned workloads (kernel, problem, device, toolchain), newest first, with their best TFLOP/s."""
    found = services.store.find_workloads(kernel=kernel)[::-1]
    return WorkloadsPublic(data=[_summary(services, i, key) for i, key in found[offset : offset + limit]], count=len(found))


@router.get("/{workload_id}", response_model=WorkloadPublic, responses=errors(*READ_ERRORS, 404))
def get_workload(workload_id: WorkloadId, services: ServicesDep) -> WorkloadPublic:
    """One workload's leaderboard (the winner and the best of every baseline, confirmed or
    not), its search trials with the best so far, and the winner's schedule beside the seed's."""
    key = next((k for i, k in services.store.find_workloads() if i == workload_id), None)
    if key is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"workload {workload_id} not found")
    b = board(list(services.store.trials_by_hash(workload_id=workload_id).values()))
    return WorkloadPublic(
        workload=_summary(services, workload_id, key),
        leaderboard=[LeaderboardRow.model_validate(r) for r in b.rows],
        trials=[TrialPoint.model_validate(p) for p in b.points],
        counts=b.counts, seed_source=b.seed_source, best_source=b.best_source,
        diff=[DiffLine.model_validate(d) for d in b.diff],
    )  # fmt: skip


@page.get(PAGE)
def dashboard_page() -> FileResponse:
    return FileResponse(STATIC / "index.html", media_type="text/html")


def static_files() -> StaticFiles:
    return StaticFiles(directory=STATIC)
