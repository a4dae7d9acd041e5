"""History rings: bounded, oldest dropped, flat memory over a day of samples."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable

import pytest

from hwdash.telemetry.history import History
from hwdash.telemetry.types import GpuSample, HostSample, NvmlStatus, ProcessSample, Snapshot

STATUS = NvmlStatus(available=True, driver_version="550")


def snapshot(t: float, gpus: int = 2, *, stale: bool = False) -> Snapshot:
    return Snapshot(
        timestamp=t,
        nvml=STATUS,
        gpus=tuple(
            GpuSample(
                index=i, name="G", uuid=None, total_bytes=1000, free_bytes=1000 - int(t) % 1000
            )
            for i in range(gpus)
        ),
        host=HostSample(cpu_percent=float(int(t) % 100), ram_used_bytes=1, ram_total_bytes=2),
        stale=stale,
    )


def test_capacity_is_the_window_at_the_interval() -> None:
    assert History(interval_s=1.0).capacity == 600
    assert History(interval_s=0.5, window_s=60).capacity == 120
    assert History(interval_s=7, window_s=60).capacity == 9
    with pytest.raises(ValueError):
        History(interval_s=0)


def test_rings_keep_the_newest_points_in_order() -> None:
    history = History(interval_s=1, window_s=5)
    for t in range(12):
        history.add(snapshot(float(t)))
    points = history.gpu(1)
    assert [p.timestamp for p in points] == [7, 8, 9, 10, 11]
    assert history.pressures(0) == pytest.approx([0.007, 0.008, 0.009, 0.010, 0.011])
    assert [p.cpu_percent for p in history.host()] == [7, 8, 9, 10, 11]
    assert history.gpu_indices() == [0, 1]
    assert history.gpu(5) == ()


def test_stale_snapshots_are_not_recorded() -> None:
    history = History(interval_s=1, window_s=10)
    history.add(snapshot(1))
    history.add(snapshot(2, stale=True))
    assert [p.timestamp for p in history.gpu(0)] == [1]


def test_memory_stays_flat_over_a_day_of_samples() -> None:
    history = History(interval_s=1.0)  # 600 points per ring
    tracemalloc.start()
    try:
        for t in range(2_000):
            history.add(snapshot(float(t), gpus=8))
        after_warmup, _ = tracemalloc.get_traced_memory()
        for t in range(2_000, 86_400, 7):  # a day at 1 s, thinned to keep the test quick
            history.add(snapshot(float(t), gpus=8))
        after_day, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert all(len(history.gpu(i)) == 600 for i in range(8))
    assert len(history.host()) == 600
    assert after_day < after_warmup * 1.2


GIB = 1024**3


def memory_at(t: float, used: float, *, processes: tuple[int, ...] = ()) -> Snapshot:
    """One 80 GiB GPU with ``used`` GiB taken and the given PIDs on it."""
    total = 80 * GIB
    return Snapshot(
        timestamp=t,
        nvml=STATUS,
        gpus=(
            GpuSample(
                index=0,
                name="G",
                uuid=None,
                total_bytes=total,
                free_bytes=total - round(used * GIB),
                processes=tuple(
                    ProcessSample(pid=pid, gpu_index=0, kind="compute", used_bytes=round(t * GIB))
                    for pid in processes
                ),
            ),
        ),
    )


def forecasts(used: Callable[[float], float], seconds: int) -> list[float | None]:
    history = History(interval_s=1.0)
    result = []
    for t in range(seconds):
        snap = memory_at(float(t), used(t))
        history.add(snap)
        result.append(history.with_forecasts(snap).gpus[0].forecast_full_s)
    return result


def test_a_steady_climb_is_forecast_to_fill_at_its_rate() -> None:
    seen = forecasts(lambda t: 20 + 0.25 * t, 90)  # 0.25 GiB/s from 20 GiB: full at t = 240
    assert seen[10] is None  # too little history yet
    assert seen[89] == pytest.approx(240 - 89, rel=0.02)


def test_flat_memory_and_memory_that_levelled_off_have_no_forecast() -> None:
    assert forecasts(lambda t: 40.0, 90)[-1] is None
    # A fast climb (a model loading) that stopped 40 s ago: no alarm from the old slope.
    assert forecasts(lambda t: min(70.0, 10 + 2.0 * t), 70)[-1] is None


def test_process_history_follows_each_process_and_forgets_those_that_ended() -> None:
    history = History(interval_s=1.0)
    for t in range(5):
        history.add(memory_at(float(t), 10, processes=(7, 8) if t < 3 else (8,)))
    assert [used for _at, used in history.process("0:8")] == [t * GIB for t in range(5)]
    assert history.process("0:7") == ()  # ended at t = 3
    assert history.process_keys() == ["0:8"]


def test_a_cluster_fits_in_turns_and_applies_the_last_slope_to_the_memory_free_now() -> None:
    # Beyond FIT_EVERY_ROUND_GPUS GPUs each is fitted every FORECAST_EVERY_S seconds; between fits
    # its last slope applies to the memory free now: it never counts down like a timer.
    from hwdash.telemetry.history import FIT_EVERY_ROUND_GPUS, FORECAST_EVERY_S

    count = FIT_EVERY_ROUND_GPUS + 6
    total = 80 * GIB
    history = History(interval_s=1.0)
    seen: list[float | None] = []
    for t in range(120):
        used = min(20 + 0.25 * t, 40.0)  # climbs 0.25 GiB/s, flat from t = 80
        gpus = tuple(
            GpuSample(
                index=i,
                name="G",
                uuid=None,
                total_bytes=total,
                free_bytes=total - round(used * GIB),
            )
            for i in range(count)
        )
        snapshot = Snapshot(timestamp=float(t), nvml=STATUS, gpus=gpus)
        history.add(snapshot)
        seen.append(history.with_forecasts(snapshot).gpus[0].forecast_full_s)
    # climbing: the memory free now at 0.25 GiB/s, fitted or not
    for t in range(40, 80):
        assert seen[t] == pytest.approx((80 - (20 + 0.25 * t)) / 0.25, abs=0.2), t
    # flat: no countdown before the next fit, and blank within a fit period of the recent lag
    for t in range(81, 120):
        assert seen[t] is None or seen[t] >= seen[t - 1] - 0.01, t  # type: ignore[operator]
    assert all(forecast is None for forecast in seen[80 + 8 + round(FORECAST_EVERY_S) :])
