"""Reading what :mod:`hwdash.probe` publishes, and joining it to NVML's processes.

A probe file names its PID; the monitor joins it to NVML's process rows by PID (only where NVML's
PIDs are this machine's, see :func:`hwdash.telemetry.host_sampler.in_host_pid_namespace`) and to a
GPU by UUID, never by index: ``CUDA_VISIBLE_DEVICES`` renumbers devices inside the process, and
``torch`` prints a UUID without NVML's ``GPU-`` prefix. A file whose process is gone (or whose PID
now belongs to a later process) is removed; a file not rewritten for a while is not believed.

The folder may be in the shared temporary folder (``/tmp/hwdash-<uid>/probes`` without
``XDG_RUNTIME_DIR``: sudo, cron, containers), where another local user could have made it first, and
the monitor often runs as root. So the reader trusts nothing in it: the folder (and the one above it)
must be a real folder owned by this user and writable by no one else, as the writer requires
(:func:`hwdash.probe.private_dir`); each file is opened without following a link and without blocking
(a FIFO named ``<pid>.json`` must not stop sampling), read only when it is a regular file of ours of at
most :data:`MAX_PROBE_FILE_BYTES`, parsed strictly (:func:`hwdash.core.strict_json.loads`) and believed
only when its ``pid`` is its name. A bad file is skipped with one warning (not one per round); the
other files are read as usual.

A probe recording out-of-memory snapshots (:mod:`hwdash.probe.oom`) lists them in its ``"oom"``
object; :func:`parse_oom` believes a listed path only when it is exactly
``<probe folder>/<pid>-oom-<n>.pickle`` of the file's own PID (no ``..``, no other folder, no other
name), at most :data:`~hwdash.telemetry.probe_files.MAX_OOM_SNAPSHOTS` of them. The snapshot file
itself is untrusted too: whoever opens it checks it is a regular file of ours (``O_NOFOLLOW``).
"""

from __future__ import annotations

import logging
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from hwdash.core.strict_json import loads
from hwdash.telemetry.probe_files import (
    FORMAT,
    MAX_OOM_SNAPSHOTS,
    is_snapshot_name,
    probe_dir,
    process_start_ticks,
)
from hwdash.telemetry.types import RETRIES_WARN_S, RunProgress, TorchSample

log = logging.getLogger(__name__)

MAX_PROBE_FILE_BYTES = 64 * 1024
"""A probe file is a few hundred bytes per GPU (:func:`hwdash.probe.read_torch`); larger is not one."""
MAX_PROBE_DEPTH = 8
"""A probe file nests three levels (object, ``devices`` list, device object)."""

_OPEN_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NOFOLLOW", 0)  # a planted link is refused, not followed (ELOOP)
    | getattr(os, "O_NONBLOCK", 0)  # opening a FIFO returns at once instead of waiting for a writer
    | getattr(os, "O_CLOEXEC", 0)
)
_DIR_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_DIRECTORY", 0)
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_CLOEXEC", 0)
)


EFFECTIVE_USER = -1
"""``ProbeDirectory(owner_uid=...)``'s default: ``os.geteuid()`` (None where there is none)."""
MAX_PID = 2**31 - 1
"""PIDs are positive C ints (``pid_t``); 0 and negative numbers name process groups to ``kill``."""


class ProbeFileError(ValueError):
    """A probe file that is not read; the message says why."""


def _effective_uid() -> int | None:
    return os.geteuid() if hasattr(os, "geteuid") else None


def check_probe_folder(info: os.stat_result, owner_uid: int | None) -> str | None:
    """Why a folder (its ``lstat``) is not trusted, or None: it must be a folder, not a link, owned
    by ``owner_uid`` and writable by neither group nor others (what :func:`private_dir` makes)."""
    if stat.S_ISLNK(info.st_mode):
        return "is a symbolic link"
    if not stat.S_ISDIR(info.st_mode):
        return "is not a folder"
    if owner_uid is not None and info.st_uid != owner_uid:
        return f"belongs to uid {info.st_uid}, not {owner_uid}"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by other users (mode {stat.S_IMODE(info.st_mode):o})"
    return None


