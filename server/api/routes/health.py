"""Liveness (the process answers) and readiness (the database answers, at the schema this server needs)."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, status

from ....store import StoreError, head_revision
from ...deps import ServicesDep
from ...schemas import ErrorPublic, HealthPublic, ReadyPublic

router = APIRouter(tags=["health"])


@router.get("/health", response_model=HealthPublic)
async def health() -> HealthPublic:
    return HealthPublic(status="ok")


@router.get("/ready", response_model=ReadyPublic, responses={503: {"model": ErrorPublic}})
def ready(services: ServicesDep) -> ReadyPublic:
    try:
        revision = services.store.schema_revision()
        alive = len(services.queue.list_workers(alive_within=services.settings.grace))
    except StoreError:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, "database unavailable") from None
    if revision != head_revision():
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE, f"database schema is {revision}, this server needs {head_revision()}"
        )
    return ReadyPublic(status="ready", schema_revision=revision, workers_alive=alive)
