"""Fixtures for the store tests: a store on a fresh database (``db_url``, from
tests/conftest.py: SQLite and PostgreSQL), and factories of stored values."""

from __future__ import annotations

from typing import Any

import pytest

from ws_tuner.candidate import Candidate, Lowering
from ws_tuner.result import Status, Timing, TrialResult
from ws_tuner.schedule import ROOT_SCOPE, Pipeline, Role, Schedule, Scope, Sync
from ws_tuner.workload import Environment, WorkloadKey

# --- factories ----------------------------------------------------------------

ENV = Environment(arch="sm_90a", device="NVIDIA H200", tilelang_version="0.1.15", cuda_version="12.8", driver_version="570.1")


def make_key(kernel: str = "gemm", m: int = 8192, device: str = "NVIDIA H200") -> WorkloadKey:
    env = Environment(ENV.arch, device, ENV.tilelang_version, ENV.cuda_version, ENV.driver_version)
    return WorkloadKey.make(kernel, "ab" * 32, {"M": m, "N": 8192, "K": 8192, "dtype": "float16"}, env)


def make_schedule(depth: int = 3, consumer_nreg: int = 232) -> Schedule:
    body = {
        "producer": ("copy_a", Sync("PRODUCER_ACQUIRE", "kv", 0), "tma_load", Sync("PRODUCER_COMMIT", "kv", 0)),
        "consumer": (Sync("CONSUMER_WAIT", "kv", 0), "gemm", Sync("CONSUMER_RELEASE", "kv", 0)),
    }
    return Schedule(
        num_warps=12,
        roles=(Role("producer", 0, 4, 40), Role("consumer", 4, 12, consumer_nreg)),
        pipelines=(Pipeline("kv", ("A_shared", "B_shared"), depth),),
        scopes=(Scope(ROOT_SCOPE, tuple(body.items())),),
    )


def make_candidate(i: int = 0, lowering: Lowering = Lowering.WS) -> Candidate:
    params = {"block_M": 128, "block_N": 64 * (1 + i % 4), "block_K": 64, "swizzle": i % 2 == 0, "tag": f"c{i}"}
    schedule = make_schedule(depth=2 + i % 3, consumer_nreg=232 - 8 * (i % 3)) if lowering is Lowering.WS else None
    return Candidate.make(params, schedule, lowering)


def make_result(candidate: Candidate, status: Status = Status.OK, median_ms: float | None = 1.0, **kw: Any) -> TrialResult:
    timing = Timing(median_ms, median_ms * 0.98, median_ms * 1.03, 50) if median_ms is not None and status is Status.OK else None
    return TrialResult(candidate.hash, status, timing=timing, **kw)


@pytest.fixture
def factories() -> Any:
    """The builders above, for tests (conftest modules should not be imported)."""

    class F:
        key = staticmethod(make_key)
        schedule = staticmethod(make_schedule)
        candidate = staticmethod(make_candidate)
        result = staticmethod(make_result)

    return F
