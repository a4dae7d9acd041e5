"""The NVML sampler's event and activity readings: Xid critical errors, GPM "real activity" and the
NVLink state (issue 28).

Called by :class:`hwdash.telemetry.nvml_health.HealthReader` on the sampler's worker thread, through
the sampler's own call wrapper (a lost GPU abandons the round as for every other field). As in
:mod:`~hwdash.telemetry.nvml_health`, a call that NVML answers with NotSupported, or that the driver
or the bindings lack, gives None without an entry in ``errors``; any other failure is recorded.

* **Xid events.** One event set for the sampler's life (``nvmlEventSetCreate``), each GPU registered
  once for ``nvmlEventTypeXidCriticalError`` (``nvmlDeviceRegisterEvents``); every round drains the
  set with ``nvmlEventSetWait_v2(set, 0)`` (a 0 ms timeout: it never blocks a frame) until NVML
  answers Timeout. An event's ``device`` is mapped to its GPU with ``nvmlDeviceGetIndex`` and its
  ``eventData`` is the Xid number (NVML's nvmlEventData_t, nvml.h; the bindings' c_nvmlEventData_t
  in pynvml.py). The set is freed at shutdown (``nvmlEventSetFree``).
* **GPM** (GPU Performance Monitoring, Hopper and later): ``nvmlGpmQueryDeviceSupport`` once per
  GPU; on a GPU that has it, two samples are allocated once (``nvmlGpmSampleAlloc``), one is taken
  each round (``nvmlGpmSampleGet``) and the metrics are computed between the previous round's and
  this one (``nvmlGpmMetricsGet`` with the bindings' ``c_nvmlGpmMetricsGet_t``). Elsewhere (and on
  the first round, before there are two samples) the activity is NVML's plain utilization.gpu,
  labelled ``source="utilization"``. The samples are freed at shutdown (``nvmlGpmSampleFree``).
* **NVLink**: the link count is found once per GPU (``nvmlDeviceGetNvLinkState`` on link 0, 1, ...
  up to ``NVML_NVLINK_MAX_LINKS``, stopping at the first index NVML refuses with NotSupported or
  InvalidArgument); each link's state is read every round (one cheap call per link).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from hwdash.telemetry.types import GpuActivity, NvLinkState, XidEvent

log = logging.getLogger(__name__)

XID_EVENTS_KEPT = 16
"""How many Xid events are kept per GPU (the newest); more in a session means a dying GPU."""

_MAX_DRAIN = 256
"""The most events one round takes from the set (the rest wait for the next round), so an event
storm cannot hold the sampler's thread."""

_XID_EVENT_TYPE = "nvmlEventTypeXidCriticalError"
_INVALID_ARGUMENT = "Invalid Argument"
"""What NVML says of a link index beyond the GPU's last (NotSupported, on PCIe-only GPUs, is quiet
already)."""

GPM_METRICS: tuple[tuple[str, str], ...] = (
    ("sm_active", "NVML_GPM_METRIC_SM_UTIL"),
    ("sm_occupancy", "NVML_GPM_METRIC_SM_OCCUPANCY"),
    ("tensor_active", "NVML_GPM_METRIC_ANY_TENSOR_UTIL"),
    ("dram_active", "NVML_GPM_METRIC_DRAM_BW_UTIL"),
)
""":class:`GpuActivity` members and the bindings' metric-id constants they are read from (the ids'
values come from the installed pynvml.py, never from here)."""


class _Health(Protocol):
    """What this module needs of :class:`hwdash.telemetry.nvml_health.HealthReader`."""

    nvml: Any
    reader: Any

    def quiet_call(
        self, errors: list[tuple[str, str]], label: str, name: str, *args: Any
    ) -> Any: ...

    def attempt(self, errors: list[tuple[str, str]], label: str, name: str, *args: Any) -> bool: ...


@dataclass
class _Gpm:
    """One GPU's two GPM samples: the previous round's and the next one to fill."""

    previous: Any
    current: Any
    filled: bool = False
    """Whether ``previous`` holds a sample (false until the first round's sample)."""
    request: Any = None
    """The ``c_nvmlGpmMetricsGet_t`` asking for :data:`GPM_METRICS`, built once (19 KB)."""


@dataclass
class _Xid:
    """One GPU's Xid registration and the events seen."""

    registered: bool
    failure: tuple[str, str] | None = None
    """Why the registration failed (a loud failure, repeated in ``errors`` every round)."""
    events: deque[XidEvent] = field(default_factory=lambda: deque(maxlen=XID_EVENTS_KEPT))


