"""The fake NVML's event sets, GPM and NVLink calls (issue 28), answered from the scenario.

Each returns what the real bindings return, built with the bindings' own ctypes types (pynvml.py):
``nvmlEventSetWait_v2`` a ``c_nvmlEventData_t`` whose ``device`` is a ``c_nvmlDevice_t`` (the
address stands for the GPU; ``nvmlDeviceGetIndex`` maps it back), or the real
``NVMLError_Timeout`` when no event is due; ``nvmlGpmSampleAlloc`` a ``c_nvmlGpmSample_t`` that
``nvmlGpmMetricsGet`` finds again in the request's ``sample1``/``sample2``. Scenario fields
(:class:`~hwdash.telemetry.fake_scenario.ScenarioGpu`)::

    xids = [{at_s = 30, xid = 79}]        # delivered once, to a set that registered the GPU before
    gpm = { sm_active = [[0, 20], [60, 63]], sm_occupancy = 40, tensor_active = 35, dram_active = 50 }
    nvlink_links = 18                     # 0 (default): PCIe only
    nvlink_active = [[0, 18], [90, 18], [90, 17]]  # the first N links are up; default: all

A GPU without ``gpm`` raises NotSupported for ``nvmlGpmQueryDeviceSupport`` (as pre-Hopper GPUs
do); ``unsupported = ["xid_events"]`` makes ``nvmlDeviceRegisterEvents`` refuse the GPU,
``["gpm"]`` and ``["nvlink"]`` the other calls. GPM metrics are the scripted series' values at
the later sample's scenario second.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from hwdash.telemetry.scenario_data import series_value

if TYPE_CHECKING:  # the models are only named here (a compiled scenario has the same fields)
    from hwdash.telemetry.fake_scenario import Scenario, ScenarioGpu

_GPM_SERIES = {
    "NVML_GPM_METRIC_SM_UTIL": "sm_active",
    "NVML_GPM_METRIC_SM_OCCUPANCY": "sm_occupancy",
    "NVML_GPM_METRIC_ANY_TENSOR_UTIL": "tensor_active",
    "NVML_GPM_METRIC_DRAM_BW_UTIL": "dram_active",
}
"""The bindings' metric-id constants the fake answers, and the scenario series of each."""

CONSTANTS = (
    "nvmlEventType",
    "NVML_GPM_",
    "NVML_NVLINK_MAX_LINKS",
    "NVML_FEATURE_",
    "NVML_SUCCESS",
    "c_nvmlGpmMetricsGet_t",
    "c_nvmlEventData_t",
)
"""Prefixes of the real bindings' names the fake module carries for these calls."""


class _Fake(Protocol):
    """What these calls need of :class:`hwdash.telemetry.fake_nvml.FakeNvml`."""

    scenario: Scenario
    _real: Any

    def now(self) -> float: ...

    def _require_init(self) -> None: ...

    def _error(self, code_name: str) -> Exception: ...

    def _gpu(self, handle: Any, field: Any = None) -> ScenarioGpu: ...


@dataclass
class FakeEventSet:
    """One event set: the GPUs registered (index -> scenario second) and the events delivered."""

    registered: dict[int, float] = field(default_factory=dict)
    delivered: set[tuple[int, int]] = field(default_factory=set)
    """(GPU index, place in the GPU's ``xids``)."""
    freed: bool = False


