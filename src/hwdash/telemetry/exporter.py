"""What ``hwdash exporter`` serves: the last snapshot as Prometheus metrics.

Per GPU, under **dcgm-exporter's names and units** (NVIDIA's dcgm-exporter, ``default-counters.csv``
and its metrics table: framebuffer memory in MiB, utilization in percent, temperature in degrees C,
power in watts; labels ``gpu``, ``UUID``, ``modelName``, ``Hostname``), so Grafana dashboards built for
dcgm-exporter work unchanged:

``DCGM_FI_DEV_FB_USED``, ``DCGM_FI_DEV_FB_FREE``, ``DCGM_FI_DEV_FB_RESERVED``, ``DCGM_FI_DEV_GPU_UTIL``,
``DCGM_FI_DEV_GPU_TEMP``, ``DCGM_FI_DEV_POWER_USAGE``; and the health readings (:data:`_GPU_SERIES`
says each one's unit and source).

Health fields that dcgm-exporter's ``etc/default-counters.csv`` lists are served under the name it
lists them by (``DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS``...); the others under the DCGM field name
that dcgm-exporter's CSV files have long used (``DCGM_FI_DEV_CLOCK_THROTTLE_REASONS``,
``DCGM_FI_DEV_PSTATE``, ``DCGM_FI_DEV_FAN_SPEED``), which current DCGM keeps as an alias of the
renamed field (go-dcgm ``pkg/dcgm/dcgm_fields.h``: ``DCGM_FI_DEV_CLOCKS_EVENT_REASONS`` 112,
``DCGM_FI_DEV_GPU_PSTATE`` 190, ``DCGM_FI_DEV_ROW_REMAP_FAILED`` 395...). The Prometheus reader
(:mod:`hwdash.telemetry.prometheus_source`) accepts both spellings.

Plus ``hwdash_*`` series for what DCGM lacks: memory total in bytes, pressure, the alert state, the OOM
forecast, the health diagnoses, per-process memory and SM / memory-bandwidth utilization and, where a
process runs :mod:`hwdash.probe`, PyTorch's allocated and reserved bytes; and the exporter's own health
(when it last sampled, whether NVML answered).

The diagnoses (:mod:`hwdash.core.live.diagnoses`) are served three ways:
``hwdash_gpu_diagnoses`` (how many are in force), ``hwdash_gpu_diagnosis{kind=...}`` (one series per
GPU and kind, always present: 1 while a diagnosis of that kind is in force, else 0, so an alert rule is
``hwdash_gpu_diagnosis == 1`` and a graph has no gaps) and ``hwdash_gpu_diagnosis_info`` (value 1, one
per diagnosis in force, its words as labels: ``kind``, ``message``, ``hint``, ``pid``, and ``since``,
when it began in Unix seconds, fixed for the diagnosis' life so the label makes no new series), which
the cluster view reads back to show a remote host's own words.

Whoever can reach ``/metrics`` reads every series. Per-process series are labelled with the GPU, the
host and the PID only; a process's user name and command line (which may hold paths, data set names or
a token passed as an argument) are labels only when the exporter is started with ``--process-details``
(``SnapshotCollector(process_details=True)``).

A scrape never calls NVML: the sampling thread keeps the last snapshot and the collector reads it, so
a hung driver call delays nothing (the snapshot then says ``stale`` and so does
``hwdash_exporter_stale``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from hwdash.core.live.diagnoses import DIAGNOSIS_KINDS
from hwdash.core.units import MIB
from hwdash.telemetry.nvml_health import installed_reason_bits, reason_mask
from hwdash.telemetry.types import GpuSample, GpuState, ProcessSample, Snapshot, TorchSample

#: Label names of the DCGM series (dcgm-exporter's; ``Hostname`` became ``hostname`` in 2026:
#: readers accept both, this exporter writes dcgm-exporter's long-standing spelling).
DCGM_LABELS = ("gpu", "UUID", "modelName", "Hostname")
HWDASH_GPU_LABELS = ("gpu", "UUID", "modelName", "Hostname")
PROCESS_LABELS = ("gpu", "UUID", "Hostname", "pid")
PROCESS_DETAIL_LABELS = ("user", "command")
"""Added to :data:`PROCESS_LABELS` with ``--process-details`` only (off by default: privacy)."""
COMMAND_LABEL_CHARS = 200
"""A command line is cut to this many characters in its label."""


def _mib(value: int | None) -> float | None:
    return None if value is None else value / MIB


class SnapshotCollector(Collector):
    """A ``prometheus_client`` collector over the last snapshot (set by the sampling loop)."""

    def __init__(self, hostname: str, *, process_details: bool = False) -> None:
        self.hostname = hostname
        self.process_details = process_details
        """Whether process series carry the user name and command line (``--process-details``)."""
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None

    def update(self, snapshot: Snapshot) -> None:
        """The snapshot the next scrape reports."""
        with self._lock:
            self._snapshot = snapshot

    @property
    def snapshot(self) -> Snapshot | None:
        with self._lock:
            return self._snapshot

    def describe(self) -> Iterator[Any]:
        return iter(())  # families depend on what the GPUs report: collected at scrape time

    def collect(self) -> Iterator[GaugeMetricFamily]:
        snapshot = self.snapshot
        health = GaugeMetricFamily(
            "hwdash_exporter_last_sample_timestamp_seconds",
            "When the snapshot served was taken (Unix time).",
            labels=["Hostname"],
        )
        stale = GaugeMetricFamily(
            "hwdash_exporter_stale",
            "1 when NVML did not answer in time and the values are the last good ones.",
            labels=["Hostname"],
        )
        nvml = GaugeMetricFamily(
            "hwdash_nvml_available", "1 when NVML answered.", labels=["Hostname"]
        )
        if snapshot is None:
            return
        host = [self.hostname]
        health.add_metric(host, snapshot.timestamp)
        stale.add_metric(host, 1.0 if snapshot.stale else 0.0)
        nvml.add_metric(host, 1.0 if snapshot.nvml.available else 0.0)
        yield health
        yield stale
        yield nvml
        yield from self._gpu_families(snapshot.gpus)

    def _gpu_families(self, gpus: tuple[GpuSample, ...]) -> Iterator[GaugeMetricFamily]:
        """The per-GPU families (:data:`_GPU_SERIES`), then the per-process ones
        (:data:`_PROCESS_SERIES`), each with a sample for every GPU or process that has a value."""
        process_label_names = PROCESS_LABELS + (
            PROCESS_DETAIL_LABELS if self.process_details else ()
        )
        gpu_families = [
            (GaugeMetricFamily(name, documentation, labels=list(labels)), read)
            for name, documentation, labels, read in _GPU_SERIES
        ]
        labelled_families = [
            (GaugeMetricFamily(name, documentation, labels=[*HWDASH_GPU_LABELS, *extra]), read)
            for name, documentation, extra, read in _GPU_LABELLED_SERIES
        ]
        process_families = [
            (GaugeMetricFamily(name, documentation, labels=list(process_label_names)), read)
            for name, documentation, read in _PROCESS_SERIES
        ]
        for gpu in gpus:
            labels = [str(gpu.index), gpu.uuid or "", gpu.name or "", self.hostname]
            for family, read_gpu in gpu_families:
                _add_sample(family, labels, read_gpu(gpu))
            for family, read_labelled in labelled_families:
                for extra_labels, value in read_labelled(gpu):
                    family.add_metric([*labels, *extra_labels], value)
            for process in gpu.processes:
                process_labels = self._process_labels(gpu, process)
                for family, read_process in process_families:
                    _add_sample(family, process_labels, read_process(process))
        yield from (family for family, _ in gpu_families)
        yield from (family for family, _ in labelled_families)
        yield from (family for family, _ in process_families)

    def _process_labels(self, gpu: GpuSample, process: ProcessSample) -> list[str]:
        """A process series' label values: GPU, UUID, host, PID (and, with ``--process-details``,
        the user and the command line cut to :data:`COMMAND_LABEL_CHARS`)."""
        process_labels = [str(gpu.index), gpu.uuid or "", self.hostname, str(process.pid)]
        if self.process_details:
            command = (process.cmdline or process.name or "")[:COMMAND_LABEL_CHARS]
            process_labels += [process.user or "", command]
        return process_labels


def _add_sample(family: GaugeMetricFamily, labels: list[str], value: float | None) -> None:
    """One sample, where there is a value (a series a GPU does not report is absent, not 0)."""
    if value is not None:
        family.add_metric(labels, float(value))


def _torch_reading(read: Callable[[TorchSample], float]) -> Callable[[ProcessSample], float | None]:
    """A probed process's PyTorch number (None where the process runs no :mod:`hwdash.probe`)."""
    return lambda process: None if process.torch is None else read(process.torch)


