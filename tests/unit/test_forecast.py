"""The OOM forecast: Theil–Sen trend of used memory, extrapolated to the total, or None."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hwdash.core.live.forecast import Forecast, forecast_full

GIB = 1024**3
TOTAL = 80 * GIB
T0 = 1_700_000_000.0  # Unix timestamps: large, to catch precision loss


def ramp(
    slope: float, *, n: int = 121, dt: float = 1.0, start: float = 20 * GIB
) -> list[tuple[float, int, int]]:
    """``n`` readings ``dt`` seconds apart climbing ``slope`` bytes per second from ``start``."""
    return [(T0 + i * dt, round(start + slope * i * dt), TOTAL) for i in range(n)]


def saw(
    slope: float, *, period: int, amplitude: float, n: int = 121, start: float = 30 * GIB
) -> list[tuple[float, int, int]]:
    """A training loop: memory rises through each ``period``-reading step by ``amplitude`` bytes and
    falls back at its end, on top of a climb of ``slope`` bytes per second (1 s readings)."""
    return [
        (T0 + i, round(start + slope * i + amplitude * (i % period) / period), TOTAL)
        for i in range(n)
    ]


def test_linear_climb_gives_exact_time_to_full() -> None:
    slope = 0.1 * GIB
    points = ramp(slope)
    result = forecast_full(points)
    assert result is not None
    last_used = 20 * GIB + slope * 120
    expected = (TOTAL - last_used) / slope  # 480 s
    assert result.seconds_to_full == pytest.approx(expected, rel=0.01)
    assert result.slope_bytes_per_s == pytest.approx(slope, rel=0.01)
    assert result.window_s == pytest.approx(120.0)


def test_unsorted_points_give_the_same_forecast() -> None:
    points = ramp(0.1 * GIB)
    shuffled = points[:]
    random.Random(1).shuffle(shuffled)
    assert forecast_full(shuffled) == forecast_full(points)


@pytest.mark.parametrize("slope", [0.0, -0.1 * GIB], ids=["flat", "falling"])
def test_flat_or_falling_gives_none(slope: float) -> None:
    assert forecast_full(ramp(slope, start=60 * GIB)) is None


def test_rise_below_one_percent_of_total_gives_none() -> None:
    # 0.5% of the total over the window: a clean line, but too small to be a trend worth a countdown.
    slope = 0.005 * TOTAL / 120
    assert forecast_full(ramp(slope)) is None
    assert forecast_full(ramp(slope * 4)) is not None  # 2%: the same line, steeper, does count


@pytest.mark.parametrize("seed", range(5))
def test_noise_without_trend_gives_none(seed: int) -> None:
    rng = random.Random(seed)
    points = [(T0 + i, round(40 * GIB + rng.gauss(0, 2 * GIB)), TOTAL) for i in range(121)]
    assert forecast_full(points) is None


def test_noisy_climb_is_still_found() -> None:
    rng = random.Random(7)
    slope = 0.05 * GIB
    points = [(T0 + i, round(20 * GIB + slope * i + rng.gauss(0, GIB)), TOTAL) for i in range(121)]
    result = forecast_full(points)
    assert result is not None
    assert result.slope_bytes_per_s == pytest.approx(slope, rel=0.25)


@pytest.mark.parametrize("period", [3, 5, 8, 13])
def test_saw_tooth_around_flat_level_gives_none(period: int) -> None:
    # Each step the memory climbs 4 GiB (5% of the total) and falls back: locally a steep rise.
    assert forecast_full(saw(0.0, period=period, amplitude=4 * GIB)) is None


@pytest.mark.parametrize("period", [3, 5, 8, 13])
def test_saw_tooth_on_slow_climb_follows_the_climb(period: int) -> None:
    slope = 0.1 * GIB
    amplitude = 4 * GIB
    result = forecast_full(saw(slope, period=period, amplitude=amplitude))
    assert result is not None
    # The underlying climb's middle line at the last reading, and its time to full.
    level = 30 * GIB + slope * 120 + amplitude / 2
    expected = (TOTAL - level) / slope
    assert result.seconds_to_full == pytest.approx(expected, rel=0.25)
    assert result.slope_bytes_per_s == pytest.approx(slope, rel=0.25)
    # The saw's own local slope (4 GiB per step) is far steeper: it must not leak in.
    assert result.slope_bytes_per_s < 2 * slope


@pytest.mark.parametrize("n", [41, 121, 481])
def test_saw_tooth_on_slow_climb_at_several_sample_counts(n: int) -> None:
    # Same 120 s window, readings 3 s, 1 s and 0.25 s apart (all pairs / subsampled pairs).
    dt = 120 / (n - 1)
    slope = 0.1 * GIB
    points = [
        (T0 + i * dt, round(30 * GIB + slope * i * dt + 4 * GIB * (i % 7) / 7), TOTAL)
        for i in range(n)
    ]
    result = forecast_full(points)
    assert result is not None
    assert result.slope_bytes_per_s == pytest.approx(slope, rel=0.25)


@pytest.mark.parametrize(("dt", "period"), [(4.0, 15), (6.0, 11)])
def test_long_steps_with_few_readings(dt: float, period: int) -> None:
    # Steps of a minute or more with readings seconds apart (fewer than 60 points, every pair): the
    # pairs inside one step see the saw's local rise, so they must not enter the median.
    n = int(120 / dt) + 1

    def points(slope: float) -> list[tuple[float, int, int]]:
        return [
            (T0 + i * dt, round(30 * GIB + slope * i * dt + 4 * GIB * (i % period) / period), TOTAL)
            for i in range(n)
        ]

    # The recent part of the window (its last quarter) lies inside one step, which climbs for a
    # minute or more: that is the current climb, the trend plus the step's own rate, never more.
    step_rate = 4 * GIB / (period * dt)
    result = forecast_full(points(0.1 * GIB))
    assert result is not None
    assert 0.75 * 0.1 * GIB <= result.slope_bytes_per_s <= 1.25 * (0.1 * GIB + step_rate)
    # On a flat level the same holds: a forecast, when shown, climbs at the step's rate.
    flat = forecast_full(points(0.0))
    assert flat is None or flat.slope_bytes_per_s <= 1.25 * step_rate


def test_equal_timestamps_are_skipped_in_pairs() -> None:
    # Readings in bursts sharing a timestamp (a coarse clock): 10 at each of 0, 60 and 120 s. Pairs
    # inside a burst have no slope; the pairs across bursts give the line.
    slope = 0.1 * GIB
    points = [(T0 + t, round(20 * GIB + slope * t), TOTAL) for t in (0, 60, 120) for _ in range(10)]
    result = forecast_full(points)
    assert result is not None
    assert result.slope_bytes_per_s == pytest.approx(slope, rel=0.01)


def test_outlier_spike_barely_changes_the_forecast() -> None:
    points = ramp(0.1 * GIB)
    clean = forecast_full(points)
    spiked = points[:]
    t, used, total = spiked[60]
    spiked[60] = (t, used + 40 * GIB, total)  # one reading 40 GiB too high
    dipped = points[:]
    dipped[30] = (dipped[30][0], 0, TOTAL)  # and one reading of zero
    assert clean is not None
    for odd in (spiked, dipped):
        result = forecast_full(odd)
        assert result is not None
        assert result.seconds_to_full == pytest.approx(clean.seconds_to_full, rel=0.05)


def test_too_few_points_gives_none() -> None:
    points = ramp(0.1 * GIB, n=7, dt=20.0)  # 7 readings over 120 s
    assert forecast_full(points) is None
    assert forecast_full(points, min_points=7) is not None


def test_too_short_span_gives_none() -> None:
    points = ramp(0.1 * GIB, n=29, dt=1.0)  # 28 s: less than a quarter of 120 s
    assert forecast_full(points) is None
    assert forecast_full(ramp(0.1 * GIB, n=31, dt=1.0)) is not None  # 30 s: exactly a quarter


def test_window_excludes_old_points() -> None:
    # A steep climb 10 minutes ago, then two minutes of flat memory: no forecast.
    old = [(T0 + i, round(10 * GIB + 0.1 * GIB * i), TOTAL) for i in range(300)]
    flat = [(T0 + 300 + i, 40 * GIB, TOTAL) for i in range(300)]
    assert forecast_full(old + flat) is None
    # A window reaching back into the climb still forecasts from the current (flat) part...
    assert forecast_full(old + flat, window_s=900) is None
    # ...unless the current part reaches back into the climb too.
    assert forecast_full(old + flat, window_s=900, recent_s=900) is not None


def test_now_sets_the_window_end() -> None:
    points = ramp(0.1 * GIB)  # 120 s of climb
    assert forecast_full(points, now=T0 + 120) is not None
    # Ten minutes later the readings are stale: none lies within the window any more.
    assert forecast_full(points, now=T0 + 720) is None
    # Readings after `now` are ignored: at T0 + 20 only 21 readings over 20 s are known.
    assert forecast_full(points, now=T0 + 20) is None


def test_already_full_gives_none() -> None:
    slope = 0.5 * GIB
    points = [(T0 + i, min(TOTAL, round(20 * GIB + slope * i)), TOTAL) for i in range(121)]
    assert points[-1][1] == TOTAL
    assert forecast_full(points) is None


def test_level_never_below_last_reading() -> None:
    # A climb whose last reading jumps up: the count starts from that reading, not the fitted line.
    slope = 0.1 * GIB
    points = ramp(slope)
    t, _, total = points[-1]
    points[-1] = (t, 70 * GIB, total)
    result = forecast_full(points)
    assert result is not None
    assert result.seconds_to_full == pytest.approx((TOTAL - 70 * GIB) / slope, rel=0.01)


@pytest.mark.parametrize(
    "points",
    [
        [],
        [(T0, 10 * GIB, TOTAL)] * 20,  # all timestamps equal
        [(T0 + i, 10 * GIB + i * GIB, 0) for i in range(121)],  # total 0
        [(T0 + i, i * GIB, TOTAL) for i in range(121) for _ in range(2)][:3],
        [(float("nan"), 1, 2)] * 20,
        [(T0 + i, None, TOTAL) for i in range(121)],
    ],
    ids=["empty", "equal-timestamps", "total-zero", "three-points", "nan", "none-values"],
)
def test_odd_input_gives_none(points: list[tuple[float, int, int]]) -> None:
    assert forecast_full(points) is None


def test_none_values_are_skipped() -> None:
    points: list[tuple[float, int | None, int]] = list(ramp(0.1 * GIB))
    for i in range(0, 121, 10):
        points[i] = (points[i][0], None, TOTAL)
    result = forecast_full(points)  # type: ignore[arg-type]
    assert result is not None
    assert result.slope_bytes_per_s == pytest.approx(0.1 * GIB, rel=0.01)


@pytest.mark.parametrize("window_s", [0.0, -5.0, math.inf, math.nan])
def test_bad_window_gives_none(window_s: float) -> None:
    assert forecast_full(ramp(0.1 * GIB), window_s=window_s) is None


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(allow_nan=False, allow_infinity=False),
            st.integers(min_value=-(2**70), max_value=2**70),
            st.integers(min_value=-(2**70), max_value=2**70),
        ),
        max_size=80,
    ),
    st.floats(min_value=1e-3, max_value=1e6),
    st.integers(min_value=0, max_value=20),
)
def test_result_is_none_or_positive_and_finite(
    points: list[tuple[float, int, int]], window_s: float, min_points: int
) -> None:
    result = forecast_full(points, window_s=window_s, min_points=min_points)
    assert result is None or isinstance(result, Forecast)
    if result is not None:
        assert math.isfinite(result.seconds_to_full) and result.seconds_to_full > 0
        assert math.isfinite(result.slope_bytes_per_s) and result.slope_bytes_per_s > 0
        assert math.isfinite(result.window_s) and result.window_s > 0


@settings(max_examples=200, deadline=None)
@given(
    st.floats(min_value=0.01, max_value=10.0),
    st.floats(min_value=0.0, max_value=0.5),
    st.integers(min_value=8, max_value=200),
)
def test_clean_climbs_are_found(slope_gib: float, start_fraction: float, n: int) -> None:
    # Any clean climb that fills less than the total inside the window gives the exact forecast.
    dt = 120 / (n - 1)
    slope = slope_gib * GIB
    points = ramp(slope, n=n, dt=dt, start=start_fraction * TOTAL)
    last = points[-1][1]
    if last >= TOTAL or slope * 120 < 0.01 * TOTAL:
        return
    result = forecast_full(points)
    assert result is not None
    assert result.seconds_to_full == pytest.approx((TOTAL - last) / slope, rel=0.01)


# -- following the current climb (issue 22) -------------------------------------------------------
#
# The monitor fits the forecast every round over its history (telemetry.history.History), so the
# tests below replay readings through it, one a second, as the monitor does.


def _monitor_forecasts(readings: list[tuple[float, int, int]]) -> list[float | None]:
    """Each round's forecast for one GPU whose (time, used+reserved, total) readings are given."""
    from hwdash.telemetry.history import History
    from hwdash.telemetry.types import GpuSample, NvmlStatus, Snapshot

    history = History(interval_s=1.0)
    seen: list[float | None] = []
    for t, taken, total in readings:
        gpu = GpuSample(index=0, name="G", uuid=None, total_bytes=total, free_bytes=total - taken)
        snapshot = Snapshot(timestamp=t, nvml=NvmlStatus(available=True), gpus=(gpu,))
        history.add(snapshot)
        seen.append(history.with_forecasts(snapshot).gpus[0].forecast_full_s)
    return seen


