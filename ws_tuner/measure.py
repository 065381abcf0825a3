"""The timing protocol: steady-state samples on a power-capped GPU, compared side by side.

An H200 capped at 700 W drops its SM clock by about 30% within 0.2 s of load
and climbs back after about 1 s idle, and each kernel settles at a clock of
its own (a kernel that draws more power per operation runs slower). A kernel
timed right after an idle gap reads up to 15% fast, so single timings taken
at different moments rank kernels wrongly. After NVIDIA's nvbench:

1. Settle: run the kernels under comparison back to back until the SM clock
   holds still (and for at least ``cold_heat_s`` after an idle gap).
2. Sample in rounds, interleaved (anchor, candidate, candidate, anchor, ...):
   each sample is ``reps`` launches with the L2 flushed before each, the clock
   read while they run.
3. Discard a sample taken while the clock was still moving or sat above the
   settled clock (the GPU had idled), or below ``throttle`` of it for a reason
   other than the power cap (thermal slowdown, another process); settle again
   and retake it.
4. Stop when the confidence interval of the ratio to the anchor is under the
   target (after ``min_rounds``; at most ``max_rounds`` or ``max_seconds``).

Ratios to an anchor timed in the same state survive a change of clock state
(another moment, another GPU); raw times do not. So ranks use ratios.

Pure Python: the GPU arrives as a ``Bench`` (gpu.py has the real one, the
testing package a simulated one), so CI checks every rule of the protocol.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol, Sequence

# NVML clock event reasons (nvmlClocksEventReason*): why the SM clock is below its maximum.
REASON_IDLE = 0x1
REASON_SW_POWER_CAP = 0x4
REASON_HW_SLOWDOWN = 0x8
REASON_SW_THERMAL = 0x20
REASON_HW_THERMAL = 0x40
REASON_HW_POWER_BRAKE = 0x80
REASON_OTHER_PROCESS = 1 << 31  # not NVML's: the bench saw another process on the GPU
# A clock held down by these is not the state the kernel will run in; the power cap is.
MAX_REPS = 500  # launches per sample, at most (a kernel of a few microseconds)
FOREIGN_REASONS = REASON_HW_SLOWDOWN | REASON_SW_THERMAL | REASON_HW_THERMAL | REASON_HW_POWER_BRAKE | REASON_OTHER_PROCESS


@dataclass(frozen=True)
class ClockReading:
    t: float  # seconds, the bench's clock
    sm_mhz: float
    power_w: float
    reasons: int = 0


@dataclass(frozen=True)
class Sample:
    """``reps`` timed launches of one kernel and the clock readings taken while they ran."""

    kernel: str
    times_ms: tuple[float, ...]
    clocks: tuple[ClockReading, ...]

    @property
    def median_ms(self) -> float:
        return statistics.median(self.times_ms)


class Bench(Protocol):
    """The GPU as the protocol sees it: named kernels, launched and timed."""

    def now(self) -> float:
        """Seconds on a monotonic clock."""
        ...

    def idle_seconds(self) -> float:
        """How long the GPU has had no work from this bench (0 while it has)."""
        ...

    def heat(self, kernels: Sequence[str], seconds: float) -> list[ClockReading]:
        """Launch ``kernels`` back to back, in turn, for about ``seconds``; the clock as it went."""
        ...

    def sample(self, kernel: str, reps: int) -> Sample:
        """Time ``reps`` launches, the L2 flushed before each."""
        ...


@dataclass(frozen=True)
class Rounds:
    """How long one comparison samples: one setting for the search, one for the final tournament."""

    reps: int = 10  # launches per sample, at least
    sample_s: float = 0.02  # ... and enough for this long a sample: short kernels get more launches, less noise
    min_rounds: int = 3
    max_rounds: int = 6
    target_ci: float = 0.02  # relative half-width of the 95% interval of the contender's ratio
    max_seconds: float = 0.5  # of sampling and settling; the search's share of GPU time per candidate
    # Seconds each kernel runs alone before its sample, so that the clock reaches the
    # kernel's own settled level (0: the kernels share one state, a blend of theirs).
    own_state_s: float = 0.0


@dataclass(frozen=True)
class MeasureConfig:
    """The whole timing protocol (documented in this module's docstring)."""

    search: Rounds = field(default_factory=Rounds)
    # The final re-timing of the leaders: long enough for a 1% interval on the winner.
    tournament: Rounds = field(default_factory=lambda: Rounds(reps=10, sample_s=0.04, min_rounds=5, max_rounds=60, target_ci=0.01,
                                                              max_seconds=40.0, own_state_s=0.12))
    cold_heat_s: float = 0.3  # load after an idle gap before the clock can be trusted
    warm_heat_s: float = 0.03  # load before sampling when the GPU was busy a moment ago
    idle_gap_s: float = 0.05  # an idle gap longer than this lets the clock climb
    settle_window_s: float = 0.05  # readings this recent must agree for the clock to count as settled
    settle_tol: float = 0.03  # ... within this fraction of their median
    max_settle_s: float = 1.5
    # A sample whose clock spans more than this (of the settled clock) is discarded. Under
    # the power cap the clock hunts by 3-6% around its settled level (benchmarks/clock_probe.py
    # on an H200); a fall from the boost clock is 30%.
    moving_tol: float = 0.10
    throttle: float = 0.90  # a sample below this fraction of the settled clock, for a foreign reason, is discarded
    max_retakes: int = 3  # discarded samples retaken per kernel and round before the round is given up


@dataclass(frozen=True)
class KernelStats:
    """What a comparison says of one kernel."""

    kernel: str
    median_ms: float  # over every accepted launch
    p20_ms: float
    p80_ms: float
    launches: int
    ratio: float  # geometric mean over rounds of (this kernel's median / the anchor's), same state
    ratio_ci: float  # relative half-width of the ratio's 95% interval (inf with one round)
    time_ci: float  # relative half-width of the 95% interval of its per-round medians (drift included)
    rounds: int
    clock_min_mhz: float
    clock_median_mhz: float
    power_w: float

    def info(self) -> dict[str, float | int | None]:
        return {
            "ratio_ci": _finite(self.ratio_ci),
            "time_ci": _finite(self.time_ci),
            "rounds": self.rounds,
            "sm_clock_min_mhz": round(self.clock_min_mhz),
            "sm_clock_median_mhz": round(self.clock_median_mhz),
            "power_w": round(self.power_w, 1),
        }


@dataclass(frozen=True)
class Comparison:
    """Kernels measured side by side in steady state."""

    anchor: str
    stats: dict[str, KernelStats]
    settled_mhz: float
    discarded: dict[str, int]  # reason -> samples thrown away
    unsettled: int  # times the clock did not hold still within max_settle_s
    seconds: float

    @property
    def winner(self) -> KernelStats:
        return min(self.stats.values(), key=lambda s: s.ratio)

    def info(self) -> dict[str, object]:
        return {"settled_mhz": round(self.settled_mhz), "discarded": dict(self.discarded), "unsettled": self.unsettled,
                "measure_s": round(self.seconds, 3)}  # fmt: skip


# --- statistics -------------------------------------------------------------

# Two-sided 95% Student t quantiles by degrees of freedom (1..30); beyond, the normal's.
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)  # fmt: skip


