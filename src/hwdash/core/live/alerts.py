"""Memory-pressure alerts: a pure rule with hysteresis, one event per crossing, and blindness.

The rule works on anything shaped like a telemetry snapshot (structural typing, so the core never
imports :mod:`hwdash.telemetry`): GPUs with ``index``, ``name``, ``state``, ``pressure``,
``total_bytes``, ``free_bytes`` and their MIG instances (``mig``), and the snapshot's ``stale`` flag.

* **raised** when the pressure of a GPU, or of one MIG instance (each instance is its own unit: a full
  3g.40gb slice fails its job however empty the rest of the GPU is), goes strictly above
  ``threshold``; or, with ``forecast_s`` set, when a whole GPU's OOM forecast
  (:mod:`hwdash.core.live.forecast`: seconds until full at its current climb) is under ``forecast_s``;
* **cleared** only when it falls strictly below ``threshold - hysteresis`` (so a value hovering at the
  threshold never makes a stream of events); a MIG instance that disappears clears too;
* **lost** once when a GPU turns ``lost``; pressure alerts for it stop until it reports again;
* **blind** once when a GPU has had no fresh memory reading for ``blind_after_s`` (NVML hangs and
  the sampler repeats old values with ``stale``, or the GPU's memory cannot be read): a monitor that
  cannot see must say so rather than keep showing the last good numbers in silence;
* **recovered** when a lost or blind GPU gives fresh readings again.

A pressure that is unknown for less than ``blind_after_s`` changes nothing. Actions (a log file, the
user's command, the UI banner) live outside the core and act on the events.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

from hwdash.core.units import format_gib_pair

AlertKind = Literal["raised", "cleared", "lost", "blind", "recovered"]

DEFAULT_THRESHOLD = 0.90
DEFAULT_HYSTERESIS = 0.05
BLIND_INTERVALS = 3
"""A GPU is blind after this many sampling intervals without a fresh memory reading..."""
BLIND_MINIMUM_S = 5.0
"""...and never sooner than this (a 0.5 s interval would otherwise page on one slow driver call)."""


def blind_after_for(interval_s: float) -> float:
    """How long without fresh data makes a GPU blind when sampling every ``interval_s`` seconds."""
    return max(BLIND_INTERVALS * interval_s, BLIND_MINIMUM_S)


class _Unit(Protocol):
    """A GPU or a MIG instance: what a pressure alert is about."""

    @property
    def name(self) -> str | None: ...
    @property
    def total_bytes(self) -> int | None: ...
    @property
    def free_bytes(self) -> int | None: ...
    @property
    def pressure(self) -> float | None: ...


class MigReading(_Unit, Protocol):
    """What the rule needs from one MIG instance (``hwdash.telemetry.types.MigSample`` fits)."""

    @property
    def index(self) -> int: ...


class GpuReading(MigReading, Protocol):
    """What the rule needs from one GPU (``hwdash.telemetry.types.GpuSample`` fits): what it needs
    from a MIG instance, plus the GPU's state and its instances."""

    @property
    def state(self) -> str: ...
    @property
    def mig(self) -> Sequence[MigReading]: ...
    @property
    def forecast_full_s(self) -> float | None: ...


class SnapshotReading(Protocol):
    """What the engine needs from a snapshot (``hwdash.telemetry.types.Snapshot`` fits)."""

    @property
    def timestamp(self) -> float: ...
    @property
    def gpus(self) -> Sequence[GpuReading]: ...
    @property
    def stale(self) -> bool: ...