def _demo_gpu3() -> list[tuple[float, int, int]]:
    """The demo recording's GPU 3 (``hwdash --demo``: climbs, levels off at 96%, restarts at 100 s
    and climbs again), read through the fake NVML and the real sampler once a second."""
    from hwdash.telemetry.fake_nvml import ManualClock, make_fake_pynvml
    from hwdash.telemetry.nvml_sampler import NvmlSampler
    from hwdash.telemetry.source import DEMO_SCENARIO

    clock = ManualClock(0.0)
    fake = make_fake_pynvml(DEMO_SCENARIO, clock)
    sampler = NvmlSampler(fake.module, round_timeout_s=2.0, wall_clock=lambda: T0 + clock())
    readings = []
    try:
        for second in range(171):
            clock.now_s = float(second)
            gpu = sampler.sample().gpus[3]
            assert gpu.total_bytes is not None and gpu.free_bytes is not None
            readings.append((T0 + second, gpu.total_bytes - gpu.free_bytes, gpu.total_bytes))
    finally:
        sampler.close()
    return readings


def test_the_demo_forecast_follows_the_current_climb() -> None:
    readings = _demo_gpu3()
    seen = _monitor_forecasts(readings)
    taken = [r[1] for r in readings]
    free = [r[2] - r[1] for r in readings]
    # The current climb at second t: the rise over the last second (the scenario is piecewise
    # linear); "settled" where it has not changed over the last 15 s (the forecast's recent part).
    rate = [0.0] + [float(taken[t] - taken[t - 1]) for t in range(1, len(taken))]

    def settled(t: int) -> bool:
        return t >= 16 and all(abs(rate[u] - rate[t]) <= 0.02 * rate[t] for u in range(t - 15, t))

    tracked = 0
    for t, forecast in enumerate(seen):
        current = free[t] / rate[t] if rate[t] > 0 else None
        if forecast is not None and current is not None:
            # never later than the current climb says (no false comfort)...
            assert forecast <= current * 1.05 + 0.2, t
            if settled(t):  # ...and on it once the climb has held for the recent part
                assert forecast == pytest.approx(current, rel=0.05, abs=0.2), t
                tracked += 1
        if t and settled(t) and rate[t] > 0 and forecast is not None and seen[t - 1] is not None:
            # memory climbing steadily: the forecast only comes down (no timer jumping back up)
            assert forecast <= seen[t - 1] + 0.2, (t, seen[t - 1], forecast)
    assert tracked >= 30  # both fast climbs (30-45 s, 130-150 s) were followed
    # The climb slows to a crawl at 60 s and memory levels off at 96%: blank from then on until
    # the restart, and within 10 s of memory stopping at 150 s.
    assert all(forecast is None for forecast in seen[60:100]), seen[60:100]
    assert all(forecast is None for forecast in seen[160:]), seen[160:]
    assert all(forecast is not None for forecast in seen[130:150])


