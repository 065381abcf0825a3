"""Response models of the dashboard's read-only endpoints (/api/v1/workloads)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _FromBoard(BaseModel):
    model_config = ConfigDict(from_attributes=True)


class WorkloadSummary(BaseModel):
    id: int
    kernel: str
    problem: dict[str, Any]
    device: str
    arch: str
    source_hash: str
    tilelang_version: str
    cuda_version: str
    driver_version: str
    trials: int = Field(description="Stored trials of every status")
    best_tflops: float | None = Field(None, description="TFLOP/s of the best correct timed trial")
    best_gbps: float | None = Field(None, description="GB/s of that trial, where the kernel file says what a call moves (bytes_moved)")
    best_candidate_hash: str | None = None


class WorkloadsPublic(BaseModel):
    data: list[WorkloadSummary]
    count: int


class LeaderboardRow(_FromBoard):
    name: str = Field(description='"ws-tune best" or a baseline: seed, default, role_based, reference')
    candidate_hash: str | None
    label: str | None
    tflops: float | None
    gbps: float | None = Field(None, description="GB/s, where the kernel file says what a call moves (bytes_moved)")
    median_ms: float | None
    ratio: float | None = Field(description="time / the anchor's, side by side")
    confirmed: bool = Field(description="re-timed together in the final tournament")


class TrialPoint(_FromBoard):
    n: int
    role: str
    status: str
    candidate_hash: str
    tflops: float | None
    gbps: float | None = Field(None, description="GB/s, where the kernel file says what a call moves (bytes_moved)")
    ratio: float | None
    median_ms: float | None
    best_tflops: float | None = Field(description="TFLOP/s of the best trial so far")


class DiffLine(_FromBoard):
    op: Literal["same", "changed", "removed", "added"]
    seed: str | None
    best: str | None


class WorkloadPublic(BaseModel):
    workload: WorkloadSummary
    leaderboard: list[LeaderboardRow]
    trials: list[TrialPoint] = Field(description="Search trials (the seed and warm starts included), in the order stored")
    counts: dict[str, int] = Field(description="Trials by status")
    seed_source: str | None = Field(description="The seed's schedule as TileLang code")
    best_source: str | None = Field(description="The winner's schedule as TileLang code")
    diff: list[DiffLine] = Field(description="The two, line by line")
