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
    unsupported = ["power"]       # these calls raise NVML's NotSupported
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

Scenario time: by default the seconds since the fake was created (real time, for ``--demo``). With
``time_step_s`` each call to ``nvmlDeviceGetCount`` (once per sampling round) advances it by that step, so
a command-line run is deterministic. Tests pass their own ``clock`` (:class:`ManualClock`).
"""

from __future__ import annotations

import itertools
import math
import os
import struct
import sys
import threading
import time
import types
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
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

from hwdash.core.units import MIB
from hwdash.errors import UsageError
from hwdash.telemetry.host_sampler import EXITED, INVISIBLE, HostProcessInfo, ProcessTable
from hwdash.telemetry.probes import ProbeReading, TorchDevice

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

SCENARIO_DIR = Path(__file__).parent / "scenarios"
"""Where the packaged scenarios live (shipped in the wheel: hatchling includes files under src/hwdash)."""


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
]


class ScenarioError(UsageError):
    """A scenario file that is missing or broken. The message names the file and the field."""


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

    @field_validator("allocated_mib", "reserved_mib", "alloc_retries", "inactive_split_mib")
    @classmethod
    def _series_in_order(cls, value: Series) -> Series:
        checked = _check_series(value)
        assert checked is not None
        return checked


class ScenarioProcess(_Strict):
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

    @field_validator("used_mib")
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


class ScenarioGpu(_Strict):
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

    @property
    def mig_current(self) -> bool:
        """Whether MIG is on now."""
        return bool(self.mig) if self.mig_mode_current is None else self.mig_mode_current

    def mig_slots(self) -> dict[int, ScenarioMig]:
        """The MIG instances by slot."""
        return {
            (mig.slot if mig.slot is not None else place): mig for place, mig in enumerate(self.mig)
        }

    @field_validator(
        "used_mib",
        "utilization",
        "memory_utilization",
        "temperature_c",
        "power_w",
        "sm_clock_mhz",
        "memory_clock_mhz",
    )
    @classmethod
    def _series_in_order(cls, value: Series) -> Series:
        checked = _check_series(value)
        assert checked is not None
        return checked


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


def _noise(second: int) -> float:
    """A repeatable value in [-1, 1) for a whole scenario second (no global random state)."""
    return (math.sin(second * 12.9898) * 43758.5453) % 1.0 * 2 - 1


def series_value(series: Series, at_s: float) -> float:
    """Value of a series at scenario second ``at_s`` (linear between points, ends held; waves
    add their swing and noise)."""
    if isinstance(series, Wave):
        value = series_value(series.base, at_s)
        if at_s >= series.start_s:
            phase = ((at_s - series.start_s) % series.period_s) / series.period_s
            if series.shape == "saw":
                value += series.amplitude * phase
            else:
                value += series.amplitude * math.sin(2 * math.pi * phase)
        return value + series.jitter * _noise(math.floor(at_s))
    if not isinstance(series, list):
        return float(series)
    if at_s <= series[0][0]:
        return float(series[0][1])
    for (t0, v0), (t1, v1) in itertools.pairwise(series):
        if at_s <= t1:
            if t1 == t0:
                return float(v1)
            return float(v0 + (v1 - v0) * (at_s - t0) / (t1 - t0))
    return float(series[-1][1])


class ManualClock:
    """A scenario clock that only moves when told to (for tests)."""

    def __init__(self, start_s: float = 0.0) -> None:
        self.now_s = start_s

    def advance(self, seconds: float) -> None:
        """Move scenario time forward."""
        self.now_s += seconds

    def __call__(self) -> float:
        return self.now_s


@dataclass(frozen=True)
class FakeDeviceHandle:
    """What ``nvmlDeviceGetHandleByIndex`` returns from the fake."""

    gpu_index: int
    mig_index: int | None = None


class ScenarioProcessTable:
    """Answers host look-ups for the scenario's PIDs from the scenario; other PIDs go to ``fallback``.

    So a demo shows users and command lines, and ``visible = false`` imitates another container,
    whatever PIDs happen to exist on the machine running the demo.
    """

    def __init__(
        self,
        scenario: Scenario,
        fallback: ProcessTable | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._fallback = fallback
        self._clock = clock
        self._known: dict[int, ScenarioProcess] = {
            process.pid: process for gpu in scenario.gpus for process in gpu.processes
        }

    def lookup(self, pids: set[int]) -> dict[int, HostProcessInfo]:
        result: dict[int, HostProcessInfo] = {}
        unknown = set()
        for pid in pids:
            process = self._known.get(pid)
            if process is None:
                unknown.add(pid)
            elif (
                process.exited_s is not None
                and self._clock is not None
                and self._clock() >= process.exited_s
            ):
                result[pid] = EXITED
            elif not process.visible:
                result[pid] = INVISIBLE
            else:
                result[pid] = HostProcessInfo(
                    visible=True,
                    name=process.name,
                    user=process.user,
                    cmdline=process.cmdline or process.name,
                    cpu_percent=process.cpu_percent,
                    rss_bytes=None if process.rss_mib is None else _mib(process.rss_mib),
                    container=process.container,
                )
        if unknown:
            if self._fallback is not None:
                result.update(self._fallback.lookup(unknown))
            else:
                result.update({pid: INVISIBLE for pid in unknown})
        return result


def _real_pynvml() -> Any:
    import pynvml  # the error classes and constants come from the real bindings

    return pynvml


def _mib(value: float) -> int:
    return round(value * MIB)


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
        started = time.monotonic()
        if clock is not None:
            self._clock = clock
        elif scenario.time_step_s is not None:
            self._clock = lambda: self._step_time
        else:
            self._clock = lambda: time.monotonic() - started
        self.module = self._build_module()

    # -- control -------------------------------------------------------------------------------
    def now(self) -> float:
        """Current scenario second."""
        return self._clock()

    def probe_source(self) -> FakeProbes:
        """What the scenario's probed processes publish (a stand-in for the probe folder)."""
        return FakeProbes(self)

    def process_table(self, fallback: ProcessTable | None = None) -> ScenarioProcessTable:
        """A host view of the scenario's PIDs (user, command line, visibility) for the host sampler."""
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
        return gpu.mig_slots()[handle.mig_index]

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

    def _alive(self, process: ScenarioProcess) -> bool:
        now = self.now()
        return now >= process.start_s and (process.end_s is None or now < process.end_s)

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
            "nvmlDeviceGetClockInfo": self.nvmlDeviceGetClockInfo,
            "nvmlSystemGetProcessName": self.nvmlSystemGetProcessName,
            "nvmlDeviceGetMigMode": self.nvmlDeviceGetMigMode,
            "nvmlDeviceGetMaxMigDeviceCount": self.nvmlDeviceGetMaxMigDeviceCount,
            "nvmlDeviceGetMigDeviceHandleByIndex": self.nvmlDeviceGetMigDeviceHandleByIndex,
            "nvmlDeviceGetGpuInstanceId": self.nvmlDeviceGetGpuInstanceId,
            "nvmlDeviceGetComputeInstanceId": self.nvmlDeviceGetComputeInstanceId,
        }
        for kind, label in (("compute", "Compute"), ("graphics", "Graphics")):
            base = f"nvmlDeviceGet{label}RunningProcesses"
            functions[base] = _bind_kind(self._processes_unversioned, kind)
            functions[f"{base}_v3"] = _bind_kind(self._processes_v3, kind)
            functions[f"{base}_v2"] = _bind_kind(self._processes, kind)

        for name, function in functions.items():
            setattr(module, name, self._counted(name, function))
        return module

    def _counted(self, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            return function(*args, **kwargs)

        call.__name__ = name
        return call


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
    function: Callable[[FakeDeviceHandle, str], list[Any]], kind: str
) -> Callable[[FakeDeviceHandle], list[Any]]:
    def call(handle: FakeDeviceHandle) -> list[Any]:
        return function(handle, kind)

    return call


