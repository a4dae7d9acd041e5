"""Health diagnoses: pure rules that say what is wrong with a GPU (or a process on it) and what to do.

The engine takes one round of readings at a time (one :class:`GpuReading` per GPU, each with its
processes) and returns the diagnoses that were raised or cleared by that round. Time is the
readings' own ``at`` (seconds), never the wall clock, so a scripted sequence gives exact results.
Every threshold lives in :class:`Thresholds`, with its reason; the rules (issue 28):

* ``throttled``: the clocks were held back by a power cap, a thermal slowdown or a power brake
  (:data:`THROTTLE_REASONS`) for more than ``throttle_raise_share`` of the last ``throttle_window_s``.
  Each reading stands for the time since the previous one (at most ``max_reading_gap_s``), and the
  share is over the whole window (time before the first reading counts as not throttled).
  Clears when the share falls below ``throttle_clear_share``.
* ``xid``: a new Xid critical error, one event per Xid number; its meaning and hint come from
  ``catalog/health/xid.toml`` (NVIDIA's Xid catalog). The same number again while it is shown raises
  nothing new (it counts, and restarts the quiet period); it clears after ``xid_quiet_s`` without it.
* ``ecc``: the uncorrected ECC count rose since the previous reading (a count already there at the
  first reading is history, not news): clears after ``ecc_quiet_s`` without a further rise; or a
  remapped-row failure: raised while the GPU reports it, cleared when it no longer does.
* ``link``: the PCIe generation or width is below its maximum while the GPU is under load
  (utilization at least ``link_load_percent``) for ``link_hold_s`` in a row, so the downshift an
  idle GPU makes to save power never counts. Clears when the link reads at its maximum (gen and
  width) for ``link_hold_s`` in a row, whatever the load.
* ``idle-holding``: a process holds more than ``idle_holding_bytes`` while its GPU's utilization
  is 0% for ``idle_holding_s`` in a row ("holding N GiB, idle 10 min"). Clears when the GPU's
  utilization reaches ``idle_clear_percent`` (a 1% blip does not), the process holds no more than
  ``idle_holding_bytes`` or is gone.
* ``stray-context``: a PID that holds memory on GPU 0 and on another GPU, where its GPU 0 share
  is a small context (under ``stray_context_bytes``) and most of its memory (at least half, and
  more than on GPU 0) is on one other GPU, for ``stray_hold_s`` in a row; the message names the
  process's ``job`` when known. Shown on GPU 0 (where the stray context sits). Clears when
  the PID holds nothing on GPU 0 any more, or is gone.
* ``input-bound``: over the last ``input_window_s`` (once the process has been seen that long;
  means are plain means of the window's readings), the GPU's mean utilization is under ``input_gpu_percent`` while the process's mean CPU is at
  least ``input_cpu_percent`` of one core (a saturated single-threaded loop or loader; a process
  that uses more cores saturates one core's worth too). Clears when the window's mean GPU
  utilization reaches ``input_clear_gpu_percent`` or its mean CPU falls under
  ``input_clear_cpu_percent``, or the process is gone.

Hysteresis: every rule raises on a stricter condition than the one that clears it (a share,
a utilization or a CPU band, or a hold time / quiet period), so a reading that hovers at a
threshold gives one event, not a stream. Each diagnosis is raised once and cleared once.

A reading that is ``None`` (the GPU or the driver cannot report it) never raises anything.

May import: the core's foundation only.
"""

from __future__ import annotations

import functools
import re
from collections import Counter, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from hwdash.core.data_files import packaged_catalog_dir, read_catalog_toml
from hwdash.core.units import GIB, format_bytes

DiagnosisKind = Literal[
    "throttled", "xid", "ecc", "link", "idle-holding", "stray-context", "input-bound"
]
DIAGNOSIS_KINDS: tuple[DiagnosisKind, ...] = (
    "throttled",
    "xid",
    "ecc",
    "link",
    "idle-holding",
    "stray-context",
    "input-bound",
)
EventKind = Literal["raised", "cleared"]