@pytest.mark.parametrize("slow_share", [0.0, 0.05], ids=["flat", "crawl"])
def test_a_climb_that_levels_off_goes_blank_within_ten_seconds(slow_share: float) -> None:
    # 0.5 GiB/s from 20 GiB to 96% of 80 GiB (about 114 s), then flat or a crawl at 5% of that.
    fast = 0.5 * GIB
    top = 0.96 * TOTAL
    knee = (top - 20 * GIB) / fast

    def taken(t: float) -> int:
        if t <= knee:
            return round(20 * GIB + fast * t)
        return min(TOTAL - 1, round(top + slow_share * fast * (t - knee)))

    readings = [(T0 + t, taken(t), TOTAL) for t in range(200)]
    seen = _monitor_forecasts(readings)
    stop = math.ceil(knee)
    assert seen[stop - 1] is not None  # the climb was forecast
    for t in range(stop + 1, len(seen)):
        if seen[t] is None:
            continue
        # The fast climb is over: the forecast never says sooner than even that climb would
        # need for the memory still free, and on flat memory it does not count down like a timer.
        assert seen[t] >= (TOTAL - readings[t][1]) / fast - 0.5, (t, seen[stop - 1 :])
        if not slow_share and seen[t - 1] is not None:
            assert seen[t] >= seen[t - 1] - 0.25, (t, seen[stop - 1 :])
    # Blank within 10 s, for as long as the window remembers the fast climb. (A crawl that goes on
    # for a whole window is a climb of its own: forecast again if it rises 1% of the memory per
    # window, as a 5% crawl at 96% does, which would fill the GPU in about two minutes.)
    assert all(forecast is None for forecast in seen[stop + 10 : stop + 45]), seen[stop:]
    if not slow_share:
        assert all(forecast is None for forecast in seen[stop + 10 :])
