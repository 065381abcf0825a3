"""One point of the search space: kernel parameters, a lowering, a schedule.

Its canonical JSON (sorted keys, no whitespace) is what gets hashed and
stored, so the same candidate hashes the same in every process.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from enum import Enum
from typing import Any, Collection

from .schedule import Schedule


class Lowering(str, Enum):
    WS = "ws"  # lowered through MaterializeWSSchedule with the candidate's schedule
    DEFAULT = "default"  # schedule stripped: tilelang's default lowering
    ROLE_BASED = "role_based"  # schedule stripped: tilelang's role_based scheduler
    # schedule stripped, warp specialization off: tilelang's software pipeline alone, as kernels
    # whose authors turn it off compile them (its fused-MoE example: the default is WRONG there)
    NO_WS = "no_ws"
    # tilelang's default lowering of the kernel as ws-tune rewrites how it moves data for
    # role_based (compiler.rewritten): one of ws-tune's candidates, not a baseline
    REWRITTEN = "rewritten"
    REFERENCE = "reference"  # the kernel file's reference (torch.matmul -> cuBLAS for GEMM); nothing to build


TILELANG_LOWERINGS = (Lowering.DEFAULT, Lowering.NO_WS, Lowering.ROLE_BASED)  # the baselines tilelang builds on its own
ParamsKey = tuple[tuple[str, Any], ...]  # a kernel-parameter point: its (name, value) pairs, sorted


@dataclass(frozen=True)
class Candidate:
    params: ParamsKey
    schedule: Schedule | None = None
    lowering: Lowering = Lowering.WS

    @classmethod
    def make(cls, params: dict[str, Any], schedule: Schedule | None = None, lowering: Lowering = Lowering.WS) -> "Candidate":
        if (schedule is None) != (lowering is not Lowering.WS):
            raise ValueError("a ws candidate needs a schedule; a baseline lowering takes none")
        return cls(tuple(sorted(params.items())), schedule, Lowering(lowering))

    @property
    def param_dict(self) -> dict[str, Any]:
        return dict(self.params)

    def to_json(self) -> dict[str, Any]:
        return {
            "lowering": self.lowering.value,
            "params": self.param_dict,
            "schedule": self.schedule.to_json() if self.schedule else None,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Candidate":
        schedule = Schedule.from_json(data["schedule"]) if data.get("schedule") else None
        return cls.make(dict(data["params"]), schedule, Lowering(data.get("lowering", "ws")))

    def canonical(self) -> str:
        return canonical_json(self.to_json())

    @property
    def hash(self) -> str:
        return sha256_hex(self.canonical())[:20]

    def describe(self, scheduled: Collection[str] = ()) -> str:
        """A short human label: params, then the schedule's shape. ``scheduled``: parameters
        whose value the schedule replaces (``ScheduleSpace.set_by_schedule``), shown so: the
        stored value (``threads=128`` beside 12 warps) is not what runs."""
        if self.schedule is None:
            return f"[{self.lowering.value}] " + " ".join(f"{k}={v}" for k, v in self.params)
        params = " ".join(f"{k}={'(schedule)' if k in scheduled else v}" for k, v in self.params)
        return f"{params} | {self.schedule.summary()}"


def canonical_json(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def sha256_hex(text: str | bytes) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()
