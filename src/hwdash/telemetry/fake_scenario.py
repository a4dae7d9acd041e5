"""The fake NVML's scenarios: the TOML schema (GPUs, processes, MIG devices, PyTorch probes), its
loading with messages that name the file and the field, and the series a value follows over
scenario time. The file format is described in :mod:`hwdash.telemetry.fake_nvml`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from hwdash.telemetry.scenario_data import (
    COMPILED_FORMAT,
    MODEL_KEY,
    SCENARIO_DIR,
    GpuBehaviour,
    ProcessBehaviour,
    ScenarioError,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib


FailureMode = Literal["no-library", "driver-not-loaded", "library-mismatch", "old-driver"]
UnsupportedField = Literal[
    "name",
    "uuid",
    "memory",
    "utilization",
    "temperature",
    "power",
    "power_limit",
    "clocks",
    "processes",
    "process_name",
    "mig",
    "energy",
    "process_utilization",
    "clocks_event_reasons",
    "pcie",
    "pcie_throughput",
    "ecc",
    "remapped_rows",
    "fan",
    "pstate",
    "xid_events",
    "gpm",
    "nvlink",
]

ClocksEventReason = Literal[
    "gpu_idle",
    "applications_clocks_setting",
    "sw_power_cap",
    "hw_slowdown",
    "sync_boost",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "display_clock_setting",
]
"""The clock-event reasons a scenario may name (hwdash's names of NVML's bits, as
:data:`hwdash.telemetry.nvml_health.CLOCKS_EVENT_REASONS` lists them)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Points = float | list[tuple[float, float]]
"""One number, or ``[seconds, value]`` points interpolated linearly, the last value holding."""


class Wave(_Strict):
    """A value that moves as a real GPU's does: a base (number or points) plus a periodic swing.

    ``saw``: rises by ``amplitude`` over each period, then drops back (memory over a training step:
    activations pile up, then are freed); ``sine``: swings ``amplitude`` either way (power, clocks,
    temperature). ``jitter`` adds up to that much noise, the same at the same scenario second.
    """

    base: Points
    amplitude: float = Field(ge=0)
    period_s: float = Field(gt=0)
    shape: Literal["saw", "sine"] = "saw"
    jitter: float = Field(default=0.0, ge=0)
    start_s: float = 0.0
    """The swing starts here (before: the base alone, e.g. while memory ramps up)."""


Series = Points | Wave
"""One number, ``[seconds, value]`` points, or a :class:`Wave` (see the module docstring)."""


def _check_series(value: Series | None) -> Series | None:
    if isinstance(value, list):
        if not value:
            raise ValueError("a series needs at least one [seconds, value] point")
        times = [point[0] for point in value]
        if times != sorted(times):
            raise ValueError("series points must be in time order")
    return value


class ScenarioTorch(_Strict):
    """What a process's PyTorch allocator says, as :mod:`hwdash.probe` would publish it."""

    allocated_mib: Series
    """``torch.cuda.memory_allocated``: live tensors."""
    reserved_mib: Series
    """``torch.cuda.memory_reserved``: the allocator's pool (at most the process's NVML memory)."""
    alloc_retries: Points = 0.0
    """Cumulative ``num_alloc_retries`` (whole numbers of the interpolated value count)."""
    ooms: int = Field(default=0, ge=0)
    """``num_ooms``."""
    inactive_split_mib: Series = 0.0
    """``inactive_split_bytes.all.current``: free pieces of split blocks (fragmentation)."""
    steps_per_s: float | None = Field(default=None, gt=0)
    """Training steps per second (the Trainer callback's global step); None: no step."""
    cuda_ready_s: float = 0.0
    """Scenario second CUDA is initialised; before it the probe says "waiting"."""
    tokens_per_step: int | None = Field(default=None, gt=0)
    """Tokens each step trains on (``hwdash.probe.step(tokens=...)``); None: the run counts none."""
    plan: str | None = None
    """The plan the run names (a saved plan's name or a plan file; a packaged file name is looked
    up beside the scenarios)."""
    max_steps: int | None = Field(default=None, gt=0)
    """The Trainer's ``max_steps`` (for the time to finish)."""
    world_size: int | None = Field(default=None, gt=0)
    """Processes of the job, when it is a multi-GPU one."""
    oom_snapshot: str | None = None
    """An allocator snapshot the probe dumped at an out-of-memory error (a path; a relative one is
    beside the scenario files): the probe records with ``record_oom`` and lists it."""

    @field_validator("allocated_mib", "reserved_mib", "alloc_retries", "inactive_split_mib")
    @classmethod
    def _series_in_order(cls, value: Series) -> Series:
        checked = _check_series(value)
        assert checked is not None
        return checked


