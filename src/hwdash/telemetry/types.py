"""What a sampler returns: frozen snapshots of the GPUs and the host, and the sampler protocol.

The UI only ever sees these types, never where they came from (NVML, the fake, later Prometheus).
Bytes are integers; a value the hardware or driver could not give is ``None`` (shown as ``n/a``), and
why is recorded in ``errors``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Literal, Protocol

from hwdash.core.live.diagnoses import Diagnosis, DiagnosisEvent


class GpuState(str, Enum):
    """Health of one GPU in a snapshot. ``alert`` and ``blind`` are set by the alert rule, not by
    the sampler."""

    OK = "ok"
    ALERT = "alert"
    BLIND = "blind"
    """No fresh memory reading for longer than the rule allows (a hung driver, unreadable memory)."""
    LOST = "lost"
    ERROR = "error"


ProcessKind = Literal["compute", "graphics", "compute+graphics"]
"""Which NVML process list a process was found in; both lists: ``compute+graphics`` (``C+G``)."""


RETRIES_WARN_S = 60.0
"""How long after the allocator last retried an allocation a process is still flagged."""


@dataclass(frozen=True)
class TorchSample:
    """The allocator's numbers for one process on one GPU, as the monitor shows them."""

    allocated_bytes: int
    reserved_bytes: int
    max_allocated_bytes: int | None
    """The allocator's peak since the process started (or its last reset); None where the source
    does not carry it (a cluster read back from Prometheus)."""
    max_reserved_bytes: int | None
    alloc_retries: int
    ooms: int
    step: int | None
    inactive_split_bytes: int = 0
    retries_rising: bool = False
    """The retry count went up within the last :data:`RETRIES_WARN_S` seconds: the allocator had to
    free its cache to satisfy an allocation (it is thrashing; an out-of-memory error is near)."""

    @property
    def cache_bytes(self) -> int:
        """Reserved but not allocated: the allocator's cache (free for this process only)."""
        return max(0, self.reserved_bytes - self.allocated_bytes)

    @property
    def fragmentation(self) -> float | None:
        """Share of the reserved pool in inactive split blocks (free pieces of larger blocks that a
        larger tensor cannot use); None with nothing reserved."""
        if self.reserved_bytes <= 0:
            return None
        return min(1.0, self.inactive_split_bytes / self.reserved_bytes)


@dataclass(frozen=True)
class RunProgress:
    """How far a probed training run has got, as its probe publishes it (the file's ``run``
    object, :mod:`hwdash.probe`): counts since the probe started, the speed over the last minute."""

    started_at: float
    """When the probe started (seconds since the epoch)."""
    at: float | None = None
    """When the probe wrote this (the file's ``written_at``, the same clock as ``started_at``)."""
    command: str | None = None
    plan: str | None = None
    """The plan the run names (a saved plan's name or a plan file's path); None: none named."""
    step: int | None = None
    tokens: int | None = None
    """Tokens seen so far (the whole job's, as the Trainer counts them); None: never given."""
    samples: int | None = None
    sequences: int | None = None
    tokens_estimated: bool = False
    """True when a callback computed ``tokens`` as batch x sequence x accumulation x world size."""
    tokens_per_s: float | None = None
    """Over the last minute of steps, slow steps (a checkpoint save) left out (the probe's rule)."""
    step_time_s: float | None = None
    first_step_at: float | None = None
    last_step_at: float | None = None
    max_steps: int | None = None
    total_tokens: int | None = None
    energy_j: float | None = None
    """The run's GPUs' energy since the probe first saw them (NVML's total energy counter)."""
    world_size: int | None = None
    """Processes of the job (each on its own GPU); None: this process alone."""


