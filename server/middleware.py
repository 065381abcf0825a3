"""ASGI middleware: the request-size and body-time limits, and the fast paths of
best-schedule lookups and job submission."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from starlette.exceptions import HTTPException

from ..store import StoreError

Scope = dict[str, Any]
_log = logging.getLogger("ws_tuner.server")


async def _send_error(send: Any, status: int, detail: str, headers: tuple[tuple[bytes, bytes], ...] = ((b"connection", b"close"),)) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({
        "type": "http.response.start", "status": status,
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers],
    })  # fmt: skip
    await send({"type": "http.response.body", "body": body})


class BodySizeLimit:
    """Refuse request bodies over ``max_bytes`` with 413, and bodies that do not
    arrive within ``timeout`` seconds with 408, before the app sees them.

    A declared Content-Length is checked up front; the body is read (up to the
    limit, never more) and replayed to the app, so a client can neither stream
    an endless body into a JSON parser nor hold a connection by declaring more
    than it sends."""

    def __init__(self, app: Any, max_bytes: int, timeout: float = 30.0) -> None:
        self.app, self.max_bytes, self.timeout = app, max_bytes, timeout

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE"):
            await self.app(scope, receive, send)
            return
        too_large = f"request body exceeds {self.max_bytes} bytes"
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    await _send_error(send, 400, "invalid Content-Length header")
                    return
                if declared > self.max_bytes:
                    await _send_error(send, 413, too_large)
                    return
        chunks: list[bytes] = []
        size = 0
        try:
            # One deadline for the whole body (asyncio.wait_for per message made a task of each).
            async with asyncio.timeout(self.timeout):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return
                    body = message.get("body", b"")
                    size += len(body)
                    if size > self.max_bytes:
                        await _send_error(send, 413, too_large)
                        return
                    chunks.append(body)
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            await _send_error(send, 408, f"request body not received within {self.timeout:g} s")
            return
        await self.app(scope, _replay(b"".join(chunks), receive), send)


class BestLookupFastPath:
    """Serve a repeated ``GET /api/v1/best?...`` straight from the answer cache,
    keyed by the raw query string, before routing and parameter validation.

    Only query strings the full route already answered (validated, looked up,
    turned into JSON bytes with an ETag) are served here: from memory within
    the answer's time to live, else looked up again by the key the route
    resolved; any other falls through to the route. When reads need a token,
    only a request whose bearer token was checked within the token cache's
    time to live is served here (no query); any other falls through, to be
    checked by the route."""

    def __init__(self, app: Any, services: Any, path: str, *, need_token: bool) -> None:
        self.app, self.services, self.path, self.need_token = app, services, path, need_token

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == self.path and scope["method"] == "GET":
            headers = dict(scope["headers"])
            if not self.need_token or self.services.known_principal(bearer_token(headers.get(b"authorization"))):
                query = scope["query_string"]
                answer = self.services.fast_answer(query)
                key = self.services.known_query(query) if answer is None else None
                if key is not None:
                    # A query string the route validated before, its answer not in memory (expired,
                    # or the cache is off): looked up again here, without routing and validation.
                    try:
                        answer = await self.services.best_answer_async(*key)
                    except StoreError as exc:  # as the route answers it (this path runs before the app's handlers)
                        _log.warning("GET %s: %s", self.path, exc)
                        await _send_error(send, 503, "database unavailable; try again", ((b"retry-after", b"5"),))
                        return
                if answer is not None:
                    await _send_answer(send, answer, headers.get(b"if-none-match"))
                    return
        await self.app(scope, receive, send)


class SubmitFastPath:
    """``POST`` to ``path`` (job submission, the hot write) without FastAPI's
    routing, dependency solving and body validation, ~5/6 of its CPU: a JSON body
    that validates as ``model`` (as FastAPI validates it: ``json.loads``, then the
    model in Python mode), from a token the token cache knows to carry ``scope``,
    goes straight to ``await handle(body, principal=...)``, the route's own
    function. Anything else (a malformed or invalid body, another content type,
    an unknown token or one lacking the scope) falls through to the route, which
    answers it in full, so every error keeps its one documented shape.

    Sits inside BodySizeLimit: the body it reads is already bounded in size and time."""

    def __init__(self, app: Any, *, path: str, services: Any, model: Any, scope: str, handle: Any) -> None:
        self.app, self.path, self.services, self.model, self.scope, self.handle = app, path, services, model, scope, handle

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] == self.path:
            headers = dict(scope["headers"])
            principal = self.services.known_principal(bearer_token(headers.get(b"authorization")))
            media_type = headers.get(b"content-type", b"").partition(b";")[0].strip().lower()
            if principal is not None and principal.allows(self.scope) and media_type == b"application/json":
                chunks: list[bytes] = []
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return
                    chunks.append(message.get("body", b""))
                    if not message.get("more_body", False):
                        break
                body = b"".join(chunks)
                try:
                    parsed = self.model.model_validate(json.loads(body))
                except ValueError:  # malformed JSON or an invalid body: the route names the problem
                    receive = _replay(body, receive)
                else:
                    await self._answer(scope, receive, send, parsed, principal)
                    return
        await self.app(scope, receive, send)

    async def _answer(self, scope: Scope, receive: Any, send: Any, body: Any, principal: Any) -> None:
        try:
            response = await self.handle(body, principal=principal)
        except HTTPException as exc:  # the route's own refusals (422, 403, 503), answered as the app answers them
            await _send_error(send, exc.status_code, str(exc.detail), tuple((k.lower().encode(), v.encode()) for k, v in (exc.headers or {}).items()))
            return
        except StoreError as exc:  # as the app's handler answers it (this path runs outside the app's exception handlers)
            _log.warning("POST %s: %s", self.path, exc)
            await _send_error(send, 503, "database unavailable; try again", ((b"retry-after", b"5"),))
            return
        await response(scope, receive, send)


def _replay(body: bytes, receive: Any) -> Any:
    """A ``receive`` that gives ``body`` (already read) once, then defers to the original."""
    replayed = False

    async def replay() -> dict[str, Any]:
        nonlocal replayed
        if not replayed:
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def bearer_token(authorization: bytes | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (the scheme in any case)."""
    if not authorization:
        return None
    scheme, _, token = authorization.decode("latin-1").partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def etag_matches(if_none_match: str, etag: str) -> bool:
    if if_none_match.strip() == "*":
        return True
    bare = etag.removeprefix("W/")
    return any(tag.strip().removeprefix("W/") == bare for tag in if_none_match.split(","))


async def _send_answer(send: Any, answer: Any, if_none_match: bytes | None) -> None:
    headers = [(b"cache-control", b"no-cache")]
    status, body = answer.status, answer.body
    if answer.etag is not None:
        headers.append((b"etag", answer.etag.encode()))
        if if_none_match and etag_matches(if_none_match.decode("latin-1"), answer.etag):
            status, body = 304, b""
    if status != 304:
        headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