class EventReader:
    """Xid events, GPM activity and NVLink state of each GPU (see the module docstring)."""

    def __init__(self, health: _Health) -> None:
        self.health = health
        self.nvml = health.nvml
        self.wall_clock: Callable[[], float] = time.time
        """Stamps the Xid events; the sampler sets its own (the snapshots' clock)."""
        self.event_set: Any = None
        self.set_failure: tuple[str, str] | None = None
        """Why the event set could not be created or drained (in every GPU's ``errors``)."""
        self.set_tried = False
        self.xid: dict[int, _Xid] = {}
        self.gpm: dict[int, _Gpm | None] = {}
        self.nvlink_count: dict[int, int] = {}

    # -- Xid -----------------------------------------------------------------------------------
    def start_round(self) -> None:
        """Create the event set (first round) and drain it into the GPUs' event lists."""
        if not self.set_tried:
            self.set_tried = True
            loud: list[tuple[str, str]] = []
            self.event_set = self.health.quiet_call(loud, "xid_events", "nvmlEventSetCreate")
            self.set_failure = loud[0] if loud else None
        if self.event_set is None or not any(x.registered for x in self.xid.values()):
            return
        timeout = getattr(self.nvml, "NVMLError_Timeout", None)
        wait = getattr(self.nvml, "nvmlEventSetWait_v2", None) or getattr(
            self.nvml, "nvmlEventSetWait", None
        )
        if wait is None:
            return
        now = self.wall_clock()
        for _ in range(_MAX_DRAIN):
            try:
                data = wait(self.event_set, 0)
            except Exception as exc:
                if not (isinstance(timeout, type) and isinstance(exc, timeout)):
                    self.set_failure = ("xid_events", self.health.reader.reason(exc))
                return  # Timeout: the set is empty
            self.set_failure = None
            self._deliver(data, now)

    def _deliver(self, data: Any, now: float) -> None:
        kind = getattr(self.nvml, _XID_EVENT_TYPE, None)
        if isinstance(kind, int) and not int(data.eventType) & kind:
            return
        try:
            index = int(self.nvml.nvmlDeviceGetIndex(data.device))
        except Exception as exc:  # the GPU is gone or odd: the event cannot be placed
            log.info("Xid %s on an unknown device: %r", data.eventData, exc)
            return
        state = self.xid.get(index)
        if state is not None:
            state.events.append(XidEvent(xid=int(data.eventData), at=now))

    def xid_events(
        self, index: int, handle: Any, errors: list[tuple[str, str]]
    ) -> tuple[XidEvent, ...] | None:
        """The GPU's Xid events so far; registers the GPU on first sight."""
        if self.event_set is None:
            if self.set_failure is not None:
                errors.append(self.set_failure)
            return None
        state = self.xid.get(index)
        if state is None:
            loud: list[tuple[str, str]] = []
            kind = getattr(self.nvml, _XID_EVENT_TYPE, None)
            registered = isinstance(kind, int) and self.health.attempt(
                loud, "xid_events", "nvmlDeviceRegisterEvents", handle, kind, self.event_set
            )
            state = _Xid(registered=registered, failure=loud[0] if loud else None)
            self.xid[index] = state
        if state.failure is not None:
            errors.append(state.failure)
        if self.set_failure is not None:
            errors.append(self.set_failure)
        return tuple(state.events) if state.registered else None

    # -- GPM -----------------------------------------------------------------------------------
    def activity(
        self, index: int, handle: Any, errors: list[tuple[str, str]], utilization: float | None
    ) -> GpuActivity | None:
        """GPM's metrics between the last round and this one, else the plain utilization."""
        if index not in self.gpm:
            self.gpm[index] = self._gpm_start(handle, errors)
        gpm = self.gpm[index]
        if gpm is not None:
            metrics = self._gpm_round(gpm, handle, errors)
            if metrics is not None:
                return GpuActivity(source="gpm", **metrics)
        return None if utilization is None else GpuActivity("utilization", sm_active=utilization)

    def _gpm_start(self, handle: Any, errors: list[tuple[str, str]]) -> _Gpm | None:
        support = self.health.quiet_call(errors, "gpm", "nvmlGpmQueryDeviceSupport", handle)
        if support is None or not getattr(support, "isSupportedDevice", 0):
            return None  # before Hopper: NotSupported (or "not a supported device")
        samples = [self.health.quiet_call(errors, "gpm", "nvmlGpmSampleAlloc") for _ in "ab"]
        if any(sample is None for sample in samples):
            self._free_samples(s for s in samples if s is not None)
            return None
        return _Gpm(previous=samples[0], current=samples[1])

    def _gpm_round(
        self, gpm: _Gpm, handle: Any, errors: list[tuple[str, str]]
    ) -> dict[str, float | None] | None:
        taken = self.health.quiet_call(errors, "gpm", "nvmlGpmSampleGet", handle, gpm.current)
        if taken is None:
            gpm.filled = False  # a missed sample: start the pair again
            return None
        metrics = self._gpm_metrics(gpm, errors) if gpm.filled else None
        gpm.previous, gpm.current, gpm.filled = gpm.current, gpm.previous, True
        return metrics

    def _gpm_metrics(self, gpm: _Gpm, errors: list[tuple[str, str]]) -> dict[str, float | None]:
        request = gpm.request
        if request is None:
            request = gpm.request = self.nvml.c_nvmlGpmMetricsGet_t()
            request.version = getattr(self.nvml, "NVML_GPM_METRICS_GET_VERSION", 1)
            request.numMetrics = len(GPM_METRICS)
            for place, (_name, constant) in enumerate(GPM_METRICS):
                request.metrics[place].metricId = int(getattr(self.nvml, constant))
        request.sample1, request.sample2 = gpm.previous, gpm.current  # older first (nvml.h)
        answer = self.health.quiet_call(errors, "gpm", "nvmlGpmMetricsGet", request)
        success = getattr(self.nvml, "NVML_SUCCESS", 0)
        values: dict[str, float | None] = {}
        for place, (name, _constant) in enumerate(GPM_METRICS):
            metric = None if answer is None else answer.metrics[place]
            ok = metric is not None and int(metric.nvmlReturn) == success
            values[name] = _percent(metric.value) if ok and metric is not None else None
        return values

    # -- NVLink --------------------------------------------------------------------------------
    def nvlink(self, index: int, handle: Any, errors: list[tuple[str, str]]) -> NvLinkState | None:
        """How many NVLinks the GPU has (found once) and how many are active now."""
        if index not in self.nvlink_count:
            self.nvlink_count[index] = self._count_links(handle, errors)
        links = self.nvlink_count[index]
        if not links:
            return None
        active = 0
        for link in range(links):
            state = self.health.quiet_call(
                errors, "nvlink", "nvmlDeviceGetNvLinkState", handle, link
            )
            if state is None:
                return None
            active += bool(state == getattr(self.nvml, "NVML_FEATURE_ENABLED", 1))
        return NvLinkState(links=links, active=active)

    def _count_links(self, handle: Any, errors: list[tuple[str, str]]) -> int:
        most = getattr(self.nvml, "NVML_NVLINK_MAX_LINKS", 0)
        for link in range(most if isinstance(most, int) else 0):
            refused: list[tuple[str, str]] = []
            state = self.health.quiet_call(
                refused, "nvlink", "nvmlDeviceGetNvLinkState", handle, link
            )
            if state is None:
                loud = [entry for entry in refused if entry[1] != _INVALID_ARGUMENT]
                errors.extend(loud)
                return 0 if loud else link
        return most if isinstance(most, int) else 0

    # -- shutdown ------------------------------------------------------------------------------
    def close(self) -> None:
        """Free the event set and the GPM samples (before ``nvmlShutdown``)."""
        ignored: list[tuple[str, str]] = []
        try:
            if self.event_set is not None:
                self.health.quiet_call(ignored, "xid_events", "nvmlEventSetFree", self.event_set)
            for gpm in self.gpm.values():
                if gpm is not None:
                    self._free_samples((gpm.previous, gpm.current))
        except Exception as exc:  # a GPU lost at the end: NVML frees what is left at shutdown
            log.info("freeing NVML event set or GPM samples failed: %r", exc)
        self.event_set = None
        self.gpm.clear()

    def _free_samples(self, samples: Any) -> None:
        ignored: list[tuple[str, str]] = []
        for sample in samples:
            self.health.quiet_call(ignored, "gpm", "nvmlGpmSampleFree", sample)


def _percent(value: Any) -> float | None:
    """A GPM metric as a percent, None when it is not a number in 0..100 (rounding aside)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return None
    return float(min(100.0, max(0.0, value))) if -1 <= value <= 101 else None
