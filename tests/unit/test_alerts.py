"""The alert rule: hysteresis, one event per crossing (hypothesis-generated series), lost GPUs."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hwdash.core.live.alerts import AlertEngine, AlertEvent, AlertRule, blind_after_for
from hwdash.telemetry.types import GpuSample, GpuState, MigSample, NvmlStatus, Snapshot

TOTAL = 80 * 1024**3
STATUS = NvmlStatus(available=True)


def gpu_at(pressure: float | None, index: int = 0, state: GpuState = GpuState.OK) -> GpuSample:
    free = None if pressure is None else round(TOTAL * (1 - pressure))
    return GpuSample(
        index=index,
        name="NVIDIA A100-SXM4-80GB",
        uuid=None,
        state=state,
        total_bytes=TOTAL,
        free_bytes=free,
    )


def feed(engine: AlertEngine, pressures: list[float | None], index: int = 0) -> list[AlertEvent]:
    events: list[AlertEvent] = []
    for t, pressure in enumerate(pressures):
        events += engine.update(
            Snapshot(timestamp=float(t), nvml=STATUS, gpus=(gpu_at(pressure, index),))
        )
    return events


def test_raise_hold_clear_raise_again() -> None:
    engine = AlertEngine(AlertRule(threshold=0.90, hysteresis=0.05))
    series = [0.50, 0.95, 0.93, 0.88, 0.86, 0.91, 0.84, 0.80, 0.95]
    events = feed(engine, series)
    assert [(e.kind, e.timestamp) for e in events] == [
        ("raised", 1.0),
        ("cleared", 6.0),
        ("raised", 8.0),
    ]
    assert engine.is_active(0)
    assert [e.kind for e in engine.active] == ["raised"]


def test_the_threshold_itself_does_not_raise_and_the_clear_level_does_not_clear() -> None:
    engine = AlertEngine(AlertRule(threshold=0.90, hysteresis=0.05))
    assert feed(engine, [0.90, 0.90]) == []
    raised = feed(engine, [0.9001])
    assert [e.kind for e in raised] == ["raised"]
    assert feed(engine, [0.85, 0.85]) == []  # clears only strictly below 0.85
    assert [e.kind for e in feed(engine, [0.8499])] == ["cleared"]


def test_event_carries_the_numbers_and_a_readable_message() -> None:
    (event,) = feed(AlertEngine(), [0.9375])
    assert event.kind == "raised" and event.gpu_index == 0
    assert event.gpu_name == "NVIDIA A100-SXM4-80GB"
    assert event.pressure == pytest.approx(0.9375)
    assert event.total_bytes == TOTAL and event.used_bytes == TOTAL * 15 // 16
    assert "GPU 0 (NVIDIA A100-SXM4-80GB)" in event.message and "94%" in event.message
    assert "75.0 of 80.0 GiB" in event.message
    assert event.to_dict()["used_bytes"] == event.used_bytes


def test_unknown_pressure_changes_nothing() -> None:
    engine = AlertEngine()
    assert [e.kind for e in feed(engine, [0.95, None, None])] == ["raised"]
    assert engine.is_active(0)
    assert feed(engine, [None]) == []


def test_gpus_are_independent() -> None:
    engine = AlertEngine()
    feed(engine, [0.95], index=0)
    events = feed(engine, [0.95], index=1)
    assert [(e.kind, e.gpu_index) for e in events] == [("raised", 1)]
    assert [e.gpu_index for e in engine.active] == [0, 1]


def test_a_lost_gpu_alerts_once_and_pressure_alerts_resume_when_it_returns() -> None:
    engine = AlertEngine()
    feed(engine, [0.95])
    lost = Snapshot(timestamp=9.0, nvml=STATUS, gpus=(gpu_at(None, state=GpuState.LOST),))
    events = engine.update(lost)
    assert [e.kind for e in events] == ["lost"]
    assert "lost" in events[0].message
    assert engine.update(lost) == []
    assert [e.kind for e in engine.active] == ["lost"]
    back = feed(engine, [0.95])
    assert [e.kind for e in back] == ["recovered", "raised"]
    assert "answers NVML again" in back[0].message


@pytest.mark.parametrize(
    ("threshold", "hysteresis"), [(0, 0.05), (1.5, 0.05), (0.9, -0.1), (0.5, 0.5), (0.9, 0.0)]
)
def test_rule_rejects_nonsense(threshold: float, hysteresis: float) -> None:
    with pytest.raises(ValueError):
        AlertRule(threshold=threshold, hysteresis=hysteresis)


def count_upward_crossings(pressures: list[float], threshold: float, clear_below: float) -> int:
    """Reference count: times the series goes above the threshold after being below the clear level
    (or never having been above)."""
    crossings = 0
    armed = True
    for value in pressures:
        if armed and value > threshold:
            crossings += 1
            armed = False
        elif not armed and value < clear_below:
            armed = True
    return crossings


pressures = st.lists(st.floats(min_value=0.0, max_value=1.0, allow_nan=False), max_size=200)
rules = st.tuples(
    st.floats(min_value=0.05, max_value=1.0), st.floats(min_value=0.001, max_value=0.2)
).filter(lambda pair: pair[1] < pair[0])


@settings(max_examples=300, deadline=None)
@given(series=pressures, rule_values=rules)
def test_exactly_one_raised_event_per_upward_crossing(
    series: list[float], rule_values: tuple[float, float]
) -> None:
    threshold, hysteresis = rule_values
    rule = AlertRule(threshold=threshold, hysteresis=hysteresis)
    events = feed(AlertEngine(rule), list(series))
    raised = [e for e in events if e.kind == "raised"]
    # What the rule sees is the pressure recomputed from bytes, so the reference uses the same values.
    seen = [gpu_at(value).pressure or 0.0 for value in series]
    assert len(raised) == count_upward_crossings(seen, threshold, rule.clear_below)
    # Events alternate raised, cleared, raised... and each sits on the right side of its level.
    assert [e.kind for e in events] == ["raised", "cleared"] * (len(events) // 2) + ["raised"] * (
        len(events) % 2
    )
    for event in events:
        assert event.pressure is not None
        if event.kind == "raised":
            assert event.pressure > threshold
        else:
            assert event.pressure < rule.clear_below


@settings(max_examples=200, deadline=None)
@given(
    hovering=st.lists(
        st.floats(min_value=0.8501, max_value=1.0, allow_nan=False), min_size=1, max_size=100
    )
)
def test_hovering_around_the_threshold_never_streams_events(hovering: list[float]) -> None:
    engine = AlertEngine(AlertRule(threshold=0.90, hysteresis=0.05))
    events = feed(engine, [0.95, *hovering])
    assert [e.kind for e in events] == ["raised"]


# -- blindness: a monitor that cannot see says so ---------------------------------------------------


def snap(t: float, *gpus: GpuSample, stale: bool = False) -> Snapshot:
    return Snapshot(timestamp=t, nvml=STATUS, gpus=gpus, stale=stale)


def test_stale_rounds_make_a_gpu_blind_once_then_fresh_data_clears_it() -> None:
    engine = AlertEngine(AlertRule(blind_after_s=3.0))
    assert engine.update(snap(0, gpu_at(0.5))) == []
    # NVML hangs: the sampler repeats the last good values, marked stale.
    assert engine.update(snap(1, gpu_at(0.5), stale=True)) == []
    assert engine.update(snap(2, gpu_at(0.5), stale=True)) == []
    (blind,) = engine.update(snap(3, gpu_at(0.5), stale=True))
    assert blind.kind == "blind"
    assert blind.gpu_index == 0
    assert "no fresh memory reading for 3 s" in blind.message
    assert "NVML does not answer" in blind.message
    assert engine.is_blind(0)
    assert [e.kind for e in engine.active] == ["blind"]
    assert engine.update(snap(4, gpu_at(0.5), stale=True)) == []  # once per GPU, not per round
    (back,) = engine.update(snap(5, gpu_at(0.5)))
    assert back.kind == "recovered"
    assert not engine.is_blind(0)
    assert engine.active == []


def test_stale_values_never_raise_or_clear_a_pressure_alert() -> None:
    engine = AlertEngine(AlertRule(blind_after_s=100.0))
    assert [e.kind for e in engine.update(snap(0, gpu_at(0.95)))] == ["raised"]
    # The repeated values are old: a low one must not clear, a high one must not raise.
    assert engine.update(snap(1, gpu_at(0.10), stale=True)) == []
    assert engine.is_active(0)
    other = AlertEngine(AlertRule(blind_after_s=100.0))
    other.update(snap(0, gpu_at(0.5)))
    assert other.update(snap(1, gpu_at(0.99), stale=True)) == []


def test_a_gpu_whose_memory_cannot_be_read_goes_blind_each_gpu_on_its_own() -> None:
    engine = AlertEngine(AlertRule(blind_after_s=2.0))
    events: list[AlertEvent] = []
    for t in range(4):
        events += engine.update(snap(t, gpu_at(0.5, 0), gpu_at(None, 1)))
    assert [(e.kind, e.gpu_index, e.timestamp) for e in events] == [("blind", 1, 2.0)]
    assert "its memory cannot be read" in events[0].message
    # An error row (the GPU cannot be opened) is blind too, with its own reason.
    broken = AlertEngine(AlertRule(blind_after_s=1.0))
    broken.update(snap(0, gpu_at(None, state=GpuState.ERROR)))
    (event,) = broken.update(snap(1, gpu_at(None, state=GpuState.ERROR)))
    assert event.kind == "blind"
    assert "cannot be opened" in event.message


def test_the_blind_clock_starts_at_the_last_fresh_reading_not_at_the_first_stale_one() -> None:
    engine = AlertEngine(AlertRule(blind_after_s=5.0))
    engine.update(snap(0, gpu_at(0.5)))
    engine.update(snap(10, gpu_at(0.5)))
    assert [e.kind for e in engine.update(snap(14.9, gpu_at(0.5), stale=True))] == []
    assert [e.kind for e in engine.update(snap(15, gpu_at(0.5), stale=True))] == ["blind"]


def test_a_short_gap_changes_nothing() -> None:
    engine = AlertEngine(AlertRule(blind_after_s=5.0))
    events = []
    for t, pressure in enumerate([0.5, None, None, 0.5, None, 0.5]):
        events += engine.update(snap(t, gpu_at(pressure)))
    assert events == []


def test_blind_after_follows_the_interval_with_a_floor() -> None:
    assert blind_after_for(1.0) == 5.0
    assert blind_after_for(0.2) == 5.0
    assert blind_after_for(4.0) == 12.0


# -- MIG: each instance is its own unit ---------------------------------------------------------


def mig_gpu(*instances: tuple[int, float | None], state: GpuState = GpuState.OK) -> GpuSample:
    size = 40 * 1024**3
    return GpuSample(
        index=0,
        name="NVIDIA A100-SXM4-80GB",
        uuid=None,
        state=state,
        total_bytes=TOTAL,
        free_bytes=TOTAL // 2,
        mig=tuple(
            MigSample(
                index=slot,
                name=f"NVIDIA A100-SXM4-80GB MIG {slot}g",
                uuid=None,
                total_bytes=size,
                used_bytes=None,
                free_bytes=None if pressure is None else round(size * (1 - pressure)),
            )
            for slot, pressure in instances
        ),
    )


def test_a_full_mig_instance_alerts_although_its_parent_gpu_is_half_empty() -> None:
    engine = AlertEngine()
    assert engine.update(snap(0, mig_gpu((0, 0.5), (3, 0.2)))) == []
    (raised,) = engine.update(snap(1, mig_gpu((0, 0.96), (3, 0.2))))
    assert (raised.kind, raised.gpu_index, raised.mig_index) == ("raised", 0, 0)
    assert "MIG slot 0" in raised.message
    assert raised.total_bytes == 40 * 1024**3
    assert engine.is_active(0, 0)
    assert not engine.is_active(0)  # the parent itself is not over the threshold
    assert not engine.is_active(0, 3)
    # Each instance crosses on its own.
    (second,) = engine.update(snap(2, mig_gpu((0, 0.97), (3, 0.95))))
    assert (second.kind, second.mig_index) == ("raised", 3)
    (cleared,) = engine.update(snap(3, mig_gpu((0, 0.5), (3, 0.95))))
    assert (cleared.kind, cleared.mig_index) == ("cleared", 0)
    assert [(e.kind, e.mig_index) for e in engine.active] == [("raised", 3)]


def test_a_mig_instance_that_disappears_clears_its_alert() -> None:
    engine = AlertEngine()
    engine.update(snap(0, mig_gpu((0, 0.99))))
    (gone,) = engine.update(snap(1, mig_gpu((3, 0.1))))
    assert (gone.kind, gone.mig_index) == ("cleared", 0)
    assert "gone" in gone.message
    assert engine.active == []


# -- the OOM forecast ------------------------------------------------------------------------------


def forecast_gpu(pressure: float, forecast_s: float | None) -> GpuSample:
    return dataclasses.replace(gpu_at(pressure), forecast_full_s=forecast_s)


def test_a_forecast_under_the_limit_raises_early_and_clears_with_its_own_hysteresis() -> None:
    engine = AlertEngine(AlertRule(forecast_s=120))
    assert engine.update(snap(0, forecast_gpu(0.6, None))) == []
    assert engine.update(snap(1, forecast_gpu(0.62, 300))) == []  # coming, not soon
    (raised,) = engine.update(snap(2, forecast_gpu(0.65, 90)))
    assert raised.kind == "raised"
    assert "full in about 90 s at its current climb (forecast alert under 120 s)" in raised.message
    assert engine.update(snap(3, forecast_gpu(0.66, 100))) == []  # one alert per crossing
    assert engine.update(snap(4, forecast_gpu(0.66, 200))) == []  # still under twice the limit
    (cleared,) = engine.update(snap(5, forecast_gpu(0.66, None)))  # flat again
    assert cleared.kind == "cleared"


def test_without_the_option_a_forecast_never_alerts() -> None:
    engine = AlertEngine(AlertRule())
    assert engine.update(snap(0, forecast_gpu(0.6, 5))) == []
    (raised,) = engine.update(snap(1, forecast_gpu(0.95, 5)))
    assert "above the 90% alert threshold" in raised.message  # the usual words past it


def test_a_forecast_alert_does_not_clear_while_pressure_is_high() -> None:
    engine = AlertEngine(AlertRule(forecast_s=60))
    engine.update(snap(0, forecast_gpu(0.7, 30)))
    assert engine.update(snap(1, forecast_gpu(0.93, None))) == []  # now over the threshold itself


@pytest.mark.parametrize("limit", [0.0, -5.0, float("inf")])
def test_a_forecast_limit_must_be_a_positive_time(limit: float) -> None:
    with pytest.raises(ValueError, match="forecast_s"):
        AlertRule(forecast_s=limit)
