"""The versioned API: one router per resource, mounted under /api/v1."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from ..config import Settings
from ..deps import known_query_only, require_read
from .routes import best, health, jobs, kernels, workers

API_PREFIX = "/api/v1"


def api_router(settings: Settings) -> APIRouter:
    """Reads are public on a loopback host unless ``public_reads`` is off (beyond
    loopback they always need a token); mutations always need their scope."""
    router = APIRouter(prefix=API_PREFIX, dependencies=[Depends(known_query_only)])
    reads = [Depends(require_read)] if settings.reads_need_token else []
    router.include_router(health.router)  # probes never need a token
    for module in (jobs, best, kernels, workers):
        router.include_router(module.router, dependencies=reads)
    return router