# Clock-event reasons that count as throttling, normalised (lower case, letters and digits only,
# NVML's ``clocksEventReason``/``clocksThrottleReason`` prefix dropped), so NVML's constant names
# (``clocksEventReasonSwPowerCap``), nvidia-smi's words ("SW Power Cap") and snake case
# (``sw_power_cap``) all match. Source: NVML's ``nvmlClocksEventReasons`` constants (nvml.h); idle,
# application-clock, display-clock and sync-boost reasons are not throttling and never count.
THROTTLE_REASONS: dict[str, str] = {
    "swpowercap": "power cap",
    "hwslowdown": "hardware slowdown",
    "hwthermalslowdown": "thermal",
    "swthermalslowdown": "thermal",
    "hwpowerbrakeslowdown": "power brake",
}
THROTTLE_HINTS: dict[str, str] = {
    "power cap": "the board is at its power limit: compare the draw with the limit "
    "(nvidia-smi -q -d POWER) and check that no one lowered the limit",
    "hardware slowdown": "the hardware slowed the clocks (heat or power brake): check cooling "
    "and the node's power supply",
    "thermal": "the GPU is too hot: check fans, airflow and the inlet temperature",
    "power brake": "an external power-brake signal is asserted: check the node's power supply "
    "and chassis with the vendor",
}
_REASON_PREFIX = re.compile(r"^clocks(event|throttle)reason")


@dataclass(frozen=True)
class Thresholds:
    """Every threshold of the diagnoses, with where it comes from (issue 28 unless said)."""

    throttle_window_s: float = 60.0
    """The window the throttled share is measured over ("the last minute")."""
    throttle_raise_share: float = 0.10
    """Raise when throttled more than this share of the window ("more than 10%")."""
    throttle_clear_share: float = 0.05
    """Clear when the share falls below this (half the raise share: hysteresis)."""
    max_reading_gap_s: float = 10.0
    """The most time one reading stands for (a paused monitor does not make one reading a minute)."""
    xid_quiet_s: float = 300.0
    """An Xid diagnosis clears after this long without the same Xid again (five minutes: long
    enough to be read on the dashboard, short enough that an old error does not linger)."""
    ecc_quiet_s: float = 600.0
    """An uncorrected-ECC diagnosis clears after this long without a further rise."""
    link_load_percent: float = 20.0
    """Utilization at or above which a GPU is under load for the link rule (an idle GPU
    downshifts its PCIe link to save power, which is not a fault)."""
    link_hold_s: float = 10.0
    """How long a downgraded link must hold under load to raise, and a full link to clear."""
    idle_holding_bytes: int = GIB
    """A process holding more than this (1 GiB) on an idle GPU is idle-holding."""
    idle_holding_s: float = 600.0
    """How long the GPU must stay at 0% utilization ("idle 10 min")."""
    idle_clear_percent: float = 5.0
    """GPU utilization that clears idle-holding (above 0%, so a 1% blip does not clear it)."""
    stray_context_bytes: int = GIB
    """A holding on GPU 0 under this (1 GiB) is a small context (a CUDA context with the
    allocator's first blocks is a few hundred MiB)."""
    stray_hold_s: float = 5.0
    """How long the stray context must be seen before it is raised (a rank's start-up)."""
    input_window_s: float = 60.0
    """The window GPU utilization and CPU are averaged over ("over a minute")."""
    input_gpu_percent: float = 50.0
    """Mean GPU utilization under which the GPU is starved ("under 50%")."""
    input_cpu_percent: float = 90.0
    """Mean CPU of the process, in percent of one core (``top``'s convention: 100 is one core
    fully busy), at or above which it is saturated: 90% of one core is a single-threaded loop
    or loader that cannot go faster."""
    input_clear_gpu_percent: float = 60.0
    """Mean GPU utilization that clears input-bound (hysteresis above the raise threshold)."""
    input_clear_cpu_percent: float = 70.0
    """Mean CPU (percent of one core) under which input-bound clears."""

    def __post_init__(self) -> None:
        if not 0 <= self.throttle_clear_share < self.throttle_raise_share < 1:
            raise ValueError("throttle shares must satisfy 0 <= clear < raise < 1")
        if self.input_clear_gpu_percent < self.input_gpu_percent:
            raise ValueError("input_clear_gpu_percent must be at least input_gpu_percent")
        if self.input_clear_cpu_percent > self.input_cpu_percent:
            raise ValueError("input_clear_cpu_percent must be at most input_cpu_percent")
        windows = (self.throttle_window_s, self.input_window_s, self.max_reading_gap_s)
        if min(windows) <= 0:
            raise ValueError("windows and gaps must be positive times")


