"""Shared dependencies of the routes: the services, authentication by scope, and
the check of uploaded sources."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool

from .kernels import CheckerBusy
from .security import JOBS_WRITE, KERNELS_UPLOAD, READ, Principal
from .state import Services

_bearer = HTTPBearer(auto_error=False, description="An API token from `ws-tune token create`")


async def get_services(request: Request) -> Services:  # async: no thread hop
    return request.app.state.services


ServicesDep = Annotated[Services, Depends(get_services)]
CredentialsDep = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def _unauthorized(detail: str) -> HTTPException:
    return HTTPException(status.HTTP_401_UNAUTHORIZED, detail, headers={"WWW-Authenticate": "Bearer"})


class RequireScope:
    """A valid token carrying ``scope`` (``admin`` carries them all); READ is any valid token."""

    def __init__(self, scope: str) -> None:
        self.scope = scope

    async def __call__(self, services: ServicesDep, credentials: CredentialsDep) -> Principal:
        if credentials is None or not credentials.credentials:
            raise _unauthorized("missing bearer token (Authorization: Bearer <token>)")
        # A token checked within the cache's time to live needs no thread; the check itself may query.
        token = credentials.credentials
        principal = services.known_principal(token) or await run_in_threadpool(services.authenticate, token)
        if principal is None:
            raise _unauthorized("invalid or revoked token")
        if self.scope != READ and not principal.allows(self.scope):
            raise HTTPException(status.HTTP_403_FORBIDDEN, f"this token lacks the {self.scope!r} scope")
        return principal


require_read = RequireScope(READ)
JobsWriter = Annotated[Principal, Depends(RequireScope(JOBS_WRITE))]
KernelUploader = Annotated[Principal, Depends(RequireScope(KERNELS_UPLOAD))]


def check_upload(services: Services, source: str, name: str) -> None:
    """That an uploaded source is Python (in the checker's processes): 422 if not, 503 when too busy."""
    try:
        services.checker.check(source, name)
    except ValueError as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc)) from None
    except CheckerBusy as exc:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, str(exc), headers={"Retry-After": "2"}) from None


async def known_query_only(request: Request) -> None:  # async: no thread hop for a check that never blocks
    """Refuse query parameters the route does not take, and any given twice (422):
    a misspelt filter must not silently widen a listing, nor ``?limit=5&limit=500``
    mean whichever one the framework happens to keep."""
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    if dependant is None or not request.query_params:
        return
    known = _query_names(dependant)
    names = [name for name, _ in request.query_params.multi_items()]
    unknown = next((name for name in names if name not in known), None)
    if unknown is not None:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, f"query.{unknown[:64]}: unknown parameter")
    repeated = next((name for name in names if names.count(name) > 1), None)
    if repeated is not None:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, f"query.{repeated}: given more than once")


def _query_names(dependant: Any) -> set[str]:
    names = {param.alias for param in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _query_names(sub)
    return names