class ScenarioProcess(_Strict, ProcessBehaviour):
    """A process using a fake GPU."""

    pid: int = Field(gt=0)
    """Process id NVML reports."""
    name: str = "python"
    """Short process name (``nvmlSystemGetProcessName`` and the host's view)."""
    user: str | None = None
    """User running it, as the host would report it."""
    cmdline: str | None = None
    """Full command line as the host would report it; defaults to ``name``."""
    kind: Literal["compute", "graphics"] = "compute"
    """Which NVML process list it appears in."""
    used_mib: Series | None = None
    """GPU memory the process uses; leave out to imitate NVML not knowing (``usedGpuMemory`` None)."""
    cpu_percent: float | None = None
    """Host CPU percent of the process."""
    rss_mib: float | None = None
    """Host resident memory of the process."""
    visible: bool = True
    """False: the host cannot see this PID (it lives in another container or PID namespace)."""
    exited_s: float | None = None
    """Scenario second the process exits while NVML keeps listing it and its memory (the host no
    longer has the PID); None: it does not."""
    mig: int | None = Field(default=None, ge=0)
    """The MIG slot the process runs on (listed by that MIG device); None: the whole GPU."""
    used_not_available_raw: bool = False
    """Report NVML's "not available" value (2^64-1) itself instead of None, as some bindings do."""
    start_s: float = 0.0
    """Scenario second the process appears."""
    end_s: float | None = None
    """Scenario second the process exits (None: never)."""
    torch: ScenarioTorch | None = None
    """The process runs :mod:`hwdash.probe` and publishes these allocator numbers."""
    container: str | None = None
    """The container the host sees it in (``docker:3f2a1b9c0d4e``); None: on the host."""
    sm_percent: Series | None = None
    """The process's SM utilization in NVML's per-process samples; None: NVML has no sample."""
    memory_bandwidth_percent: Series | None = None
    """The process's memory-bandwidth utilization (NVML's ``memUtil``); None: 0 with an SM
    sample, no sample without one."""

    @field_validator("used_mib", "sm_percent", "memory_bandwidth_percent")
    @classmethod
    def _series_in_order(cls, value: Series | None) -> Series | None:
        return _check_series(value)


class ScenarioMig(_Strict):
    """A MIG instance under a fake GPU."""

    name: str
    """Name NVML reports for the MIG device."""
    uuid: str | None = None
    """UUID (``MIG-...``); generated when left out."""
    memory_total_mib: float = Field(gt=0)
    """Memory of the instance."""
    used_mib: Series = 0.0
    """Memory in use."""
    slot: int | None = Field(default=None, ge=0, le=6)
    """MIG device index under the parent (0-6 on an A100/H100); default: its place in the list."""
    gpu_instance_id: int | None = Field(default=None, ge=0)
    """NVML's GPU instance id (GI); default slot + 1."""
    compute_instance_id: int = Field(default=0, ge=0)
    """NVML's compute instance id (CI)."""

    @field_validator("used_mib")
    @classmethod
    def _series_in_order(cls, value: Series | None) -> Series | None:
        return _check_series(value)


class ScenarioRemappedRows(_Strict):
    """A GPU's row remapping (``nvmlDeviceGetRemappedRows``); counts are whole numbers of the
    interpolated value, ``pending`` and ``failure`` are true where their series is above 0."""

    corrected: Points = 0.0
    uncorrected: Points = 0.0
    pending: Points = 0.0
    failure: Points = 0.0

    @field_validator("corrected", "uncorrected", "pending", "failure")
    @classmethod
    def _series_in_order(cls, value: Points) -> Points:
        checked = _check_series(value)
        assert checked is not None and not isinstance(checked, Wave)
        return checked


class ScenarioXid(_Strict):
    """An Xid critical error the fake delivers through NVML's event set at a scenario second."""

    at_s: float = Field(ge=0)
    xid: int = Field(gt=0)


class ScenarioGpm(_Strict):
    """A GPU's GPM metrics (Hopper and later), percents 0..100; a GPU with this table answers
    ``nvmlGpmQueryDeviceSupport``, one without it raises NotSupported (as pre-Hopper GPUs do)."""

    sm_active: Series = 0.0
    sm_occupancy: Series = 0.0
    tensor_active: Series = 0.0
    dram_active: Series = 0.0

    @field_validator("sm_active", "sm_occupancy", "tensor_active", "dram_active")
    @classmethod
    def _series_in_order(cls, value: Series) -> Series:
        checked = _check_series(value)
        assert checked is not None
        return checked