def make_fake_pynvml(
    scenario: Scenario | str | Path, clock: Callable[[], float] | None = None
) -> FakeNvml:
    """Build a fake NVML from a scenario (object, packaged name or path); use ``.module`` as pynvml."""
    if not isinstance(scenario, Scenario):
        scenario = load_scenario(scenario)
    return FakeNvml(scenario, clock)


class FakeProbes:
    """The probe readings of a scenario's processes at the scenario's current second; the same
    ``read()`` as :class:`hwdash.telemetry.probes.ProbeDirectory`, so the monitor joins them with
    its real code. UUIDs are given as ``torch`` prints them (without NVML's ``GPU-`` prefix)."""

    def __init__(self, fake: FakeNvml) -> None:
        self.fake = fake
        self._peaks: dict[tuple[int, int], tuple[int, int]] = {}

    def read(self) -> dict[int, ProbeReading]:
        now = self.fake.now()
        devices: dict[int, list[TorchDevice]] = {}
        ready: dict[int, bool] = {}
        steps: dict[int, int | None] = {}
        for index, gpu in enumerate(self.fake.scenario.gpus):
            for process in gpu.processes:
                torch = process.torch
                if torch is None or not self.fake._alive(process):
                    continue
                ready[process.pid] = now >= torch.cuda_ready_s
                steps[process.pid] = (
                    None
                    if torch.steps_per_s is None
                    else int(max(0.0, now - torch.cuda_ready_s) * torch.steps_per_s)
                )
                if not ready[process.pid]:
                    continue
                allocated = _mib(series_value(torch.allocated_mib, now))
                reserved = max(allocated, _mib(series_value(torch.reserved_mib, now)))
                peak_allocated, peak_reserved = self._peaks.get((process.pid, index), (0, 0))
                peak_allocated, peak_reserved = (
                    max(peak_allocated, allocated),
                    max(peak_reserved, reserved),
                )
                self._peaks[process.pid, index] = (peak_allocated, peak_reserved)
                uuid = gpu.uuid or f"GPU-fake-{index}"
                devices.setdefault(process.pid, []).append(
                    TorchDevice(
                        uuid=uuid.removeprefix("GPU-"),
                        allocated_bytes=allocated,
                        reserved_bytes=reserved,
                        max_allocated_bytes=peak_allocated,
                        max_reserved_bytes=peak_reserved,
                        alloc_retries=int(series_value(torch.alloc_retries, now)),
                        ooms=torch.ooms,
                        inactive_split_bytes=_mib(series_value(torch.inactive_split_mib, now)),
                    )
                )
        written = time.time()
        return {
            pid: ProbeReading(
                pid=pid,
                written_at=written,
                interval_s=1.0,
                cuda_ready=is_ready,
                step=steps.get(pid),
                devices=tuple(devices.get(pid, ())),
            )
            for pid, is_ready in ready.items()
        }