@dataclass(frozen=True)
class ProcessReading:
    """One process on one GPU in one round."""

    pid: int
    used_bytes: int | None
    """GPU memory the process holds on this GPU."""
    cpu_percent: float | None = None
    """The process's CPU in percent of one core (100: one core fully busy; 400: four cores)."""
    cpu_count: int | None = None
    """Cores of the box (for the input-bound hint)."""
    job: int | str | None = None
    """A key grouping the ranks of one multi-GPU job (e.g. the parent PID), or None."""
    sm_percent: float | None = None
    """The process's SM utilization (NVML's per-process utilization), when known; carried for
    the caller, no rule reads it yet (input-bound judges the GPU's utilization, as issue 28 says)."""


@dataclass(frozen=True)
class GpuReading:
    """One GPU in one round: what the rules need, each ``None`` where it cannot be read."""

    index: int
    uuid: str | None
    at: float
    """When the reading was taken, in seconds (any origin; only differences matter)."""
    utilization_gpu: float | None = None
    """NVML's GPU utilization, 0..100."""
    clocks_event_reasons: tuple[str, ...] | None = None
    """Active clock-event (throttle) reasons; () when none, None when not supported."""
    pcie_gen: int | None = None
    pcie_gen_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    ecc_uncorrected: int | None = None
    remapped_failure: bool | None = None
    xid: tuple[int, ...] = ()
    """Xid numbers of the critical-error events seen since the previous round."""
    processes: tuple[ProcessReading, ...] = ()


@dataclass(frozen=True)
class Diagnosis:
    """A diagnosis in force on one GPU."""

    kind: DiagnosisKind
    message: str
    since: float
    hint: str
    pid: int | None = None
    """The process it is about (idle-holding, stray-context, input-bound), else None."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``gpus[].diagnoses[]``)."""
        return {"kind": self.kind, "message": self.message, "since": self.since, "hint": self.hint}


@dataclass(frozen=True)
class DiagnosisEvent:
    """One diagnosis raised or cleared on one GPU."""

    event: EventKind
    kind: DiagnosisKind
    gpu_index: int
    message: str
    hint: str
    since: float
    """When the diagnosis started (the raising round's ``at``, or when its condition began)."""
    at: float
    """The round's time of this event."""
    pid: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (for the alert log)."""
        return {
            "event": self.event,
            "kind": self.kind,
            "gpu_index": self.gpu_index,
            "message": self.message,
            "hint": self.hint,
            "since": self.since,
            "at": self.at,
            "pid": self.pid,
        }


@dataclass(frozen=True)
class XidEntry:
    """What one Xid number means (``catalog/health/xid.toml``)."""

    meaning: str
    hint: str


XID_CATALOG_URL = "https://docs.nvidia.com/deploy/xid-errors/"


@functools.cache
def xid_catalog() -> dict[int, XidEntry]:
    """The common Xid numbers' meanings and hints, from ``catalog/health/xid.toml``."""
    path = packaged_catalog_dir() / "health" / "xid.toml"
    data = read_catalog_toml(path)
    return {int(number): XidEntry(str(t["meaning"]), str(t["hint"])) for number, t in data.items()}


def describe_xid(number: int) -> tuple[str, str]:
    """(message, hint) for one Xid number; an unlisted one points at NVIDIA's catalog."""
    entry = xid_catalog().get(number)
    if entry is None:
        return f"Xid {number}", f"look Xid {number} up in NVIDIA's Xid catalog ({XID_CATALOG_URL})"
    return f"Xid {number}: {entry.meaning}", entry.hint


