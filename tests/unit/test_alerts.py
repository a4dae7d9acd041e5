"""The alert rule: hysteresis, one event per crossing (hypothesis-generated series), lost GPUs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hwdash.core.alerts import AlertEngine, AlertEvent, AlertRule
from hwdash.telemetry.types import GpuSample, GpuState, NvmlStatus, Snapshot

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
    assert [e.kind for e in back] == ["raised"]


@pytest.mark.parametrize(
    ("threshold", "hysteresis"), [(0, 0.05), (1.5, 0.05), (0.9, -0.1), (0.5, 0.5)]
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
    st.floats(min_value=0.05, max_value=1.0), st.floats(min_value=0.0, max_value=0.2)
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
