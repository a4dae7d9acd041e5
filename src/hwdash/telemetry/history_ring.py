"""History you did not have to start: the bounded recording every sampling hwdash process keeps.

Whichever hwdash process samples this box's GPUs (the dashboard, ``hwdash monitor``, ``hwdash
exporter``) appends what it sees to ``$XDG_STATE_HOME/hwdash/history/`` (by default
``~/.local/state/hwdash/history``; ``HWDASH_HISTORY_DIR`` or ``--history-dir`` elsewhere), in the
JSON-lines form ``hwdash monitor --json`` writes (:mod:`hwdash.telemetry.snapshot_json`), so
``hwdash monitor --replay DIR`` shows it again and ``hwdash report`` reads it. Pure standard library.

Two tiers of segment files, each named by the time of its first line:

* ``raw-<ms>.jsonl``: every sample. A segment covers :data:`RAW_SEGMENT_S` (10 minutes); a closed
  segment is deleted once all its samples are older than :data:`RAW_KEEP_S` (an hour), so between
  60 and 70 minutes of samples are kept.
* ``1m-<ms>.jsonl``: one line per minute (:data:`MINUTE_S`), always written, beside the raw tier
  too (a kill loses at most the minute in progress there; the raw tier holds it). Each GPU's
  readings over the minute are reduced as :func:`downsample` says; the line carries
  ``"downsampled": {"seconds": 60, "samples": n}``. A segment covers :data:`MINUTE_SEGMENT_S`;
  closed ones older than the age cap (default 7 days) are deleted.

Size cap: after every line, when all segments together exceed the cap (default 50 MiB), the oldest
closed segments go first; a segment is also closed when it reaches an eighth of the cap, so the
two open ones never hold more than a quarter of it.

A line is written with one ``write`` and flushed (no fsync): a kill mid-write leaves at most the last
line of a segment cut short, which :func:`read_history` skips without a word (the next process
starts new segments, never appending to a cut one).

One writer per box: :meth:`HistoryRing.open` takes an exclusive, non-blocking ``fcntl.flock`` on
``lock`` in the directory (and writes its PID there). A second process finds it taken, records
nothing, and says so once (:attr:`HistoryRing.note`); it never waits. The lock goes with the process.

Writing never raises into the sampler: a directory that cannot be made, a full disk, a file that
cannot be written turn the ring off with a note.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import re
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hwdash.core import strict_json

if TYPE_CHECKING:
    from hwdash.telemetry.types import Sampler, Snapshot

HISTORY_DIR_ENV = "HWDASH_HISTORY_DIR"
DEFAULT_MAX_AGE_S = 7 * 86400.0
"""How long the minute tier is kept by default (``--history-max-age``)."""
DEFAULT_MAX_SIZE_BYTES = 200 * 1024 * 1024
"""The default size cap of the whole directory (``--history-max-size``). Measured on the fake
``h100x8`` scenario (8 GPUs, a process on each): about 10.5 KB a sample, so the raw hour is
about 38 MB and a week of minutes about 105 MB."""
RAW_KEEP_S = 3600.0
"""Every sample is kept this long (then only the minute tier)."""
RAW_SEGMENT_S = 600.0
"""Span of one raw segment (the raw tier is pruned a segment at a time)."""
MINUTE_S = 60.0
"""Width of one downsampled point."""
MINUTE_SEGMENT_S = 6 * 3600.0
"""Span of one minute segment."""
SEGMENT_SHARE_OF_CAP = 8
"""A segment is closed when it reaches cap / this (so pruning by size frees space in small steps)."""
MIN_SEGMENT_BYTES = 4096
"""...but never below this (a tiny cap would start a file per line)."""
MAX_LINE_BYTES = 4 * 1024 * 1024
"""A history line longer than this is not read (a snapshot of 8 GPUs is a few kilobytes)."""
READ_DEPTH = 16
"""Nesting a history line may have (a snapshot nests six levels; replay's limit)."""
LOCK_NAME = "lock"
RAW_PREFIX = "raw-"
MINUTE_PREFIX = "1m-"
_SEGMENT = re.compile(r"^(raw|1m)-(\d{1,16})\.jsonl$")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)
_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.IGNORECASE)
_AGE_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_SIZE_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def default_history_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$HWDASH_HISTORY_DIR``, else ``$XDG_STATE_HOME/hwdash/history``, by default
    ``~/.local/state/hwdash/history`` (beside the alert log and the runs ledger)."""
    env = os.environ if environ is None else environ
    explicit = env.get(HISTORY_DIR_ENV, "").strip()
    if explicit:
        return Path(explicit).expanduser()
    state_home = env.get("XDG_STATE_HOME", "").strip()
    base = Path(state_home) if state_home else Path.home() / ".local" / "state"
    return base / "hwdash" / "history"


def parse_max_age(text: str) -> float:
    """``--history-max-age``: ``7d``, ``36h``, ``2w``, ``90m`` -> seconds (ValueError otherwise)."""
    found = _AGE.match(text)
    if not found:
        raise ValueError(f"{text!r} is not a duration (e.g. 7d, 36h, 2w)")
    seconds = float(found.group(1)) * _AGE_UNITS[found.group(2).lower()]
    if not 0 < seconds < math.inf:
        raise ValueError(f"{text!r} is no time at all")
    return seconds


def parse_max_size(text: str) -> int:
    """``--history-max-size``: ``50M``, ``200MiB``, ``1G``, ``65536`` (bytes) -> bytes (binary
    units; ValueError otherwise, and under 64 KiB)."""
    found = _SIZE.match(text)
    if not found:
        raise ValueError(f"{text!r} is not a size (e.g. 50M, 1G)")
    size = int(float(found.group(1)) * _SIZE_UNITS[found.group(2).lower()])
    if size < 64 * 1024:
        raise ValueError(f"{text!r} is under 64K: too small to hold an hour of samples' files")
    return size


# -- downsampling ---------------------------------------------------------------------------------

_GPU_MAX = (
    "memory_used_bytes",
    "memory_reserved_bytes",
    "pressure",
    "temperature_c",
    "power_w",
    "fan_percent",
)
"""Per GPU, the minute's largest reading: what filled memory, ran hottest, drew most."""
_GPU_MIN = ("memory_free_bytes",)
"""The minute's smallest reading (free memory at the fullest moment)."""
_GPU_MEAN = ("utilization_gpu", "utilization_memory", "sm_clock_mhz", "memory_clock_mhz")
"""The minute's mean: how busy it was on average (clocks rounded back to whole MHz)."""
_WHOLE = frozenset({"sm_clock_mhz", "memory_clock_mhz"})
_HOST_MAX = ("ram_used_bytes", "swap_used_bytes")
_HOST_MIN = ("ram_available_bytes",)
_HOST_MEAN = ("cpu_percent",)
_STATE_ORDER = {"ok": 0, "alert": 1, "blind": 2, "error": 3, "lost": 4}
"""The worst state of the minute wins (a GPU lost for one second was lost)."""


