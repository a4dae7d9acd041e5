"""What a sampler returns: frozen snapshots of the GPUs and the host, and the sampler protocol.

The UI only ever sees these types, never where they came from (NVML, the fake, later Prometheus).
Bytes are integers; a value the hardware or driver could not give is ``None`` (shown as ``n/a``), and
why is recorded in ``errors``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Literal, Protocol


class GpuState(str, Enum):
    """Health of one GPU in a snapshot. ``alert`` is set by the alert rule, not by the sampler."""

    OK = "ok"
    ALERT = "alert"
    LOST = "lost"
    ERROR = "error"


@dataclass(frozen=True)
class ProcessSample:
    """One process using a GPU, joined with what the host knows about its PID."""

    pid: int
    gpu_index: int
    kind: Literal["compute", "graphics"]
    used_bytes: int | None
    """GPU memory NVML attributes to the process; None when NVML does not know (MIG, WDDM)."""
    visible: bool = True
    """False when psutil cannot see the PID (another container or PID namespace)."""
    name: str | None = None
    user: str | None = None
    cmdline: str | None = None
    cpu_percent: float | None = None
    rss_bytes: int | None = None


@dataclass(frozen=True)
class MigSample:
    """One MIG instance listed under its parent GPU."""

    index: int
    name: str | None
    uuid: str | None
    total_bytes: int | None
    used_bytes: int | None
    free_bytes: int | None


@dataclass(frozen=True)
class GpuSample:
    """One GPU at one instant."""

    index: int
    name: str | None
    uuid: str | None
    state: GpuState = GpuState.OK
    total_bytes: int | None = None
    reserved_bytes: int | None = None
    """Memory the driver reserves (memory info v2); None on drivers with v1 only."""
    used_bytes: int | None = None
    """Memory in use by processes (v2 semantics: excludes reserved)."""
    free_bytes: int | None = None
    utilization_gpu: float | None = None
    """Percent of time a kernel was running."""
    utilization_memory: float | None = None
    """Percent of time the memory bus was busy (not how full memory is)."""
    temperature_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    sm_clock_mhz: int | None = None
    memory_clock_mhz: int | None = None
    processes: tuple[ProcessSample, ...] = ()
    mig: tuple[MigSample, ...] = ()
    errors: tuple[tuple[str, str], ...] = ()
    """(field, reason) for every field that could not be read, e.g. ("power", "not supported")."""

    @property
    def pressure(self) -> float | None:
        """Memory pressure ``1 - free/total``: how much a new allocation can no longer get."""
        if self.total_bytes is None or self.free_bytes is None or self.total_bytes <= 0:
            return None
        return min(1.0, max(0.0, 1.0 - self.free_bytes / self.total_bytes))


@dataclass(frozen=True)
class HostSample:
    """The host at one instant (psutil)."""

    cpu_percent: float | None = None
    per_cpu_percent: tuple[float, ...] = ()
    load_average: tuple[float, float, float] | None = None
    ram_total_bytes: int | None = None
    ram_used_bytes: int | None = None
    ram_available_bytes: int | None = None
    swap_total_bytes: int | None = None
    swap_used_bytes: int | None = None


@dataclass(frozen=True)
class NvmlStatus:
    """Whether NVML answered, and if not, why, in words a user understands."""

    available: bool
    driver_version: str | None = None
    error: str | None = None
    """E.g. "no NVIDIA driver found: the planner still works"."""


@dataclass(frozen=True)
class Snapshot:
    """Everything one sampling round saw."""

    timestamp: float
    """``time.time()`` when the round started."""
    nvml: NvmlStatus
    gpus: tuple[GpuSample, ...] = ()
    host: HostSample | None = None
    sample_seconds: float = 0.0
    """How long the round took."""
    errors: tuple[str, ...] = field(default_factory=tuple)
    """Round-level problems (a call that timed out, a GPU that vanished)."""
    stale: bool = False
    """True when NVML did not answer in time: ``gpus`` are the last good values, ``errors`` says why."""


class Sampler(Protocol):
    """A source of snapshots. Implementations: NVML (real or fake pynvml), later Prometheus."""

    def sample(self) -> Snapshot:
        """Take one snapshot. Never raises for hardware or driver trouble: it reports it."""
        ...

    def close(self) -> None:
        """Release the source (``nvmlShutdown``)."""
        ...