@dataclass(frozen=True)
class RunView:
    """A probed run held against its plan: the ``run`` object of ``monitor --json``'s processes.
    None members where unknown (no plan, no price, no token counts)."""

    step: int | None = None
    tokens: int | None = None
    tokens_per_s: float | None = None
    tokens_estimated: bool = False
    tflops: float | None = None
    """Model TFLOPS achieved by the whole job (tokens/s x the plan's FLOPs per token)."""
    mfu: float | None = None
    """``tflops`` over the job's GPUs' peak (the accelerator catalog), 0..1."""
    eta_s: float | None = None
    progress: float | None = None
    """Share of the run done, 0..1 (tokens of the total, or steps of max_steps)."""
    cost_usd: float | None = None
    cost_to_go_usd: float | None = None
    price_per_hour: float | None = None
    energy_kwh: float | None = None
    plan: str | None = None
    plan_error: str | None = None
    """Why the named plan could not be read; None when it was (or none is named)."""
    planned_peak_bytes: int | None = None
    """The plan's per-GPU peak as the allocator reserves it (its total less the CUDA context)."""
    measured_peak_bytes: int | None = None
    """The allocator's reserved peak on this GPU (``max_memory_reserved``)."""
    peak_error: float | None = None
    """measured / planned - 1 (+0.04: the run needed 4% more than the plan said)."""
    planned_total_bytes: int | None = None
    """The plan's whole-GPU total (what NVML should show)."""
    measured_nvml_peak_bytes: int | None = None
    """The largest NVML reading of the process on this GPU since the monitor saw it."""
    started_at: float | None = None
    elapsed_s: float | None = None


@dataclass(frozen=True)
class ProcessSample:
    """One process using a GPU, joined with what the host knows about its PID."""

    pid: int
    gpu_index: int
    kind: ProcessKind
    used_bytes: int | None
    """GPU memory NVML attributes to the process; None when NVML does not know (MIG, WDDM)."""
    visible: bool = True
    """False when psutil cannot see the PID (another container or PID namespace, or it exited)."""
    exited: bool = False
    """The PID is gone from this monitor's ``/proc`` (or is a zombie) while NVML still lists it
    with its memory: the process exited and the driver has not released its memory yet."""
    verifiable: bool = True
    """False when this monitor runs in a PID namespace other than the host's: NVML reports host
    PIDs, so a local process with the same number is unrelated and is not joined."""
    mig_index: int | None = None
    """The MIG device (slot under its parent GPU) the process runs on; None without MIG."""
    gpu_instance_id: int | None = None
    """MIG GPU instance id (``nvidia-smi``'s GI); None without MIG."""
    compute_instance_id: int | None = None
    """MIG compute instance id (``nvidia-smi``'s CI); None without MIG."""
    name: str | None = None
    user: str | None = None
    cmdline: str | None = None
    cpu_percent: float | None = None
    rss_bytes: int | None = None
    torch: TorchSample | None = None
    """What the process's own PyTorch allocator says (:mod:`hwdash.probe`); None without a probe."""
    progress: RunProgress | None = None
    """How far the process's training run has got, when its probe says (:mod:`hwdash.probe`)."""
    run: RunView | None = None
    """The run against its plan (set by :class:`hwdash.runs.watch.RunWatcher`); None without one."""
    oom_recording: bool = False
    """The probe records the allocator's history for an out-of-memory snapshot (``record_oom``)."""
    oom_snapshot: str | None = None
    """The newest allocator snapshot the probe dumped (read it with ``hwdash oom PATH``); None: none."""
    container: str | None = None
    """The container the process runs in (``docker:3f2a1b9c0d4e``), from its cgroup; None on the host
    or when unknown."""
    host: str | None = None
    """The machine the process runs on when it is another one (a cluster read from Prometheus): its
    PID means nothing here; None for this machine."""
    host_gpu: int | None = None
    """The GPU's number on ``host`` (``node-c:1``); None for this machine."""
    started_at: float | None = None
    """When the process started (psutil's ``create_time``, seconds since the epoch), read when the
    row was sampled; a signal is sent only while the PID's process still has this start time.
    None when unknown (another machine's process, a fake scenario, a replay)."""
    sm_percent: float | None = None
    """Share of time the process's kernels ran on the SMs, percent (NVML's per-process
    utilization samples, ``nvmlDeviceGetProcessUtilization``'s ``smUtil``; nvitop's ``%SM``);
    None when NVML has no sample for it since the last round, or cannot say (MIG, old GPUs)."""
    memory_bandwidth_percent: float | None = None
    """Share of time the process read or wrote device memory, percent (``memUtil``; nvitop's
    ``%GMBW``); None as for ``sm_percent``."""