def gpu_busy(gpu: Mapping[str, Any]) -> bool:
    """A GPU reading counts as busy when a process holds memory on it or its utilization is above
    zero (NVML's ``utilization.gpu``: share of the last sample period a kernel ran)."""
    processes = gpu.get("processes")
    if isinstance(processes, list) and processes:
        return True
    utilization = _number(gpu.get("utilization_gpu"))
    return utilization is not None and utilization > 0


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _reduce(
    target: dict[str, Any], readings: Sequence[Mapping[str, Any]], highs: Iterable[str], how: str
) -> None:
    for key in highs:
        values = [v for item in readings if (v := _number(item.get(key))) is not None]
        if not values:
            continue
        if how == "max":
            result: float = max(values)
        elif how == "min":
            result = min(values)
        else:
            result = sum(values) / len(values)
        whole = all(isinstance(item.get(key), int) for item in readings if key in item)
        target[key] = round(result) if (whole and how != "mean") or key in _WHOLE else result


def _merge_processes(readings: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every process seen on the GPU in the minute (by PID and MIG slot), its largest memory and
    otherwise its last row."""
    merged: dict[tuple[Any, Any], dict[str, Any]] = {}
    for gpu in readings:
        for process in gpu.get("processes") or ():
            if not isinstance(process, dict):
                continue
            key = (process.get("pid"), process.get("mig_index"))
            earlier = merged.get(key)
            row = dict(process)
            if earlier is not None:
                used = [
                    v
                    for v in (_number(earlier.get("used_bytes")), _number(row.get("used_bytes")))
                    if v is not None
                ]
                if used:
                    row["used_bytes"] = round(max(used))
            merged[key] = row
    return list(merged.values())


def downsample(snapshots: Sequence[Mapping[str, Any]], bucket_start: float) -> dict[str, Any]:
    """One minute's snapshot dicts reduced to one, in the same form: the last snapshot's names and
    totals; per GPU (matched by index) the largest memory used and reserved, pressure, temperature,
    power and fan, the smallest memory free, the mean utilization and clocks, the worst state, the
    union of processes (largest memory each) and ``busy_share`` (share of the samples that were
    :func:`gpu_busy`); for the host the mean CPU, the largest RAM and swap used, the smallest RAM
    available. ``timestamp`` is the minute's start."""
    last = snapshots[-1]
    result = dict(last)
    result["timestamp"] = bucket_start
    result["downsampled"] = {"seconds": MINUTE_S, "samples": len(snapshots)}
    result["events"] = [event for snap in snapshots for event in (snap.get("events") or ())]
    by_index: dict[Any, list[Mapping[str, Any]]] = {}
    for snap in snapshots:
        for gpu in snap.get("gpus") or ():
            if isinstance(gpu, dict):
                by_index.setdefault(gpu.get("index"), []).append(gpu)
    gpus = []
    for gpu in last.get("gpus") or ():
        if not isinstance(gpu, dict):
            continue
        readings: Sequence[Mapping[str, Any]] = by_index.get(gpu.get("index"), [gpu])
        reduced = dict(gpu)
        _reduce(reduced, readings, _GPU_MAX, "max")
        _reduce(reduced, readings, _GPU_MIN, "min")
        _reduce(reduced, readings, _GPU_MEAN, "mean")
        reduced["state"] = max(
            (str(item.get("state")) for item in readings),
            key=lambda state: _STATE_ORDER.get(state, 0),
        )
        reduced["processes"] = _merge_processes(readings)
        reduced["busy_share"] = sum(gpu_busy(item) for item in readings) / len(readings)
        gpus.append(reduced)
    result["gpus"] = gpus
    hosts = [snap["host"] for snap in snapshots if isinstance(snap.get("host"), dict)]
    if hosts and isinstance(last.get("host"), dict):
        host = dict(last["host"])
        _reduce(host, hosts, _HOST_MAX, "max")
        _reduce(host, hosts, _HOST_MIN, "min")
        _reduce(host, hosts, _HOST_MEAN, "mean")
        result["host"] = host
    return result


# -- the writer -----------------------------------------------------------------------------------


@dataclass
class _Segment:
    path: Path
    tier: str
    start: float
    size: int


def _segments(directory: Path) -> list[_Segment]:
    """The segment files in ``directory``, oldest first (other files are left alone)."""
    found = []
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    for name in names:
        match = _SEGMENT.match(name)
        if not match:
            continue
        path = directory / name
        try:
            size = os.lstat(path).st_size
        except OSError:
            continue
        found.append(_Segment(path, match.group(1), int(match.group(2)) / 1000, size))
    found.sort(key=lambda segment: (segment.start, segment.tier))
    return found


class _Writer:
    """One open segment of one tier."""

    def __init__(self, ring: HistoryRing, tier: str, span_s: float) -> None:
        self.ring = ring
        self.tier = tier
        self.span_s = span_s
        self.segment: _Segment | None = None
        self.handle: int | None = None
        self.ends_at = 0.0

    def write(self, timestamp: float, line: bytes) -> None:
        if (
            self.segment is None
            or timestamp >= self.ends_at
            or timestamp < self.segment.start
            or self.segment.size >= self.ring.segment_bytes
        ):
            self.rotate(timestamp)
        assert self.handle is not None and self.segment is not None
        written = os.write(self.handle, line)
        if written != len(line):  # a short write: the disk is full
            raise OSError("short write (disk full?)")
        self.segment.size += written
        self.ring.total_bytes += written

    def rotate(self, timestamp: float) -> None:
        self.close()
        start_ms = max(0, int(timestamp * 1000))
        path = self.ring.directory / f"{self.tier}-{start_ms:013d}.jsonl"
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0)
        self.handle = os.open(path, flags, 0o600)
        size = os.fstat(self.handle).st_size
        if size:  # the same millisecond as an earlier file (a restart): end its last line first
            with open(path, "rb") as existing:
                existing.seek(size - 1)
                if existing.read(1) != b"\n":
                    size += os.write(self.handle, b"\n")
        for known in [s for s in self.ring.segments if s.path == path]:
            self.ring.segments.remove(known)
            self.ring.total_bytes -= known.size
        self.segment = _Segment(path, self.tier, start_ms / 1000, size)
        self.ring.segments.append(self.segment)
        self.ring.total_bytes += size
        self.ends_at = (math.floor(timestamp / self.span_s) + 1) * self.span_s
        self.ring.prune(timestamp)

    def close(self) -> None:
        if self.handle is not None:
            os.close(self.handle)
        self.handle = None