class ScenarioGpu(_Strict, GpuBehaviour):
    """One fake GPU."""

    name: str
    """Name NVML reports, e.g. ``NVIDIA A100-SXM4-80GB``."""
    uuid: str | None = None
    """UUID; generated from the index when left out."""
    memory_total_mib: float = Field(ge=0)
    """Total memory NVML reports (0: a unified-memory part that reports none)."""
    memory_reserved_mib: float = Field(default=0.0, ge=0)
    """Memory the driver reserves (memory info v2)."""
    used_mib: Series = 0.0
    """Memory in use by processes, excluding reserved."""
    utilization: Series = 0.0
    """Percent of time a kernel ran."""
    memory_utilization: Series = 0.0
    """Percent of time the memory bus was busy."""
    temperature_c: Series = 40.0
    """GPU temperature."""
    power_w: Series = 60.0
    """Power draw in watts."""
    power_limit_w: float = Field(default=300.0, gt=0)
    """Enforced power limit in watts."""
    sm_clock_mhz: Series = 1410.0
    """SM clock."""
    memory_clock_mhz: Series = 1593.0
    """Memory clock."""
    unsupported: list[UnsupportedField] = []
    """Fields whose calls raise NVML's NotSupported."""
    lost_after_s: float | None = Field(default=None, ge=0)
    """From this scenario second on, every call for this GPU raises GpuIsLost."""
    hang_after_s: float | None = Field(default=None, ge=0)
    """From this scenario second on, every call for this GPU blocks until the fake is released."""
    processes: list[ScenarioProcess] = []
    """Processes using this GPU."""
    mig: list[ScenarioMig] = []
    """MIG instances; a non-empty list turns MIG mode on unless the modes below say otherwise."""
    mig_mode_current: bool | None = None
    """MIG mode in force now (default: on when ``mig`` lists instances)."""
    mig_mode_pending: bool | None = None
    """MIG mode after the next GPU reset (default: the current mode)."""
    clocks_event_reasons: list[tuple[float, list[ClocksEventReason]]] = []
    """``[seconds, [names]]`` points: the clock-event (throttle) reasons from that second until the
    next point; none before the first point (and with none listed)."""
    pcie_gen: Points = 4.0
    """PCIe link generation now (a link downgraded under load: a series that drops)."""
    pcie_gen_max: int = Field(default=4, ge=1)
    pcie_width: Points = 16.0
    """PCIe lanes in use now."""
    pcie_width_max: int = Field(default=16, ge=1)
    pcie_tx_mib_s: Series = 0.0
    """PCIe traffic the GPU sends, MiB/s (NVML reports KB/s)."""
    pcie_rx_mib_s: Series = 0.0
    ecc_uncorrected: Points = 0.0
    """Volatile uncorrected ECC errors (whole numbers of the interpolated value)."""
    ecc_uncorrected_aggregate: Points | None = None
    """Lifetime uncorrected ECC errors; default: the volatile count."""
    remapped_rows: ScenarioRemappedRows = ScenarioRemappedRows()
    fan_percent: Series = 30.0
    """Fan speed, percent of its maximum (list ``fan`` in ``unsupported`` for a passive card)."""
    pstate: Points = 0.0
    """Performance state (0: P0)."""
    xids: list[ScenarioXid] = []
    """Xid critical errors (``[{at_s = 30, xid = 79}]``), delivered once to an event set that
    registered the GPU before ``at_s``."""
    gpm: ScenarioGpm | None = None
    """GPM metrics; None: the GPU has no GPM (``nvmlGpmQueryDeviceSupport`` NotSupported)."""
    nvlink_links: int = Field(default=0, ge=0)
    """NVLinks of the GPU (0: PCIe only, link 0 NotSupported); links beyond: InvalidArgument."""
    nvlink_active: Points | None = None
    """How many links are up (the first ones; whole numbers of the value); None: all."""
    process_struct_mismatch: bool = False
    """Return process rows packed as NVML's v2 struct and read back at the v3 stride, as
    nvidia-ml-py 12.535.77 does on drivers that fill v2: rows after the first are scrambled."""

    @model_validator(mode="after")
    def _mig_slots_exist(self) -> ScenarioGpu:
        slots = [mig.slot if mig.slot is not None else place for place, mig in enumerate(self.mig)]
        if len(set(slots)) != len(slots):
            raise ValueError(f"two MIG instances in one slot: {sorted(slots)}")
        for process in self.processes:
            if process.mig is not None and process.mig not in slots:
                raise ValueError(
                    f"process {process.pid} runs on MIG slot {process.mig}, not listed"
                )
        return self

    @field_validator(
        "used_mib",
        "utilization",
        "memory_utilization",
        "temperature_c",
        "power_w",
        "sm_clock_mhz",
        "memory_clock_mhz",
        "pcie_gen",
        "pcie_width",
        "pcie_tx_mib_s",
        "pcie_rx_mib_s",
        "ecc_uncorrected",
        "ecc_uncorrected_aggregate",
        "fan_percent",
        "pstate",
        "nvlink_active",
    )
    @classmethod
    def _series_in_order(cls, value: Series | None) -> Series | None:
        return _check_series(value)

    @field_validator("clocks_event_reasons")
    @classmethod
    def _reasons_in_order(
        cls, value: list[tuple[float, list[ClocksEventReason]]]
    ) -> list[tuple[float, list[ClocksEventReason]]]:
        times = [point[0] for point in value]
        if times != sorted(times):
            raise ValueError("clock-event reason points must be in time order")
        return value


