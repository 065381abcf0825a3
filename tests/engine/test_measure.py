"""The timing protocol (ws_tuner/measure.py) on a simulated power-capped GPU:
settling, discarding, interleaving and stopping on a confidence interval."""

from __future__ import annotations

import math

import pytest

from ws_tuner.measure import (
    REASON_OTHER_PROCESS,
    REASON_SW_POWER_CAP,
    ClockReading,
    MeasureConfig,
    MeasurementError,
    Rounds,
    Sample,
    compare,
    judge,
    ratio_interval,
    settle,
)
from ws_tuner.testing import SimulatedGPU

CONFIG = MeasureConfig()
SEARCH = CONFIG.search
TOURNAMENT = CONFIG.tournament
# An H200-like pair: "ws" is faster at equal clocks but draws more power, so it
# settles lower (1410 MHz) than "vendor" (1480 MHz); each in its own steady state,
# the vendor kernel wins: 1.00 * 1980/1410 = 1.404 ms against 1.02 * 1980/1480 = 1.365 ms.
KERNELS = {"ws": (1.00, 1410.0), "vendor": (1.02, 1480.0)}
STEADY = {k: base * 1980.0 / mhz for k, (base, mhz) in KERNELS.items()}


def gpu(**kw) -> SimulatedGPU:
    g = SimulatedGPU(KERNELS, **kw)
    g.idle(5.0)
    return g


def test_settling_waits_out_the_fall_from_the_boost_clock():
    g = gpu()
    assert g.mhz == pytest.approx(1980, rel=1e-3)
    start = g.now()
    mhz, ok = settle(g, ["ws"], CONFIG)
    assert ok and mhz == pytest.approx(1410, rel=CONFIG.settle_tol)
    assert g.now() - start >= CONFIG.cold_heat_s  # an idle GPU gets the full heat, however still the clock looks
    # Warm: a short top-up is enough.
    start = g.now()
    settle(g, ["ws"], CONFIG)
    assert g.now() - start < CONFIG.cold_heat_s / 2


def test_settling_gives_up_at_its_limit_and_says_so():
    g = gpu(clock_jitter=0.08)  # a clock that never holds still
    start = g.now()
    _, ok = settle(g, ["ws"], CONFIG)
    assert not ok and CONFIG.max_settle_s <= g.now() - start < CONFIG.max_settle_s + 0.2


def _sample(*mhz: float, reasons: int = REASON_SW_POWER_CAP) -> Sample:
    return Sample("k", (1.0, 1.0), tuple(ClockReading(i * 0.001, m, 700.0, reasons) for i, m in enumerate(mhz)))


@pytest.mark.parametrize(
    "clocks, reasons, verdict",
    [
        ((1400, 1405, 1398), REASON_SW_POWER_CAP, None),  # steady, held by the power cap: the state we want
        ((1700, 1550, 1420), REASON_SW_POWER_CAP, "clock moving"),
        ((1560, 1565, 1562), 0, "clock above settled (the GPU idled)"),
        ((1200, 1190, 1195), 0x20, "throttled (thermal, hardware slowdown or another process)"),
        ((1200, 1190, 1195), REASON_OTHER_PROCESS, "throttled (thermal, hardware slowdown or another process)"),
        ((1300, 1290, 1295), REASON_SW_POWER_CAP, None),  # lower, but for the power cap: still steady state
    ],
)
def test_judge(clocks, reasons, verdict):
    assert judge(_sample(*clocks, reasons=reasons), 1400.0, CONFIG) == verdict


def test_a_single_timing_after_idle_ranks_wrongly_and_the_protocol_does_not():
    g = gpu()
    # The naive way: each kernel timed once, "ws" right after the GPU idled.
    cold_ws = g.sample("ws", 30).median_ms
    g.heat(["vendor"], 1.0)
    warm_vendor = g.sample("vendor", 30).median_ms
    assert cold_ws < warm_vendor  # ws looks 10%+ faster...
    # ...but each in its own steady state, side by side, the vendor kernel wins, by the true margin.
    g.idle(5.0)
    result = compare(g, ["vendor", "ws"], "vendor", CONFIG, TOURNAMENT)
    assert result.winner.kernel == "vendor"
    assert result.stats["ws"].ratio == pytest.approx(STEADY["ws"] / STEADY["vendor"], rel=0.01)
    assert result.stats["ws"].median_ms == pytest.approx(STEADY["ws"], rel=0.01)
    assert result.stats["ws"].clock_median_mhz == pytest.approx(1410, rel=0.02)


def test_the_ratio_survives_a_change_of_clock_state():
    ratios = []
    for idle, base_shift in ((5.0, 1.0), (0.0, 1.0), (5.0, 0.8)):  # after idle, warm, and a GPU 20% slower overall
        g = SimulatedGPU({k: (b * base_shift, m) for k, (b, m) in KERNELS.items()})
        g.idle(idle)
        ratios.append(compare(g, ["vendor", "ws"], "vendor", CONFIG, SEARCH).stats["ws"].ratio)
    assert max(ratios) / min(ratios) < 1.01