@dataclass(frozen=True)
class MigSample:
    """One MIG instance listed under its parent GPU."""

    index: int
    """The MIG device slot under its parent (slots may be sparse: 0, 2, 5)."""
    name: str | None
    uuid: str | None
    total_bytes: int | None
    used_bytes: int | None
    free_bytes: int | None
    gpu_instance_id: int | None = None
    """NVML's GPU instance id (GI)."""
    compute_instance_id: int | None = None
    """NVML's compute instance id (CI)."""
    state: GpuState = GpuState.OK
    """``alert`` when the alert rule holds an alert for this instance."""

    @property
    def pressure(self) -> float | None:
        """Memory pressure of the instance (``1 - free/total``); alerts are evaluated per instance."""
        return _pressure(self.total_bytes, self.free_bytes)


@dataclass(frozen=True)
class PcieLink:
    """A GPU's PCIe link now and at its best, and its traffic (:mod:`hwdash.telemetry.nvml_health`).
    Each member is None where NVML cannot read it; a link below its maximum is ``gen < gen_max``
    or ``width < width_max`` (links drop to a lower generation when idle, to save power)."""

    gen: int | None = None
    gen_max: int | None = None
    """The most this GPU and its slot can do (``nvmlDeviceGetMaxPcieLinkGeneration``)."""
    width: int | None = None
    """Lanes in use now (x16: 16)."""
    width_max: int | None = None
    tx_bytes_per_s: int | None = None
    """Bytes per second the GPU sent over the link (``nvmlDeviceGetPcieThroughput``, a 20 ms
    sample)."""
    rx_bytes_per_s: int | None = None


@dataclass(frozen=True)
class RemappedRows:
    """Memory rows the GPU replaced with spares (``nvmlDeviceGetRemappedRows``; A100 and later)."""

    corrected: int
    """Rows remapped after correctable errors."""
    uncorrected: int
    """Rows remapped after uncorrectable errors."""
    pending: bool
    """A remapping waits for the next GPU reset."""
    failure: bool
    """A remapping failed (no spare row left): the GPU needs service."""


@dataclass(frozen=True)
class XidEvent:
    """One Xid critical-error event NVML delivered for a GPU (``nvmlEventTypeXidCriticalError``;
    :mod:`hwdash.telemetry.nvml_events`)."""

    xid: int
    """The Xid number (the event's ``eventData``); its meaning: ``catalog/health/xid.toml``."""
    at: float
    """When the monitor received it (seconds since the epoch, the snapshot's clock)."""


@dataclass(frozen=True)
class GpuActivity:
    """How busy the GPU really is (:mod:`hwdash.telemetry.nvml_events`), percents 0..100 or None.

    ``source`` says where the numbers come from: ``gpm`` (GPU Performance Monitoring, Hopper and
    later: ``nvmlGpmMetricsGet`` between two samples) or ``utilization`` (NVML's plain
    ``utilization.gpu``, the share of time *any* kernel ran, however few SMs it used: then only
    ``sm_active`` is set, to that number, and the label must say it is not SM activity)."""

    source: Literal["gpm", "utilization"]
    sm_active: float | None = None
    """GPM: the share of SMs busy (NVML_GPM_METRIC_SM_UTIL); else NVML's utilization.gpu."""
    sm_occupancy: float | None = None
    """Warps resident over the SMs' maximum (NVML_GPM_METRIC_SM_OCCUPANCY)."""
    tensor_active: float | None = None
    """Share of time the SMs ran any tensor-core instruction (NVML_GPM_METRIC_ANY_TENSOR_UTIL)."""
    dram_active: float | None = None
    """DRAM bandwidth used over its maximum (NVML_GPM_METRIC_DRAM_BW_UTIL)."""


