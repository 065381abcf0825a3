"""Shared dependencies of the routes: the services, and authentication by scope."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from .security import JOBS_WRITE, KERNELS_UPLOAD, READ, Principal
from .services import Services

_bearer = HTTPBearer(auto_error=False, description="An API token from `ws-tune token create`")


def get_services(request: Request) -> Services:
    return request.app.state.services


ServicesDep = Annotated[Services, Depends(get_services)]
CredentialsDep = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def _unauthorized(detail: str) -> HTTPException:
    return HTTPException(status.HTTP_401_UNAUTHORIZED, detail, headers={"WWW-Authenticate": "Bearer"})


class RequireScope:
    """A valid token carrying ``scope`` (``admin`` carries them all); READ is any valid token."""

    def __init__(self, scope: str) -> None:
        self.scope = scope

    def __call__(self, services: ServicesDep, credentials: CredentialsDep) -> Principal:
        if credentials is None or not credentials.credentials:
            raise _unauthorized("missing bearer token (Authorization: Bearer <token>)")
        principal = services.authenticate(credentials.credentials)
        if principal is None:
            raise _unauthorized("invalid or revoked token")
        if self.scope != READ and not principal.allows(self.scope):
            raise HTTPException(status.HTTP_403_FORBIDDEN, f"this token lacks the {self.scope!r} scope")
        return principal


require_read = RequireScope(READ)
JobsWriter = Annotated[Principal, Depends(RequireScope(JOBS_WRITE))]
KernelUploader = Annotated[Principal, Depends(RequireScope(KERNELS_UPLOAD))]
