"""Replaying what ``hwdash monitor --json`` wrote: one more sampler behind the same protocol.

Each line of the file is one snapshot object (:mod:`hwdash.telemetry.snapshot_json`); the replay turns
them back into :class:`~hwdash.telemetry.types.Snapshot` objects, so the monitor and the dashboard
show a recorded run with the code that showed it live. A last line cut short (the run was killed
while writing) is skipped with a warning, and so is a line that is JSON but holds what hwdash never
writes (``NaN``, an infinity, an integer past 20 digits, nesting past :data:`MAX_LINE_DEPTH`: an edited
or corrupted file; see :func:`hwdash.core.strict_json.loads`); any other line that is not a snapshot
is an error naming the line. Alert states are recomputed by the reader's own rule, as they were live.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hwdash.core.strict_json import UntrustedJsonError, loads
from hwdash.errors import UsageError
from hwdash.telemetry.types import (
    GpuActivity,
    GpuSample,
    GpuState,
    HostSample,
    MigSample,
    NvLinkState,
    NvmlStatus,
    PcieLink,
    ProcessSample,
    RemappedRows,
    Snapshot,
    TorchSample,
    XidEvent,
)

if TYPE_CHECKING:
    from hwdash.telemetry.history import History

MAX_LINE_DEPTH = 16
"""A snapshot nests six levels (snapshot, gpus, GPU, processes, process, torch)."""


MAX_WAIT_S = 3600.0
"""The longest wait between two replayed snapshots (a longer recorded gap: the recorder slept)."""


class ReplayError(UsageError):
    """A replay file that cannot be read; the message names the file and the line."""

    def __init__(self, message: str) -> None:
        super().__init__(message, flag="--replay")


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _list(value: Any) -> list[Any]:
    """A JSON array's items; anything else (a number, a string, an object) holds none."""
    return value if isinstance(value, list) else []


def _torch(data: Any) -> TorchSample | None:
    if not isinstance(data, dict):
        return None
    return TorchSample(
        allocated_bytes=_int(data.get("allocated_bytes")) or 0,
        reserved_bytes=_int(data.get("reserved_bytes")) or 0,
        max_allocated_bytes=_int(data.get("max_allocated_bytes")),
        max_reserved_bytes=_int(data.get("max_reserved_bytes")),
        alloc_retries=_int(data.get("alloc_retries")) or 0,
        ooms=_int(data.get("ooms")) or 0,
        step=_int(data.get("step")),
    )


def _process(data: dict[str, Any], gpu_index: int) -> ProcessSample:
    kind = data.get("kind")
    return ProcessSample(
        pid=_int(data.get("pid")) or 0,
        gpu_index=gpu_index,
        kind=kind if kind in ("compute", "graphics", "compute+graphics") else "compute",
        used_bytes=_int(data.get("used_bytes")),
        visible=data.get("visible") is not False,
        verifiable=data.get("verifiable") is not False,
        exited=data.get("exited") is True,
        mig_index=_int(data.get("mig_index")),
        gpu_instance_id=_int(data.get("gpu_instance_id")),
        compute_instance_id=_int(data.get("compute_instance_id")),
        name=_str(data.get("name")),
        user=_str(data.get("user")),
        cmdline=_str(data.get("cmdline")),
        cpu_percent=_float(data.get("cpu_percent")),
        rss_bytes=_int(data.get("rss_bytes")),
        torch=_torch(data.get("torch")),
        container=_str(data.get("container")),
        host=_str(data.get("host")),
        host_gpu=_int(data.get("host_gpu")),
        sm_percent=_float(data.get("sm_percent")),
        memory_bandwidth_percent=_float(data.get("memory_bandwidth_percent")),
    )


