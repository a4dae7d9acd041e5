"""A stand-in for the ``pynvml`` module, driven by a TOML scenario, so the real sampler runs without a GPU.

:func:`make_fake_pynvml` returns a :class:`FakeNvml` whose ``module`` attribute is a plain module object
exposing the NVML functions, constants and error classes that :mod:`hwdash.telemetry.nvml_sampler`
uses. The error classes are the *real* ones from the installed nvidia-ml-py (``NVMLError_NotSupported``,
``NVMLError_GpuIsLost``, ``NVMLLibraryMismatchError``...), so the sampler's ``except`` clauses are tested
against what the bindings really raise. Tests may delete functions from ``module`` to imitate older
bindings that lack them.

Scenario files (``scenarios/*.toml`` in this package) look like this; every series is either one number
or a list of ``[seconds, value]`` points, linear in between, the last value holding::

    description = "what this box shows"
    driver_version = "550.54.15"
    failure = "old-driver"        # optional: no-library | driver-not-loaded | library-mismatch | old-driver
    time_step_s = 5               # optional: scenario time advances 5 s per sampling round (deterministic)

    [[gpus]]
    name = "NVIDIA A100-SXM4-80GB"
    memory_total_mib = 81920
    memory_reserved_mib = 512
    used_mib = [[0, 1024], [60, 75000]]
    utilization = [[0, 0], [10, 97]]
    unsupported = ["power"]       # these calls raise NVML's NotSupported ("energy": the counter)
    lost_after_s = 120            # from then on calls for this GPU raise GpuIsLost
    hang_after_s = 30             # from then on calls for this GPU block until released

    [[gpus.processes]]
    pid = 4242
    name = "python"
    user = "alice"
    cmdline = "python train.py"
    used_mib = [[0, 512], [60, 74000]]   # leave out: NVML does not know (usedGpuMemory None)
    visible = false                      # the host cannot see this PID (another container)
    exited_s = 90                        # from then on the PID is gone from /proc, NVML still lists it

    [[gpus.mig]]
    name = "NVIDIA A100-SXM4-80GB MIG 3g.40gb"
    memory_total_mib = 40192
    used_mib = 12000
    slot = 2                      # optional: the MIG device index (slots may be sparse)
    gpu_instance_id = 1           # optional: GI (default slot + 1), CI (default 0)

MIG modes: ``mig_mode_current`` / ``mig_mode_pending`` (default: on when ``mig`` lists instances). A
process with ``mig = SLOT`` runs on that MIG device and is listed by it; the parent GPU's process list
on a MIG GPU is refused (NoPermission) unless the scenario says ``privileged = true``, as NVML does
for unprivileged users. ``process_struct_mismatch = true`` on a GPU returns its process rows as
bindings with the wrong struct stride read them (nvidia-ml-py 12.535.77). A process with
``used_not_available_raw = true`` reports NVML's "not available" value (2^64-1) as it is, as bindings
that do not convert it to None do. ``memory_total_mib = 0`` or ``unsupported = ["memory"]`` imitate a
unified-memory part (GH200, GB10). ``monitor_in_container = true`` says the monitor runs in a PID
namespace other than the host's.

Health readings (issue 28), each NotSupported when its name is in ``unsupported`` (``fan``, ``ecc``,
``pcie``, ``pcie_throughput``, ``remapped_rows``, ``pstate``, ``clocks_event_reasons``,
``process_utilization``); the defaults are a healthy Gen4 x16 GPU at P0 with its fan at 30%::

    clocks_event_reasons = [[0, ["sw_power_cap", "hw_power_brake_slowdown"]], [600, []]]  # held
    pcie_gen = [[0, 5], [60, 5], [60, 3]]   # pcie_gen_max = 5, pcie_width(_max), pcie_tx/rx_mib_s
    ecc_uncorrected = [[0, 0], [120, 2]]    # volatile; ecc_uncorrected_aggregate (default: the same)
    remapped_rows = { corrected = 1, uncorrected = 0, pending = [[0, 0], [120, 1]], failure = 0 }
    fan_percent = 30
    pstate = 0

    [[gpus.processes]]
    sm_percent = [[0, 90], [60, 30]]        # NVML's per-process samples; leave out: no sample
    memory_bandwidth_percent = 40

Xid events, GPM metrics and NVLink state (``xids``, ``gpm``, ``nvlink_links``, ``nvlink_active``) are
answered by :mod:`hwdash.telemetry.fake_nvml_events`, which describes them.

The clock-event reasons answer under the R535 name and the older ``...ThrottleReasons`` one (the
``old-driver`` failure mode has only the older); per-process samples are stamped with scenario time,
so a round at the same scenario second as the last sees none (NVML's NotFound).

Energy: ``nvmlDeviceGetTotalEnergyConsumption`` returns a per-GPU counter in millijoules that starts at
:data:`ENERGY_START_MJ` (a driver loaded before the run) and integrates the scripted ``power_w`` over
scenario time (trapezoids through the series' points, exact for straight pieces); it never goes back.

Scenario time: by default the seconds since the fake was created (real time, for ``--demo``). With
``time_step_s`` each call to ``nvmlDeviceGetCount`` (once per sampling round) advances it by that step, so
a command-line run is deterministic. Tests pass their own ``clock`` (:class:`ManualClock`).
"""