@dataclass(frozen=True)
class AlertRule:
    """When to raise and clear a memory-pressure alert."""

    threshold: float = DEFAULT_THRESHOLD
    """Pressure (0..1, ``1 - free/total``) above which the alert is raised."""
    hysteresis: float = DEFAULT_HYSTERESIS
    """How far below the threshold pressure must fall before the alert clears. Never 0: a value
    jittering around the threshold would then raise and clear on every other sample."""
    blind_after_s: float = BLIND_MINIMUM_S
    """Seconds without a fresh memory reading after which a GPU is reported blind."""
    forecast_s: float | None = None
    """Raise early when a GPU's forecast time to full is under this many seconds (None: never).
    Such an alert clears when pressure is below ``clear_below`` and the forecast is gone or at
    least twice this (the forecast's own hysteresis)."""

    def __post_init__(self) -> None:
        if not 0 < self.threshold <= 1:
            raise ValueError(f"alert threshold must be in (0, 1], got {self.threshold}")
        if not 0 < self.hysteresis < self.threshold:
            raise ValueError(
                f"alert hysteresis must be in (0, threshold), got {self.hysteresis} "
                f"with threshold {self.threshold}"
            )
        if not 0 < self.blind_after_s < float("inf"):
            raise ValueError(f"blind_after_s must be a positive time, got {self.blind_after_s}")
        if self.forecast_s is not None and not 0 < self.forecast_s < float("inf"):
            raise ValueError(f"forecast_s must be a positive time, got {self.forecast_s}")

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
    """The GPU's name (for a MIG instance, its parent's; ``mig_name`` names the instance)."""
    pressure: float | None
    used_bytes: int | None
    """Memory no longer available to a new allocation (``total - free``: used plus reserved)."""
    total_bytes: int | None
    message: str
    timestamp: float
    mig_index: int | None = None
    """The MIG instance (slot) the event is about; None for the whole GPU."""
    mig_name: str | None = None
    """The MIG instance's name (``... MIG 3g.40gb``)."""
    diagnosis: str | None = None
    """A health rule's kind (``throttled``, ``stray-context``...) when the event is a diagnosis
    (:mod:`hwdash.core.live.diagnoses`), not a memory alert; ``--on-alert`` gets it as
    ``HWDASH_KIND``."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (bytes as integers)."""
        out: dict[str, Any] = {
            "kind": self.kind,
            "gpu_index": self.gpu_index,
            "gpu_name": self.gpu_name,
            "mig_index": self.mig_index,
            "mig_name": self.mig_name,
            "pressure": self.pressure,
            "used_bytes": self.used_bytes,
            "total_bytes": self.total_bytes,
            "message": self.message,
            "timestamp": self.timestamp,
        }
        if self.diagnosis is not None:
            out["diagnosis"] = self.diagnosis
        return out


UnitKey = tuple[int, int | None]
"""(GPU index, MIG slot or None for the whole GPU)."""


def _taken_bytes(unit: _Unit) -> int | None:
    if unit.total_bytes is None or unit.free_bytes is None:
        return None
    return unit.total_bytes - unit.free_bytes


def _label(gpu: GpuReading, mig: MigReading | None = None) -> str:
    # A cluster's GPU (a Prometheus source) is named by its host and its number there.
    host = getattr(gpu, "host", None)
    number = f"{host} GPU {getattr(gpu, 'host_gpu', None)}" if host else f"GPU {gpu.index}"
    label = f"{number} ({gpu.name})" if gpu.name else number
    if mig is not None:
        label += f" MIG slot {mig.index}" + (f" ({mig.name})" if mig.name else "")
    return label


def _pressure_message(
    kind: AlertKind, gpu: GpuReading, mig: MigReading | None, rule: AlertRule
) -> str:
    unit: _Unit = mig if mig is not None else gpu
    pressure = unit.pressure or 0.0
    taken = _taken_bytes(unit)
    amounts = ""
    if taken is not None and unit.total_bytes is not None:
        amounts = f" ({format_gib_pair(taken, unit.total_bytes, joiner=' of ')})"
    if kind == "raised":
        return (
            f"{_label(gpu, mig)} memory {pressure:.0%} full{amounts}, above the "
            f"{rule.threshold:.0%} alert threshold"
        )
    return (
        f"{_label(gpu, mig)} memory back to {pressure:.0%}{amounts}, below {rule.clear_below:.0%}"
    )


def _blind_reason(gpu: GpuReading, stale: bool) -> str:
    if stale:
        return "NVML does not answer (a driver call hangs)"
    if gpu.state == "error":
        return "the GPU cannot be opened"
    return "its memory cannot be read"


@dataclass
class _UnitState:
    seen_fresh_at: float
    """When the unit last gave a fresh memory reading (or was first seen)."""
    raised: AlertEvent | None = None
    lost: AlertEvent | None = None
    blind: AlertEvent | None = None