def uuid_key(uuid: str | None) -> str | None:
    """A UUID as both sides can compare it: lower case, without NVML's ``GPU-``/``MIG-`` prefix."""
    if not uuid:
        return None
    text = uuid.strip().lower()
    for prefix in ("gpu-", "mig-"):
        if text.startswith(prefix):
            text = text[len(prefix) :]
    return text or None


@dataclass(frozen=True)
class TorchDevice:
    """One CUDA device as the process's caching allocator sees it."""

    uuid: str | None
    allocated_bytes: int
    reserved_bytes: int
    max_allocated_bytes: int
    max_reserved_bytes: int
    alloc_retries: int
    ooms: int
    inactive_split_bytes: int


OOM_REASONS = ("oom", "signal")
"""Why a probe dumped an allocator snapshot: an out-of-memory error, or ``SIGUSR2``."""
MAX_PATH_CHARS = 4096
"""``PATH_MAX`` on Linux: a longer path is not one the probe wrote."""


@dataclass(frozen=True)
class OomSnapshotFile:
    """One allocator snapshot a probe dumped (the ``"oom"`` object's ``snapshots``)."""

    path: Path
    """``<probe folder>/<pid>-oom-<n>.pickle``, rebuilt from the folder and the checked name."""
    at: float
    """When it was written (seconds since the epoch)."""
    reason: str
    """``"oom"`` (the allocator's out-of-memory observer) or ``"signal"`` (``SIGUSR2``)."""
    bytes: int


@dataclass(frozen=True)
class ProbeOom:
    """A probe's out-of-memory recording (the file's ``"oom"`` object)."""

    recording: bool
    """The allocator history is on and the out-of-memory observer attached."""
    snapshots: tuple[OomSnapshotFile, ...]
    """Oldest first; entries whose path, time, reason or size is not believable are left out."""
    error: str | None
    """Why recording was refused (a torch without CUDA) or the last snapshot failed."""


@dataclass(frozen=True)
class ProbeReading:
    """One probe file."""

    pid: int
    written_at: float
    interval_s: float
    cuda_ready: bool
    step: int | None
    devices: tuple[TorchDevice, ...]
    error: str | None = None
    run: RunProgress | None = None
    """The run's progress (the file's ``run`` object); None from a probe that publishes none."""
    oom: ProbeOom | None = None
    """Out-of-memory snapshots; None when the probe was not asked to record (or the object is
    bad)."""

    def device(self, gpu_uuid: str | None) -> TorchDevice | None:
        """The device with this NVML UUID (None when the process has not used it)."""
        key = uuid_key(gpu_uuid)
        if key is None:
            return None
        return next((device for device in self.devices if uuid_key(device.uuid) == key), None)


def _int(value: Any) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


MAX_COUNT = 10**18
"""Counts (steps, tokens) above this are not believed (a corrupt or hostile file)."""
MAX_TEXT = 1000
"""Command lines and plan references are cut to this many characters."""