def ratio_interval(ratios: Sequence[float]) -> tuple[float, float]:
    """(geometric mean, relative half-width of its 95% interval) of per-round ratios.

    Logs: a ratio and its inverse then get the same interval."""
    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return math.exp(mean), math.inf
    t = _T95[len(logs) - 2] if len(logs) - 1 <= len(_T95) else 1.96
    half = t * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), math.expm1(half)


# --- the protocol -----------------------------------------------------------


def settle(bench: Bench, kernels: Sequence[str], config: MeasureConfig, at_least: float = 0.0) -> tuple[float, bool]:
    """Load the GPU with ``kernels`` until the SM clock holds still (``at_least`` seconds, or
    ``cold_heat_s`` after an idle gap).

    Returns (the settled clock, whether it settled within ``max_settle_s``).
    """
    first = max(config.cold_heat_s if bench.idle_seconds() > config.idle_gap_s else config.warm_heat_s, at_least)
    readings = bench.heat(kernels, first)
    spent = first
    while True:
        if readings:
            recent = [r.sm_mhz for r in readings if r.t >= readings[-1].t - config.settle_window_s]
            center = statistics.median(recent)
            if len(recent) >= 3 and (max(recent) - min(recent)) <= config.settle_tol * center:
                return center, True
            if spent >= config.max_settle_s:
                return center, False
        elif spent >= config.max_settle_s:
            return 0.0, False
        step = max(config.settle_window_s, 0.01)
        readings += bench.heat(kernels, step)
        spent += step


def judge(sample: Sample, settled_mhz: float, config: MeasureConfig) -> str | None:
    """Why a sample must be discarded, or None to keep it."""
    if not sample.clocks or settled_mhz <= 0:
        return None  # no clock to read (a bench without NVML): nothing to judge by
    mhz = [c.sm_mhz for c in sample.clocks]
    if max(mhz) - min(mhz) > config.moving_tol * settled_mhz:
        return "clock moving"
    center = statistics.median(mhz)
    if center > settled_mhz * (1 + config.moving_tol):
        return "clock above settled (the GPU idled)"
    reasons = 0
    for c in sample.clocks:
        reasons |= c.reasons
    if min(mhz) < config.throttle * settled_mhz and reasons & FOREIGN_REASONS:
        return "throttled (thermal, hardware slowdown or another process)"
    return None


