"""The NVML sampler's health readings: per-process SM and memory-bandwidth utilization, clock-event
(throttle) reasons, the PCIe link, ECC, remapped rows, fan, P-state and the energy counter; Xid
events, GPM activity and NVLink state through :mod:`hwdash.telemetry.nvml_events`.

Called by :mod:`hwdash.telemetry.nvml_sampler` on its worker thread, through the sampler's own
call wrapper (so a lost GPU abandons the round as for every other field). Each reading is None
where the GPU or driver lacks it. A call that NVML answers with NotSupported, or that the driver or
the bindings do not have, is not recorded in ``errors`` (as MIG is not: most GPUs lack one of these,
a GeForce has no ECC, an H100 SXM has no fan, and the row would fill with ``n/a``); any other
failure (no permission, an unknown error) is, under the reading's label.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from hwdash.telemetry.nvml_events import EventReader
from hwdash.telemetry.types import PcieLink, ProcessSample, RemappedRows

CLOCKS_EVENT_REASONS: tuple[tuple[str, str], ...] = (
    ("gpu_idle", "GpuIdle"),
    ("applications_clocks_setting", "ApplicationsClocksSetting"),
    ("sw_power_cap", "SwPowerCap"),
    ("hw_slowdown", "HwSlowdown"),
    ("sync_boost", "SyncBoost"),
    ("sw_thermal_slowdown", "SwThermalSlowdown"),
    ("hw_thermal_slowdown", "HwThermalSlowdown"),
    ("hw_power_brake_slowdown", "HwPowerBrakeSlowdown"),
    ("display_clock_setting", "DisplayClockSetting"),
)
"""The names hwdash gives NVML's clock-event reason bits, and the suffix of each bit's constant in
the bindings (``nvmlClocksEventReason...``, before driver R535 ``nvmlClocksThrottleReason...``);
the bit values come from the installed nvidia-ml-py (pynvml.py), never from here."""


def reason_bits(nvml: Any) -> dict[str, int]:
    """Each reason's name -> its bit, from ``nvml``'s constants (``nvmlClocksEventReason...``, else
    the pre-R535 ``nvmlClocksThrottleReason...``); a reason the bindings lack is left out."""
    bits: dict[str, int] = {}
    for name, suffix in CLOCKS_EVENT_REASONS:
        bit = getattr(nvml, "nvmlClocksEventReason" + suffix, None)
        if not isinstance(bit, int):
            bit = getattr(nvml, "nvmlClocksThrottleReason" + suffix, None)
        if isinstance(bit, int) and bit:
            bits[name] = bit
    return bits


@functools.cache
def installed_reason_bits() -> Mapping[str, int]:
    """:func:`reason_bits` of the installed nvidia-ml-py, for the exporter's and the Prometheus
    reader's clock-event bitmask (DCGM's clock-event field carries NVML's bit values: dcgm_fields.h,
    ``DCGM_CLOCKS_EVENT_REASON_*``); empty without the bindings."""
    try:
        import pynvml
    except ImportError:
        return {}
    return reason_bits(pynvml)


_OLD_REASONS_FUNCTION = "nvmlDeviceGetCurrentClocksThrottleReasons"
"""The name before driver R535 (and nvidia-ml-py 12.535), kept by later bindings as an alias."""

_QUIET_REASONS = frozenset({"not supported", "not in this driver", "not in these NVML bindings"})
"""Reasons a health reading is None without an entry in ``errors`` (see the module docstring)."""

_PERCENT_MAX = 100
"""NVML's utilization samples are percents; a larger value is a sample NVML could not fill."""

_PSTATE_MAX = 15
"""P0..P15 (NVML's nvmlPstates_t); NVML_PSTATE_UNKNOWN (32) and anything else is unknown."""


class Reader(Protocol):
    """What this module needs of the sampler's reader (:class:`~.nvml_sampler._NvmlReader`)."""

    nvml: Any
    not_found_error: type[BaseException]

    def reason(self, exc: BaseException) -> str: ...

    def call_function(
        self,
        errors: list[tuple[str, str]],
        label: str,
        function: Callable[..., Any] | None,
        *args: Any,
    ) -> Any: ...