def throttle_reason(name: str) -> str | None:
    """The throttling cause a clock-event reason name stands for, None when it is not one."""
    key = _REASON_PREFIX.sub("", re.sub(r"[^a-z0-9]", "", name.lower()))
    return THROTTLE_REASONS.get(key)


def _gib_words(n: float) -> str:
    """Whole GiB from 10 GiB on ("holding 70 GiB"), one decimal below ("holding 1.5 GiB")."""
    value = n / GIB
    return f"{value:.0f} GiB" if value >= 10 else f"{value:.1f} GiB"


Key = tuple[int, DiagnosisKind, object]
"""(GPU index, kind, what within the kind: an Xid number, a PID, a sub-rule)."""


@dataclass
class _Window:
    """Timed values over a sliding window: ``(at, value, weight)`` rows, with the sum and count of
    the values that are not None kept as rows come and go (each round costs O(1), not O(window))."""

    rows: deque[tuple[float, Any, float]] = field(default_factory=deque)
    first_at: float | None = None
    _sum: float = 0.0
    _count: int = 0

    def add(self, at: float, value: Any, max_gap: float) -> None:
        weight = 0.0 if not self.rows else min(max(at - self.rows[-1][0], 0.0), max_gap)
        if self.first_at is None:
            self.first_at = at
        self.rows.append((at, value, weight))
        self._entered(value, weight)

    def trim(self, now: float, window: float) -> None:
        while self.rows and self.rows[0][0] <= now - window:
            _at, value, weight = self.rows.popleft()
            self._left(value, weight)

    def _entered(self, value: Any, weight: float) -> None:
        if isinstance(value, (int, float)):
            self._sum += value
            self._count += 1

    def _left(self, value: Any, weight: float) -> None:
        if isinstance(value, (int, float)):
            self._count -= 1
            self._sum = self._sum - value if self._count else 0.0

    def mean(self) -> float | None:
        return self._sum / self._count if self._count else None


@dataclass
class _ReasonWindow(_Window):
    """The clock-event reasons over the throttled rule's window, with running totals: the time
    throttled (a row with any throttling cause), the time per cause and per reason name, and how
    many rows could say (their reasons were not None). Each row stands for ``weight`` seconds."""

    throttled: float = 0.0
    by_cause: dict[str, float] = field(default_factory=dict)
    by_name: dict[str, float] = field(default_factory=dict)
    _rows_with: Counter[str] = field(default_factory=Counter)
    readable: int = 0

    def _entered(self, value: Any, weight: float) -> None:
        if value is None:
            return
        self.readable += 1
        causes, names = _reason_sets(value)
        if causes:
            self.throttled += weight
        for cause in causes:
            self.by_cause[cause] = self.by_cause.get(cause, 0.0) + weight
            self._rows_with["cause:" + cause] += 1
        for name in names:
            self.by_name[name] = self.by_name.get(name, 0.0) + weight
            self._rows_with["name:" + name] += 1

    def _left(self, value: Any, weight: float) -> None:
        if value is None:
            return
        self.readable -= 1
        causes, names = _reason_sets(value)
        if causes:
            self.throttled = max(0.0, self.throttled - weight)
        for cause in causes:
            _take(self.by_cause, self._rows_with, "cause:", cause, weight)
        for name in names:
            _take(self.by_name, self._rows_with, "name:", name, weight)
        if not self.by_cause:
            self.throttled = 0.0  # no throttled row left: exactly none, whatever the float sums