def _diagnosis_events(snapshot: SnapshotReading) -> list[AlertEvent]:
    """The health rules' events of this round as alert events (``diagnosis`` set): logged and given
    to ``--on-alert`` like the memory alerts. A snapshot without them (a replay) gives none."""
    gpus = {gpu.index: gpu for gpu in snapshot.gpus}
    names = {gpu.index: gpu.name for gpu in snapshot.gpus}
    out = []
    for event in getattr(snapshot, "diagnosis_events", ()):
        # A cluster's GPU (a Prometheus source) is named by its host and its number there.
        host = getattr(gpus.get(event.gpu_index), "host", None)
        number = getattr(gpus.get(event.gpu_index), "host_gpu", None)
        where = f"{host} GPU {number}" if host else f"GPU {event.gpu_index}"
        words = f"{where} {event.kind}: {event.message}"
        if event.event == "raised" and event.hint:
            words += f"; {event.hint}"
        out.append(
            AlertEvent(
                kind=event.event,
                gpu_index=event.gpu_index,
                gpu_name=names.get(event.gpu_index),
                pressure=None,
                used_bytes=None,
                total_bytes=None,
                message=words,
                timestamp=event.at,
                diagnosis=event.kind,
            )
        )
    return out


@dataclass
class AlertEngine:
    """Feeds snapshots through an :class:`AlertRule` and remembers which alerts are active."""

    rule: AlertRule = field(default_factory=AlertRule)
    _states: dict[UnitKey, _UnitState] = field(default_factory=dict, init=False, repr=False)
    _migs: dict[int, set[int]] = field(default_factory=dict, init=False, repr=False)
    """MIG slots with a state, per GPU (a cluster's hundreds of GPUs are not scanned per GPU)."""

    def _mig_slots(self, gpu_index: int) -> set[int]:
        return set(self._migs.get(gpu_index, ()))

    def update(self, snapshot: SnapshotReading) -> list[AlertEvent]:
        """Events caused by this snapshot (usually none)."""
        events: list[AlertEvent] = []
        now = snapshot.timestamp
        for gpu in snapshot.gpus:
            state = self._states.setdefault((gpu.index, None), _UnitState(seen_fresh_at=now))
            if self._lost_events(gpu, state, now, events):
                continue
            if self._blind_events(gpu, state, now, snapshot.stale, events):
                continue  # old or missing numbers: no pressure verdict on them
            state.seen_fresh_at = now
            events.extend(self._pressure(gpu, None, state, now))
            events.extend(self._mig_events(gpu, now))
        events.extend(_diagnosis_events(snapshot))
        return events

    def _lost_events(
        self, gpu: GpuReading, state: _UnitState, now: float, events: list[AlertEvent]
    ) -> bool:
        """Add ``lost`` when NVML loses the GPU (once) and ``recovered`` when it answers again;
        True while it is lost (nothing else to judge)."""
        if gpu.state == "lost":
            if state.lost is None:
                state.lost = self._event(
                    "lost", gpu, now, f"{_label(gpu)} is lost: NVML can no longer reach it"
                )
                state.raised = state.blind = None
                self._forget_mig(gpu.index)
                events.append(state.lost)
            return True
        if state.lost is not None:
            state.lost = None
            state.seen_fresh_at = now
            events.append(self._event("recovered", gpu, now, f"{_label(gpu)} answers NVML again"))
        return False

    def _blind_events(
        self,
        gpu: GpuReading,
        state: _UnitState,
        now: float,
        stale: bool,
        events: list[AlertEvent],
    ) -> bool:
        """Add ``blind`` when no fresh memory reading came for ``blind_after_s`` (once) and
        ``recovered`` when one comes again; True while the readings are old or missing."""
        if stale or gpu.pressure is None:
            blind_for = now - state.seen_fresh_at
            if state.blind is None and blind_for >= self.rule.blind_after_s:
                state.blind = self._event(
                    "blind",
                    gpu,
                    now,
                    f"{_label(gpu)} is blind: no fresh memory reading for {blind_for:.0f} s; "
                    f"{_blind_reason(gpu, stale)}",
                )
                events.append(state.blind)
            return True
        if state.blind is not None:
            events.append(
                self._event(
                    "recovered",
                    gpu,
                    now,
                    f"{_label(gpu)} memory readings again after "
                    f"{now - state.seen_fresh_at:.0f} s blind",
                )
            )
            state.blind = None
        return False

    def _mig_events(self, gpu: GpuReading, now: float) -> list[AlertEvent]:
        """Pressure events of the GPU's MIG slots, and ``cleared`` for a raised slot now gone."""
        events: list[AlertEvent] = []
        present = {mig.index for mig in gpu.mig}
        for mig in gpu.mig:
            self._migs.setdefault(gpu.index, set()).add(mig.index)
            mig_state = self._states.setdefault(
                (gpu.index, mig.index), _UnitState(seen_fresh_at=now)
            )
            events.extend(self._pressure(gpu, mig, mig_state, now))
        for slot in sorted(self._mig_slots(gpu.index) - present):
            gone = self._states.pop((gpu.index, slot))
            self._migs[gpu.index].discard(slot)
            if gone.raised is not None:
                events.append(
                    replace(
                        gone.raised,
                        kind="cleared",
                        timestamp=now,
                        message=f"{_label(gpu)} MIG slot {slot} is gone",
                    )
                )
        return events

    def _pressure(
        self, gpu: GpuReading, mig: MigReading | None, state: _UnitState, now: float
    ) -> list[AlertEvent]:
        unit: _Unit = mig if mig is not None else gpu
        pressure = unit.pressure
        if pressure is None:
            return []
        forecast = None if mig is not None else gpu.forecast_full_s
        limit = self.rule.forecast_s
        soon = limit is not None and forecast is not None and forecast < limit
        if state.raised is None and (pressure > self.rule.threshold or soon):
            message = _pressure_message("raised", gpu, mig, self.rule)
            if pressure <= self.rule.threshold and forecast is not None:
                message = (
                    f"{message.split(', above the')[0]}, full in about {forecast:.0f} s at its "
                    f"current climb (forecast alert under {limit:.0f} s)"
                )
            state.raised = self._event("raised", gpu, now, message, mig)
            return [state.raised]
        still_soon = limit is not None and forecast is not None and forecast < 2 * limit
        if state.raised is not None and pressure < self.rule.clear_below and not still_soon:
            state.raised = None
            message = _pressure_message("cleared", gpu, mig, self.rule)
            return [self._event("cleared", gpu, now, message, mig)]
        return []

    def _forget_mig(self, gpu_index: int) -> None:
        for slot in self._migs.pop(gpu_index, set()):
            self._states.pop((gpu_index, slot), None)

    def _event(
        self,
        kind: AlertKind,
        gpu: GpuReading,
        timestamp: float,
        message: str,
        mig: MigReading | None = None,
    ) -> AlertEvent:
        unit: _Unit = mig if mig is not None else gpu
        return AlertEvent(
            kind=kind,
            gpu_index=gpu.index,
            gpu_name=gpu.name,
            pressure=unit.pressure,
            used_bytes=_taken_bytes(unit),
            total_bytes=unit.total_bytes,
            message=message,
            timestamp=timestamp,
            mig_index=None if mig is None else mig.index,
            mig_name=None if mig is None else mig.name,
        )

    @property
    def active(self) -> list[AlertEvent]:
        """Alerts in force now, by GPU and MIG slot: the event that started each (a lost GPU
        shows only its loss; a blind GPU shows its blindness and any pressure alert it had)."""
        result: list[AlertEvent] = []
        for key in sorted(self._states, key=lambda key: (key[0], -1 if key[1] is None else key[1])):
            state = self._states[key]
            if state.lost is not None:
                result.append(state.lost)
                continue
            if state.blind is not None:
                result.append(state.blind)
            if state.raised is not None:
                result.append(state.raised)
        return result

    def is_active(self, gpu_index: int, mig_index: int | None = None) -> bool:
        """Whether the GPU (or one of its MIG instances) has a raised or lost alert now."""
        state = self._states.get((gpu_index, mig_index))
        return state is not None and (state.raised is not None or state.lost is not None)

    def is_blind(self, gpu_index: int) -> bool:
        """Whether the GPU has had no fresh memory reading for longer than the rule allows."""
        state = self._states.get((gpu_index, None))
        return state is not None and state.blind is not None