class Scenario(_Strict):
    """A whole fake machine."""

    description: str = ""
    """What the scenario shows."""
    driver_version: str = "550.54.15"
    """What ``nvmlSystemGetDriverVersion`` returns."""
    failure: FailureMode | None = None
    """A machine-wide failure: no NVML library, driver not loaded, driver/library mismatch, or an old
    driver without memory info v2 and v3 process calls."""
    time_step_s: float | None = Field(default=None, gt=0)
    """If set, scenario time advances by this step per sampling round instead of following the clock."""
    gpus: list[ScenarioGpu] = []
    """The GPUs, in NVML index order."""
    privileged: bool = False
    """Whether the monitor runs as a privileged user: NVML then serves a MIG GPU's own process list."""
    monitor_in_container: bool = False
    """The monitor runs in a PID namespace other than the host's (NVML's PIDs cannot be checked)."""


def scenario_names() -> list[str]:
    """Names of the packaged scenarios (file names without ``.toml``)."""
    return sorted(path.stem for path in SCENARIO_DIR.glob("*.toml"))


def scenario_path(name_or_path: str | Path) -> Path:
    """Resolve a scenario: an existing file path, or the name of a packaged scenario (``h100x8``)."""
    text = str(name_or_path)
    path = Path(text)
    if path.is_file():
        return path
    if "/" not in text and os.sep not in text:
        packaged = SCENARIO_DIR / (text if text.endswith(".toml") else f"{text}.toml")
        if packaged.is_file():
            return packaged
        if path.suffix == "":
            raise ScenarioError(
                f"no fake NVML scenario named {text!r}; packaged scenarios: "
                + ", ".join(scenario_names())
            )
    raise ScenarioError(f"fake NVML scenario file {text!r} does not exist")


def _describe_validation_error(path: Path, error: ValidationError) -> str:
    first = error.errors()[0]
    location = ".".join(str(part) for part in first["loc"]) or "(top level)"
    more = len(error.errors()) - 1
    suffix = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    return f"{path}: {location}: {first['msg']}{suffix}"


def load_scenario(name_or_path: str | Path) -> Scenario:
    """Read and validate a scenario by path or packaged name. Raises :class:`ScenarioError`."""
    path = scenario_path(name_or_path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ScenarioError(f"cannot read fake NVML scenario {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{path}: not valid TOML: {exc}") from exc
    try:
        return Scenario.model_validate(raw)
    except ValidationError as exc:
        raise ScenarioError(_describe_validation_error(path, exc)) from exc


def compile_scenario(scenario: Scenario) -> dict[str, Any]:
    """A validated scenario as plain JSON data for
    :func:`hwdash.telemetry.scenario_data.load_compiled_scenario`, which needs no pydantic: each
    model an object naming its class, with every field, defaults included."""

    def plain(value: Any) -> Any:
        if isinstance(value, BaseModel):
            fields = {name: plain(getattr(value, name)) for name in type(value).model_fields}
            return {MODEL_KEY: type(value).__name__, **fields}
        if isinstance(value, list | tuple):
            return [plain(item) for item in value]
        return value

    return {"format": COMPILED_FORMAT, "scenario": plain(scenario)}


class ManualClock:
    """A scenario clock that only moves when told to (for tests)."""

    def __init__(self, start_s: float = 0.0) -> None:
        self.now_s = start_s

    def advance(self, seconds: float) -> None:
        """Move scenario time forward."""
        self.now_s += seconds

    def __call__(self) -> float:
        return self.now_s