def _reason_sets(names: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A reading's throttling causes (:func:`throttle_reason`) and reason names, each once."""
    found = (throttle_reason(name) for name in names)
    return tuple(sorted({cause for cause in found if cause is not None})), tuple(set(names))


def _take(
    totals: dict[str, float], rows_with: Counter[str], prefix: str, key: str, weight: float
) -> None:
    """Take a leaving row's ``weight`` from ``totals[key]``; the key goes with its last row."""
    rows_with[prefix + key] -= 1
    if rows_with[prefix + key] <= 0:
        del rows_with[prefix + key]
        totals.pop(key, None)
    else:
        totals[key] -= weight


@dataclass
class _Holding:
    """A condition that must hold for some time in a row: when it started, or None."""

    since: float | None = None

    def hold(self, condition: bool, at: float) -> float | None:
        """Track the condition; the time it has held (None when it does not hold now)."""
        if not condition:
            self.since = None
            return None
        if self.since is None:
            self.since = at
        return at - self.since


@dataclass
class DiagnosisEngine:
    """Feeds rounds of readings through the rules and remembers which diagnoses are in force."""

    thresholds: Thresholds = field(default_factory=Thresholds)
    _active: dict[Key, Diagnosis] = field(default_factory=dict, init=False, repr=False)
    _windows: dict[tuple[Any, ...], _Window] = field(default_factory=dict, init=False, repr=False)
    _holds: dict[tuple[Any, ...], _Holding] = field(default_factory=dict, init=False, repr=False)
    _last: dict[Key, float] = field(default_factory=dict, init=False, repr=False)
    """When each quiet-period diagnosis (Xid, ECC rise) last saw its cause."""
    _ecc: dict[int, int] = field(default_factory=dict, init=False, repr=False)
    _xid_counts: dict[Key, int] = field(default_factory=dict, init=False, repr=False)

    def update(self, readings: Sequence[GpuReading]) -> list[DiagnosisEvent]:
        """Events caused by this round of readings (one reading per GPU; usually no events)."""
        events: list[DiagnosisEvent] = []
        for gpu in readings:
            events.extend(self._throttled(gpu))
            events.extend(self._xid(gpu))
            events.extend(self._ecc_events(gpu))
            events.extend(self._link(gpu))
            events.extend(self._idle_holding(gpu))
            events.extend(self._input_bound(gpu))
        events.extend(self._stray_context(readings))
        return events

    # ------------------------------------------------------------------ state in force

    def diagnoses(self, gpu_index: int) -> list[Diagnosis]:
        """The diagnoses in force on one GPU, oldest first."""
        found = [d for (index, _, _), d in self._active.items() if index == gpu_index]
        return sorted(found, key=lambda d: (d.since, DIAGNOSIS_KINDS.index(d.kind)))

    @property
    def active(self) -> dict[int, list[Diagnosis]]:
        """Every GPU with a diagnosis in force, by index."""
        return {index: self.diagnoses(index) for index in sorted({k[0] for k in self._active})}

    def _raise(
        self, key: Key, message: str, hint: str, since: float, at: float, pid: int | None = None
    ) -> list[DiagnosisEvent]:
        if key in self._active:
            return []
        kind = key[1]
        self._active[key] = Diagnosis(kind, message, since, hint, pid)
        return [DiagnosisEvent("raised", kind, key[0], message, hint, since, at, pid)]

    def _clear(self, key: Key, message: str, at: float) -> list[DiagnosisEvent]:
        gone = self._active.pop(key, None)
        if gone is None:
            return []
        return [
            DiagnosisEvent(
                "cleared", gone.kind, key[0], message, gone.hint, gone.since, at, gone.pid
            )
        ]

    def _window(self, *key: Any) -> _Window:
        return self._windows.setdefault(key, _Window())

    def _reason_window(self, gpu_index: int) -> _ReasonWindow:
        window = self._windows.setdefault((gpu_index, "throttle"), _ReasonWindow())
        assert isinstance(window, _ReasonWindow)
        return window

    def _holding(self, *key: Any) -> _Holding:
        return self._holds.setdefault(key, _Holding())

    # ------------------------------------------------------------------ throttled

    def _throttled(self, gpu: GpuReading) -> list[DiagnosisEvent]:
        t = self.thresholds
        window = self._reason_window(gpu.index)
        window.add(gpu.at, gpu.clocks_event_reasons, t.max_reading_gap_s)
        window.trim(gpu.at, t.throttle_window_s)
        by_cause = window.by_cause
        share = window.throttled / t.throttle_window_s
        key: Key = (gpu.index, "throttled", None)
        minute = f"{t.throttle_window_s:.0f} s"
        if share > t.throttle_raise_share:
            ranked = sorted(by_cause, key=lambda cause: (-by_cause[cause], cause))
            reasons = ", ".join(f"{c} {by_cause[c] / t.throttle_window_s:.0%}" for c in ranked)
            message = f"clocks throttled {share:.0%} of the last {minute} ({reasons})"
            return self._raise(key, message, THROTTLE_HINTS[ranked[0]], gpu.at, gpu.at)
        if share < t.throttle_clear_share:
            message = f"no longer throttled ({share:.0%} of the last {minute})"
            return self._clear(key, message, gpu.at)
        return []

    def clocks_event_share(self, gpu_index: int) -> dict[str, float] | None:
        """Each clock-event reason's share (0..1) of the last ``throttle_window_s``, by its name as
        read (throttling or not: ``gpu_idle`` counts too), over the throttled rule's window and
        with its rule (each reading stands for the time since the previous one, at most
        ``max_reading_gap_s``; time before the first reading counts as without the reason);
        {} when none was in force, None when no reading in the window could say."""
        window = self._windows.get((gpu_index, "throttle"))
        if not isinstance(window, _ReasonWindow) or not window.readable:
            return None
        spent = window.by_name
        span = self.thresholds.throttle_window_s
        return {name: round(min(1.0, spent[name] / span), 4) for name in sorted(spent)}

    # ------------------------------------------------------------------ xid and ecc

    def _xid(self, gpu: GpuReading) -> list[DiagnosisEvent]:
        events: list[DiagnosisEvent] = []
        for number in sorted(set(gpu.xid)):
            key: Key = (gpu.index, "xid", number)
            self._last[key] = gpu.at
            self._xid_counts[key] = self._xid_counts.get(key, 0) + 1
            message, hint = describe_xid(number)
            if key in self._active:
                count = self._xid_counts[key]
                old = self._active[key]
                self._active[key] = Diagnosis(
                    "xid", f"{message} ({count} times)", old.since, hint, None
                )
            events.extend(self._raise(key, message, hint, gpu.at, gpu.at))
        quiet = self.thresholds.xid_quiet_s
        for key in [k for k in self._active if k[0] == gpu.index and k[1] == "xid"]:
            if gpu.at - self._last[key] >= quiet:
                self._xid_counts.pop(key, None)
                message = f"Xid {key[2]}: none for {quiet / 60:.0f} min"
                events.extend(self._clear(key, message, gpu.at))
        return events

    def _ecc_events(self, gpu: GpuReading) -> list[DiagnosisEvent]:
        events: list[DiagnosisEvent] = []
        key: Key = (gpu.index, "ecc", "uncorrected")
        count, before = gpu.ecc_uncorrected, self._ecc.get(gpu.index)
        if count is not None:
            self._ecc[gpu.index] = count
            if before is not None and count > before:
                self._last[key] = gpu.at
                message = f"uncorrected ECC errors rose {before} -> {count}"
                hint = (
                    "uncorrectable memory errors: drain the GPU, reset it (nvidia-smi -r) and "
                    "watch the counters; errors that keep coming need service"
                )
                if key in self._active:
                    old = self._active[key]
                    self._active[key] = Diagnosis("ecc", message, old.since, hint, None)
                events.extend(self._raise(key, message, hint, gpu.at, gpu.at))
        quiet = self.thresholds.ecc_quiet_s
        if key in self._active and gpu.at - self._last[key] >= quiet:
            message = f"no new uncorrected ECC errors for {quiet / 60:.0f} min"
            events.extend(self._clear(key, message, gpu.at))
        remap: Key = (gpu.index, "ecc", "remap")
        if gpu.remapped_failure:
            message = "row remapping failed: the GPU could not retire a bad memory row"
            hint = "drain the GPU and have it serviced (a remapping failure is an RMA condition)"
            events.extend(self._raise(remap, message, hint, gpu.at, gpu.at))
        elif gpu.remapped_failure is False:
            events.extend(self._clear(remap, "row remapping failure no longer reported", gpu.at))
        return events

    # ------------------------------------------------------------------ link

    def _link(self, gpu: GpuReading) -> list[DiagnosisEvent]:
        t = self.thresholds
        gen, gen_max, width, width_max = (
            gpu.pcie_gen,
            gpu.pcie_gen_max,
            gpu.pcie_width,
            gpu.pcie_width_max,
        )
        known = down = False
        if gen is not None and gen_max is not None and width is not None and width_max is not None:
            known, down = True, gen < gen_max or width < width_max
        loaded = gpu.utilization_gpu is not None and gpu.utilization_gpu >= t.link_load_percent
        key: Key = (gpu.index, "link", None)
        down_for = self._holding(gpu.index, "link-down").hold(down and loaded, gpu.at)
        full_for = self._holding(gpu.index, "link-full").hold(known and not down, gpu.at)
        if down_for is not None and down_for >= t.link_hold_s:
            message = (
                f"PCIe link at gen {gen} x{width}, below its maximum gen {gen_max} "
                f"x{width_max} under load"
            )
            hint = (
                "a downgraded link slows host transfers: reseat the card or check the riser and "
                "the slot's BIOS setting; nvidia-smi -q -d PCIE shows current and max"
            )
            return self._raise(key, message, hint, gpu.at - down_for, gpu.at)
        if full_for is not None and full_for >= t.link_hold_s:
            return self._clear(key, f"PCIe link back at gen {gen} x{width}", gpu.at)
        return []

    # ------------------------------------------------------------------ processes

    def _idle_holding(self, gpu: GpuReading) -> list[DiagnosisEvent]:
        t = self.thresholds
        events: list[DiagnosisEvent] = []
        idle = gpu.utilization_gpu is not None and gpu.utilization_gpu <= 0
        busy = gpu.utilization_gpu is not None and gpu.utilization_gpu >= t.idle_clear_percent
        present = set()
        for process in gpu.processes:
            present.add(process.pid)
            key: Key = (gpu.index, "idle-holding", process.pid)
            holds = process.used_bytes is not None and process.used_bytes > t.idle_holding_bytes
            held = self._holding(gpu.index, "idle", process.pid).hold(holds and idle, gpu.at)
            if held is not None and held >= t.idle_holding_s and process.used_bytes is not None:
                message = (
                    f"PID {process.pid} holding {_gib_words(process.used_bytes)}, "
                    f"idle {t.idle_holding_s / 60:.0f} min"
                )
                hint = "the GPU does nothing with this memory: end the process or free it"
                since = gpu.at - held
                events.extend(self._raise(key, message, hint, since, gpu.at, process.pid))
            elif busy or not holds:
                events.extend(self._clear(key, f"PID {process.pid} busy or released", gpu.at))
        events.extend(self._forget_gone(gpu, "idle-holding", "idle", present))
        return events

    def _forget_gone(
        self, gpu: GpuReading, kind: str, hold_name: str, present: set[int]
    ) -> list[DiagnosisEvent]:
        """Clear the per-process diagnoses of processes no longer on the GPU, drop their state."""
        events: list[DiagnosisEvent] = []
        for key in [k for k in self._active if k[0] == gpu.index and k[1] == kind]:
            if key[2] not in present:
                events.extend(self._clear(key, f"PID {key[2]} is gone", gpu.at))
        for state in (self._holds, self._windows):
            for hold_key in [k for k in state if k[:2] == (gpu.index, hold_name)]:
                if hold_key[2] not in present:
                    del state[hold_key]
        return events

    def _input_bound(self, gpu: GpuReading) -> list[DiagnosisEvent]:
        t = self.thresholds
        events: list[DiagnosisEvent] = []
        utilization = self._window(gpu.index, "utilization")
        utilization.add(gpu.at, gpu.utilization_gpu, t.max_reading_gap_s)
        utilization.trim(gpu.at, t.input_window_s)
        gpu_mean = utilization.mean()
        present = set()
        for process in gpu.processes:
            present.add(process.pid)
            cpu = self._window(gpu.index, "cpu", process.pid)
            cpu.add(gpu.at, process.cpu_percent, t.max_reading_gap_s)
            cpu.trim(gpu.at, t.input_window_s)
            full = cpu.first_at is not None and gpu.at - cpu.first_at >= t.input_window_s
            cpu_mean = cpu.mean()
            if not full or cpu_mean is None or gpu_mean is None:
                continue
            key: Key = (gpu.index, "input-bound", process.pid)
            if gpu_mean < t.input_gpu_percent and cpu_mean >= t.input_cpu_percent:
                message, hint = _input_words(process, gpu_mean, cpu_mean, t.input_window_s)
                events.extend(self._raise(key, message, hint, gpu.at, gpu.at, process.pid))
            elif gpu_mean >= t.input_clear_gpu_percent or cpu_mean < t.input_clear_cpu_percent:
                message = f"PID {process.pid} no longer input-bound (GPU {gpu_mean:.0f}%)"
                events.extend(self._clear(key, message, gpu.at))
        events.extend(self._forget_gone(gpu, "input-bound", "cpu", present))
        return events

    def _stray_context(self, readings: Sequence[GpuReading]) -> list[DiagnosisEvent]:
        t = self.thresholds
        events: list[DiagnosisEvent] = []
        gpu0 = next((gpu for gpu in readings if gpu.index == 0), None)
        if gpu0 is None:
            return events
        held = _holdings_by_pid(readings)
        jobs = {p.pid: p.job for gpu in readings for p in gpu.processes if p.job is not None}
        for pid, by_gpu in sorted(held.items()):
            key: Key = (0, "stray-context", pid)
            small = by_gpu.get(0, 0)
            others = {index: used for index, used in by_gpu.items() if index != 0}
            main = max(others, key=lambda index: (others[index], -index)) if others else None
            stray = (
                main is not None
                and 0 < small < t.stray_context_bytes
                and others[main] > small
                and others[main] >= sum(by_gpu.values()) / 2
            )
            for_s = self._holding(0, "stray", pid).hold(stray, gpu0.at)
            if for_s is not None and for_s >= t.stray_hold_s and main is not None:
                job = jobs.get(pid)
                message = (
                    f"PID {pid}{'' if job is None else f' (job {job})'} of GPU {main} holds a "
                    f"{format_bytes(small)} context on GPU 0 besides its "
                    f"{_gib_words(others[main])} on GPU {main}"
                )
                hint = "call torch.cuda.set_device(local_rank) before any CUDA work"
                events.extend(self._raise(key, message, hint, gpu0.at - for_s, gpu0.at, pid))
            elif small == 0:
                events.extend(self._clear(key, f"PID {pid} no longer on GPU 0", gpu0.at))
        for key in [k for k in self._active if k[1] == "stray-context" and k[2] not in held]:
            events.extend(self._clear(key, f"PID {key[2]} is gone", gpu0.at))
        for hold_key in [k for k in self._holds if k[1] == "stray" and k[2] not in held]:
            del self._holds[hold_key]
        return events


def _holdings_by_pid(readings: Iterable[GpuReading]) -> dict[int, dict[int, int]]:
    """PID -> GPU index -> bytes held, over one round (known amounts only)."""
    held: dict[int, dict[int, int]] = {}
    for gpu in readings:
        for process in gpu.processes:
            if process.used_bytes is not None and process.used_bytes > 0:
                by_gpu = held.setdefault(process.pid, {})
                by_gpu[gpu.index] = by_gpu.get(gpu.index, 0) + process.used_bytes
    return held


def _input_words(
    process: ProcessReading, gpu_mean: float, cpu_mean: float, window_s: float
) -> tuple[str, str]:
    """The input-bound message and hint: one busy core (a single-threaded loop or loader) or
    the box's cores all busy."""
    cores = process.cpu_count
    of_box = f" of {cores} cores" if cores else ""
    message = (
        f"PID {process.pid} input-bound: GPU {gpu_mean:.0f}% over {window_s:.0f} s while its "
        f"CPU is {cpu_mean:.0f}% of one core{of_box}"
    )
    if cores and cpu_mean >= 0.9 * 100 * cores:
        return message, (
            "every core of the box is busy: the CPU side (loading, augmenting) needs fewer "
            "cycles per step or a bigger box"
        )
    return message, (
        "one CPU core is saturated: feed the GPU with more loader workers "
        "(DataLoader num_workers, pin_memory=True) or move preprocessing off the training loop"
    )