def _health(data: dict[str, Any]) -> dict[str, Any]:
    """The GPU's health readings (:func:`hwdash.telemetry.snapshot_json.health_to_dict`)."""
    reasons = data.get("clocks_event_reasons")
    pcie = data.get("pcie")
    rows = data.get("remapped_rows")
    return {
        "clocks_event_reasons": tuple(str(name) for name in reasons if isinstance(name, str))
        if isinstance(reasons, list)
        else None,
        "pcie": PcieLink(
            **{key: _int(pcie.get(key)) for key in (field.name for field in fields(PcieLink))}
        )
        if isinstance(pcie, dict)
        else None,
        "ecc_uncorrected": _int(data.get("ecc_uncorrected")),
        "ecc_uncorrected_aggregate": _int(data.get("ecc_uncorrected_aggregate")),
        "remapped_rows": RemappedRows(
            corrected=_int(rows.get("corrected")) or 0,
            uncorrected=_int(rows.get("uncorrected")) or 0,
            pending=rows.get("pending") is True,
            failure=rows.get("failure") is True,
        )
        if isinstance(rows, dict)
        else None,
        "fan_percent": _float(data.get("fan_percent")),
        "pstate": _int(data.get("pstate")),
        "energy_mj": _int(data.get("energy_mj")),
        **_events(data),
    }


def _events(data: dict[str, Any]) -> dict[str, Any]:
    """Xid events, activity, NVLink and the reasons' shares (:mod:`hwdash.telemetry.nvml_events`)."""
    xids = data.get("xid_events")
    activity = data.get("activity")
    nvlink = data.get("nvlink")
    share = data.get("clocks_event_share")
    return {
        "xid_events": tuple(
            XidEvent(xid=number, at=at)
            for item in xids
            if isinstance(item, dict)
            and (number := _int(item.get("xid"))) is not None
            and (at := _float(item.get("at"))) is not None
        )
        if isinstance(xids, list)
        else None,
        "activity": GpuActivity(
            source="gpm" if activity.get("source") == "gpm" else "utilization",
            **{
                key: _float(activity.get(key))
                for key in ("sm_active", "sm_occupancy", "tensor_active", "dram_active")
            },
        )
        if isinstance(activity, dict)
        else None,
        "nvlink": NvLinkState(
            links=_int(nvlink.get("links")) or 0, active=_int(nvlink.get("active")) or 0
        )
        if isinstance(nvlink, dict)
        else None,
        "clocks_event_share": {
            str(name): value for name, raw in share.items() if (value := _float(raw)) is not None
        }
        if isinstance(share, dict)
        else None,
    }


def _mig(data: dict[str, Any]) -> MigSample:
    return MigSample(
        index=_int(data.get("index")) or 0,
        name=_str(data.get("name")),
        uuid=_str(data.get("uuid")),
        total_bytes=_int(data.get("memory_total_bytes")),
        used_bytes=_int(data.get("memory_used_bytes")),
        free_bytes=_int(data.get("memory_free_bytes")),
        gpu_instance_id=_int(data.get("gpu_instance_id")),
        compute_instance_id=_int(data.get("compute_instance_id")),
    )


def _gpu(data: dict[str, Any]) -> GpuSample:
    index = _int(data.get("index"))
    if index is None:
        raise ValueError("a GPU without an index")
    state = data.get("state")
    # alert and blind are the rule's verdicts: the replay's own rule decides them again.
    recorded = GpuState(state) if state in ("lost", "error") else GpuState.OK
    errors = data.get("errors")
    source = data.get("memory_source")
    return GpuSample(
        index=index,
        name=_str(data.get("name")),
        uuid=_str(data.get("uuid")),
        state=recorded,
        total_bytes=_int(data.get("memory_total_bytes")),
        reserved_bytes=_int(data.get("memory_reserved_bytes")),
        used_bytes=_int(data.get("memory_used_bytes")),
        free_bytes=_int(data.get("memory_free_bytes")),
        utilization_gpu=_float(data.get("utilization_gpu")),
        utilization_memory=_float(data.get("utilization_memory")),
        temperature_c=_float(data.get("temperature_c")),
        power_w=_float(data.get("power_w")),
        power_limit_w=_float(data.get("power_limit_w")),
        sm_clock_mhz=_int(data.get("sm_clock_mhz")),
        memory_clock_mhz=_int(data.get("memory_clock_mhz")),
        processes=tuple(
            _process(item, index) for item in _list(data.get("processes")) if isinstance(item, dict)
        ),
        mig=tuple(_mig(item) for item in _list(data.get("mig")) if isinstance(item, dict)),
        errors=tuple((str(key), str(value)) for key, value in (errors or {}).items())
        if isinstance(errors, dict)
        else (),
        memory_source="host" if source == "host" else "device",
        host=_str(data.get("host")),
        host_gpu=_int(data.get("host_gpu")),
        processes_reliable=data.get("processes_reliable") is not False,
        **_health(data),
    )


