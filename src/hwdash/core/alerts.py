"""Memory-pressure alerts: a pure rule with hysteresis, one event per crossing.

The rule works on anything shaped like a telemetry snapshot (structural typing, so the core never
imports :mod:`hwdash.telemetry`): GPUs with ``index``, ``name``, ``state``, ``pressure``,
``total_bytes`` and ``free_bytes``.

* **raised** when a GPU's pressure goes strictly above ``threshold``;
* **cleared** only when it falls strictly below ``threshold - hysteresis`` (so a value hovering at the
  threshold never makes a stream of events);
* **lost** once when a GPU turns ``lost``; pressure alerts for it stop until it reports again.

A pressure that is unknown (``None``) changes nothing. Actions (a log file, the user's command, the UI
banner) live outside the core and act on the events.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from hwdash.core.units import GIB, format_bytes

AlertKind = Literal["raised", "cleared", "lost"]

DEFAULT_THRESHOLD = 0.90
DEFAULT_HYSTERESIS = 0.05


class GpuReading(Protocol):
    """What the rule needs from one GPU (``hwdash.telemetry.types.GpuSample`` fits)."""

    @property
    def index(self) -> int: ...
    @property
    def name(self) -> str | None: ...
    @property
    def state(self) -> str: ...
    @property
    def total_bytes(self) -> int | None: ...
    @property
    def free_bytes(self) -> int | None: ...
    @property
    def pressure(self) -> float | None: ...


class SnapshotReading(Protocol):
    """What the engine needs from a snapshot (``hwdash.telemetry.types.Snapshot`` fits)."""

    @property
    def timestamp(self) -> float: ...
    @property
    def gpus(self) -> Sequence[GpuReading]: ...


@dataclass(frozen=True)
class AlertRule:
    """When to raise and clear a memory-pressure alert."""

    threshold: float = DEFAULT_THRESHOLD
    """Pressure (0..1, ``1 - free/total``) above which the alert is raised."""
    hysteresis: float = DEFAULT_HYSTERESIS
    """How far below the threshold pressure must fall before the alert clears."""

    def __post_init__(self) -> None:
        if not 0 < self.threshold <= 1:
            raise ValueError(f"alert threshold must be in (0, 1], got {self.threshold}")
        if not 0 <= self.hysteresis < self.threshold:
            raise ValueError(
                f"alert hysteresis must be in [0, threshold), got {self.hysteresis} "
                f"with threshold {self.threshold}"
            )

    @property
    def clear_below(self) -> float:
        """Pressure below which a raised alert clears."""
        return self.threshold - self.hysteresis


@dataclass(frozen=True)
class AlertEvent:
    """One alert crossing for one GPU."""

    kind: AlertKind
    gpu_index: int
    gpu_name: str | None
    pressure: float | None
    used_bytes: int | None
    """Memory no longer available to a new allocation (``total - free``: used plus reserved)."""
    total_bytes: int | None
    message: str
    timestamp: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (bytes as integers)."""
        return {
            "kind": self.kind,
            "gpu_index": self.gpu_index,
            "gpu_name": self.gpu_name,
            "pressure": self.pressure,
            "used_bytes": self.used_bytes,
            "total_bytes": self.total_bytes,
            "message": self.message,
            "timestamp": self.timestamp,
        }


def _taken_bytes(gpu: GpuReading) -> int | None:
    if gpu.total_bytes is None or gpu.free_bytes is None:
        return None
    return gpu.total_bytes - gpu.free_bytes


def _label(gpu: GpuReading) -> str:
    return f"GPU {gpu.index} ({gpu.name})" if gpu.name else f"GPU {gpu.index}"


def _message(kind: AlertKind, gpu: GpuReading, rule: AlertRule) -> str:
    if kind == "lost":
        return f"{_label(gpu)} is lost: NVML can no longer reach it"
    pressure = gpu.pressure or 0.0
    taken = _taken_bytes(gpu)
    amounts = ""
    if taken is not None and gpu.total_bytes is not None:
        amounts = f" ({taken / GIB:.1f} of {format_bytes(gpu.total_bytes, unit='GiB')})"
    if kind == "raised":
        return (
            f"{_label(gpu)} memory {pressure:.0%} full{amounts}, above the "
            f"{rule.threshold:.0%} alert threshold"
        )
    return f"{_label(gpu)} memory back to {pressure:.0%}{amounts}, below {rule.clear_below:.0%}"


@dataclass
class _GpuAlertState:
    raised: AlertEvent | None = None
    lost: AlertEvent | None = None


@dataclass
class AlertEngine:
    """Feeds snapshots through an :class:`AlertRule` and remembers which alerts are active."""

    rule: AlertRule = field(default_factory=AlertRule)
    _states: dict[int, _GpuAlertState] = field(default_factory=dict, init=False, repr=False)

    def update(self, snapshot: SnapshotReading) -> list[AlertEvent]:
        """Events caused by this snapshot (usually none)."""
        events: list[AlertEvent] = []
        for gpu in snapshot.gpus:
            state = self._states.setdefault(gpu.index, _GpuAlertState())
            if gpu.state == "lost":
                if state.lost is None:
                    state.lost = self._event("lost", gpu, snapshot.timestamp)
                    state.raised = None
                    events.append(state.lost)
                continue
            state.lost = None  # it reports again
            pressure = gpu.pressure
            if pressure is None:
                continue
            if state.raised is None and pressure > self.rule.threshold:
                state.raised = self._event("raised", gpu, snapshot.timestamp)
                events.append(state.raised)
            elif state.raised is not None and pressure < self.rule.clear_below:
                state.raised = None
                events.append(self._event("cleared", gpu, snapshot.timestamp))
        return events

    def _event(self, kind: AlertKind, gpu: GpuReading, timestamp: float) -> AlertEvent:
        return AlertEvent(
            kind=kind,
            gpu_index=gpu.index,
            gpu_name=gpu.name,
            pressure=gpu.pressure,
            used_bytes=_taken_bytes(gpu),
            total_bytes=gpu.total_bytes,
            message=_message(kind, gpu, self.rule),
            timestamp=timestamp,
        )

    @property
    def active(self) -> list[AlertEvent]:
        """Alerts in force now (raised or lost), by GPU index: the event that started each."""
        result: list[AlertEvent] = []
        for index in sorted(self._states):
            state = self._states[index]
            if state.lost is not None:
                result.append(state.lost)
            elif state.raised is not None:
                result.append(state.raised)
        return result

    def is_active(self, gpu_index: int) -> bool:
        """Whether the GPU has a raised (or lost) alert now."""
        state = self._states.get(gpu_index)
        return state is not None and (state.raised is not None or state.lost is not None)
