"""The web dashboard of ``ws-tune serve`` and ``ws-tune dashboard``: per workload a
leaderboard, the best so far over the trials, the winner's schedule beside the
seed's, and the jobs' progress, live. Its assets are in static/ (no CDN)."""

from __future__ import annotations

from fastapi import Depends, FastAPI

from ..api.main import API_PREFIX
from ..config import Settings
from ..deps import known_query_only, require_read
from . import routes
from .routes import PAGE

__all__ = ["PAGE", "install"]


def install(app: FastAPI, settings: Settings) -> None:
    """Mount the page, its assets and /api/v1/workloads (reads need a token as the API's do)."""
    reads = [Depends(require_read)] if settings.reads_need_token else []
    app.include_router(routes.router, prefix=API_PREFIX, dependencies=[Depends(known_query_only), *reads])
    app.include_router(routes.page)
    app.mount(f"{PAGE}/static", routes.static_files(), name="dashboard-static")