def _clock_event_mask(gpu: GpuSample) -> float | None:
    """The clock-event reasons as NVML's bitmask (the bits from the installed bindings); None
    where the GPU cannot say, or a reason has no bit in these bindings."""
    if gpu.clocks_event_reasons is None:
        return None
    mask = reason_mask(gpu.clocks_event_reasons, installed_reason_bits())
    return None if mask is None else float(mask)


def _last_xid(gpu: GpuSample) -> float | None:
    """The newest Xid's number, as DCGM's XID_ERRORS field keeps it; 0 with none seen, None where
    the GPU cannot report Xid events."""
    if gpu.xid_events is None:
        return None
    return float(gpu.xid_events[-1].xid) if gpu.xid_events else 0.0


def _gpm_ratio(gpu: GpuSample, metric: str) -> float | None:
    """A GPM metric as DCGM's profiling fields give it (a ratio, 0..1); None where the numbers are
    not GPM's (NVML's plain utilization is not SM activity)."""
    activity = gpu.activity
    if activity is None or activity.source != "gpm":
        return None
    value = getattr(activity, metric)
    return None if value is None else value / 100.0


def _member(
    reading: str, member: str, convert: Callable[[Any], float | None] = lambda value: value
) -> Callable[[GpuSample], float | None]:
    """A member of one of the GPU's composite readings (``pcie.gen``, ``remapped_rows.failure``,
    ``nvlink.active``), ``convert``-ed; None where the GPU has no such reading."""

    def read(gpu: GpuSample) -> float | None:
        composite = getattr(gpu, reading)
        return None if composite is None else convert(getattr(composite, member))

    return read