def compare(bench: Bench, kernels: Sequence[str], anchor: str, config: MeasureConfig, protocol: Rounds) -> Comparison:
    """Time ``kernels`` (the anchor among them) interleaved, in steady state.

    Each round samples every kernel once, in an order that turns around every
    round (A B C, C B A, ...) so that a slow drift within a round falls on all
    alike. With ``protocol.own_state_s``, each kernel first runs alone until
    the clock settles at its own level: under a power cap a kernel's speed
    includes the clock its power draw allows, which a shared state blends away.

    Stops, after ``min_rounds``, once the ratio to the anchor of the fastest
    other kernel (the one that contends with the anchor, or beats it)
    is known to ``protocol.target_ci``; at the latest after ``max_rounds`` or
    ``max_seconds``. Precision goes to the contenders: a kernel far behind
    needs no third digit.
    """
    if anchor not in kernels:
        raise ValueError(f"anchor {anchor!r} is not among the kernels compared")
    order = [anchor] + [k for k in dict.fromkeys(kernels) if k != anchor]
    start = bench.now()
    settled, ok = (0.0, True) if protocol.own_state_s else settle(bench, order, config)
    unsettled = 0 if ok else 1
    discarded: Counter[str] = Counter()
    rounds: list[dict[str, Sample]] = []
    reps = dict.fromkeys(order, protocol.reps)
    while len(rounds) < protocol.max_rounds:
        round_: dict[str, Sample] = {}
        for kernel in order if len(rounds) % 2 == 0 else order[::-1]:
            state = [kernel] if protocol.own_state_s else order
            for attempt in range(config.max_retakes + 1):
                if protocol.own_state_s or attempt:  # a retake follows nvbench's recovery: settle again
                    settled, ok = settle(bench, state, config, protocol.own_state_s)
                    unsettled += 0 if ok else 1
                sample = bench.sample(kernel, reps[kernel])
                why = judge(sample, settled, config)
                if why is None:
                    round_[kernel] = sample
                    if not rounds:  # sized once, from the first sample: every round then weighs alike
                        reps[kernel] = min(max(protocol.reps, int(protocol.sample_s * 1e3 / sample.median_ms)), MAX_REPS)
                    break
                discarded[why] += 1
        if len(round_) == len(order):  # a round missing a kernel compares nothing
            rounds.append(round_)
        elapsed = bench.now() - start
        if len(rounds) >= protocol.min_rounds and _precise(rounds, order, protocol.target_ci):
            break
        if elapsed > protocol.max_seconds:
            break
    if not rounds:
        raise MeasurementError(f"every sample was discarded ({', '.join(f'{n} {why}' for why, n in discarded.items())})")
    stats = {k: _stats(k, anchor, rounds) for k in order}
    return Comparison(anchor, stats, settled, dict(discarded), unsettled, bench.now() - start)


class MeasurementError(RuntimeError):
    """No sample survived the protocol (the GPU never reached a steady state)."""


def _ratios(kernel: str, anchor: str, rounds: Sequence[dict[str, Sample]]) -> list[float]:
    return [r[kernel].median_ms / r[anchor].median_ms for r in rounds]


def _precise(rounds: Sequence[dict[str, Sample]], order: Sequence[str], target: float) -> bool:
    anchor, others = order[0], order[1:]
    if not others:
        return True
    best = min((ratio_interval(_ratios(k, anchor, rounds)) for k in others), key=lambda interval: interval[0])
    return best[1] <= target


def _stats(kernel: str, anchor: str, rounds: Sequence[dict[str, Sample]]) -> KernelStats:
    samples = [r[kernel] for r in rounds]
    times = sorted(t for s in samples for t in s.times_ms)
    q = statistics.quantiles(times, n=5) if len(times) >= 2 else [times[0]] * 4
    ratio, ci = (1.0, 0.0) if kernel == anchor else ratio_interval(_ratios(kernel, anchor, rounds))
    _, time_ci = ratio_interval([s.median_ms for s in samples])
    clocks = [c for s in samples for c in s.clocks]
    mhz = [c.sm_mhz for c in clocks] or [0.0]
    return KernelStats(
        kernel=kernel,
        median_ms=statistics.median(times),
        p20_ms=q[0],
        p80_ms=q[3],
        launches=len(times),
        ratio=ratio,
        ratio_ci=ci,
        time_ci=time_ci,
        rounds=len(rounds),
        clock_min_mhz=min(mhz),
        clock_median_mhz=statistics.median(mhz),
        power_w=statistics.median([c.power_w for c in clocks]) if clocks else 0.0,
    )


def _finite(x: float) -> float | None:
    return round(x, 5) if math.isfinite(x) else None
