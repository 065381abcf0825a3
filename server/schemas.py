"""Request and response models of the API (XCreate / XPublic / XsPublic{data,count}).

These are the API's shapes only: the store hands back its own records and
the routes convert; no ORM object reaches a response.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt

from .kernels import NAME_PATTERN

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


Text = Annotated[str, AfterValidator(_storable)]
MAX_SOURCE_CHARS = 1024 * 1024
MAX_BUDGET = 100_000
Strategy = Literal["tpe", "random", "grid"]
ProblemValue = Union[StrictInt, StrictFloat, StrictBool, Annotated[Text, Field(min_length=1, max_length=256)]]
Problem = Union[
    Annotated[Text, Field(min_length=1, max_length=2048, examples=["M=4096,N=4096,K=4096"])],
    Annotated[dict[Annotated[str, Field(pattern=NAME_PATTERN)], ProblemValue], Field(min_length=1, max_length=32)],
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorPublic(BaseModel):
    detail: str


# --- jobs ---------------------------------------------------------------------


class JobCreate(_Strict):
    kernel: str = Field(
        ..., pattern=NAME_PATTERN, description="Kernel name: a registered kernel, or the name of the source below",
        examples=["gemm"],
    )  # fmt: skip
    source: Text | None = Field(
        None, min_length=1, max_length=MAX_SOURCE_CHARS,
        description="Kernel file source to upload with the job (needs the kernels:upload scope)",
    )  # fmt: skip
    source_sha256: str | None = Field(None, pattern=SHA256_PATTERN, description="A previously uploaded kernel source")
    problem: Problem = Field(..., description="Problem arguments: 'M=4096,N=4096,K=4096' or an object")
    params: Text | None = Field(None, max_length=1024, description="Pinned kernel parameters, e.g. 'block_M=128'")
    budget: int = Field(64, ge=1, le=MAX_BUDGET, description="Search candidates to measure")
    time_budget: float | None = Field(None, gt=0, le=30 * 86400, description="Stop claiming new candidates after this many seconds")
    strategy: Strategy = "tpe"
    seed: int = Field(0, ge=0, le=2**31 - 1)
    baselines: bool = Field(False, description="Also measure the kernel's own schedule and tilelang's lowerings")
    device: Text | None = Field(None, min_length=1, max_length=256, description="Only workers on this device may run it")


class JobProgress(BaseModel):
    budget: int
    claimed: int
    queued: int
    running: int
    done: int
    failed: int
    cancelled: int
    fraction: float = Field(description="finished search trials / budget")


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


class JobTrialPublic(BaseModel):
    id: int
    slot: int | None
    kind: str
    state: str
    attempts: int
    worker_id: str | None
    candidate_hash: str | None
    status: str | None
    message: str | None
    median_ms: float | None
    tflops: float | None
    created_at: datetime
    finished_at: datetime | None


class JobTrialsPublic(BaseModel):
    data: list[JobTrialPublic]
    count: int


# --- kernels ------------------------------------------------------------------


class KernelCreate(_Strict):
    name: str = Field(..., pattern=NAME_PATTERN, examples=["my_gemm"])
    source: Text = Field(..., min_length=1, max_length=MAX_SOURCE_CHARS)


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