@dataclass
class HistoryRing:
    """The writer of the history directory; call :meth:`open`, then :meth:`add` for each sample
    (from the sampling thread), then :meth:`close`."""

    directory: Path
    max_age_s: float = DEFAULT_MAX_AGE_S
    max_size_bytes: int = DEFAULT_MAX_SIZE_BYTES
    raw_keep_s: float = RAW_KEEP_S
    recording: bool = False
    """The lock is held and lines are being written."""
    note: str | None = None
    """Why nothing is recorded (another process holds the lock, a write failed); None while
    recording or before :meth:`open`."""
    segments: list[_Segment] = field(default_factory=list)
    total_bytes: int = 0
    lines: int = 0
    _lock: int | None = None
    _bucket: float | None = None
    _bucket_points: list[dict[str, Any]] = field(default_factory=list)
    _raw: _Writer | None = None
    _minute: _Writer | None = None
    _guard: threading.Lock = field(default_factory=threading.Lock)

    @property
    def segment_bytes(self) -> int:
        return max(MIN_SEGMENT_BYTES, self.max_size_bytes // SEGMENT_SHARE_OF_CAP)

    def open(self) -> bool:
        """Take the box's lock; True when this process records. Never blocks, never raises."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            lock = os.open(
                self.directory / LOCK_NAME,
                os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0),
                0o600,
            )
        except OSError as exc:
            self.note = f"history off: cannot use {self.directory}: {exc.strerror or exc}"
            return False
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = _read_pid(lock)
            os.close(lock)
            who = f"process {holder}" if holder else "another hwdash process"
            self.note = (
                f"history: {who} already records this box in {self.directory}; not recording"
            )
            return False
        os.ftruncate(lock, 0)
        os.pwrite(lock, f"{os.getpid()}\n".encode(), 0)
        self._lock = lock
        self.segments = _segments(self.directory)
        self.total_bytes = sum(segment.size for segment in self.segments)
        self._raw = _Writer(self, "raw", RAW_SEGMENT_S)
        self._minute = _Writer(self, "1m", MINUTE_SEGMENT_S)
        self.recording = True
        self.note = None
        self.prune(time.time())
        return True

    def add(self, snapshot: Mapping[str, Any]) -> None:
        """Append one snapshot dict (:func:`hwdash.telemetry.snapshot_json.snapshot_to_dict`)."""
        with self._guard:  # close() from another thread waits for the line being written
            self._add(snapshot)

    def _add(self, snapshot: Mapping[str, Any]) -> None:
        if not self.recording:
            return
        timestamp = _number(snapshot.get("timestamp"))
        if timestamp is None:
            return
        try:
            self._write(self._raw, timestamp, snapshot)
            bucket = math.floor(timestamp / MINUTE_S) * MINUTE_S
            if self._bucket is not None and bucket != self._bucket:
                self._flush_minute()
            self._bucket = bucket
            self._bucket_points.append(dict(snapshot))
            if self.total_bytes > self.max_size_bytes:
                self.prune(timestamp)
        except (OSError, ValueError) as exc:
            self._fail(exc)

    def _write(self, writer: _Writer | None, timestamp: float, document: Mapping[str, Any]) -> None:
        assert writer is not None
        document = _without_nulls(document)
        try:
            text = json.dumps(document, separators=(",", ":"), allow_nan=False)
        except ValueError:  # a NaN or an infinity: null, as snapshot_json's readers expect
            from hwdash.core.strict_json import finite_or_none

            text = json.dumps(finite_or_none(document), separators=(",", ":"), allow_nan=False)
        line = text + "\n"
        writer.write(timestamp, line.encode("utf-8"))
        self.lines += 1

    def _flush_minute(self) -> None:
        if self._bucket is None or not self._bucket_points:
            return
        point = downsample(self._bucket_points, self._bucket)
        self._bucket_points = []
        self._write(self._minute, self._bucket, point)

    def prune(self, now: float) -> None:
        """Delete raw segments wholly older than the raw window, minute segments wholly older than
        the age cap, then the oldest closed segments while over the size cap."""
        open_paths = {
            w.segment.path
            for w in (self._raw, self._minute)
            if w is not None and w.segment is not None and w.handle is not None
        }
        self.segments.sort(key=lambda segment: (segment.start, segment.tier))
        for tier, keep in (("raw", self.raw_keep_s), ("1m", self.max_age_s)):
            tier_segments = [s for s in self.segments if s.tier == tier]
            for segment, after in pairwise(tier_segments):
                # Every line of a closed segment is older than the next segment's start.
                if after.start <= now - keep and segment.path not in open_paths:
                    self._delete(segment)
        for segment in list(self.segments):
            if self.total_bytes <= self.max_size_bytes:
                break
            if segment.path not in open_paths:
                self._delete(segment)

    def _delete(self, segment: _Segment) -> None:
        try:
            os.unlink(segment.path)
        except FileNotFoundError:
            pass
        except OSError:
            return
        self.segments.remove(segment)
        self.total_bytes -= segment.size

    def _fail(self, exc: Exception) -> None:
        message = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        self.note = f"history off: writing {self.directory} failed: {message}"
        self._close()

    def close(self) -> None:
        """Write the minute in progress, close the files and let go of the lock."""
        with self._guard:
            self._close()

    def _close(self) -> None:
        was_recording, self.recording = self.recording, False
        if was_recording:
            with contextlib.suppress(OSError, ValueError):
                self._flush_minute()
        for writer in (self._raw, self._minute):
            if writer is not None:
                writer.close()
        if was_recording and self.total_bytes > self.max_size_bytes:
            self.prune(self._bucket if self._bucket is not None else time.time())
        if self._lock is not None:
            os.close(self._lock)  # releases the flock
            self._lock = None


def _without_nulls(value: Any) -> Any:
    """``value`` less the members that are null (the reader takes a missing member as null):
    about a third of a snapshot line."""
    if isinstance(value, dict):
        return {key: _without_nulls(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [_without_nulls(item) for item in value]
    return value


def _read_pid(handle: int) -> int | None:
    try:
        text = os.pread(handle, 32, 0).decode("ascii", errors="replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


class RecordingSampler:
    """A sampler that records each snapshot it returns in a :class:`HistoryRing` (on the thread
    that samples: the dashboard's sampling thread, the monitor's and the exporter's loop) and
    closes the ring when it is closed; every other attribute is the inner sampler's."""

    def __init__(self, inner: Sampler, ring: HistoryRing) -> None:
        self.inner = inner
        self.ring = ring
        self.add_seconds = 0.0
        """Time spent turning snapshots into lines and writing them, in all."""

    def __getattr__(self, name: str) -> Any:
        if name in ("inner", "ring"):
            raise AttributeError(name)
        return getattr(self.inner, name)

    def sample(self) -> Snapshot:
        snapshot = self.inner.sample()
        # A box without a driver (a laptop planning) has nothing to keep: no line at all.
        if self.ring.recording and snapshot.gpus:
            from hwdash.telemetry.snapshot_json import snapshot_to_dict

            started = time.perf_counter()
            try:
                document = snapshot_to_dict(snapshot)
            except ValueError:  # a reading JSON cannot hold is a bug elsewhere: skip the line
                document = None
            if document is not None:
                self.ring.add(document)
            self.add_seconds += time.perf_counter() - started
        return snapshot

    def close(self) -> None:
        try:
            self.inner.close()
        finally:
            self.ring.close()


# -- the reader -----------------------------------------------------------------------------------


@dataclass
class HistoryRead:
    """What :func:`read_history` found: snapshot dicts oldest first (the raw tier where it has the
    minute, else the minute tier's point), lines skipped (cut short by a kill, or not JSON)."""

    directory: Path
    points: list[dict[str, Any]]
    skipped: int = 0
    files: int = 0
    read_bytes: int | None = None
    """Bytes read from the segments this time (:class:`HistoryCache`; None: not counted)."""
    errors: list[str] = field(default_factory=list)
    """Segments that could not be read, with why (:class:`HistoryCache`)."""
    cut: int = 0
    """Of ``skipped``, the lines cut short at a segment's end (a kill, or a line being written
    while read), which are not damage (:class:`HistoryCache`)."""


def _lines(path: Path) -> Iterator[bytes]:
    try:
        with open(path, "rb") as handle:
            yield from handle
    except OSError:
        return


def _points(
    path: Path, since: float | None, until: float | None, slack: float
) -> tuple[list[Any], int]:
    return _parse(_lines(path), since, until, slack)


def _parse(
    lines: Iterable[bytes], since: float | None, until: float | None, slack: float
) -> tuple[list[Any], int]:
    points: list[Any] = []
    skipped = 0
    for line in lines:
        if not line.strip():
            continue
        if len(line) > MAX_LINE_BYTES or not line.endswith(b"\n"):
            skipped += 1  # a line cut short by a kill (the last one) or absurdly long
            continue
        try:  # NaN, infinities, 20-digit integers and deep nesting refused as replay refuses them
            document = strict_json.loads(line, max_depth=READ_DEPTH)
        except ValueError:
            skipped += 1
            continue
        stamp = _number(document.get("timestamp")) if isinstance(document, dict) else None
        if stamp is None or not isinstance(document.get("gpus"), list):
            skipped += 1
            continue
        # A raw sample from ``since`` on; a minute point whose minute ends after ``since``.
        early = since is not None and (stamp + slack <= since if slack else stamp < since)
        if not early and (until is None or stamp <= until):
            points.append(document)
    return points, skipped


def _merge(raw: list[dict[str, Any]], minutes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The raw samples, and the minute points of the minutes no raw sample is in, oldest first."""
    covered = {math.floor(point["timestamp"] / MINUTE_S) for point in raw}
    merged = raw + [
        point for point in minutes if math.floor(point["timestamp"] / MINUTE_S) not in covered
    ]
    merged.sort(key=lambda point: point["timestamp"])
    return merged


def is_history_dir(path: Path) -> bool:
    """Whether ``path`` is a directory holding history segments."""
    return path.is_dir() and bool(_segments(path))


def read_history(
    directory: Path, *, since: float | None = None, until: float | None = None
) -> HistoryRead:
    """Every point of the history in ``directory`` between ``since`` and ``until`` (a minute
    point starting up to a minute before ``since`` too), oldest first: raw samples, and the minute
    tier's points for the minutes the raw tier no longer (or never) held."""
    raw: list[dict[str, Any]] = []
    minutes: list[dict[str, Any]] = []
    skipped = files = 0
    segments = _segments(directory)
    for position, segment in enumerate(segments):
        files += 1
        if until is not None and segment.start > until:
            continue
        later = next((s for s in segments[position + 1 :] if s.tier == segment.tier), None)
        if since is not None and later is not None and later.start < since - MINUTE_S:
            continue  # every line of it is older than the window
        found, bad = _points(segment.path, since, until, MINUTE_S if segment.tier == "1m" else 0.0)
        skipped += bad
        (raw if segment.tier == "raw" else minutes).extend(found)
    return HistoryRead(directory, _merge(raw, minutes), skipped, files)


@dataclass
class _Cached:
    """What :class:`HistoryCache` keeps of one segment: which file it was (device, inode), how
    far it was read (to the end of its last whole line), the points and bad lines up to there."""

    identity: tuple[int, int]
    offset: int
    points: list[dict[str, Any]]
    skipped: int


class HistoryCache:
    """:func:`read_history` (the whole directory) for a reader that reads the same directory again
    and again, the dashboard's time cursor: each segment's points are kept with the file they came
    from and how far it was read. Reading again opens no segment that did not change, reads a
    grown one (the open segments the sampler appends to) from where the last read stopped, reads
    a replaced or shorter one anew, and forgets a vanished one (pruned by the writer). Safe to
    call from several threads (one read at a time)."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._directory: Path | None = None
        self._segments: dict[Path, _Cached] = {}

    def __call__(self, directory: Path) -> HistoryRead:
        return self.read(directory)

    def read(self, directory: Path) -> HistoryRead:
        with self._guard:
            if directory != self._directory:
                self._directory, self._segments = directory, {}
            raw: list[dict[str, Any]] = []
            minutes: list[dict[str, Any]] = []
            skipped = read_bytes = cut = 0
            errors: list[str] = []
            kept: dict[Path, _Cached] = {}
            segments = _segments(directory)
            for segment in segments:
                try:
                    cached, tail, count = self._segment(segment.path)
                except FileNotFoundError:
                    continue  # pruned since the listing: its points are gone from the ring too
                except OSError as exc:
                    errors.append(f"{segment.path.name}: {exc.strerror or exc}")
                    continue
                kept[segment.path] = cached
                read_bytes += count
                skipped += cached.skipped + tail  # a cut last line counts, as read_history's
                cut += tail
                (raw if segment.tier == "raw" else minutes).extend(cached.points)
            self._segments = kept
            return HistoryRead(
                directory, _merge(raw, minutes), skipped, len(segments), read_bytes, errors, cut
            )

    def _segment(self, path: Path) -> tuple[_Cached, int, int]:
        """The segment's cached state brought up to date, whether its bytes after the last whole
        line are a cut line (1) or not (0), and how many bytes were read."""
        with open(path, "rb") as handle:
            status = os.fstat(handle.fileno())
            identity = (status.st_dev, status.st_ino)
            cached = self._segments.get(path)
            if cached is None or cached.identity != identity or status.st_size < cached.offset:
                cached = _Cached(identity, 0, [], 0)
            elif status.st_size == cached.offset:
                return cached, 0, 0
            handle.seek(cached.offset)
            data = handle.read()
        whole = data.rfind(b"\n") + 1
        points, bad = _parse(data[:whole].splitlines(keepends=True), None, None, 0.0)
        grown = _Cached(
            identity, cached.offset + whole, cached.points + points, cached.skipped + bad
        )
        return grown, int(bool(data[whole:].strip())), len(data)


@dataclass
class GpuUse:
    """One GPU over a window, from the history: monitored, busy, peak memory used."""

    uuid: str | None
    index: int | None
    name: str | None
    observed_s: float = 0.0
    busy_s: float = 0.0
    peak_used_bytes: int | None = None


def gpu_use(points: list[dict[str, Any]], since: float, until: float) -> list[GpuUse]:
    """Per GPU (by UUID, else index), how long the history watched it within ``[since, until]``,
    how much of that it was busy (:func:`gpu_busy`; a minute point by its ``busy_share``) and the
    largest memory used. A raw sample stands for the time to the next one, at most three times the
    usual gap (a longer gap: no monitor ran); a minute point for its minute."""
    raw_stamps = [p["timestamp"] for p in points if "downsampled" not in p]
    gaps = sorted(b - a for a, b in pairwise(raw_stamps) if b > a)
    usual = gaps[len(gaps) // 2] if gaps else 1.0
    uses: dict[Any, GpuUse] = {}
    for position, point in enumerate(points):
        start = point["timestamp"]
        minute = point.get("downsampled")
        if isinstance(minute, dict):
            span = _number(minute.get("seconds")) or MINUTE_S
        else:
            following = points[position + 1]["timestamp"] if position + 1 < len(points) else None
            gap = None if following is None else following - start
            span = gap if gap is not None and 0 < gap <= 3 * usual else usual
        low, high = max(start, since), min(start + span, until)
        if high <= low:
            continue
        for gpu in point.get("gpus") or ():
            if not isinstance(gpu, dict):
                continue
            uuid = gpu.get("uuid") if isinstance(gpu.get("uuid"), str) else None
            index = gpu.get("index") if isinstance(gpu.get("index"), int) else None
            key = uuid or index
            if key is None:
                continue
            use = uses.setdefault(key, GpuUse(uuid, index, gpu.get("name")))
            use.observed_s += high - low
            share = _number(gpu.get("busy_share"))
            busy = share if isinstance(minute, dict) and share is not None else gpu_busy(gpu)
            use.busy_s += (high - low) * float(busy)
            used = _number(gpu.get("memory_used_bytes"))
            if used is not None:
                use.peak_used_bytes = max(use.peak_used_bytes or 0, int(used))
    return sorted(
        uses.values(), key=lambda u: (u.index if u.index is not None else -1, u.uuid or "")
    )
