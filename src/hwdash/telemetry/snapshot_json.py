"""The JSON form of a snapshot (``hwdash monitor --json``): bytes as integers, unknown values as null.

Top-level keys: ``timestamp``, ``nvml`` (``available``, ``driver_version``, ``error``,
``bindings_version``, ``source``: a cluster's Prometheus server, else null), ``gpus``, ``host``,
``alerts`` (active alerts), ``events`` (alert events of this round), ``stale`` and ``errors``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from hwdash.core.live.alerts import AlertEvent
from hwdash.core.live.diagnoses import xid_catalog
from hwdash.telemetry.types import (
    GpuSample,
    HostSample,
    MigSample,
    ProcessSample,
    RunView,
    Snapshot,
    TorchSample,
)


def process_to_dict(process: ProcessSample) -> dict[str, Any]:
    """One GPU process."""
    return {
        "pid": process.pid,
        "kind": process.kind,
        "used_bytes": process.used_bytes,
        "visible": process.visible,
        "verifiable": process.verifiable,
        "exited": process.exited,
        "mig_index": process.mig_index,
        "gpu_instance_id": process.gpu_instance_id,
        "compute_instance_id": process.compute_instance_id,
        "name": process.name,
        "user": process.user,
        "cmdline": process.cmdline,
        "cpu_percent": process.cpu_percent,
        "rss_bytes": process.rss_bytes,
        "container": process.container,
        "host": process.host,
        "host_gpu": process.host_gpu,
        "torch": torch_to_dict(process.torch),
        "run": run_to_dict(process.run),
        "oom_recording": process.oom_recording,
        "oom_snapshot": process.oom_snapshot,
        "sm_percent": process.sm_percent,
        "memory_bandwidth_percent": process.memory_bandwidth_percent,
    }


RUN_KEYS = (
    "step",
    "tokens",
    "tokens_per_s",
    "mfu",
    "eta_s",
    "cost_usd",
    "cost_to_go_usd",
    "energy_kwh",
    "plan",
    "planned_peak_bytes",
    "measured_peak_bytes",
    "peak_error",
)
"""The members issue 26 fixes for ``processes[].run`` (scripts rely on them), first."""


def run_to_dict(run: RunView | None) -> dict[str, Any] | None:
    """The run against its plan (:class:`hwdash.telemetry.types.RunView`), or None."""
    if run is None:
        return None
    out: dict[str, Any] = {key: getattr(run, key) for key in RUN_KEYS}
    for extra in (
        "tokens_estimated",
        "tflops",
        "progress",
        "price_per_hour",
        "plan_error",
        "planned_total_bytes",
        "measured_nvml_peak_bytes",
        "started_at",
        "elapsed_s",
    ):
        out[extra] = getattr(run, extra)
    return out


def torch_to_dict(torch: TorchSample | None) -> dict[str, Any] | None:
    """What the process's PyTorch allocator says (:mod:`hwdash.probe`), or None without a probe."""
    if torch is None:
        return None
    return {
        "allocated_bytes": torch.allocated_bytes,
        "reserved_bytes": torch.reserved_bytes,
        "max_allocated_bytes": torch.max_allocated_bytes,
        "max_reserved_bytes": torch.max_reserved_bytes,
        "alloc_retries": torch.alloc_retries,
        "ooms": torch.ooms,
        "step": torch.step,
    }


def mig_to_dict(mig: MigSample) -> dict[str, Any]:
    """One MIG instance."""
    return {
        "index": mig.index,
        "name": mig.name,
        "uuid": mig.uuid,
        "memory_total_bytes": mig.total_bytes,
        "memory_used_bytes": mig.used_bytes,
        "memory_free_bytes": mig.free_bytes,
        "pressure": None if mig.pressure is None else round(mig.pressure, 6),
        "state": mig.state.value,
        "gpu_instance_id": mig.gpu_instance_id,
        "compute_instance_id": mig.compute_instance_id,
    }