def _flag(value: bool | None) -> float | None:
    return None if value is None else (1.0 if value else 0.0)


def _diagnosis_by_kind(gpu: GpuSample) -> Iterable[tuple[tuple[str, ...], float]]:
    """One sample per diagnosis kind, 1 while one of that kind is in force, else 0."""
    held = {diagnosis.kind for diagnosis in gpu.diagnoses}
    return (((kind,), 1.0 if kind in held else 0.0) for kind in DIAGNOSIS_KINDS)


def _diagnosis_info(gpu: GpuSample) -> Iterable[tuple[tuple[str, ...], float]]:
    """One sample (value 1) per diagnosis in force, its words and start as labels."""
    return (
        (
            (
                diagnosis.kind,
                diagnosis.message,
                diagnosis.hint,
                "" if diagnosis.pid is None else str(diagnosis.pid),
                f"{diagnosis.since:.3f}",
            ),
            1.0,
        )
        for diagnosis in gpu.diagnoses
    )


#: The per-GPU series in the order served: (name, help, label names, the GPU's value or None).
#: DCGM's first, in dcgm-exporter's units (MiB, %, C, W); then hwdash's. A DCGM name is the field's
#: in go-dcgm's ``pkg/dcgm/dcgm_fields.h`` (the name ``etc/default-counters.csv`` uses where it lists
#: the field; see the module docstring).
_GPU_SERIES: tuple[tuple[str, str, tuple[str, ...], Callable[[GpuSample], float | None]], ...] = (
    (
        "DCGM_FI_DEV_FB_USED",
        "Framebuffer memory used (in MiB).",
        DCGM_LABELS,
        lambda gpu: _mib(gpu.used_bytes),
    ),
    (
        "DCGM_FI_DEV_FB_FREE",
        "Framebuffer memory free (in MiB).",
        DCGM_LABELS,
        lambda gpu: _mib(gpu.free_bytes),
    ),
    (
        "DCGM_FI_DEV_FB_RESERVED",
        "Framebuffer memory reserved (in MiB).",
        DCGM_LABELS,
        lambda gpu: _mib(gpu.reserved_bytes),
    ),
    (
        "DCGM_FI_DEV_GPU_UTIL",
        "GPU utilization (in %).",
        DCGM_LABELS,
        lambda gpu: gpu.utilization_gpu,
    ),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", DCGM_LABELS, lambda gpu: gpu.temperature_c),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", DCGM_LABELS, lambda gpu: gpu.power_w),
    (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "Total energy consumption since the driver loaded (in mJ).",
        DCGM_LABELS,
        lambda gpu: gpu.energy_mj,
    ),
    (
        "DCGM_FI_DEV_PCIE_LINK_GEN",
        "PCIe link generation.",
        DCGM_LABELS,
        _member("pcie", "gen"),
    ),
    (
        "DCGM_FI_DEV_PCIE_LINK_WIDTH",
        "PCIe link width (lanes).",
        DCGM_LABELS,
        _member("pcie", "width"),
    ),
    (
        "DCGM_FI_DEV_PCIE_MAX_LINK_GEN",
        "PCIe link generation the device and system support.",
        DCGM_LABELS,
        _member("pcie", "gen_max"),
    ),
    (
        "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH",
        "PCIe link width the device and system support.",
        DCGM_LABELS,
        _member("pcie", "width_max"),
    ),
    (
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "Uncorrectable (double-bit) ECC errors since the driver loaded.",
        DCGM_LABELS,
        lambda gpu: gpu.ecc_uncorrected,
    ),
    (
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "Uncorrectable (double-bit) ECC errors over the GPU's life (persistent count).",
        DCGM_LABELS,
        lambda gpu: gpu.ecc_uncorrected_aggregate,
    ),
    (
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "Memory rows remapped after uncorrectable errors.",
        DCGM_LABELS,
        _member("remapped_rows", "uncorrected"),
    ),
    (
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "Memory rows remapped after correctable errors.",
        DCGM_LABELS,
        _member("remapped_rows", "corrected"),
    ),
    (
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "1 when a row remapping failed (no spare row left: the GPU needs service).",
        DCGM_LABELS,
        _member("remapped_rows", "failure", _flag),
    ),
    (
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
        "1 when a row remapping waits for the next GPU reset.",
        DCGM_LABELS,
        _member("remapped_rows", "pending", _flag),
    ),
    (
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        "Why the clocks are below their maximum: NVML's clock-event reasons bitmask "
        "(1 GPU idle, 4 SW power cap, 8 HW slowdown, 128 HW power brake...).",
        DCGM_LABELS,
        _clock_event_mask,
    ),
    (
        "DCGM_FI_DEV_PSTATE",
        "Performance state (0 = P0, the fastest).",
        DCGM_LABELS,
        lambda gpu: gpu.pstate,
    ),
    (
        "DCGM_FI_DEV_FAN_SPEED",
        "Fan speed (in % of its maximum).",
        DCGM_LABELS,
        lambda gpu: gpu.fan_percent,
    ),
    (
        "DCGM_FI_DEV_XID_ERRORS",
        "Value of the last Xid error the GPU raised (0: none since the monitor started).",
        DCGM_LABELS,
        _last_xid,
    ),
    (
        "DCGM_FI_PROF_SM_ACTIVE",
        "Ratio of time at least one warp was resident on an SM, averaged over the SMs (GPM).",
        DCGM_LABELS,
        lambda gpu: _gpm_ratio(gpu, "sm_active"),
    ),
    (
        "DCGM_FI_PROF_SM_OCCUPANCY",
        "Ratio of warps resident on an SM to the most it can hold, averaged over the SMs (GPM).",
        DCGM_LABELS,
        lambda gpu: _gpm_ratio(gpu, "sm_occupancy"),
    ),
    (
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "Ratio of cycles any tensor pipe was active (GPM).",
        DCGM_LABELS,
        lambda gpu: _gpm_ratio(gpu, "tensor_active"),
    ),
    (
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "Ratio of cycles the device memory interface was sending or receiving data (GPM).",
        DCGM_LABELS,
        lambda gpu: _gpm_ratio(gpu, "dram_active"),
    ),
    (
        "hwdash_gpu_nvlinks",
        "NVLinks the GPU has (nvmlDeviceGetNvLinkState answers for them).",
        HWDASH_GPU_LABELS,
        _member("nvlink", "links"),
    ),
    (
        "hwdash_gpu_nvlinks_active",
        "NVLinks of the GPU that are up.",
        HWDASH_GPU_LABELS,
        _member("nvlink", "active"),
    ),
    (
        "hwdash_gpu_memory_total_bytes",
        "Memory of the GPU as NVML reports it.",
        HWDASH_GPU_LABELS,
        lambda gpu: gpu.total_bytes,
    ),
    (
        "hwdash_gpu_memory_pressure",
        "1 - free/total: how much a new allocation can no longer get (0..1).",
        HWDASH_GPU_LABELS,
        lambda gpu: gpu.pressure,
    ),
    (
        "hwdash_gpu_alert",
        "1 while hwdash's alert rule holds an alert for the GPU (memory, blind or lost).",
        HWDASH_GPU_LABELS,
        lambda gpu: 1.0 if gpu.state is not GpuState.OK else 0.0,
    ),
    (
        "hwdash_gpu_lost",
        "1 when the GPU stopped answering.",
        HWDASH_GPU_LABELS,
        lambda gpu: 1.0 if gpu.state is GpuState.LOST else 0.0,
    ),
    (
        "hwdash_gpu_diagnoses",
        "Health diagnoses in force on the GPU (throttled, xid, ecc, link, idle-holding, "
        "stray-context, input-bound); the dashboard and the alert log say which.",
        HWDASH_GPU_LABELS,
        lambda gpu: float(len(gpu.diagnoses)),
    ),
    (
        "hwdash_gpu_forecast_full_seconds",
        "Seconds until memory is full at its current climb (absent: no such trend).",
        HWDASH_GPU_LABELS,
        lambda gpu: gpu.forecast_full_s,
    ),
)

