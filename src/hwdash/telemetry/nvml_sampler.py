"""The NVML sampler: the one module in hwdash that calls ``pynvml`` (with its small sibling
:mod:`hwdash.telemetry.nvml_energy`, the energy counter that the probe reads in a training process).

It takes the pynvml module as an argument (the real ``import pynvml`` or the fake from
:mod:`hwdash.telemetry.fake_nvml`), so tests drive this very code.

How it degrades (each case gives a snapshot, never an exception):

* No library, driver not loaded, driver/library mismatch: ``NvmlStatus(available=False, error=...)`` in
  words, and no GPUs; the host still shows. Initialisation is tried once per sampler.
* A field that is not supported: that field is ``None`` and ``GpuSample.errors`` says why; every field
  is read on its own, so one failure never hides the others.
* Old drivers: memory info v2 falls back to v1 (reserved unknown, "used" then includes it); the
  unversioned (v3) running-process calls fall back to the ``_v2`` and ``_v1`` variants when the bindings
  raise ``NVMLLibraryMismatchError`` (a plain Exception) or ``FunctionNotFound``, or lack the function.
  What worked is remembered, so the fallbacks cost one failed call per sampler, not one per round.
* A GPU that is lost (``GpuIsLost``) becomes a ``GpuState.LOST`` row keeping its name and UUID.
* Unified-memory parts (GH200, GB10) answer the memory query with NotSupported or a total of 0:
  the sample says ``unified_memory=True`` and the system sampler shows the host's RAM for it.
* Process rows are sanity-checked: bindings that read NVML's process struct at the wrong stride
  (nvidia-ml-py 12.535.77 on drivers R510-R530 and >= 535.86, see nvitop PR #79 and
  gpuopenanalytics/pynvml issue #50) give PID 0 or 0xFFFFFFFF, PIDs above the kernel's limit or
  more memory than the GPU has. Such a list is dropped and reported as unreliable, never shown.
* Compute and graphics lists are merged by PID: a process with both contexts is one row (``C+G``).
* MIG: the mode used is the *current* one (a pending mode takes effect only after a GPU reset);
  instances are looked up in every slot up to the maximum (slots may be sparse); processes are
  read from each MIG device, which any user may query, and carry their GPU/compute instance ids
  (NVML serves the parent GPU's process list on MIG only to privileged users).
* Process names are cached by PID only while the PID is in NVML's lists: a PID that leaves them is
  forgotten, so a reused PID never shows a dead process's name.
* A call that hangs: all NVML calls (init, reads, shutdown) run in **one long-lived worker thread**.
  ``sample()`` hands the worker a round and waits at most ``round_timeout_s``. If the worker does not
  answer in time, ``sample()`` returns the last good GPU values with ``stale=True`` and an error, and
  while the worker stays stuck no new round is queued and no new thread is started: later calls return
  at once with the same stale values. When the hung call finally returns, the next round is fresh. A
  thread stuck in the driver cannot be killed from Python; it is a daemon, so it never blocks exit.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from hwdash.telemetry.nvml_health import HealthReader
from hwdash.telemetry.types import (
    GpuSample,
    GpuState,
    MigSample,
    NvmlStatus,
    ProcessSample,
    Snapshot,
)

log = logging.getLogger(__name__)

NO_DRIVER_MESSAGE = "no NVIDIA driver found: the planner still works"

_NVML_VALUE_NOT_AVAILABLE = 2**64 - 1
"""What NVML puts in a 64-bit field it cannot fill; the bindings usually turn it into None already."""

_NVML_PID_INVALID = 0xFFFFFFFF
"""A 32-bit all-ones PID: what a process row read at the wrong stride shows (an instance id field)."""

PID_MAX_LIMIT = 4 * 1024 * 1024
"""The largest PID Linux can hand out on 64-bit machines (``PID_MAX_LIMIT``, 2^22, in the kernel's
include/linux/threads.h); a larger PID in a process row is garbage."""

SAFE_BINDINGS = (12, 535, 108)
"""Oldest nvidia-ml-py of the 12.535 line that reads the process struct right: 12.535.77 used the v3
struct on drivers that fill v2 (nvitop PR #79; gpustat requires >= 12.535.108 for this reason)."""


def bindings_problem(version: str | None) -> str | None:
    """Why process rows from these nvidia-ml-py bindings cannot be trusted, or None.

    11.x predates the v3 process struct and is fine; 12.535.77 is the release with the wrong
    stride (see :data:`SAFE_BINDINGS`).
    """
    if not version:
        return None
    try:
        parts = tuple(int(part) for part in version.split(".")[:3])
    except ValueError:
        return None
    if parts[:2] == SAFE_BINDINGS[:2] and parts < SAFE_BINDINGS:
        return (
            f"nvidia-ml-py {version} reads NVML's process list at the wrong stride on many "
            f"drivers; install nvidia-ml-py >= {'.'.join(map(str, SAFE_BINDINGS))}"
        )
    return None


class _NeverRaised(Exception):
    """Stands in for an error class that an old pynvml does not define, so ``except`` still works."""


class _GpuLost(Exception):
    """Internal: a call for this GPU raised GpuIsLost; abandon the GPU for this round."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class _StaticInfo:
    """What is read once per GPU."""

    handle: Any
    name: str | None
    uuid: str | None
    power_limit_w: float | None
    mig_enabled: bool
    """MIG mode as it is now (NVML's *current* mode, not the pending one)."""
    errors: list[tuple[str, str]]


@dataclass
class _RoundResult:
    status: NvmlStatus
    gpus: tuple[GpuSample, ...] = ()
    errors: tuple[str, ...] = ()


@dataclass
class _Round:
    started: float = field(default_factory=time.monotonic)
    done: threading.Event = field(default_factory=threading.Event)
    result: _RoundResult | None = None


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class _NvmlReader:
    """Reads one round from NVML. Used only from the worker thread."""

    def __init__(self, nvml: Any, bindings_version: str | None = None) -> None:
        self.nvml = nvml
        self.bindings_version = bindings_version
        self.bindings_problem = bindings_problem(bindings_version)
        """Set when the installed bindings are known to scramble process rows: none are shown."""
        self.base_error: type[BaseException] = self._error_class("NVMLError")
        self.not_supported_error = self._error_class("NVMLError_NotSupported")
        self.lost_error = self._error_class("NVMLError_GpuIsLost")
        self.not_found_error = self._error_class("NVMLError_NotFound")
        self.function_not_found_error = self._error_class("NVMLError_FunctionNotFound")
        self.mismatch_error = self._error_class("NVMLLibraryMismatchError")
        self.version_mismatch_error = self._error_class("NVMLError_ArgumentVersionMismatch")
        self.status: NvmlStatus | None = None
        self.static: dict[int, _StaticInfo] = {}
        self.memory_v2: bool | None = None
        """None: not tried yet; False: the driver or bindings lack it, use v1."""
        self.process_variant: dict[str, str | None] = {}
        """Per process kind, the function suffix that worked ("" for unversioned), None if none did."""
        self.process_names: dict[int, str | None] = {}
        """Names by PID, kept only while the PID is in NVML's process lists."""
        self._seen_pids: set[int] = set()
        self.health = HealthReader(self)
        """Throttle reasons, PCIe, ECC, fan, P-state, energy, per-process SM% (nvml_health)."""

    def _error_class(self, name: str) -> type[BaseException]:
        cls = getattr(self.nvml, name, None)
        return cls if isinstance(cls, type) and issubclass(cls, BaseException) else _NeverRaised

    # -- words ---------------------------------------------------------------------------------
    def reason(self, exc: BaseException) -> str:
        """A short reason for a field that could not be read."""
        name = type(exc).__name__
        words = {
            "NVMLError_NotSupported": "not supported",
            "NVMLError_NoPermission": "no permission",
            "NVMLError_FunctionNotFound": "not in this driver",
            "NVMLLibraryMismatchError": "not in this driver",
            "NVMLError_Timeout": "timed out",
            "NVMLError_GpuIsLost": "GPU is lost",
            "NVMLError_Unknown": "unknown NVML error",
        }
        if name in words:
            return words[name]
        text = str(exc).strip()
        return text or name

    def init_failure(self, exc: BaseException) -> str:
        """Why NVML could not start, in words a user understands."""
        name = type(exc).__name__
        if name == "NVMLError_LibraryNotFound" or isinstance(exc, OSError):
            return NO_DRIVER_MESSAGE
        if name == "NVMLError_DriverNotLoaded":
            return "NVIDIA driver not loaded: the planner still works"
        if name == "NVMLError_LibRmVersionMismatch":
            return (
                "NVIDIA driver and NVML library versions do not match (reboot or reinstall the "
                "driver): the planner still works"
            )
        if name == "NVMLError_NoPermission":
            return "no permission to use the NVIDIA driver: the planner still works"
        return f"NVML failed to start ({self.reason(exc)}): the planner still works"

    # -- life cycle ----------------------------------------------------------------------------
    def start(self) -> NvmlStatus:
        try:
            self.nvml.nvmlInit()
        except Exception as exc:
            self.status = NvmlStatus(
                available=False,
                error=self.init_failure(exc),
                bindings_version=self.bindings_version,
            )
            return self.status
        driver: str | None = None
        try:
            driver = _text(self.nvml.nvmlSystemGetDriverVersion())
        except Exception as exc:
            log.info("driver version unavailable: %s", exc)
        self.status = NvmlStatus(
            available=True, driver_version=driver, bindings_version=self.bindings_version
        )
        return self.status

    def shutdown(self) -> None:
        if self.status is not None and self.status.available:
            self.health.close()  # the event set and GPM samples, while NVML is still up
            try:
                self.nvml.nvmlShutdown()
            except Exception as exc:
                log.info("nvmlShutdown failed: %s", exc)

    # -- one round -----------------------------------------------------------------------------
    def read_round(self) -> _RoundResult:
        status = self.status if self.status is not None else self.start()
        if not status.available:
            return _RoundResult(status)
        try:
            count = int(self.nvml.nvmlDeviceGetCount())
        except Exception as exc:
            return _RoundResult(status, errors=(f"cannot count GPUs: {self.reason(exc)}",))
        self._seen_pids = set()
        self.health.start_round()  # the Xid events since the last round (nvml_events)
        gpus = [self.read_gpu(index) for index in range(count)]
        # A PID that left NVML's lists may be reused by an unrelated process: forget its name.
        self.process_names = {
            pid: name for pid, name in self.process_names.items() if pid in self._seen_pids
        }
        errors: list[str] = []
        for index in sorted(i for i in self.static if i >= count):
            info = self.static[index]
            errors.append(f"GPU {index} vanished from NVML")
            gpus.append(
                GpuSample(
                    index=index,
                    name=info.name,
                    uuid=info.uuid,
                    state=GpuState.LOST,
                    errors=(("gpu", "vanished from NVML"),),
                )
            )
        return _RoundResult(status, tuple(gpus), tuple(errors))

    def call(
        self, errors: list[tuple[str, str]], label: str, function_name: str, *args: Any
    ) -> Any:
        """Call one NVML function; on failure record ``(label, reason)`` and return None."""
        return self.call_function(errors, label, getattr(self.nvml, function_name, None), *args)

    def call_function(
        self,
        errors: list[tuple[str, str]],
        label: str,
        function: Callable[..., Any] | None,
        *args: Any,
    ) -> Any:
        """:meth:`call` for a function in hand (None: the bindings lack it)."""
        if function is None:
            errors.append((label, "not in these NVML bindings"))
            return None
        try:
            return function(*args)
        except self.lost_error as exc:
            raise _GpuLost(self.reason(exc)) from exc
        except (self.base_error, self.mismatch_error) as exc:
            errors.append((label, self.reason(exc)))
        # The bindings raise odd things on odd drivers; never end the monitor.
        except Exception as exc:
            log.warning("NVML %s failed unexpectedly: %r", label, exc)
            errors.append((label, f"unexpected error: {exc!r}"))
        return None

    def read_static(self, index: int) -> _StaticInfo:
        info = self.static.get(index)
        if info is not None:
            return info
        errors: list[tuple[str, str]] = []
        handle = self.nvml.nvmlDeviceGetHandleByIndex(index)
        name = self.call(errors, "name", "nvmlDeviceGetName", handle)
        uuid = self.call(errors, "uuid", "nvmlDeviceGetUUID", handle)
        limit_mw = self.call(errors, "power_limit", "nvmlDeviceGetEnforcedPowerLimit", handle)
        mig_enabled = False
        mig_errors: list[tuple[str, str]] = []  # most GPUs have no MIG: not worth showing
        mode = self.call(mig_errors, "mig", "nvmlDeviceGetMigMode", handle)
        if mode is not None:
            enabled_value = getattr(self.nvml, "NVML_DEVICE_MIG_ENABLE", 1)
            mig_enabled = mode[0] == enabled_value
        info = _StaticInfo(
            handle=handle,
            name=None if name is None else _text(name),
            uuid=None if uuid is None else _text(uuid),
            power_limit_w=None if limit_mw is None else limit_mw / 1000,
            mig_enabled=mig_enabled,
            errors=errors,
        )
        self.static[index] = info
        return info

    def read_gpu(self, index: int) -> GpuSample:
        info = self.static.get(index)
        try:
            try:
                info = self.read_static(index)
            except _GpuLost:
                raise
            except self.lost_error as exc:
                raise _GpuLost(self.reason(exc)) from exc
            except Exception as exc:
                return GpuSample(
                    index=index,
                    name=None,
                    uuid=None,
                    state=GpuState.ERROR,
                    errors=(("gpu", f"cannot open: {self.reason(exc)}"),),
                )
            return self.read_dynamic(index, info)
        except _GpuLost as lost:
            return GpuSample(
                index=index,
                name=info.name if info else None,
                uuid=info.uuid if info else None,
                state=GpuState.LOST,
                power_limit_w=info.power_limit_w if info else None,
                errors=(("gpu", lost.reason),),
            )

    def read_dynamic(self, index: int, info: _StaticInfo) -> GpuSample:
        errors = list(info.errors)
        handle = info.handle
        total, reserved, used, free = self.read_memory(handle, errors, "memory")
        utilization = self.call(errors, "utilization", "nvmlDeviceGetUtilizationRates", handle)
        sensors = self.read_sensors(handle, errors)
        unified = total == 0 or (total is None and ("memory", "not supported") in errors)
        if total == 0:
            errors.append(("memory", "total 0: unified memory"))
            total = reserved = used = free = None
        mig: tuple[MigSample, ...] = ()
        if info.mig_enabled:
            mig, processes = self.read_mig(index, handle, errors)
        else:
            processes = self.read_processes(index, handle, errors)
        reliable, processes = self.checked_processes(processes, total, errors)
        if not info.mig_enabled:  # NVML keeps no per-process samples on MIG devices
            processes = self.health.with_process_utilization(index, handle, processes, errors)
        health = self.health.read_gpu(index, handle, errors, utilization)
        return GpuSample(
            index=index,
            name=info.name,
            uuid=info.uuid,
            state=GpuState.OK,
            total_bytes=total,
            reserved_bytes=reserved,
            used_bytes=used,
            free_bytes=free,
            utilization_gpu=None if utilization is None else float(utilization.gpu),
            utilization_memory=None if utilization is None else float(utilization.memory),
            power_limit_w=info.power_limit_w,
            processes=processes,
            mig=mig,
            errors=tuple(errors),
            unified_memory=unified,
            processes_reliable=reliable,
            **sensors,
            **health,
        )

    def read_sensors(self, handle: Any, errors: list[tuple[str, str]]) -> dict[str, Any]:
        """Temperature, power and clocks: the :class:`GpuSample` fields by name."""
        temperature = self.call(
            errors,
            "temperature",
            "nvmlDeviceGetTemperature",
            handle,
            getattr(self.nvml, "NVML_TEMPERATURE_GPU", 0),
        )
        power_mw = self.call(errors, "power", "nvmlDeviceGetPowerUsage", handle)
        sm_clock = self.call(
            errors,
            "sm_clock",
            "nvmlDeviceGetClockInfo",
            handle,
            getattr(self.nvml, "NVML_CLOCK_SM", 1),
        )
        memory_clock = self.call(
            errors,
            "memory_clock",
            "nvmlDeviceGetClockInfo",
            handle,
            getattr(self.nvml, "NVML_CLOCK_MEM", 2),
        )
        return {
            "temperature_c": None if temperature is None else float(temperature),
            "power_w": None if power_mw is None else power_mw / 1000,
            "sm_clock_mhz": None if sm_clock is None else int(sm_clock),
            "memory_clock_mhz": None if memory_clock is None else int(memory_clock),
        }

    def checked_processes(
        self,
        processes: tuple[ProcessSample, ...],
        total_bytes: int | None,
        errors: list[tuple[str, str]],
    ) -> tuple[bool, tuple[ProcessSample, ...]]:
        """(reliable, rows): the rows, or none when they cannot be trusted (see the module doc)."""
        if self.bindings_problem is not None:
            if processes:
                errors.append(("processes", f"unreliable: {self.bindings_problem}"))
            return False, ()
        for process in processes:
            problem = None
            if process.pid in (0, _NVML_PID_INVALID) or process.pid > PID_MAX_LIMIT:
                problem = f"impossible PID {process.pid}"
            elif (
                process.used_bytes is not None
                and total_bytes is not None
                and process.used_bytes > total_bytes
            ):
                problem = f"PID {process.pid} uses more memory than the GPU has"
            if problem is not None:
                errors.append(
                    (
                        "processes",
                        f"unreliable: {problem} (NVML's process list read wrongly: check the "
                        "nvidia-ml-py and driver versions)",
                    )
                )
                return False, ()
        return True, processes

    def read_memory(
        self, handle: Any, errors: list[tuple[str, str]], label: str
    ) -> tuple[int | None, int | None, int | None, int | None]:
        """(total, reserved, used, free) in bytes: memory info v2, else v1 (reserved None)."""
        version = getattr(self.nvml, "nvmlMemory_v2", None)
        if self.memory_v2 is not False and version is not None:
            try:
                info = self.nvml.nvmlDeviceGetMemoryInfo(handle, version=version)
            except self.lost_error as exc:
                raise _GpuLost(self.reason(exc)) from exc
            except (
                self.function_not_found_error,
                self.version_mismatch_error,
                self.mismatch_error,
                TypeError,
            ):
                self.memory_v2 = False  # the driver (or old bindings) lack v2: use v1 from now on
            except self.base_error as exc:
                errors.append((f"{label}_v2", self.reason(exc)))
            else:
                self.memory_v2 = True
                return int(info.total), int(info.reserved), int(info.used), int(info.free)
        info = self.call(errors, label, "nvmlDeviceGetMemoryInfo", handle)
        if info is None:
            return None, None, None, None
        errors.append((f"{label}_reserved", "unknown: driver has memory info v1 only"))
        # v1 "used" includes the driver's reserved memory.
        return int(info.total), None, int(info.used), int(info.free)

    def running_processes(self, handle: Any, kind: str, errors: list[tuple[str, str]]) -> list[Any]:
        """Running processes of one kind, trying the v3 call, then ``_v2`` and ``_v1``."""
        label = "Compute" if kind == "compute" else "Graphics"
        base = f"nvmlDeviceGet{label}RunningProcesses"
        error_label = f"{kind}_processes"
        variants: tuple[str, ...] = ("", "_v3", "_v2", "_v1")
        if kind in self.process_variant:
            chosen = self.process_variant[kind]
            if chosen is None:
                errors.append((error_label, "not in this driver"))
                return []
            variants = (chosen,)
        for suffix in variants:
            function = getattr(self.nvml, base + suffix, None)
            if function is None:
                continue
            try:
                result = list(function(handle))
            except self.lost_error as exc:
                raise _GpuLost(self.reason(exc)) from exc
            except (self.mismatch_error, self.function_not_found_error):
                continue  # this struct version is not in the driver: try the next one
            except self.base_error as exc:
                errors.append((error_label, self.reason(exc)))
                return []
            self.process_variant[kind] = suffix
            return result
        self.process_variant[kind] = None
        errors.append((error_label, "not in this driver"))
        return []

    def process_name(self, pid: int) -> str | None:
        if pid not in self.process_names:
            ignored: list[tuple[str, str]] = []
            name = self.call(ignored, "process_name", "nvmlSystemGetProcessName", pid)
            self.process_names[pid] = None if name is None else _text(name)
        return self.process_names[pid]

    def read_processes(
        self,
        index: int,
        handle: Any,
        errors: list[tuple[str, str]],
        mig: MigSample | None = None,
    ) -> tuple[ProcessSample, ...]:
        """Compute and graphics processes on one device (a GPU, or one MIG device), one row per PID.

        A PID in both lists is one ``compute+graphics`` row; NVML reports the process's memory on the
        device in each list, so the larger of the two is kept, not their sum.
        """
        rows: dict[int, ProcessSample] = {}
        kinds: tuple[Literal["compute", "graphics"], ...] = ("compute", "graphics")
        for kind in kinds:
            for entry in self.running_processes(handle, kind, errors):
                used = getattr(entry, "usedGpuMemory", None)
                if used is not None and int(used) >= _NVML_VALUE_NOT_AVAILABLE:
                    used = None
                pid = int(entry.pid)
                self._seen_pids.add(pid)
                used_bytes = None if used is None else int(used)
                earlier = rows.get(pid)
                if earlier is not None:
                    known = [v for v in (earlier.used_bytes, used_bytes) if v is not None]
                    rows[pid] = dataclasses.replace(
                        earlier,
                        kind="compute+graphics" if earlier.kind != kind else kind,
                        used_bytes=max(known) if known else None,
                    )
                    continue
                rows[pid] = ProcessSample(
                    pid=pid,
                    gpu_index=index,
                    kind=kind,
                    used_bytes=used_bytes,
                    name=self.process_name(pid),
                    mig_index=None if mig is None else mig.index,
                    gpu_instance_id=None if mig is None else mig.gpu_instance_id,
                    compute_instance_id=None if mig is None else mig.compute_instance_id,
                )
        return tuple(rows.values())

    def read_mig(
        self, index: int, handle: Any, errors: list[tuple[str, str]]
    ) -> tuple[tuple[MigSample, ...], tuple[ProcessSample, ...]]:
        """The MIG instances in every slot (slots may be sparse) and the processes on each."""
        count = self.call(errors, "mig", "nvmlDeviceGetMaxMigDeviceCount", handle)
        if not count:
            return (), ()
        samples: list[MigSample] = []
        processes: list[ProcessSample] = []
        for mig_index in range(int(count)):
            try:
                mig_handle = self.nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, mig_index)
            except self.not_found_error:
                continue  # no instance in this slot
            except self.lost_error as exc:
                raise _GpuLost(self.reason(exc)) from exc
            except Exception as exc:
                errors.append((f"mig{mig_index}", self.reason(exc)))
                continue
            label = f"mig{mig_index}"
            name = self.call(errors, f"{label}.name", "nvmlDeviceGetName", mig_handle)
            uuid = self.call(errors, f"{label}.uuid", "nvmlDeviceGetUUID", mig_handle)
            gi = self.call(
                errors, f"{label}.gpu_instance", "nvmlDeviceGetGpuInstanceId", mig_handle
            )
            ci = self.call(
                errors, f"{label}.compute_instance", "nvmlDeviceGetComputeInstanceId", mig_handle
            )
            total, _reserved, used, free = self.read_memory(mig_handle, errors, f"{label}.memory")
            sample = MigSample(
                index=mig_index,
                name=None if name is None else _text(name),
                uuid=None if uuid is None else _text(uuid),
                total_bytes=total,
                used_bytes=used,
                free_bytes=free,
                gpu_instance_id=None if gi is None else int(gi),
                compute_instance_id=None if ci is None else int(ci),
            )
            samples.append(sample)
            processes.extend(self.read_processes(index, mig_handle, errors, sample))
        return tuple(samples), tuple(processes)


class NvmlSampler:
    """GPU snapshots from NVML (real or fake), read in one long-lived worker thread.

    ``sample()`` returns a :class:`Snapshot` with GPUs only (``host`` is None); see
    :class:`hwdash.telemetry.system_sampler.SystemSampler` for the host join.
    """

    def __init__(
        self,
        nvml: Any,
        *,
        round_timeout_s: float = 2.0,
        wall_clock: Callable[[], float] = time.time,
        bindings_version: str | None = None,
    ) -> None:
        if round_timeout_s <= 0:
            raise ValueError("round_timeout_s must be positive")
        self.round_timeout_s = round_timeout_s
        self._wall_clock = wall_clock
        self._reader = _NvmlReader(nvml, bindings_version)
        self._reader.health.events.wall_clock = wall_clock  # Xid events on the snapshots' clock
        self._requests: queue.Queue[_Round | None] = queue.Queue()
        self._worker: threading.Thread | None = None
        self._pending: _Round | None = None
        self._last: _RoundResult | None = None
        self._closed = False
        self._lock = threading.Lock()

    @property
    def worker_thread(self) -> threading.Thread | None:
        """The one NVML thread (None before the first sample)."""
        return self._worker

    def _run_worker(self) -> None:
        while True:
            request = self._requests.get()
            if request is None:
                self._reader.shutdown()
                return
            try:
                request.result = self._reader.read_round()
            except Exception as exc:  # a bug or a very odd binding: report it, keep the thread
                log.exception("NVML round failed")
                status = self._reader.status or NvmlStatus(available=False)
                request.result = _RoundResult(status, errors=(f"NVML round failed: {exc!r}",))
            request.done.set()

    def _stale(self, timestamp: float, started: float, message: str) -> Snapshot:
        last = self._last
        if last is None:
            return Snapshot(
                timestamp=timestamp,
                nvml=NvmlStatus(available=False, error=message),
                sample_seconds=time.perf_counter() - started,
                errors=(message,),
                stale=True,
            )
        return Snapshot(
            timestamp=timestamp,
            nvml=last.status,
            gpus=last.gpus,
            sample_seconds=time.perf_counter() - started,
            errors=(message,),
            stale=True,
        )

    def sample(self) -> Snapshot:
        """One round of NVML readings; never blocks longer than ``round_timeout_s``."""
        timestamp = self._wall_clock()
        started = time.perf_counter()
        with self._lock:
            if self._closed:
                return Snapshot(
                    timestamp=timestamp, nvml=NvmlStatus(available=False, error="sampler closed")
                )
            if self._worker is None:
                self._worker = threading.Thread(
                    target=self._run_worker, name="hwdash-nvml", daemon=True
                )
                self._worker.start()
            pending = self._pending
            if pending is not None and not pending.done.is_set():
                stuck = time.monotonic() - pending.started
                return self._stale(
                    timestamp,
                    started,
                    f"NVML has not answered for {stuck:.0f} s (a driver call hangs); "
                    "showing the last values",
                )
            request = _Round()
            self._pending = request
            self._requests.put(request)
        if not request.done.wait(self.round_timeout_s):
            return self._stale(
                timestamp,
                started,
                f"NVML did not answer within {self.round_timeout_s:g} s (a driver call hangs); "
                "showing the last values",
            )
        with self._lock:
            self._pending = None
        result = request.result
        assert result is not None
        self._last = result
        return Snapshot(
            timestamp=timestamp,
            nvml=result.status,
            gpus=result.gpus,
            sample_seconds=time.perf_counter() - started,
            errors=result.errors,
        )

    def close(self, timeout_s: float = 1.0) -> None:
        """Stop the worker (it calls ``nvmlShutdown``); a worker stuck in the driver is left behind."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            worker = self._worker
        if worker is not None:
            self._requests.put(None)
            worker.join(timeout_s)
