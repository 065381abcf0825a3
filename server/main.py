"""The FastAPI app: ``create_app(settings)`` assembles it.

For uvicorn: ``uvicorn --factory ws_tuner.server.main:app_from_env`` (settings
from ``WS_TUNE_*`` variables and ``WS_TUNE_CONFIG``; the process seals itself). The schema comes from
the Alembic migrations (``ws-tune db upgrade``, the deploy's prestart step); a
server finding an older schema refuses to start rather than migrating under
running workers. Every error body is ``{"detail": "<one line>"}``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import re
import threading
from collections.abc import AsyncIterator
from typing import Any

import anyio.to_thread
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from fastapi_offline import FastAPIOffline
from starlette.concurrency import run_in_threadpool

from .. import __version__
from ..store import StoreError
from .api.main import API_PREFIX, api_router
from .config import Settings
from .dashboard import install as install_dashboard
from .api.routes.jobs import create_job
from .middleware import BestLookupFastPath, BodySizeLimit, SubmitFastPath
from .schemas import EVERY_ROUTE, JobCreate
from .security import JOBS_WRITE
from .state import Services

_log = logging.getLogger("ws_tuner.server")


def _operation_id(route: APIRoute) -> str:
    return f"{route.tags[0]}-{route.name}" if route.tags else route.name


_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _validation_detail(exc: RequestValidationError) -> tuple[int, str]:
    """(status, one line) for a request that failed validation: malformed JSON is a
    400, anything else a 422 naming the first problem. The location keeps names
    and indices only (pydantic's union branches are named after validator reprs)."""
    errors = exc.errors()
    if not errors:
        return 422, "invalid request"
    first = errors[0]
    if first.get("type") == "json_invalid":
        reason = str((first.get("ctx") or {}).get("error", "invalid JSON")).splitlines()[0][:200]
        return 400, f"malformed JSON body: {reason}"
    loc = ".".join(str(p) for p in first.get("loc", ()) if p != "body" and (isinstance(p, int) or _NAME.match(str(p)))) or "body"
    message = str(first.get("msg", "invalid")).removeprefix("Value error, ").splitlines()[0][:300]
    more = f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})" if len(errors) > 1 else ""
    return 422, f"{loc}: {message}{more}"


class _Sweeper(threading.Thread):
    """Re-queues stale trials even when no worker is alive to do it. A thread, not
    a task: shutdown waits for a sweep in progress before the store closes."""

    def __init__(self, services: Services) -> None:
        super().__init__(name="ws-tune-sweeper", daemon=True)
        self.services, self.stopping = services, threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(self.services.settings.heartbeat_interval):
            try:
                self.services.sweep()
            except StoreError as exc:
                _log.warning("sweeper: %s", exc)
            except Exception:  # noqa: BLE001 - the sweeper must outlive a bad round
                _log.exception("sweeper round failed")

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=30)


class _ServiceApp(FastAPI):
    """The app, with ``front`` (the best-lookup fast path) in front of everything:
    FastAPI's own per-request work (its telemetry checks, error middleware and body
    limit) cost a sixth of a cached lookup's CPU, for a path that needs none of it."""

    front: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await (self.front or super().__call__)(scope, receive, send)


def create_app(settings: Settings | None = None, *, services: Services | None = None) -> FastAPI:
    settings = settings or Settings()
    services = services or Services.open(settings)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # The threads that run blocking route code (and the store's pool is as large).
        anyio.to_thread.current_default_thread_limiter().total_tokens = settings.threads
        sweeper = _Sweeper(services)
        sweeper.start()
        try:
            yield
        finally:
            await run_in_threadpool(sweeper.stop)
            services.close()

    # /docs and /redoc with their JavaScript and CSS served from the package, not a CDN: air-gapped clusters.
    app = FastAPIOffline(
        title="ws-tune",
        version=__version__,
        summary="Tune TileLang warp-specialization schedules: jobs, workers, best-schedule lookups.",
        lifespan=lifespan,
        generate_unique_id_function=_operation_id,
        responses=EVERY_ROUTE,
    )
    # fastapi_offline builds a plain FastAPI; only its class can put the fast path before
    # FastAPI's own __call__ (a special method is looked up on the type, not the instance).
    app.__class__ = _ServiceApp
    app.state.services = services
    app.add_middleware(
        SubmitFastPath, path=f"{API_PREFIX}/jobs", services=services, model=JobCreate, scope=JOBS_WRITE,
        handle=functools.partial(create_job, services=services),
    )  # fmt: skip
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes, timeout=settings.body_timeout)
    app.front = BestLookupFastPath(super(_ServiceApp, app).__call__, services, f"{API_PREFIX}/best", need_token=settings.reads_need_token)
    app.include_router(api_router(settings))
    install_dashboard(app, settings)  # /dashboard and /api/v1/workloads

    default_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            _no_null_parameters(default_openapi())
        return app.openapi_schema  # type: ignore[return-value]

    app.openapi = openapi  # type: ignore[method-assign]

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        status, detail = _validation_detail(exc)
        return JSONResponse({"detail": detail}, status_code=status)

    @app.exception_handler(StoreError)
    async def _store_down(request: Request, exc: StoreError) -> JSONResponse:
        _log.warning("%s %s: %s", request.method, request.url.path, exc)  # the URL in it is masked
        return JSONResponse({"detail": "database unavailable; try again"}, status_code=503, headers={"Retry-After": "5"})

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        _log.error("%s %s: internal error: %s: %s", request.method, request.url.path, type(exc).__name__, exc)
        return JSONResponse({"detail": "internal server error"}, status_code=500)

    return app


def _no_null_parameters(spec: dict[str, Any]) -> None:
    """An optional parameter's schema says "or null", which a path or query string
    cannot carry (absent is its null): keep the one real type."""
    for operations in spec.get("paths", {}).values():
        for operation in operations.values():
            for parameter in operation.get("parameters", ()):
                schema = parameter.get("schema", {})
                kinds = [s for s in schema.get("anyOf", ()) if s != {"type": "null"}]
                if "anyOf" in schema and len(kinds) == 1:
                    del schema["anyOf"]
                    schema.update(kinds[0])


def app_from_env() -> Any:
    """The factory uvicorn's worker processes call (``--factory``)."""
    from .process import freeze_startup_objects, seal

    app = create_app(seal(Settings()))
    freeze_startup_objects()
    return app
