"""Outcomes of building and running a candidate. Failures are data, not exceptions."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class Status(str, Enum):
    # Builder outcomes.
    BUILT = "built"  # compiled; not (yet) run
    REJECTED = "rejected"  # MaterializeWSSchedule's verifier refused the schedule
    COMPILE_ERROR = "compile_error"
    COMPILE_TIMEOUT = "compile_timeout"
    # Runner outcomes.
    OK = "ok"  # correct and timed
    WRONG = "wrong"  # ran, but the output failed the correctness gate
    TIMEOUT = "timeout"  # hung on the GPU (killed)
    CRASH = "crash"  # the runner process died (illegal access, abort)
    LAUNCH_ERROR = "launch_error"  # the launch itself failed (resources)

    @property
    def is_build_failure(self) -> bool:
        return self in (Status.REJECTED, Status.COMPILE_ERROR, Status.COMPILE_TIMEOUT)

    @property
    def is_final_for_device(self) -> bool:
        """Outcomes a re-run on the same workload reuses instead of redoing."""
        return self is not Status.BUILT


@dataclass(frozen=True)
class Timing:
    """Kernel time over repetitions, in milliseconds."""

    median_ms: float
    p20_ms: float
    p80_ms: float
    reps: int

    @property
    def spread(self) -> float:
        """Relative inter-quantile spread; about run-to-run noise."""
        return (self.p80_ms - self.p20_ms) / self.median_ms if self.median_ms else 0.0


@dataclass(frozen=True)
class TrialResult:
    candidate_hash: str
    status: Status
    message: str = ""
    build_seconds: float | None = None
    timing: Timing | None = None
    tflops: float | None = None
    gbps: float | None = None  # where the kernel file says what a call moves (bytes_moved)
    info: dict[str, Any] = field(default_factory=dict)  # clocks, power, max error, the anchor, ...
    # time / the anchor's time, measured side by side in one clock state: what ranks
    # results, since it survives a change of clock state (another moment, another GPU).
    ratio: float | None = None
    confirmed: bool = False  # re-timed in the final tournament

    def rank_key(self) -> tuple[bool, float, float]:
        """Sort key of correct timed results, best first: confirmed ones, then by ratio, then by time."""
        return (not self.confirmed, self.ratio if self.ratio is not None else math.inf,
                self.timing.median_ms if self.timing else math.inf)  # fmt: skip