def gpu_to_dict(gpu: GpuSample) -> dict[str, Any]:
    """One GPU."""
    pressure = gpu.pressure
    return {
        "index": gpu.index,
        "name": gpu.name,
        "uuid": gpu.uuid,
        "state": gpu.state.value,
        "memory_total_bytes": gpu.total_bytes,
        "memory_reserved_bytes": gpu.reserved_bytes,
        "memory_used_bytes": gpu.used_bytes,
        "memory_free_bytes": gpu.free_bytes,
        "memory_source": gpu.memory_source,
        "pressure": None if pressure is None else round(pressure, 6),
        "utilization_gpu": gpu.utilization_gpu,
        "utilization_memory": gpu.utilization_memory,
        "temperature_c": gpu.temperature_c,
        "power_w": gpu.power_w,
        "power_limit_w": gpu.power_limit_w,
        "sm_clock_mhz": gpu.sm_clock_mhz,
        "memory_clock_mhz": gpu.memory_clock_mhz,
        "forecast_full_s": gpu.forecast_full_s,
        "host": gpu.host,
        "host_gpu": gpu.host_gpu,
        "processes": [process_to_dict(process) for process in gpu.processes],
        "processes_reliable": gpu.processes_reliable,
        "diagnoses": [diagnosis.to_dict() for diagnosis in gpu.diagnoses],
        "mig": [mig_to_dict(mig) for mig in gpu.mig],
        "errors": {name: reason for name, reason in gpu.errors},
        **health_to_dict(gpu),
    }


def health_to_dict(gpu: GpuSample) -> dict[str, Any]:
    """The GPU's health readings (:mod:`hwdash.telemetry.nvml_health`,
    :mod:`hwdash.telemetry.nvml_events`); null where unreadable.

    ``xid_events``: ``[{xid, at, meaning}]`` (``meaning`` from ``catalog/health/xid.toml``, null for
    an unlisted number); ``activity``: ``{source, sm_active, sm_occupancy, tensor_active,
    dram_active}``; ``nvlink``: ``{links, active}``; ``clocks_event_share``: reason -> share 0..1
    of the last minute.
    """
    reasons = gpu.clocks_event_reasons
    share = gpu.clocks_event_share
    return {
        "clocks_event_reasons": None if reasons is None else list(reasons),
        "pcie": None if gpu.pcie is None else dataclasses.asdict(gpu.pcie),
        "ecc_uncorrected": gpu.ecc_uncorrected,
        "ecc_uncorrected_aggregate": gpu.ecc_uncorrected_aggregate,
        "remapped_rows": None
        if gpu.remapped_rows is None
        else dataclasses.asdict(gpu.remapped_rows),
        "fan_percent": gpu.fan_percent,
        "pstate": gpu.pstate,
        "energy_mj": gpu.energy_mj,
        "xid_events": None
        if gpu.xid_events is None
        else [_xid(e.xid, e.at) for e in gpu.xid_events],
        "activity": None if gpu.activity is None else dataclasses.asdict(gpu.activity),
        "nvlink": None if gpu.nvlink is None else dataclasses.asdict(gpu.nvlink),
        "clocks_event_share": None if share is None else dict(share),
    }


def _xid(number: int, at: float) -> dict[str, Any]:
    entry = xid_catalog().get(number)
    return {"xid": number, "at": at, "meaning": None if entry is None else entry.meaning}


def host_to_dict(host: HostSample | None) -> dict[str, Any] | None:
    """The host, or None when it was not sampled."""
    if host is None:
        return None
    return {
        "cpu_percent": host.cpu_percent,
        "per_cpu_percent": list(host.per_cpu_percent),
        "load_average": None if host.load_average is None else list(host.load_average),
        "ram_total_bytes": host.ram_total_bytes,
        "ram_used_bytes": host.ram_used_bytes,
        "ram_available_bytes": host.ram_available_bytes,
        "swap_total_bytes": host.swap_total_bytes,
        "swap_used_bytes": host.swap_used_bytes,
    }


def snapshot_to_dict(
    snapshot: Snapshot,
    active_alerts: Iterable[AlertEvent] = (),
    events: Iterable[AlertEvent] = (),
) -> dict[str, Any]:
    """The whole snapshot as one JSON-ready object."""
    return {
        "timestamp": snapshot.timestamp,
        "nvml": {
            "available": snapshot.nvml.available,
            "driver_version": snapshot.nvml.driver_version,
            "error": snapshot.nvml.error,
            "bindings_version": snapshot.nvml.bindings_version,
            "source": snapshot.nvml.source,
        },
        "gpus": [gpu_to_dict(gpu) for gpu in snapshot.gpus],
        "host": host_to_dict(snapshot.host),
        "alerts": [event.to_dict() for event in active_alerts],
        "events": [event.to_dict() for event in events],
        "stale": snapshot.stale,
        "subset": snapshot.subset,
        "errors": list(snapshot.errors),
        "sample_seconds": round(snapshot.sample_seconds, 6),
    }
