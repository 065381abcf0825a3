"""Request and response models of the API (XCreate / XPublic / XsPublic{data,count}).

These are the API's shapes only: the store hands back its own records and
the routes convert; no ORM object reaches a response.

Requests are strict: JSON types as declared (no "10" for 10, no true for 1,
no "yes" for true), integers bounded, floats finite, unknown fields refused.
Every error body is ``ErrorPublic``: ``{"detail": "<one line>"}``.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal, Union

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, StringConstraints, Tag, WithJsonSchema

from .kernels import INT_MAX, INT_MIN, NAME_PATTERN

SHA256_PATTERN = r"^[0-9a-f]{64}$"


def _storable(value: str) -> str:
    """Text the databases can hold: no NUL (PostgreSQL refuses it) and valid UTF-8
    (a lone surrogate from JSON's \\ud800 cannot be encoded)."""
    if "\x00" in value:
        raise ValueError("text must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("text must be valid Unicode (no lone surrogates)") from None
    return value


def _whole(value: Any) -> Any:
    # JSON has one number type: 64.0 is the integer 64 (as JSON Schema says); 64.5 and "64" are not.
    return int(value) if isinstance(value, float) and value.is_integer() else value


Whole = BeforeValidator(_whole)


def text(min_length: int, max_length: int) -> Any:
    """A string of ``min_length`` to ``max_length`` characters that the databases can store."""
    return Annotated[str, StringConstraints(min_length=min_length, max_length=max_length), AfterValidator(_storable)]


def _problem_kind(value: Any) -> str | None:
    return "problem-text" if isinstance(value, str) else "problem-object" if isinstance(value, dict) else None


def _json_kind(value: Any) -> str | None:
    # bool before int: in Python, True is an int
    for kind, types in (("boolean", bool), ("integer", int), ("number", float), ("string", str)):
        if isinstance(value, types):
            return f"json-{kind}"
    return None


MAX_SOURCE_CHARS = 1024 * 1024
MAX_BUDGET = 100_000
Strategy = Literal["tpe", "random", "grid"]
# Unions are tagged by the JSON type given, so that an error names that form only
# (tags are not identifiers: error locations leave them out, see main.py).
ProblemValue = Annotated[
    Union[Annotated[bool, Tag("json-boolean")], Annotated[int, Field(ge=INT_MIN, le=INT_MAX), Tag("json-integer")],
          Annotated[float, Field(ge=INT_MIN, le=INT_MAX, allow_inf_nan=False), Tag("json-number")],
          Annotated[text(1, 256), Tag("json-string")]],
    Discriminator(_json_kind, custom_error_type="problem_value", custom_error_message="should be a number, a boolean or a string"),
    WithJsonSchema({"anyOf": [{"type": "boolean"}, {"type": "number", "minimum": INT_MIN, "maximum": INT_MAX},
                              {"type": "string", "minLength": 1, "maxLength": 256}]}),
]  # fmt: skip
Problem = Annotated[
    Union[
        Annotated[text(1, 2048), Tag("problem-text")],
        Annotated[dict[Annotated[str, Field(pattern=NAME_PATTERN)], ProblemValue], Field(min_length=1, max_length=32), Tag("problem-object")],
    ],
    Discriminator(_problem_kind, custom_error_type="problem_type",
                  custom_error_message="should be 'KEY=VALUE,...' text or an object"),
]  # fmt: skip


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class ErrorPublic(BaseModel):
    """Every error: one line, no internals."""

    detail: str = Field(examples=["budget: Input should be a valid integer"])


# --- jobs ---------------------------------------------------------------------


class JobCreate(_Strict):
    kernel: str = Field(
        ..., pattern=NAME_PATTERN, examples=["gemm"],
        description="Kernel name: a registered kernel, or the name of the source below (an upload keeps its name)",
    )  # fmt: skip
    source: text(1, MAX_SOURCE_CHARS) | None = Field(  # type: ignore[valid-type]
        None, description="Kernel file source to upload with the job (needs the kernels:upload scope)"
    )
    source_sha256: str | None = Field(
        None, pattern=SHA256_PATTERN, description="A previously uploaded kernel source, run under its own name"
    )
    problem: Problem = Field(..., description="Problem arguments: 'M=4096,N=4096,K=4096' or an object",
                             examples=["M=4096,N=4096,K=4096"])  # fmt: skip
    params: text(1, 1024) | None = Field(None, description="Pinned kernel parameters, e.g. 'block_M=128'")  # type: ignore[valid-type]
    budget: Annotated[int, Field(ge=1, le=MAX_BUDGET), Whole] = Field(64, description="Search candidates to measure")
    time_budget: float | None = Field(
        None, gt=0, le=30 * 86400, allow_inf_nan=False, description="Seconds of search: no search candidate is claimed past them; the clock starts with the first search candidate, after the baselines"
    )
    strategy: Strategy = "tpe"
    seed: Annotated[int, Field(ge=0, le=2**31 - 1), Whole] = 0
    baselines: bool = Field(False, description="Also measure the kernel's own schedule and tilelang's lowerings (and, as warm starts, the schedules shaped as tilelang's default lowering)")
    device: text(1, 256) | None = Field(None, description="Only workers on this device may run it")  # type: ignore[valid-type]


class SlotCounts(BaseModel):
    queued: int
    running: int
    done: int
    failed: int
    cancelled: int


class JobProgress(SlotCounts):
    """Search trials against the budget; the baselines and warm starts, measured on
    top of it, are counted apart (so ``done`` never exceeds ``budget``)."""

    budget: int
    claimed: int
    fraction: float = Field(description="finished search trials / budget")
    baselines: SlotCounts = Field(description="baseline and warm-start trials (not in the budget)")


class JobBest(BaseModel):
    candidate_hash: str | None
    median_ms: float


class JobPublic(BaseModel):
    id: int
    state: Literal["queued", "running", "succeeded", "failed", "cancelled"]
    kernel: str
    kernel_sha256: str
    problem: dict[str, Any]
    problem_checked: bool
    params: str | None
    strategy: str
    seed: int
    budget: int
    time_budget: float | None
    baselines: bool
    device: str | None
    workload_id: int | None
    error: str | None
    progress: JobProgress
    best: JobBest | None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class JobsPublic(BaseModel):
    data: list[JobPublic]
    count: int


class TrialTiming(BaseModel):
    median_ms: float
    p20_ms: float
    p80_ms: float
    reps: int


class JobTrialPublic(BaseModel):
    """One trial of a job: its slot, and once a candidate is chosen what it was
    (lowering, kernel parameters, schedule) and how it fared (status, timing)."""

    id: int
    slot: int | None = Field(description="search slot number; None for a baseline or warm start")
    kind: str = Field(description="search, baseline or warm")
    state: str
    attempts: int
    worker_id: str | None
    candidate_hash: str | None
    lowering: str | None = Field(None, description="ws (a T.WSSchedule), default or role_based (tilelang's own lowerings), reference")
    params: dict[str, Any] | None = Field(None, description="the kernel parameters")
    schedule: dict[str, Any] | None = Field(None, description="the T.WSSchedule as JSON (None for tilelang's own lowerings)")
    status: str | None = Field(description="built, ok, wrong, rejected, compile_error, timeout, crash, ...")
    message: str | None
    median_ms: float | None
    tflops: float | None
    gbps: float | None = Field(None, description="GB/s, where the kernel file says what a call moves (bytes_moved); None otherwise")
    timing: TrialTiming | None = Field(None, description="the steady-state timing (None until timed, or compile-only)")
    ratio: float | None = Field(None, description="time / the anchor's time, measured side by side")
    confirmed: bool | None = Field(None, description="re-timed in the final tournament")
    build_seconds: float | None = None
    created_at: datetime
    finished_at: datetime | None


class JobTrialsPublic(BaseModel):
    data: list[JobTrialPublic]
    count: int


# --- kernels ------------------------------------------------------------------


class KernelCreate(_Strict):
    name: str = Field(..., pattern=NAME_PATTERN, examples=["my_gemm"])
    source: text(1, MAX_SOURCE_CHARS) = Field(..., examples=["PROBLEM = {}\n"])  # type: ignore[valid-type]


class KernelPublic(BaseModel):
    sha256: str
    name: str
    size_bytes: int
    registered: bool
    problem: dict[str, Any] | None = Field(None, description="PROBLEM defaults of a registered kernel")
    created_at: datetime


class KernelsPublic(BaseModel):
    data: list[KernelPublic]
    count: int


# --- best ---------------------------------------------------------------------


class BestPublic(BaseModel):
    kernel: str
    problem: dict[str, Any]
    device: str
    source_hash: str
    workload: dict[str, Any]
    candidate_hash: str
    candidate: dict[str, Any]
    lowering: str
    median_ms: float
    p20_ms: float
    p80_ms: float
    reps: int
    tflops: float | None
    gbps: float | None = Field(None, description="GB/s, where the kernel file says what a call moves (bytes_moved); None otherwise")
    tilelang: str | None = Field(None, description="The schedule as TileLang code to paste into the kernel")
    updated_at: datetime


# --- health / workers -----------------------------------------------------------


class HealthPublic(BaseModel):
    status: Literal["ok"]


class ReadyPublic(BaseModel):
    status: Literal["ready"]
    schema_revision: str
    workers_alive: int


class WorkerPublic(BaseModel):
    id: str
    host: str
    pid: int
    gpu: int | None
    device: str
    state: str
    job_id: int | None
    started_at: datetime
    heartbeat_at: datetime


class WorkersPublic(BaseModel):
    data: list[WorkerPublic]
    count: int


# --- parameters and error responses -----------------------------------------------


def _digits(value: Any) -> Any:
    # Path and query values arrive as text: an integer is plain digits ("1.0", "1e0" and " 1" are not).
    if isinstance(value, str) and not re.fullmatch(r"[0-9]{1,19}", value):
        raise ValueError("should be a whole number written in digits")
    return value


def _true_or_false(value: Any) -> Any:
    if isinstance(value, str):
        if value not in ("true", "false"):
            raise ValueError("should be true or false")
        return value == "true"
    return value


Digits = BeforeValidator(_digits)
TrueOrFalse = BeforeValidator(_true_or_false)

_REASONS = {
    400: "Malformed request: invalid JSON or Content-Length; or invalid HTTP, answered as plain text by the HTTP server",
    401: "Missing, invalid or revoked token",
    403: "The token lacks the scope, or the job is another token's",
    404: "Not found",
    408: "The request body did not arrive within the server's body timeout",
    409: "Conflict with the resource's state",
    413: "Request body too large",
    422: "Invalid input: one line naming the first problem",
    503: "Database unavailable, or too busy to check an upload: retry (Retry-After)",
}


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for the error statuses a route returns, all ``ErrorPublic``."""
    out: dict[int | str, dict[str, Any]] = {status: {"model": ErrorPublic, "description": _REASONS[status]} for status in statuses}
    if 400 in out:  # uvicorn refuses malformed HTTP itself, before any route, in plain text
        out[400]["content"] = {"text/plain": {"schema": {"type": "string"}}}
    return out


EVERY_ROUTE = errors(400)  # any request can be malformed HTTP
READ_ERRORS = (401, 422, 503)  # every read: a token when reads need one, parameters, the database
WRITE_ERRORS = (401, 403, 408, 413, 422, 503)  # every mutation: the body, the token and its scope