def _count(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        return None
    return value


def _real(value: Any, *, low: float = 0.0, high: float = 1e18) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if low <= number <= high else None  # NaN fails both comparisons


def _text(value: Any) -> str | None:
    if not isinstance(value, str) or not value:
        return None
    return value[:MAX_TEXT]


def parse_progress(data: Any, at: float | None = None) -> RunProgress | None:
    """The probe file's ``run`` object, or None when there is none (or it names no start time).
    Each member is checked on its own: a wrong type or an impossible value reads as unknown."""
    if not isinstance(data, dict):
        return None
    started = _real(data.get("started_at"), low=1.0)
    if started is None:
        return None
    world = _count(data.get("world_size"))
    return RunProgress(
        started_at=started,
        at=at,
        command=_text(data.get("command")),
        plan=_text(data.get("plan")),
        step=_count(data.get("step")),
        tokens=_count(data.get("tokens")),
        samples=_count(data.get("samples")),
        sequences=_count(data.get("sequences")),
        tokens_estimated=data.get("tokens_estimated") is True,
        tokens_per_s=_real(data.get("tokens_per_s")),
        step_time_s=_real(data.get("step_time_s")),
        first_step_at=_real(data.get("first_step_at"), low=1.0),
        last_step_at=_real(data.get("last_step_at"), low=1.0),
        max_steps=_count(data.get("max_steps")),
        total_tokens=_count(data.get("total_tokens")),
        energy_j=_real(data.get("energy_j")),
        world_size=world if world else None,
    )


def _snapshot_file(item: Any, pid: int, folder: str) -> OomSnapshotFile | None:
    """One listed snapshot, or None when any member is not what the probe writes."""
    if not isinstance(item, dict):
        return None
    path = item.get("path")
    if not isinstance(path, str) or not 0 < len(path) <= MAX_PATH_CHARS or "\0" in path:
        return None
    parent, name = os.path.split(path)
    # The exact folder (no '..', no '//', no link to elsewhere spelled in) and the exact name.
    if parent != folder or os.path.normpath(path) != path or not is_snapshot_name(name, pid):
        return None
    at = _real(item.get("at"), low=1.0)
    size = _count(item.get("bytes"))
    reason = item.get("reason")
    if at is None or size is None or reason not in OOM_REASONS:
        return None
    return OomSnapshotFile(path=Path(folder) / name, at=at, reason=str(reason), bytes=size)


def parse_oom(data: Any, pid: int, folder: Path | None = None) -> ProbeOom | None:
    """The probe file's ``"oom"`` object, or None when there is none or it is not one: ``recording``
    must be a boolean, ``error`` a string or null, ``snapshots`` a list of at most
    :data:`MAX_OOM_SNAPSHOTS`; each snapshot is kept only when its path is in ``folder`` (the probe
    folder read; default :func:`probe_dir`) and named for ``pid`` (see the module)."""
    if not isinstance(data, dict):
        return None
    recording, listed, error = data.get("recording"), data.get("snapshots"), data.get("error")
    if not isinstance(recording, bool) or not (error is None or isinstance(error, str)):
        return None
    if not isinstance(listed, list) or len(listed) > MAX_OOM_SNAPSHOTS:
        return None
    where = os.path.normpath(os.path.abspath(folder if folder is not None else probe_dir()))
    found = (_snapshot_file(item, pid, where) for item in listed)
    return ProbeOom(
        recording=recording,
        snapshots=tuple(item for item in found if item is not None),
        error=_text(error),
    )


def parse_reading(data: Any, folder: Path | None = None) -> ProbeReading | None:
    """A probe file's object, or None when it is not one this version understands. ``folder`` is
    the probe folder the file was read from (snapshot paths must be in it; default
    :func:`probe_dir`)."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return None
    pid = data.get("pid")
    written = data.get("written_at")
    if not isinstance(pid, int) or isinstance(pid, bool) or not 0 < pid <= MAX_PID:
        return None
    if isinstance(written, bool) or not isinstance(written, (int, float)):
        return None
    devices = []
    listed = data.get("devices")
    for item in listed if isinstance(listed, list) else ():
        if not isinstance(item, dict):
            continue
        uuid = item.get("uuid")
        devices.append(
            TorchDevice(
                uuid=uuid if isinstance(uuid, str) else None,
                allocated_bytes=_int(item.get("allocated_bytes")),
                reserved_bytes=_int(item.get("reserved_bytes")),
                max_allocated_bytes=_int(item.get("max_allocated_bytes")),
                max_reserved_bytes=_int(item.get("max_reserved_bytes")),
                alloc_retries=_int(item.get("alloc_retries")),
                ooms=_int(item.get("ooms")),
                inactive_split_bytes=_int(item.get("inactive_split_bytes")),
            )
        )
    interval = data.get("interval_s")
    step = data.get("step")
    error = data.get("error")
    return ProbeReading(
        pid=pid,
        written_at=float(written),
        interval_s=float(interval) if isinstance(interval, (int, float)) and interval > 0 else 1.0,
        cuda_ready=data.get("cuda") == "ready",
        step=step if isinstance(step, int) and not isinstance(step, bool) else None,
        devices=tuple(devices),
        error=error if isinstance(error, str) else None,
        run=parse_progress(data.get("run"), float(written)),
        oom=parse_oom(data.get("oom"), pid, folder) if "oom" in data else None,
    )


def _pid_state(pid: int, start_ticks: Any, proc_root: str) -> bool:
    """Whether ``pid`` is the process that wrote the file (alive, and started when it said)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, another user's
    except OSError:
        return False
    if isinstance(start_ticks, int):
        now = process_start_ticks(pid, proc_root)
        if now is not None and now != start_ticks:
            return False  # the number was reused
    return True


class ProbeDirectory:
    """The probe files of this user: read each round, stale and orphaned ones dealt with.

    ``owner_uid`` is who the folder and its files must belong to: by default this process's
    effective user (:data:`EFFECTIVE_USER`); None skips the owner check."""

    def __init__(
        self,
        directory: Path | None = None,
        *,
        clock: Callable[[], float] = time.time,
        proc_root: str = "/proc",
        pid_alive: Callable[[int, Any], bool] | None = None,
        owner_uid: int | None = EFFECTIVE_USER,
    ) -> None:
        self.directory = directory if directory is not None else probe_dir()
        self._clock = clock
        self._proc_root = proc_root
        self._pid_alive = pid_alive or (lambda pid, ticks: _pid_state(pid, ticks, proc_root))
        self.owner_uid = _effective_uid() if owner_uid == EFFECTIVE_USER else owner_uid
        self._warned: dict[str, str] = {}
        """The warning last given for each file name (and ``""`` for the folder): said once."""
        self._ended: list[ProbeReading] = []
        """Last readings of runs whose process died leaving its file (see :meth:`take_ended`)."""

    def _warn(self, key: str, message: str) -> None:
        if self._warned.get(key) != message:
            self._warned[key] = message
            log.warning("%s", message)

    def _open_folder(self) -> int | None:
        """A descriptor of the probe folder once it and its parent pass :func:`check_probe_folder`;
        None when there is no folder yet (nothing to read) or it is refused (warned once)."""
        try:
            parent = os.lstat(self.directory.parent)
            handle = os.open(self.directory, _DIR_FLAGS)
        except FileNotFoundError:
            self._warned.pop("", None)
            return None
        except OSError as exc:
            self._warn("", f"probe folder {self.directory} not read: {exc.strerror or exc}")
            return None
        # The folder is checked through the descriptor that is then listed: no swap in between.
        for folder, info in ((self.directory.parent, parent), (self.directory, os.fstat(handle))):
            problem = check_probe_folder(info, self.owner_uid)
            if problem is not None:
                os.close(handle)
                self._warn("", f"probe folder not read: {folder} {problem}")
                return None
        self._warned.pop("", None)
        return handle

    def _load(self, folder: int, name: str) -> Any:
        """The parsed content of one file. Raises :class:`ProbeFileError` (or OSError)."""
        handle = os.open(name, _OPEN_FLAGS, dir_fd=folder)
        try:
            info = os.fstat(handle)  # after the open: the file read is the file checked
            if not stat.S_ISREG(info.st_mode):
                raise ProbeFileError("not a regular file")
            if self.owner_uid is not None and info.st_uid != self.owner_uid:
                raise ProbeFileError(f"belongs to uid {info.st_uid}, not {self.owner_uid}")
            if info.st_size > MAX_PROBE_FILE_BYTES:
                raise ProbeFileError(f"{info.st_size} bytes (at most {MAX_PROBE_FILE_BYTES})")
            data = os.read(handle, MAX_PROBE_FILE_BYTES + 1)
        finally:
            os.close(handle)
        if len(data) > MAX_PROBE_FILE_BYTES:  # it grew after the fstat
            raise ProbeFileError(f"more than {MAX_PROBE_FILE_BYTES} bytes")
        try:
            return loads(data, max_depth=MAX_PROBE_DEPTH)
        except ValueError as exc:  # also UnicodeDecodeError and JSONDecodeError
            if not data.strip() or isinstance(exc, UnicodeDecodeError):
                raise ProbeFileError("not JSON") from None
            raise ProbeFileError(f"not JSON: {exc}") from None

    def read(self) -> dict[int, ProbeReading]:
        """Fresh readings by PID. Files of exited processes are removed; files not rewritten
        within five intervals (and 5 s) are skipped; bad files are skipped with one warning each."""
        folder = self._open_folder()
        if folder is None:
            return {}
        try:
            return self._read_files(folder)
        finally:
            os.close(folder)

    def _read_files(self, folder: int) -> dict[int, ProbeReading]:
        try:
            names = os.listdir(folder)
        except OSError:
            return {}
        now = self._clock()
        readings: dict[int, ProbeReading] = {}
        seen: set[str] = set()
        for name in names:
            stem, _dot, suffix = name.partition(".")
            if suffix != "json" or not stem.isdigit() or not stem.isascii():
                continue
            seen.add(name)
            try:
                data = self._load(folder, name)
                reading = parse_reading(data, self.directory)
                if reading is None:
                    raise ProbeFileError(f"not a probe file of format {FORMAT}")
                if reading.pid != int(stem):
                    raise ProbeFileError(f"it names PID {reading.pid}, not {int(stem)}")
            except FileNotFoundError:
                continue  # removed between the listing and the open: its process ended
            except (OSError, ProbeFileError) as exc:
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
                self._warn(name, f"probe file {self.directory / name} skipped: {reason}")
                continue
            self._warned.pop(name, None)
            if not self._pid_alive(reading.pid, data.get("start_ticks")):
                try:
                    os.unlink(name, dir_fd=folder)  # its process is gone; nobody else removes it
                except OSError:
                    continue  # another monitor removed it first (and records the run)
                if reading.run is not None:
                    self._ended.append(reading)
                continue
            if now - reading.written_at > 5 * reading.interval_s + 5:
                continue  # the process lives but its probe stopped answering
            readings[reading.pid] = reading
        for gone in set(self._warned) - seen - {""}:
            del self._warned[gone]  # a file that comes back bad is warned about again
        return readings

    def take_ended(self) -> list[ProbeReading]:
        """The last readings of runs whose process died without its probe's exit handler (a
        ``kill -9``, a crash in C): their files are removed here, so each is handed out once (of
        several monitors, the one whose removal succeeded)."""
        ended, self._ended = self._ended, []
        return ended


class ProbeSource(Protocol):
    """Where readings come from: the probe folder, or a fake scenario's processes."""

    def read(self) -> dict[int, ProbeReading]:
        """Fresh readings by PID."""
        ...


class ProbeJoiner:
    """Attaches readings to process rows and remembers each process's retry count between rounds
    (to say when it rises). Used by one sampling thread only."""

    def __init__(self, source: ProbeSource, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.source = source
        self._clock = clock
        self._retries: dict[tuple[int, str], tuple[int, float | None]] = {}

    def read(self) -> dict[int, ProbeReading]:
        """This round's readings."""
        return self.source.read()

    def take_ended(self) -> list[ProbeReading]:
        """Runs whose process died leaving its probe file (see :meth:`ProbeDirectory.take_ended`)."""
        take = getattr(self.source, "take_ended", None)
        return [] if take is None else list(take())

    def sample_for(
        self, reading: ProbeReading | None, pid: int, gpu_uuid: str | None
    ) -> TorchSample | None:
        """The allocator's numbers of ``pid`` on the GPU with ``gpu_uuid``, or None."""
        if reading is None:
            return None
        device = reading.device(gpu_uuid)
        if device is None:
            return None
        key = (pid, uuid_key(gpu_uuid) or "")
        now = self._clock()
        previous, rose_at = self._retries.get(key, (device.alloc_retries, None))
        if device.alloc_retries > previous:
            rose_at = now
        self._retries[key] = (device.alloc_retries, rose_at)
        return TorchSample(
            allocated_bytes=device.allocated_bytes,
            reserved_bytes=device.reserved_bytes,
            max_allocated_bytes=device.max_allocated_bytes,
            max_reserved_bytes=device.max_reserved_bytes,
            alloc_retries=device.alloc_retries,
            ooms=device.ooms,
            step=reading.step,
            inactive_split_bytes=device.inactive_split_bytes,
            retries_rising=rose_at is not None and now - rose_at < RETRIES_WARN_S,
        )

    def forget_except(self, live: set[tuple[int, str]]) -> None:
        """Drop the memory of processes no longer listed."""
        for key in set(self._retries) - live:
            del self._retries[key]