from __future__ import annotations

import importlib
import math
import struct
import threading
import time
import types
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hwdash.telemetry.fake_nvml_events import CONSTANTS as _EVENT_CONSTANTS
from hwdash.telemetry.fake_nvml_events import FakeEvents
from hwdash.telemetry.scenario_data import (
    SCENARIO_DIR,
    ScenarioError,
    _mib,
    integrate_watts,
    is_compiled_path,
    load_compiled_scenario,
    series_value,
)

if TYPE_CHECKING:
    from hwdash.telemetry.fake_processes import FakeProbes, ScenarioProcessTable
    from hwdash.telemetry.fake_scenario import (
        FailureMode,
        ManualClock,
        Points,
        Scenario,
        ScenarioGpu,
        ScenarioMig,
        ScenarioProcess,
        ScenarioTorch,
        Series,
        UnsupportedField,
        Wave,
        load_scenario,
        scenario_names,
        scenario_path,
    )
    from hwdash.telemetry.host_sampler import ProcessTable

_LAZY = {"FakeProbes": "fake_processes", "ScenarioProcessTable": "fake_processes"}
"""Names re-exported from the host's and the probes' view of a scenario, imported on first use:
a client that only calls NVML functions (nvitop under the bench's shim) never loads them."""

_FROM_MODELS = frozenset(
    (
        "FailureMode",
        "ManualClock",
        "Points",
        "Scenario",
        "ScenarioGpu",
        "ScenarioMig",
        "ScenarioProcess",
        "ScenarioTorch",
        "Series",
        "UnsupportedField",
        "Wave",
        "load_scenario",
        "scenario_names",
        "scenario_path",
    )
)
"""Names this module re-exports from the pydantic models, imported on first use: the fake itself
runs on a compiled scenario without them (:mod:`hwdash.telemetry.scenario_data`)."""


def __getattr__(name: str) -> Any:
    if name in _FROM_MODELS or name in _LAZY:
        module = importlib.import_module("hwdash.telemetry." + _LAZY.get(name, "fake_scenario"))
        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "SCENARIO_DIR",
    "FailureMode",
    "FakeDeviceHandle",
    "FakeNvml",
    "FakeProbes",
    "ManualClock",
    "Points",
    "Scenario",
    "ScenarioError",
    "ScenarioGpu",
    "ScenarioMig",
    "ScenarioProcess",
    "ScenarioProcessTable",
    "ScenarioTorch",
    "Series",
    "UnsupportedField",
    "Wave",
    "load_any_scenario",
    "load_scenario",
    "make_fake_pynvml",
    "scenario_names",
    "scenario_path",
    "series_value",
]


@dataclass(frozen=True)
class FakeDeviceHandle:
    """What ``nvmlDeviceGetHandleByIndex`` returns from the fake."""

    gpu_index: int
    mig_index: int | None = None


def _real_pynvml() -> Any:
    import pynvml  # the error classes and constants come from the real bindings

    return pynvml


