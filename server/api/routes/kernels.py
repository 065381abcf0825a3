"""Kernel sources: upload (stored content-addressed, never imported here), list, inspect."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query, status

from ....store.registry import KernelRecord
from ...deps import KernelUploader, ServicesDep, check_upload
from ...schemas import READ_ERRORS, SHA256_PATTERN, WRITE_ERRORS, Digits, KernelCreate, KernelPublic, KernelsPublic, TrueOrFalse, errors

router = APIRouter(prefix="/kernels", tags=["kernels"])


def kernel_public(k: KernelRecord) -> KernelPublic:
    return KernelPublic(
        sha256=k.sha256, name=k.name, size_bytes=k.size_bytes, registered=k.registered,
        problem=(k.problem or {}).get("defaults") if k.problem else None, created_at=k.created_at,
    )  # fmt: skip


@router.post("", status_code=status.HTTP_201_CREATED, response_model=KernelPublic, responses=errors(*WRITE_ERRORS))
def upload_kernel(body: KernelCreate, services: ServicesDep, principal: KernelUploader) -> KernelPublic:
    """Store a kernel file's source (content-addressed by sha256) for jobs to
    reference. It is code: it runs only in the workers' sandboxed processes."""
    check_upload(services, body.source, body.name)
    return kernel_public(services.registry.put_kernel(body.name, body.source))


@router.get("", response_model=KernelsPublic, responses=errors(*READ_ERRORS))
def list_kernels(
    services: ServicesDep,
    registered: Annotated[bool | None, Query(), TrueOrFalse] = None,
    limit: Annotated[int, Query(ge=1, le=500), Digits] = 100,
    offset: Annotated[int, Query(ge=0, le=2**31 - 1), Digits] = 0,
) -> KernelsPublic:
    """Registered kernels and uploaded sources (metadata only, never the source)."""
    records, count = services.registry.list_kernels(registered=registered, limit=limit, offset=offset)
    return KernelsPublic(data=[kernel_public(k) for k in records], count=count)


@router.get("/{sha256}", response_model=KernelPublic, responses=errors(*READ_ERRORS, 404))
def get_kernel(sha256: Annotated[str, Path(pattern=SHA256_PATTERN)], services: ServicesDep) -> KernelPublic:
    record = services.registry.kernel(sha256)
    if record is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no kernel source with sha256 {sha256}")
    return kernel_public(record)
