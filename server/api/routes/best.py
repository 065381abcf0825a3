"""The best known schedule of (kernel, problem, device): the production lookup.

Lean on purpose: answers are served from memory for ``best_cache_ttl``
seconds as ready-made JSON bytes, a miss is one indexed query, and clients
revalidate with ``If-None-Match`` (304, no body) using the ETag.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from ...kernels import NAME_PATTERN
from ...middleware import etag_matches
from ...schemas import READ_ERRORS, SHA256_PATTERN, BestPublic, errors
from ...state import Services

router = APIRouter(prefix="/best", tags=["best"])

_TEXT = r"^[^\x00]+$"


@router.get(
    "",
    response_model=BestPublic,
    responses={
        **errors(*READ_ERRORS, 404, 409),
        304: {"description": "Not modified (If-None-Match matched the ETag)"},
        404: errors(404)[404] | {"description": "Nothing timed yet for this kernel source, problem and device"},
        409: errors(409)[409] | {"description": "Results of several sources of an unregistered kernel: give source_hash"},
    },
)
async def get_best(
    request: Request,
    kernel: Annotated[str, Query(pattern=NAME_PATTERN, description="Kernel name (its file stem)")],
    problem: Annotated[str, Query(min_length=1, max_length=2048, pattern=_TEXT, description="e.g. M=4096,N=4096,K=4096")],
    device: Annotated[str, Query(min_length=1, max_length=256, pattern=_TEXT, description="e.g. NVIDIA H200")],
    source_hash: Annotated[
        str | None, Query(pattern=SHA256_PATTERN, description="The kernel's source (default: the registered file's)")
    ] = None,
) -> Response:
    """The fastest correct stored schedule of one source of the kernel (``source_hash``;
    by default the registered file's, or the only source with results), whoever
    measured it (CLI or workers)."""
    services: Services = request.app.state.services
    entry = services.best_cache.peek((kernel, problem, device, source_hash), 0.0)
    answer = entry[0] if entry else await services.best_answer_async(kernel, problem, device, source_hash)
    # The fast path (middleware) serves this query string as is from now on (to a checked token, if reads need one).
    services.remember_query(request.scope["query_string"], kernel, problem, device, source_hash, answer)
    headers = {"Cache-Control": "no-cache"}
    if answer.etag is not None:
        headers["ETag"] = answer.etag
        if_none_match = request.headers.get("if-none-match")
        if if_none_match and etag_matches(if_none_match, answer.etag):
            return Response(status_code=304, headers=headers)
    return Response(answer.body, status_code=answer.status, headers=headers, media_type="application/json")
