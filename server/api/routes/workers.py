"""The workers that have registered, with their heartbeats."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from ...deps import ServicesDep
from ...schemas import READ_ERRORS, TrueOrFalse, WorkerPublic, WorkersPublic, errors

router = APIRouter(prefix="/workers", tags=["workers"])


@router.get("", response_model=WorkersPublic, responses=errors(*READ_ERRORS))
def list_workers(services: ServicesDep, alive: Annotated[bool, Query(), TrueOrFalse] = False) -> WorkersPublic:
    """Workers, newest first; ``alive``: only those whose heartbeat is within the grace period."""
    records = services.queue.list_workers(alive_within=services.settings.grace if alive else None)
    data = [
        WorkerPublic(id=w.id, host=w.host, pid=w.pid, gpu=w.gpu, device=w.device, state=w.state, job_id=w.job_id,
                     started_at=w.started_at, heartbeat_at=w.heartbeat_at)
        for w in records
    ]  # fmt: skip
    return WorkersPublic(data=data, count=len(data))