#: Per-GPU series with labels of their own after :data:`HWDASH_GPU_LABELS`: (name, help, the extra
#: label names, the GPU's samples as (extra label values, value)).
_GPU_LABELLED_SERIES: tuple[
    tuple[
        str, str, tuple[str, ...], Callable[[GpuSample], Iterable[tuple[tuple[str, ...], float]]]
    ],
    ...,
] = (
    (
        "hwdash_gpu_diagnosis",
        "1 while a health diagnosis of this kind is in force on the GPU, else 0 (one series per "
        "kind, always present).",
        ("kind",),
        _diagnosis_by_kind,
    ),
    (
        "hwdash_gpu_diagnosis_info",
        "One series (value 1) per diagnosis in force: its kind, message, hint, the process it is "
        "about (pid) and when it began (since, Unix seconds).",
        ("kind", "message", "hint", "pid", "since"),
        _diagnosis_info,
    ),
)

#: The per-process series in the order served: (name, help, the process's value or None); their
#: label names are :data:`PROCESS_LABELS` (plus :data:`PROCESS_DETAIL_LABELS` where asked for).
_PROCESS_SERIES: tuple[tuple[str, str, Callable[[ProcessSample], float | None]], ...] = (
    (
        "hwdash_process_memory_used_bytes",
        "GPU memory NVML charges a process.",
        lambda process: process.used_bytes,
    ),
    (
        "hwdash_process_sm_percent",
        "Share of time the process's kernels ran on the SMs (in %; NVML's per-process "
        "utilization, nvitop's %SM).",
        lambda process: process.sm_percent,
    ),
    (
        "hwdash_process_memory_bandwidth_percent",
        "Share of time the process read or wrote device memory (in %; nvitop's %GMBW).",
        lambda process: process.memory_bandwidth_percent,
    ),
    (
        "hwdash_process_torch_allocated_bytes",
        "PyTorch memory_allocated of a process running hwdash.probe.",
        _torch_reading(lambda torch: torch.allocated_bytes),
    ),
    (
        "hwdash_process_torch_reserved_bytes",
        "PyTorch memory_reserved (the caching allocator's pool) of a probed process.",
        _torch_reading(lambda torch: torch.reserved_bytes),
    ),
    (
        "hwdash_process_torch_alloc_retries",
        "PyTorch num_alloc_retries of a probed process (rising: an OOM is near).",
        _torch_reading(lambda torch: torch.alloc_retries),
    ),
)