def test_search_samples_interleave_and_turn_around():
    g = gpu()
    compare(g, ["vendor", "ws"], "vendor", CONFIG, Rounds(reps=2, sample_s=0.0, min_rounds=4, max_rounds=4, target_ci=0.0, max_seconds=60))
    timed = g.launches[-8:]  # the last two rounds (the 3rd, then the 4th turned around), 2 launches per sample
    assert timed == ["vendor"] * 2 + ["ws"] * 4 + ["vendor"] * 2


def test_short_kernels_get_longer_samples():
    g = SimulatedGPU({"a": (0.2, 1500.0), "b": (0.25, 1500.0)})
    result = compare(g, ["a", "b"], "a", CONFIG, Rounds(reps=10, sample_s=0.02, min_rounds=3, max_rounds=3, max_seconds=60))
    # 20 ms of a ~0.26 ms kernel (at the settled clock): about 75 launches per sample after the first round.
    assert 60 * 2 <= result.stats["a"].launches <= 10 + 2 * 80


def test_a_thermal_slowdown_is_discarded_and_retaken():
    g = gpu()
    settle(g, ["vendor", "ws"], CONFIG)
    g.throttle(g.now() + 0.10, g.now() + 0.13, 0.8)  # during the second or third round
    result = compare(g, ["vendor", "ws"], "vendor", CONFIG, SEARCH)
    assert sum(result.discarded.values()) >= 1
    assert any("throttled" in why or "moving" in why for why in result.discarded)
    clean = compare(gpu(), ["vendor", "ws"], "vendor", CONFIG, SEARCH)
    assert result.stats["ws"].ratio == pytest.approx(clean.stats["ws"].ratio, rel=0.01)


def test_stops_on_the_confidence_interval():
    quiet = compare(gpu(noise=0.0005), ["vendor", "ws"], "vendor", CONFIG, Rounds(min_rounds=3, max_rounds=50, target_ci=0.01, max_seconds=60))
    noisy = compare(gpu(noise=0.05), ["vendor", "ws"], "vendor", CONFIG, Rounds(min_rounds=3, max_rounds=50, target_ci=0.01, max_seconds=60))
    assert quiet.stats["ws"].rounds == 3 and quiet.stats["ws"].ratio_ci <= 0.01
    assert noisy.stats["ws"].rounds > quiet.stats["ws"].rounds
    assert noisy.stats["ws"].ratio_ci <= 0.01 or noisy.stats["ws"].rounds == 50


def test_time_bounds_hold():
    g = gpu(noise=0.2)
    start = g.now()
    result = compare(g, ["vendor", "ws"], "vendor", CONFIG, Rounds(min_rounds=2, max_rounds=1000, target_ci=1e-6, max_seconds=0.5))
    # One round past the limit at most (a round is two samples, a few tens of ms here).
    assert result.stats["ws"].rounds >= 2 and g.now() - start < 0.5 + 0.2


def test_a_tournament_spends_precision_on_the_contenders():
    kernels = {"anchor": (1.0, 1450.0), "close": (0.99, 1450.0), "far": (2.0, 1450.0)}
    g = SimulatedGPU(kernels, noise=0.01)
    result = compare(g, list(kernels), "anchor", CONFIG, Rounds(min_rounds=3, max_rounds=80, target_ci=0.01, max_seconds=60))
    assert result.winner.kernel == "close" and result.stats["close"].ratio_ci <= 0.01
    assert result.stats["far"].ratio == pytest.approx(2.0, rel=0.02)


def test_every_sample_discarded_is_an_error():
    g = gpu()
    g.throttle(0.0, math.inf, 0.5)  # thermally throttled for good, below the settled clock
    g.kernels["ws"] = (1.0, 1410.0)

    class Lying(SimulatedGPU):
        def sample(self, kernel, reps):
            s = super().sample(kernel, reps)
            return Sample(kernel, s.times_ms, tuple(ClockReading(c.t, c.sm_mhz * (0.5 if i % 2 else 1.0), c.power_w, c.reasons) for i, c in enumerate(s.clocks)))

    lying = Lying(KERNELS)
    with pytest.raises(MeasurementError, match="discarded"):
        compare(lying, ["vendor", "ws"], "vendor", CONFIG, SEARCH)


def test_ratio_interval():
    mean, half = ratio_interval([1.0, 1.0, 1.0])
    assert mean == 1.0 and half == 0.0
    mean, half = ratio_interval([0.9, 1.1])
    assert mean == pytest.approx(math.sqrt(0.99)) and half > 0.5  # two rounds: a wide interval
    assert ratio_interval([2.0])[1] == math.inf