class FakeNvml:
    """The state behind a fake ``pynvml`` module: the scenario, its clock, call counts, hangs."""

    def __init__(self, scenario: Scenario, clock: Callable[[], float] | None = None) -> None:
        self.scenario = scenario
        self.calls: Counter[str] = Counter()
        """How many times each NVML function was called (tests check static fields are read once)."""
        self._real = _real_pynvml()
        self._initialized = False
        self._hang_release = threading.Event()
        self._step_time = 0.0
        self._energy: dict[int, tuple[float, float]] = {}
        """GPU index -> (scenario second of the last energy read, millijoules then)."""
        started = time.monotonic()
        if clock is not None:
            self._clock = clock
        elif scenario.time_step_s is not None:
            self._clock = lambda: self._step_time
        else:
            self._clock = lambda: time.monotonic() - started
        self.events = FakeEvents(self)
        """Event sets, GPM, NVLink (:mod:`hwdash.telemetry.fake_nvml_events`)."""
        self.module = self._build_module()

    # -- control -------------------------------------------------------------------------------
    def now(self) -> float:
        """Current scenario second."""
        return self._clock()

    def probe_source(self) -> FakeProbes:
        """What the scenario's probed processes publish (a stand-in for the probe folder)."""
        from hwdash.telemetry.fake_processes import FakeProbes

        return FakeProbes(self.scenario, self.now)

    def process_table(self, fallback: ProcessTable | None = None) -> ScenarioProcessTable:
        """A host view of the scenario's PIDs (user, command line, visibility) for the host sampler."""
        from hwdash.telemetry.fake_processes import ScenarioProcessTable

        return ScenarioProcessTable(self.scenario, fallback, self.now)

    def release_hangs(self) -> None:
        """Let calls blocked by ``hang_after_s`` return (they then raise NVML's Timeout)."""
        self._hang_release.set()

    # -- helpers -------------------------------------------------------------------------------
    def _error(self, code_name: str) -> Exception:
        cls: type[Exception] = getattr(self._real, code_name)
        return cls()

    def _require_init(self) -> None:
        if not self._initialized:
            raise self._error("NVMLError_Uninitialized")

    def _gpu(self, handle: FakeDeviceHandle, field: UnsupportedField | None = None) -> ScenarioGpu:
        self._require_init()
        if not isinstance(handle, FakeDeviceHandle) or not (
            0 <= handle.gpu_index < len(self.scenario.gpus)
        ):
            raise self._error("NVMLError_InvalidArgument")
        gpu = self.scenario.gpus[handle.gpu_index]
        now = self.now()
        if gpu.lost_after_s is not None and now >= gpu.lost_after_s:
            raise self._error("NVMLError_GpuIsLost")
        if gpu.hang_after_s is not None and now >= gpu.hang_after_s:
            self._hang_release.wait()
            raise self._error("NVMLError_Timeout")
        if field is not None and field in gpu.unsupported:
            raise self._error("NVMLError_NotSupported")
        return gpu

    def _mig(self, handle: FakeDeviceHandle) -> ScenarioMig:
        gpu = self._gpu(handle)
        assert handle.mig_index is not None
        mig: ScenarioMig = gpu.mig_slots()[handle.mig_index]
        return mig

    def _old_driver(self) -> bool:
        return self.scenario.failure == "old-driver"

    # -- NVML functions ------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        failure = self.scenario.failure
        if failure == "no-library":
            raise self._error("NVMLError_LibraryNotFound")
        if failure == "driver-not-loaded":
            raise self._error("NVMLError_DriverNotLoaded")
        if failure == "library-mismatch":
            raise self._error("NVMLError_LibRmVersionMismatch")
        self._initialized = True

    def nvmlShutdown(self) -> None:
        self._require_init()
        self._initialized = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._require_init()
        return self.scenario.driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._require_init()
        if self.scenario.time_step_s is not None:
            self._step_time += self.scenario.time_step_s
        return len(self.scenario.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeDeviceHandle:
        handle = FakeDeviceHandle(index)
        self._gpu(handle)
        return handle

    def nvmlDeviceGetName(self, handle: FakeDeviceHandle) -> str:
        if handle.mig_index is not None:
            return self._mig(handle).name
        return self._gpu(handle, "name").name

    def nvmlDeviceGetUUID(self, handle: FakeDeviceHandle) -> str:
        if handle.mig_index is not None:
            mig = self._mig(handle)
            return mig.uuid or f"MIG-fake-{handle.gpu_index:04d}-{handle.mig_index:04d}"
        gpu = self._gpu(handle, "uuid")
        return gpu.uuid or f"GPU-fake-0000-0000-0000-{handle.gpu_index:012d}"

    def nvmlDeviceGetMemoryInfo(self, handle: FakeDeviceHandle, version: int | None = None) -> Any:
        if version is not None and self._old_driver():
            raise self._error("NVMLError_FunctionNotFound")
        now = self.now()
        if handle.mig_index is not None:
            mig = self._mig(handle)
            total, reserved, used = mig.memory_total_mib, 0.0, series_value(mig.used_mib, now)
        else:
            gpu = self._gpu(handle, "memory")
            total = gpu.memory_total_mib
            reserved = gpu.memory_reserved_mib
            used = series_value(gpu.used_mib, now)
        used = min(max(used, 0.0), total - reserved)
        free = total - reserved - used
        if version is None:
            # v1 semantics: "used" includes what the driver reserves.
            return types.SimpleNamespace(
                total=_mib(total), free=_mib(free), used=_mib(used + reserved)
            )
        return types.SimpleNamespace(
            version=version,
            total=_mib(total),
            reserved=_mib(reserved),
            free=_mib(free),
            used=_mib(used),
        )

    def nvmlDeviceGetUtilizationRates(self, handle: FakeDeviceHandle) -> Any:
        gpu = self._gpu(handle, "utilization")
        now = self.now()
        return types.SimpleNamespace(  # NVML's percentages stay within 0..100
            gpu=round(min(100.0, max(0.0, series_value(gpu.utilization, now)))),
            memory=round(min(100.0, max(0.0, series_value(gpu.memory_utilization, now)))),
        )

    def nvmlDeviceGetTemperature(self, handle: FakeDeviceHandle, sensor: int) -> int:
        gpu = self._gpu(handle, "temperature")
        if sensor != self._real.NVML_TEMPERATURE_GPU:
            raise self._error("NVMLError_InvalidArgument")
        return round(series_value(gpu.temperature_c, self.now()))

    def nvmlDeviceGetPowerUsage(self, handle: FakeDeviceHandle) -> int:
        gpu = self._gpu(handle, "power")
        return round(max(0.0, series_value(gpu.power_w, self.now())) * 1000)  # milliwatts

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> FakeDeviceHandle:
        self._require_init()
        wanted = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        for index, gpu in enumerate(self.scenario.gpus):
            if (gpu.uuid or f"GPU-fake-0000-0000-0000-{index:012d}") == wanted:
                handle = FakeDeviceHandle(index)
                self._gpu(handle)
                return handle
        raise self._error("NVMLError_NotFound")

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: FakeDeviceHandle) -> int:
        gpu = self._gpu(handle, "energy")
        now = self.now()
        last_s, energy = self._energy.get(handle.gpu_index, (now, float(ENERGY_START_MJ)))
        if now > last_s:
            energy += integrate_watts(gpu.power_w, last_s, now) * 1000  # J -> mJ
            last_s = now
        self._energy[handle.gpu_index] = (last_s, energy)
        return round(energy)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: FakeDeviceHandle) -> int:
        gpu = self._gpu(handle, "power_limit")
        return round(gpu.power_limit_w * 1000)  # milliwatts

    def nvmlDeviceGetClockInfo(self, handle: FakeDeviceHandle, clock_type: int) -> int:
        gpu = self._gpu(handle, "clocks")
        if clock_type == self._real.NVML_CLOCK_SM:
            return round(series_value(gpu.sm_clock_mhz, self.now()))
        if clock_type == self._real.NVML_CLOCK_MEM:
            return round(series_value(gpu.memory_clock_mhz, self.now()))
        raise self._error("NVMLError_InvalidArgument")

    def _reasons_mask(self, handle: FakeDeviceHandle) -> int:
        from hwdash.telemetry.nvml_health import CLOCKS_EVENT_REASONS  # loads the sample types

        gpu = self._gpu(handle, "clocks_event_reasons")
        bits = dict(CLOCKS_EVENT_REASONS)
        names = gpu.clocks_event_reasons_at(self.now())
        return sum(int(getattr(self._real, "nvmlClocksEventReason" + bits[name])) for name in names)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeDeviceHandle) -> int:
        if self._old_driver():  # the name came with driver R535
            raise self._error("NVMLError_FunctionNotFound")
        return self._reasons_mask(handle)

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: FakeDeviceHandle) -> int:
        return self._reasons_mask(handle)

    def _pcie(self, handle: FakeDeviceHandle, series: str) -> int:
        gpu = self._gpu(handle, "pcie")
        value: Series | int = getattr(gpu, series)
        return round(series_value(value, self.now()) if not isinstance(value, int) else value)

    def nvmlDeviceGetPcieThroughput(self, handle: FakeDeviceHandle, counter: int) -> int:
        gpu = self._gpu(handle, "pcie_throughput")
        if counter == self._real.NVML_PCIE_UTIL_TX_BYTES:
            series = gpu.pcie_tx_mib_s
        elif counter == self._real.NVML_PCIE_UTIL_RX_BYTES:
            series = gpu.pcie_rx_mib_s
        else:
            raise self._error("NVMLError_InvalidArgument")
        return round(max(0.0, series_value(series, self.now())) * 1024)  # MiB/s -> KB/s

    def nvmlDeviceGetTotalEccErrors(
        self, handle: FakeDeviceHandle, error_type: int, counter_type: int
    ) -> int:
        gpu = self._gpu(handle, "ecc")
        if error_type != self._real.NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
            return 0  # scenarios script the uncorrected errors only
        series = gpu.ecc_uncorrected
        if counter_type == self._real.NVML_AGGREGATE_ECC:
            series = (
                gpu.ecc_uncorrected_aggregate
                if gpu.ecc_uncorrected_aggregate is not None
                else series
            )
        elif counter_type != self._real.NVML_VOLATILE_ECC:
            raise self._error("NVMLError_InvalidArgument")
        return math.floor(max(0.0, series_value(series, self.now())))

    def nvmlDeviceGetRemappedRows(self, handle: FakeDeviceHandle) -> tuple[int, int, int, int]:
        rows = self._gpu(handle, "remapped_rows").remapped_rows
        now = self.now()
        return (
            math.floor(max(0.0, series_value(rows.corrected, now))),
            math.floor(max(0.0, series_value(rows.uncorrected, now))),
            int(series_value(rows.pending, now) > 0),
            int(series_value(rows.failure, now) > 0),
        )

    def nvmlDeviceGetFanSpeed(self, handle: FakeDeviceHandle) -> int:
        gpu = self._gpu(handle, "fan")
        return round(min(100.0, max(0.0, series_value(gpu.fan_percent, self.now()))))

    def nvmlDeviceGetPerformanceState(self, handle: FakeDeviceHandle) -> int:
        gpu = self._gpu(handle, "pstate")
        return round(series_value(gpu.pstate, self.now()))

    def nvmlDeviceGetProcessUtilization(self, handle: FakeDeviceHandle, since_us: int) -> list[Any]:
        """One sample per process with a scripted SM series, stamped with scenario time (NVML's
        microseconds, from :data:`_SAMPLE_EPOCH_US`); NotFound when none is newer than ``since_us``."""
        gpu = self._gpu(handle, "process_utilization")
        now = self.now()
        stamp = _SAMPLE_EPOCH_US + round(now * 1_000_000)
        samples = [
            types.SimpleNamespace(
                pid=process.pid,
                timeStamp=stamp,
                smUtil=round(min(100.0, max(0.0, series_value(process.sm_percent, now)))),
                memUtil=round(
                    min(100.0, max(0.0, series_value(process.memory_bandwidth_percent or 0.0, now)))
                ),
                encUtil=0,
                decUtil=0,
            )
            for process in gpu.processes
            if process.sm_percent is not None and self._alive(process) and stamp > since_us
        ]
        if not samples:
            raise self._error("NVMLError_NotFound")
        return samples

    def _alive(self, process: ScenarioProcess) -> bool:
        return process.alive_at(self.now())

    def _processes(self, handle: FakeDeviceHandle, kind: str) -> list[Any]:
        gpu = self._gpu(handle, "processes")
        if handle.mig_index is None and gpu.mig_current and not self.scenario.privileged:
            raise self._error("NVMLError_NoPermission")  # NVML: root only on a MIG parent
        slots = gpu.mig_slots()
        now = self.now()
        result = []
        for process in gpu.processes:
            if process.kind != kind or not self._alive(process):
                continue
            if handle.mig_index is not None and process.mig != handle.mig_index:
                continue
            used = None if process.used_mib is None else _mib(series_value(process.used_mib, now))
            if process.used_not_available_raw:
                used = _NOT_AVAILABLE_ULONGLONG
            mig = slots.get(process.mig) if process.mig is not None else None
            result.append(
                types.SimpleNamespace(
                    pid=process.pid,
                    usedGpuMemory=used,
                    gpuInstanceId=_no_instance(mig, "gpu"),
                    computeInstanceId=_no_instance(mig, "compute"),
                )
            )
        if gpu.process_struct_mismatch:
            return _read_at_v3_stride(result)
        return result

    def _processes_v3(self, handle: FakeDeviceHandle, kind: str) -> list[Any]:
        if self._old_driver():
            raise self._error("NVMLError_FunctionNotFound")
        return self._processes(handle, kind)

    def _processes_unversioned(self, handle: FakeDeviceHandle, kind: str) -> list[Any]:
        # The real bindings call the v3 function and turn FunctionNotFound into this plain Exception.
        try:
            return self._processes_v3(handle, kind)
        except self._real.NVMLError_FunctionNotFound:
            raise self._real.NVMLLibraryMismatchError(
                "Unversioned function called and the pyNVML version does not match the NVML lib "
                "version (fake NVML, old-driver scenario)"
            ) from None

    def nvmlSystemGetProcessName(self, pid: int) -> str:
        self._require_init()
        for index, gpu in enumerate(self.scenario.gpus):
            for process in gpu.processes:
                if process.pid == pid and self._alive(process):  # a PID may be reused later
                    self._gpu(FakeDeviceHandle(index), "process_name")
                    return process.name
        raise self._error("NVMLError_NotFound")

    def nvmlDeviceGetMigMode(self, handle: FakeDeviceHandle) -> list[int]:
        gpu = self._gpu(handle, "mig")

        def mode(on: bool) -> int:
            return int(
                self._real.NVML_DEVICE_MIG_ENABLE if on else self._real.NVML_DEVICE_MIG_DISABLE
            )

        pending = gpu.mig_current if gpu.mig_mode_pending is None else gpu.mig_mode_pending
        return [mode(gpu.mig_current), mode(pending)]  # NVML returns (current, pending)

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: FakeDeviceHandle) -> int:
        gpu = self._gpu(handle, "mig")
        return 7 if gpu.mig_current else 0  # A100/H100: up to seven MIG devices

    def nvmlDeviceGetMigDeviceHandleByIndex(
        self, handle: FakeDeviceHandle, index: int
    ) -> FakeDeviceHandle:
        gpu = self._gpu(handle, "mig")
        if not gpu.mig_current:
            raise self._error("NVMLError_InvalidArgument")
        if index not in gpu.mig_slots():
            raise self._error("NVMLError_NotFound")
        return FakeDeviceHandle(handle.gpu_index, index)

    def nvmlDeviceGetGpuInstanceId(self, handle: FakeDeviceHandle) -> int:
        if handle.mig_index is None:
            self._gpu(handle)
            raise self._error("NVMLError_InvalidArgument")
        return _no_instance(self._mig(handle), "gpu", handle.mig_index)

    def nvmlDeviceGetComputeInstanceId(self, handle: FakeDeviceHandle) -> int:
        if handle.mig_index is None:
            self._gpu(handle)
            raise self._error("NVMLError_InvalidArgument")
        return _no_instance(self._mig(handle), "compute", handle.mig_index)

    # -- the module ----------------------------------------------------------------------------
    def _build_module(self) -> types.ModuleType:
        module = types.ModuleType("pynvml", "fake pynvml driven by a hwdash scenario")
        for name in dir(self._real):
            if name.startswith(("NVMLError", "NVML_ERROR_")) or name == "NVMLLibraryMismatchError":
                setattr(module, name, getattr(self._real, name))
        for name in (
            "NVML_TEMPERATURE_GPU",
            "NVML_CLOCK_SM",
            "NVML_CLOCK_MEM",
            "NVML_DEVICE_MIG_ENABLE",
            "NVML_DEVICE_MIG_DISABLE",
            "nvmlMemory_v2",
        ):
            setattr(module, name, getattr(self._real, name))
        for name in dir(self._real):
            if name.startswith(_HEALTH_CONSTANTS + _EVENT_CONSTANTS):
                setattr(module, name, getattr(self._real, name))

        functions: dict[str, Callable[..., Any]] = {
            "nvmlInit": self.nvmlInit,
            "nvmlShutdown": self.nvmlShutdown,
            "nvmlSystemGetDriverVersion": self.nvmlSystemGetDriverVersion,
            "nvmlDeviceGetCount": self.nvmlDeviceGetCount,
            "nvmlDeviceGetHandleByIndex": self.nvmlDeviceGetHandleByIndex,
            "nvmlDeviceGetName": self.nvmlDeviceGetName,
            "nvmlDeviceGetUUID": self.nvmlDeviceGetUUID,
            "nvmlDeviceGetMemoryInfo": self.nvmlDeviceGetMemoryInfo,
            "nvmlDeviceGetUtilizationRates": self.nvmlDeviceGetUtilizationRates,
            "nvmlDeviceGetTemperature": self.nvmlDeviceGetTemperature,
            "nvmlDeviceGetPowerUsage": self.nvmlDeviceGetPowerUsage,
            "nvmlDeviceGetEnforcedPowerLimit": self.nvmlDeviceGetEnforcedPowerLimit,
            "nvmlDeviceGetHandleByUUID": self.nvmlDeviceGetHandleByUUID,
            "nvmlDeviceGetTotalEnergyConsumption": self.nvmlDeviceGetTotalEnergyConsumption,
            "nvmlDeviceGetClockInfo": self.nvmlDeviceGetClockInfo,
            "nvmlSystemGetProcessName": self.nvmlSystemGetProcessName,
            "nvmlDeviceGetMigMode": self.nvmlDeviceGetMigMode,
            "nvmlDeviceGetMaxMigDeviceCount": self.nvmlDeviceGetMaxMigDeviceCount,
            "nvmlDeviceGetMigDeviceHandleByIndex": self.nvmlDeviceGetMigDeviceHandleByIndex,
            "nvmlDeviceGetGpuInstanceId": self.nvmlDeviceGetGpuInstanceId,
            "nvmlDeviceGetComputeInstanceId": self.nvmlDeviceGetComputeInstanceId,
            **self._health_functions(),
        }
        for kind, label in (("compute", "Compute"), ("graphics", "Graphics")):
            base = f"nvmlDeviceGet{label}RunningProcesses"
            functions[base] = _bind_kind(self._processes_unversioned, kind)
            functions[f"{base}_v3"] = _bind_kind(self._processes_v3, kind)
            functions[f"{base}_v2"] = _bind_kind(self._processes, kind)

        for name, function in functions.items():
            setattr(module, name, self._counted(name, function))
        return module

    def _health_functions(self) -> dict[str, Callable[..., Any]]:
        """The health readings' calls (throttle reasons, PCIe, ECC, fan, P-state, per-process SM%)."""
        functions: dict[str, Callable[..., Any]] = {
            "nvmlDeviceGetCurrentClocksEventReasons": self.nvmlDeviceGetCurrentClocksEventReasons,
            "nvmlDeviceGetCurrentClocksThrottleReasons": (
                self.nvmlDeviceGetCurrentClocksThrottleReasons
            ),
            "nvmlDeviceGetPcieThroughput": self.nvmlDeviceGetPcieThroughput,
            "nvmlDeviceGetTotalEccErrors": self.nvmlDeviceGetTotalEccErrors,
            "nvmlDeviceGetRemappedRows": self.nvmlDeviceGetRemappedRows,
            "nvmlDeviceGetFanSpeed": self.nvmlDeviceGetFanSpeed,
            "nvmlDeviceGetPerformanceState": self.nvmlDeviceGetPerformanceState,
            "nvmlDeviceGetProcessUtilization": self.nvmlDeviceGetProcessUtilization,
            **self.events.functions(),
        }
        for name, series in _PCIE_FUNCTIONS:
            functions[name] = _bind_kind(self._pcie, series)
        return functions

    def _counted(self, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return function(*args, **kwargs)

        call.__name__ = name
        return call


_HEALTH_CONSTANTS = (
    "nvmlClocksEventReason",
    "nvmlClocksThrottleReason",
    "NVML_MEMORY_ERROR_TYPE_",
    "NVML_VOLATILE_ECC",
    "NVML_AGGREGATE_ECC",
    "NVML_PCIE_UTIL_",
    "NVML_PSTATE_",
)
"""Prefixes of the real bindings' constants the fake module carries for the health readings."""

_PCIE_FUNCTIONS = (
    ("nvmlDeviceGetCurrPcieLinkGeneration", "pcie_gen"),
    ("nvmlDeviceGetMaxPcieLinkGeneration", "pcie_gen_max"),
    ("nvmlDeviceGetGpuMaxPcieLinkGeneration", "pcie_gen_max"),
    ("nvmlDeviceGetCurrPcieLinkWidth", "pcie_width"),
    ("nvmlDeviceGetMaxPcieLinkWidth", "pcie_width_max"),
)
"""The PCIe link calls and the scenario field each answers from."""

_SAMPLE_EPOCH_US = 1_700_000_000_000_000
"""Scenario second 0 on NVML's per-process sample clock (microseconds since the epoch, as the
driver stamps them: never 0, so a first read "since 0" sees every sample)."""

ENERGY_START_MJ = 5_000_000_000
"""Where every fake GPU's energy counter starts (5 MJ): a counter is not zero when a run starts."""

_NOT_AVAILABLE_ULONGLONG = 2**64 - 1
"""NVML_VALUE_NOT_AVAILABLE_ulonglong: what NVML writes into a 64-bit field it cannot fill."""


def _no_instance(mig: ScenarioMig | None, which: str, slot: int | None = None) -> int:
    """A MIG instance id, or NVML's 0xFFFFFFFF for "no instance" (a process on a whole GPU)."""
    if mig is None:
        return 0xFFFFFFFF
    if which == "compute":
        return mig.compute_instance_id
    if mig.gpu_instance_id is not None:
        return mig.gpu_instance_id
    return (mig.slot if mig.slot is not None else (slot or 0)) + 1


_V2_ROW = struct.Struct("<IxxxxQII")
"""NVML's c_nvmlProcessInfo_v2_t: pid, (padding), usedGpuMemory, gpuInstanceId, computeInstanceId."""
_V3_ROW = struct.Struct("<IxxxxQIIQ")
"""c_nvmlProcessInfo_v3_t: the same plus usedGpuCcProtectedMemory (8 bytes more per row)."""


def _read_at_v3_stride(rows: list[Any]) -> list[Any]:
    """Rows written by the driver as v2 structs and read back as v3 ones (the 12.535.77 bug):
    the first row is right, later rows straddle two structs, and the tail reads zeros."""
    packed = b"".join(
        _V2_ROW.pack(
            row.pid,
            _NOT_AVAILABLE_ULONGLONG if row.usedGpuMemory is None else row.usedGpuMemory,
            row.gpuInstanceId,
            row.computeInstanceId,
        )
        for row in rows
    )
    buffer = packed.ljust(_V3_ROW.size * len(rows), b"\0")
    result = []
    for place in range(len(rows)):
        pid, used, gpu_instance, compute_instance, _cc = _V3_ROW.unpack_from(
            buffer, place * _V3_ROW.size
        )
        result.append(
            types.SimpleNamespace(
                pid=pid,
                usedGpuMemory=None if used == _NOT_AVAILABLE_ULONGLONG else used,
                gpuInstanceId=gpu_instance,
                computeInstanceId=compute_instance,
            )
        )
    return result


def _bind_kind(
    function: Callable[[FakeDeviceHandle, str], Any], kind: str
) -> Callable[[FakeDeviceHandle], Any]:
    def call(handle: FakeDeviceHandle) -> Any:
        return function(handle, kind)

    return call


def load_any_scenario(name_or_path: str | Path) -> Scenario:
    """A compiled scenario (``.json``: no pydantic loaded) or a TOML one, validated by the models."""
    if is_compiled_path(name_or_path):
        compiled: Scenario = load_compiled_scenario(name_or_path)
        return compiled
    from hwdash.telemetry.fake_scenario import load_scenario

    return load_scenario(name_or_path)


def make_fake_pynvml(
    scenario: Scenario | str | Path, clock: Callable[[], float] | None = None
) -> FakeNvml:
    """Build a fake NVML from a scenario (object, packaged name, TOML path or compiled ``.json``
    path); use ``.module`` as pynvml."""
    if isinstance(scenario, str | Path):
        scenario = load_any_scenario(scenario)
    return FakeNvml(scenario, clock)