class FakeEvents:
    """The calls, bound to one :class:`~hwdash.telemetry.fake_nvml.FakeNvml`."""

    def __init__(self, fake: _Fake) -> None:
        self.fake = fake
        self.real = fake._real
        self.event_sets: list[FakeEventSet] = []
        self.gpm_samples: dict[int, tuple[int, float] | None] = {}
        """Sample address -> (GPU index, scenario second taken), None before a SampleGet."""
        self.freed_samples: set[int] = set()
        self.gpm_series = {int(getattr(self.real, name)): key for name, key in _GPM_SERIES.items()}
        """Metric id -> the scenario series that answers it."""

    def functions(self) -> dict[str, Callable[..., Any]]:
        return {
            "nvmlEventSetCreate": self.nvmlEventSetCreate,
            "nvmlDeviceRegisterEvents": self.nvmlDeviceRegisterEvents,
            "nvmlEventSetWait_v2": self.nvmlEventSetWait_v2,
            "nvmlEventSetWait": self.nvmlEventSetWait_v2,
            "nvmlEventSetFree": self.nvmlEventSetFree,
            "nvmlDeviceGetIndex": self.nvmlDeviceGetIndex,
            "nvmlGpmQueryDeviceSupport": self.nvmlGpmQueryDeviceSupport,
            "nvmlGpmSampleAlloc": self.nvmlGpmSampleAlloc,
            "nvmlGpmSampleGet": self.nvmlGpmSampleGet,
            "nvmlGpmMetricsGet": self.nvmlGpmMetricsGet,
            "nvmlGpmSampleFree": self.nvmlGpmSampleFree,
            "nvmlDeviceGetNvLinkState": self.nvmlDeviceGetNvLinkState,
        }

    def _gpu(self, handle: Any, unsupported: str | None = None) -> ScenarioGpu:
        return self.fake._gpu(handle, unsupported)

    # -- events --------------------------------------------------------------------------------
    def nvmlEventSetCreate(self) -> FakeEventSet:
        self.fake._require_init()
        self.event_sets.append(FakeEventSet())
        return self.event_sets[-1]

    def nvmlDeviceRegisterEvents(
        self, handle: Any, event_types: int, event_set: FakeEventSet
    ) -> None:
        self._gpu(handle, "xid_events")
        if event_set.freed or event_types & ~self.real.nvmlEventTypeAll:
            raise self.fake._error("NVMLError_InvalidArgument")
        if event_types & self.real.nvmlEventTypeXidCriticalError:
            event_set.registered.setdefault(handle.gpu_index, self.fake.now())

    def nvmlEventSetWait_v2(self, event_set: FakeEventSet, timeout_ms: int) -> Any:
        self.fake._require_init()
        now = self.fake.now()
        for index, since in sorted(event_set.registered.items()):
            gpu = self.fake.scenario.gpus[index]
            for place, xid in enumerate(gpu.xids):
                if since <= xid.at_s <= now and (index, place) not in event_set.delivered:
                    event_set.delivered.add((index, place))
                    data = self.real.c_nvmlEventData_t()
                    data.device = ctypes.cast(ctypes.c_void_p(index + 1), self.real.c_nvmlDevice_t)
                    data.eventType = self.real.nvmlEventTypeXidCriticalError
                    data.eventData = xid.xid
                    data.gpuInstanceId = data.computeInstanceId = 0xFFFFFFFF
                    return data
        raise self.fake._error("NVMLError_Timeout")  # nothing due within timeout_ms

    def nvmlEventSetFree(self, event_set: FakeEventSet) -> None:
        self.fake._require_init()
        event_set.freed = True

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        """A handle's index: the fake's own handles, or the address in an event's device."""
        self.fake._require_init()
        if hasattr(handle, "gpu_index"):
            return int(handle.gpu_index)
        address = ctypes.cast(handle, ctypes.c_void_p).value
        if address is None or not 1 <= address <= len(self.fake.scenario.gpus):
            raise self.fake._error("NVMLError_InvalidArgument")
        return address - 1

    # -- GPM -----------------------------------------------------------------------------------
    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> Any:
        gpu = self._gpu(handle, "gpm")
        if gpu.gpm is None:
            raise self.fake._error("NVMLError_NotSupported")
        support = self.real.c_nvmlGpmSupport_t()
        support.version = self.real.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = 1
        return support

    def nvmlGpmSampleAlloc(self) -> Any:
        self.fake._require_init()
        address = 0x1000 + len(self.gpm_samples)
        self.gpm_samples[address] = None
        return ctypes.cast(ctypes.c_void_p(address), self.real.c_nvmlGpmSample_t)

    def _address(self, sample: Any) -> int:
        address = ctypes.cast(sample, ctypes.c_void_p).value
        if address is None or address not in self.gpm_samples or address in self.freed_samples:
            raise self.fake._error("NVMLError_InvalidArgument")
        return address

    def nvmlGpmSampleGet(self, handle: Any, sample: Any) -> Any:
        gpu = self._gpu(handle, "gpm")
        if gpu.gpm is None:
            raise self.fake._error("NVMLError_NotSupported")
        self.gpm_samples[self._address(sample)] = (handle.gpu_index, self.fake.now())
        return sample

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        self.fake._require_init()
        first = self.gpm_samples[self._address(request.sample1)]
        second = self.gpm_samples[self._address(request.sample2)]
        if first is None or second is None or first[0] != second[0] or second[1] < first[1]:
            raise self.fake._error("NVMLError_InvalidArgument")
        gpm = self.fake.scenario.gpus[second[0]].gpm
        assert gpm is not None
        for place in range(int(request.numMetrics)):
            metric = request.metrics[place]
            series = self.gpm_series.get(int(metric.metricId))
            if series is None:
                metric.nvmlReturn = self.real.NVML_ERROR_NOT_SUPPORTED
                continue
            value = series_value(getattr(gpm, series), second[1])
            metric.value = min(100.0, max(0.0, value))
            metric.nvmlReturn = self.real.NVML_SUCCESS
        return request

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self.fake._require_init()
        self.freed_samples.add(self._address(sample))

    # -- NVLink --------------------------------------------------------------------------------
    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        gpu = self._gpu(handle, "nvlink")
        if gpu.nvlink_links == 0:
            raise self.fake._error("NVMLError_NotSupported")
        if not 0 <= link < gpu.nvlink_links:
            raise self.fake._error("NVMLError_InvalidArgument")
        active = gpu.nvlink_links
        if gpu.nvlink_active is not None:
            active = math.floor(series_value(gpu.nvlink_active, self.fake.now()))
        enabled = link < active
        return int(self.real.NVML_FEATURE_ENABLED if enabled else self.real.NVML_FEATURE_DISABLED)
