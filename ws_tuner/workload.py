"""What a stored result depends on. Two results are comparable only when
their workload keys are equal."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from .candidate import canonical_json, sha256_hex

COMPILE_ONLY_DEVICE = "compile-only"


@dataclass(frozen=True)
class Environment:
    """The machine and toolchain a result was produced with."""

    arch: str  # e.g. "sm_90a"
    device: str  # e.g. "NVIDIA H200", or COMPILE_ONLY_DEVICE without a GPU
    tilelang_version: str
    cuda_version: str
    driver_version: str


@dataclass(frozen=True)
class WorkloadKey:
    kernel: str  # the kernel's name (file stem)
    source_hash: str  # sha256 of the kernel file
    problem: str  # canonical JSON of the problem arguments
    arch: str
    device: str
    tilelang_version: str
    cuda_version: str
    driver_version: str

    @classmethod
    def make(cls, kernel: str, source_hash: str, problem: dict[str, Any], env: Environment) -> "WorkloadKey":
        return cls(kernel=kernel, source_hash=source_hash, problem=canonical_json(problem), **asdict(env))

    @property
    def hash(self) -> str:
        return sha256_hex(canonical_json(asdict(self)))[:24]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def untimed_note(asked: str, stored: Iterable[str]) -> str:
    """Why a lookup on device ``asked`` found no timing, given the devices of the
    workloads stored for the same kernel source and problem: a compile-only tuning
    times nothing, and another device's results are one device name away ("" when
    neither applies)."""
    devices = sorted(set(stored) - {asked})
    notes = []
    if COMPILE_ONLY_DEVICE in devices or asked == COMPILE_ONLY_DEVICE:
        notes.append("compile-only tunings (no GPU) verify and build candidates but time nothing: tune on a Hopper GPU")
    if others := [d for d in devices if d != COMPILE_ONLY_DEVICE]:
        notes.append(f"results exist for device {', '.join(repr(d) for d in others)}")
    return "".join(f"; {n}" for n in notes)