class HealthReader:
    """The health readings of each GPU; remembers what is read once (the link's maximum) and the
    newest process-utilization sample seen per GPU."""

    def __init__(self, reader: Reader) -> None:
        self.reader = reader
        self.nvml = reader.nvml
        self.last_sample_us: dict[int, int] = {}
        """GPU index -> the newest per-process sample's timestamp (NVML's microseconds)."""
        self.link_max: dict[int, tuple[int | None, int | None]] = {}
        self.reason_function: str | None = None
        """``nvmlDeviceGetCurrentClocksEventReasons`` or the older name, once one answered."""
        self.events = EventReader(self)
        """Xid events, GPM activity, NVLink state (:mod:`hwdash.telemetry.nvml_events`)."""

    def start_round(self) -> None:
        """Before a round's GPUs: take the Xid events NVML has for them."""
        self.events.start_round()

    def close(self) -> None:
        """Before ``nvmlShutdown``: free the event set and the GPM samples."""
        self.events.close()

    def quiet_call(self, errors: list[tuple[str, str]], label: str, name: str, *args: Any) -> Any:
        """One NVML call by name; failures other than "not supported" go to ``errors``."""
        return self._quiet(errors, label, getattr(self.nvml, name, None), *args)

    def attempt(self, errors: list[tuple[str, str]], label: str, name: str, *args: Any) -> bool:
        """:meth:`quiet_call` for a call that returns nothing: whether it succeeded."""
        scratch: list[tuple[str, str]] = []
        self.reader.call_function(scratch, label, getattr(self.nvml, name, None), *args)
        errors.extend(entry for entry in scratch if entry[1] not in _QUIET_REASONS)
        return not scratch

    def _quiet(
        self,
        errors: list[tuple[str, str]],
        label: str,
        function: Callable[..., Any] | None,
        *args: Any,
    ) -> Any:
        scratch: list[tuple[str, str]] = []
        value = self.reader.call_function(scratch, label, function, *args)
        errors.extend(entry for entry in scratch if entry[1] not in _QUIET_REASONS)
        return value

    def _constant(self, name: str, default: int) -> int:
        value = getattr(self.nvml, name, default)
        return value if isinstance(value, int) else default

    # -- per GPU -------------------------------------------------------------------------------
    def read_gpu(
        self,
        index: int,
        handle: Any,
        errors: list[tuple[str, str]],
        utilization: Any = None,
    ) -> dict[str, Any]:
        """The health fields of :class:`~hwdash.telemetry.types.GpuSample`, by name
        (``utilization``: NVML's utilization rates, the activity's fallback)."""
        busy = None if utilization is None else _number(getattr(utilization, "gpu", None))
        return {
            "xid_events": self.events.xid_events(index, handle, errors),
            "activity": self.events.activity(index, handle, errors, busy),
            "nvlink": self.events.nvlink(index, handle, errors),
            "clocks_event_reasons": self.clocks_event_reasons(handle, errors),
            "pcie": self.pcie(index, handle, errors),
            "ecc_uncorrected": self.ecc(handle, errors, "NVML_VOLATILE_ECC", 0),
            "ecc_uncorrected_aggregate": self.ecc(handle, errors, "NVML_AGGREGATE_ECC", 1),
            "remapped_rows": self.remapped_rows(handle, errors),
            "fan_percent": _number(self.quiet_call(errors, "fan", "nvmlDeviceGetFanSpeed", handle)),
            "pstate": self.pstate(handle, errors),
            "energy_mj": _count(
                self.quiet_call(errors, "energy", "nvmlDeviceGetTotalEnergyConsumption", handle)
            ),
        }

    def clocks_event_reasons(
        self, handle: Any, errors: list[tuple[str, str]]
    ) -> tuple[str, ...] | None:
        """The reasons' names, from the R535 name or, on older drivers and bindings, the old one."""
        names = (
            (self.reason_function,)
            if self.reason_function is not None
            else ("nvmlDeviceGetCurrentClocksEventReasons", _OLD_REASONS_FUNCTION)
        )
        for name in names:
            loud: list[tuple[str, str]] = []
            mask = self.quiet_call(loud, "clocks_event_reasons", name, handle)
            errors.extend(loud)
            if mask is not None:
                self.reason_function = name
                return self._reason_names(int(mask))
            if loud:  # a real failure, not a missing name: the old name would fail the same way
                return None
        return None

    def _reason_names(self, mask: int) -> tuple[str, ...]:
        return reason_names(mask, reason_bits(self.nvml))

    def pcie(self, index: int, handle: Any, errors: list[tuple[str, str]]) -> PcieLink | None:
        """The link now, its maximum (read once per GPU) and its traffic (KB/s -> bytes/s)."""
        if index not in self.link_max:
            gen_max = self.quiet_call(errors, "pcie", "nvmlDeviceGetMaxPcieLinkGeneration", handle)
            if gen_max is None:  # the GPU's own maximum, where the slot's is not readable
                gen_max = self.quiet_call(
                    errors, "pcie", "nvmlDeviceGetGpuMaxPcieLinkGeneration", handle
                )
            width_max = self.quiet_call(errors, "pcie", "nvmlDeviceGetMaxPcieLinkWidth", handle)
            self.link_max[index] = (_count(gen_max), _count(width_max))
        gen_max, width_max = self.link_max[index]
        traffic = []
        for counter, default in (("NVML_PCIE_UTIL_TX_BYTES", 0), ("NVML_PCIE_UTIL_RX_BYTES", 1)):
            kilobytes = _count(
                self.quiet_call(
                    errors,
                    "pcie_throughput",
                    "nvmlDeviceGetPcieThroughput",
                    handle,
                    self._constant(counter, default),
                )
            )
            traffic.append(None if kilobytes is None else kilobytes * 1024)
        link = PcieLink(
            gen=_count(
                self.quiet_call(errors, "pcie", "nvmlDeviceGetCurrPcieLinkGeneration", handle)
            ),
            gen_max=gen_max,
            width=_count(self.quiet_call(errors, "pcie", "nvmlDeviceGetCurrPcieLinkWidth", handle)),
            width_max=width_max,
            tx_bytes_per_s=traffic[0],
            rx_bytes_per_s=traffic[1],
        )
        return None if link == PcieLink() else link

    def ecc(
        self, handle: Any, errors: list[tuple[str, str]], counter: str, default: int
    ) -> int | None:
        """Uncorrected ECC errors, volatile (since the driver loaded) or aggregate (lifetime)."""
        return _count(
            self.quiet_call(
                errors,
                "ecc",
                "nvmlDeviceGetTotalEccErrors",
                handle,
                self._constant("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1),
                self._constant(counter, default),
            )
        )

    def remapped_rows(self, handle: Any, errors: list[tuple[str, str]]) -> RemappedRows | None:
        """(corrected, uncorrected, pending, failure) as NVML returns them."""
        rows = self.quiet_call(errors, "remapped_rows", "nvmlDeviceGetRemappedRows", handle)
        try:
            corrected, uncorrected, pending, failure = (int(value) for value in rows)
        except (TypeError, ValueError):
            return None
        return RemappedRows(corrected, uncorrected, bool(pending), bool(failure))

    def pstate(self, handle: Any, errors: list[tuple[str, str]]) -> int | None:
        state = _count(self.quiet_call(errors, "pstate", "nvmlDeviceGetPerformanceState", handle))
        return state if state is not None and state <= _PSTATE_MAX else None

    # -- per process ---------------------------------------------------------------------------
    def with_process_utilization(
        self,
        index: int,
        handle: Any,
        processes: tuple[ProcessSample, ...],
        errors: list[tuple[str, str]],
    ) -> tuple[ProcessSample, ...]:
        """The rows with ``sm_percent`` and ``memory_bandwidth_percent`` from NVML's samples since
        the newest one seen on this GPU (the newest sample per PID; a PID without one: None)."""
        if not processes:
            return processes
        function = getattr(self.nvml, "nvmlDeviceGetProcessUtilization", None)
        not_found = self.reader.not_found_error

        def samples(device: Any, since_us: int) -> list[Any]:
            try:
                return list(function(device, since_us)) if function is not None else []
            except not_found:  # no sample since then: nothing ran, or the sampler is too fast
                return []

        since = self.last_sample_us.get(index, 0)
        found = self._quiet(
            errors, "process_utilization", samples if function else None, handle, since
        )
        newest: dict[int, Any] = {}
        for sample in found or []:
            stamp = _count(getattr(sample, "timeStamp", None)) or 0
            pid = _count(getattr(sample, "pid", None))
            if pid is None:
                continue
            since = max(since, stamp)
            if pid not in newest or stamp >= (_count(newest[pid].timeStamp) or 0):
                newest[pid] = sample
        self.last_sample_us[index] = since
        return tuple(
            dataclasses.replace(
                process,
                sm_percent=_percent(getattr(newest[process.pid], "smUtil", None)),
                memory_bandwidth_percent=_percent(getattr(newest[process.pid], "memUtil", None)),
            )
            if process.pid in newest
            else process
            for process in processes
        )


def _count(value: Any) -> int | None:
    """A whole number NVML returned, or None (not a number, or NVML's "not available")."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or value >= 2**63:
        return None
    return value


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _percent(value: Any) -> float | None:
    number = _count(value)
    return None if number is None or number > _PERCENT_MAX else float(number)


def reason_names(mask: int, bits: Mapping[str, int]) -> tuple[str, ...]:
    """The names of the reasons set in ``mask``, in :data:`CLOCKS_EVENT_REASONS`' order."""
    return tuple(name for name, bit in bits.items() if mask & bit)


def reason_mask(names: tuple[str, ...], bits: Mapping[str, int]) -> int | None:
    """The bitmask of these reasons (NVML's, and DCGM's clock-event field's); None when a name has
    no bit in ``bits`` (bindings without it: a partial mask would say less than it seems to)."""
    if any(name not in bits for name in names):
        return None
    mask = 0
    for name in names:
        mask |= bits[name]
    return mask