def _host(data: Any) -> HostSample | None:
    if not isinstance(data, dict):
        return None
    load = data.get("load_average")
    loads = (
        tuple(float(value) for value in load[:3])
        if isinstance(load, list)
        and len(load) >= 3
        and all(_float(value) is not None for value in load[:3])
        else None
    )
    return HostSample(
        cpu_percent=_float(data.get("cpu_percent")),
        per_cpu_percent=tuple(
            float(value)
            for value in _list(data.get("per_cpu_percent"))
            if _float(value) is not None
        ),
        load_average=loads,  # type: ignore[arg-type]
        ram_total_bytes=_int(data.get("ram_total_bytes")),
        ram_used_bytes=_int(data.get("ram_used_bytes")),
        ram_available_bytes=_int(data.get("ram_available_bytes")),
        swap_total_bytes=_int(data.get("swap_total_bytes")),
        swap_used_bytes=_int(data.get("swap_used_bytes")),
    )


def snapshot_from_dict(data: Any) -> Snapshot:
    """A snapshot back from its JSON form (raises ValueError when ``data`` is not one)."""
    if not isinstance(data, dict) or not isinstance(data.get("gpus"), list):
        raise ValueError("not a hwdash monitor snapshot (no 'gpus' list)")
    timestamp = _float(data.get("timestamp"))
    if timestamp is None:
        raise ValueError("a snapshot without a timestamp")
    recorded = data.get("nvml")
    nvml: dict[str, Any] = recorded if isinstance(recorded, dict) else {}
    return Snapshot(
        timestamp=timestamp,
        nvml=NvmlStatus(
            available=nvml.get("available") is True,
            driver_version=_str(nvml.get("driver_version")),
            error=_str(nvml.get("error")),
            bindings_version=_str(nvml.get("bindings_version")),
            source=_str(nvml.get("source")),
        ),
        gpus=tuple(_gpu(item) for item in data["gpus"] if isinstance(item, dict)),
        host=_host(data.get("host")),
        sample_seconds=_float(data.get("sample_seconds")) or 0.0,
        errors=tuple(str(item) for item in _list(data.get("errors"))),
        stale=data.get("stale") is True,
    )


def read_history_replay(path: Path) -> tuple[list[Snapshot], list[str]]:
    """Every snapshot of a history directory (:mod:`hwdash.telemetry.history_ring`), oldest first:
    the minute tier's points, then every sample of the last hour. Lines cut short by a kill are
    skipped without a warning (a killed writer is the ring's normal end). Raises
    :class:`ReplayError` when it holds no snapshot."""
    from hwdash.telemetry.history_ring import read_history

    found = read_history(path)
    snapshots: list[Snapshot] = []
    unusable = 0
    for point in found.points:
        try:
            snapshots.append(snapshot_from_dict(point))
        except ValueError:
            unusable += 1
    if not snapshots:
        raise ReplayError(f"{path}: no snapshots in this history directory")
    warnings = [f"{path}: {unusable} history line(s) skipped (not snapshots)"] if unusable else []
    return snapshots, warnings


def read_replay(path: Path) -> tuple[list[Snapshot], list[str]]:
    """Every snapshot of a recording (a ``monitor --json`` file, or a history directory), and
    warnings (a cut last line, a line with an unusable number or nesting). Raises
    :class:`ReplayError`."""
    if path.is_dir():
        return read_history_replay(path)
    try:
        lines = path.read_bytes().decode("utf-8", errors="replace").splitlines()
    except OSError as exc:
        raise ReplayError(f"cannot read {path}: {exc.strerror or exc}") from None
    snapshots: list[Snapshot] = []
    warnings: list[str] = []
    numbered = [(number, line) for number, line in enumerate(lines, 1) if line.strip()]
    for position, (number, line) in enumerate(numbered):
        try:
            snapshots.append(snapshot_from_dict(loads(line, max_depth=MAX_LINE_DEPTH)))
        except UntrustedJsonError as exc:
            warnings.append(f"{path}:{number}: {exc}; skipped")
            continue
        except json.JSONDecodeError as exc:
            if position == len(numbered) - 1 and snapshots:
                warnings.append(
                    f"{path}:{number}: the last line is cut short (the recording was stopped "
                    "while writing it); skipped"
                )
                continue
            raise ReplayError(f"{path}:{number}: not JSON ({exc.msg})") from None
        except ValueError as exc:
            raise ReplayError(f"{path}:{number}: {exc}") from None
    if not snapshots:
        raise ReplayError(f"{path}: no snapshots (record one with `hwdash monitor --json > FILE`)")
    return snapshots, warnings