@dataclass(frozen=True)
class NvLinkState:
    """A GPU's NVLinks: how many it has and how many are up (``nvmlDeviceGetNvLinkState``)."""

    links: int
    active: int


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
    memory_source: Literal["device", "host"] = "device"
    """``host`` on unified-memory parts (GH200, GB10) whose NVML memory query is not supported or
    reports a total of 0: the memory numbers are then the host's RAM, which the GPU shares."""
    unified_memory: bool = False
    """NVML gave no memory of its own for this GPU (not supported, or total 0): a unified-memory
    part; the system sampler fills the memory numbers from the host."""
    forecast_full_s: float | None = None
    """Seconds until the GPU's memory is full at its current climb (:mod:`hwdash.core.live.forecast`),
    set from the history by whoever keeps one (the dashboard, the streaming monitor); None when
    memory is flat, falling or noisy, or there is no history."""
    host: str | None = None
    """The machine the GPU is in, when the snapshot covers several (a Prometheus source); None for
    this machine's own GPUs. ``index`` is then a place in the cluster, ``host_gpu`` the GPU's
    number on its host."""
    host_gpu: int | None = None
    """The GPU's index on its own host (a Prometheus source); None for this machine's GPUs."""
    processes_reliable: bool = True
    """False when NVML's process rows failed the sanity check (PID 0 or 0xFFFFFFFF, more memory
    than the GPU has): the rows are dropped and the reason is in ``errors``."""
    diagnoses: tuple[Diagnosis, ...] = ()
    """What the health rules say of this GPU now (:mod:`hwdash.core.live.diagnoses`): throttled,
    an Xid, ECC, a slow link, an idle holder, a stray context, an input-bound process."""
    clocks_event_reasons: tuple[str, ...] | None = None
    """Why the clocks are below their maximum now, by name (``sw_power_cap``, ``hw_slowdown``,
    ``gpu_idle``..., :data:`hwdash.telemetry.nvml_health.CLOCKS_EVENT_REASONS`); () when none; None
    when NVML cannot say."""
    pcie: PcieLink | None = None
    """The PCIe link; None when no part of it could be read."""
    ecc_uncorrected: int | None = None
    """Uncorrected ECC errors since the driver loaded (NVML's volatile count); None without ECC."""
    ecc_uncorrected_aggregate: int | None = None
    """Uncorrected ECC errors over the GPU's life (NVML's aggregate count)."""
    remapped_rows: RemappedRows | None = None
    """Row remapping; None on GPUs without it (before Ampere, consumer cards)."""
    fan_percent: float | None = None
    """Fan speed as a percent of its maximum; None on passively cooled GPUs."""
    pstate: int | None = None
    """Performance state, 0 (P0, the fastest) to 15; None when unknown."""
    energy_mj: int | None = None
    """NVML's energy counter (millijoules since the driver loaded; Volta and later)."""
    xid_events: tuple[XidEvent, ...] | None = None
    """The Xid critical errors seen since the monitor started, oldest first (the newest
    :data:`hwdash.telemetry.nvml_events.XID_EVENTS_KEPT` kept); None when the GPU cannot report
    them (it refused the event registration, or NVML has no event sets)."""
    activity: GpuActivity | None = None
    """SM activity from GPM, or the plain utilization labelled as such; None when neither is read."""
    nvlink: NvLinkState | None = None
    """The NVLinks; None on a GPU without them (PCIe only) or when NVML cannot say."""
    clocks_event_share: dict[str, float] | None = None
    """Each clock-event reason's share (0..1) of the last minute, by name (the window and rule of
    the ``throttled`` diagnosis, :meth:`hwdash.core.live.diagnoses.DiagnosisEngine.clocks_event_share`);
    None when the reasons cannot be read or no one keeps the window (a bare NVML sampler)."""

    @property
    def pressure(self) -> float | None:
        """Memory pressure ``1 - free/total``: how much a new allocation can no longer get."""
        return _pressure(self.total_bytes, self.free_bytes)

    @property
    def host_stale(self) -> str | None:
        """Why a cluster GPU's readings are old (its host stopped reporting); None when fresh."""
        return next((why for field, why in self.errors if field == "host"), None)


def _pressure(total: int | None, free: int | None) -> float | None:
    if total is None or free is None or total <= 0:
        return None
    return min(1.0, max(0.0, 1.0 - free / total))


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
    bindings_version: str | None = None
    """The installed nvidia-ml-py (None for the fake NVML or when unknown)."""
    source: str | None = None
    """Where the readings come from when it is not this machine's driver, in words
    (``Prometheus http://prom:9090``); None for NVML (real or fake)."""


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
    diagnosis_events: tuple[DiagnosisEvent, ...] = ()
    """The health rules' raised and cleared diagnoses of this round (the alert log and
    ``--on-alert`` get them through :class:`hwdash.core.live.alerts.AlertEngine`)."""
    subset: str | None = None
    """Set when only some GPUs are shown (``2 of 8 GPUs (--gpus 0,2)``); None: all of them."""


class Sampler(Protocol):
    """A source of snapshots. Implementations: NVML (real or fake pynvml), later Prometheus."""

    def sample(self) -> Snapshot:
        """Take one snapshot. Never raises for hardware or driver trouble: it reports it."""
        ...

    def close(self) -> None:
        """Release the source (``nvmlShutdown``)."""
        ...