class ReplaySampler:
    """Implements :class:`~hwdash.telemetry.types.Sampler` over a recording: each ``sample()`` is the
    next snapshot; at the end the last one repeats and :attr:`finished` is True.

    ``step(n)`` moves the position (the dashboard's arrow keys) and ``paused`` holds it; the
    recorded gap to the next snapshot divided by ``speed`` is :meth:`wait_s` (0 = as fast as
    possible)."""

    def __init__(self, snapshots: list[Snapshot], *, speed: float = 1.0) -> None:
        if not snapshots:
            raise ValueError("nothing to replay")
        self.snapshots = snapshots
        self.speed = speed
        self.position = -1
        """Index of the snapshot the next ``sample()`` starts from (-1: none yet); a step moves it."""
        self.shown = -1
        """Index of the snapshot the last ``sample()`` returned (-1: none yet); a step made
        meanwhile does not change it."""
        self.paused = False
        self._hold = False

    @classmethod
    def from_file(cls, path: Path, *, speed: float = 1.0) -> tuple[ReplaySampler, list[str]]:
        snapshots, warnings = read_replay(path)
        return cls(snapshots, speed=speed), warnings

    @property
    def finished(self) -> bool:
        """The last snapshot has been returned."""
        return self.position >= len(self.snapshots) - 1

    def sample(self) -> Snapshot:
        if self._hold:
            self._hold = False  # a step already moved the position
        elif not self.paused and not self.finished:
            self.position += 1
        self.shown = max(0, self.position)
        return self.snapshots[self.shown]

    def step(self, by: int) -> None:
        """Move ``by`` snapshots (negative: back); the next ``sample()`` returns that snapshot."""
        self.position = max(0, min(len(self.snapshots) - 1, max(0, self.position) + by))
        self._hold = True

    def wait_s(self) -> float:
        """Seconds to wait before the next snapshot: the recorded gap over ``speed``, at most
        :data:`MAX_WAIT_S`."""
        if self.speed == 0 or self.finished or self.position < 0:
            return 0.0
        gap = self.snapshots[self.position + 1].timestamp - self.snapshots[self.position].timestamp
        # Two finite timestamps can be an infinity apart (1e308 and -1e308), and time.sleep raises
        # OverflowError past about 292 years: a longer gap waits MAX_WAIT_S.
        return min(MAX_WAIT_S, max(0.0, gap / self.speed))

    def history_feed(
        self, select: Callable[[Snapshot], Snapshot] | None = None
    ) -> ReplayHistoryFeed:
        """What adds this replay's snapshots to a :class:`History` (``select``: the same choice of
        GPUs the samples went through, e.g. ``--gpus``)."""
        return ReplayHistoryFeed(self, select)

    def __iter__(self) -> Iterator[Snapshot]:
        while not self.finished:
            yield self.sample()

    def close(self) -> None:
        """Nothing to release."""


class ReplayHistoryFeed:
    """Keeps a :class:`History` equal to the recording up to the snapshot shown, whatever was
    viewed: a snapshot shown again (paused, or the end repeating) adds nothing, and a step back
    or a jump rebuilds the history from the recording, so sparklines and forecasts never hold
    points the recording does not have in that order.

    Call it with each snapshot right after the replay's ``sample()`` returned it (the sampling
    thread does), instead of ``history.add``.
    """

    def __init__(
        self, replay: ReplaySampler, select: Callable[[Snapshot], Snapshot] | None = None
    ) -> None:
        self.replay = replay
        self.select = select
        self._added = -1
        """Index of the last snapshot added (-1: none)."""

    def __call__(self, history: History, snapshot: Snapshot) -> None:
        shown = self.replay.shown
        if shown == self._added + 1:
            history.add(snapshot)
        elif shown != self._added:
            history.clear()
            # The rings keep at most ``capacity`` points, so earlier snapshots would fall out.
            for earlier in self.replay.snapshots[max(0, shown - history.capacity) : shown]:
                history.add(earlier if self.select is None else self.select(earlier))
            history.add(snapshot)
        self._added = shown
