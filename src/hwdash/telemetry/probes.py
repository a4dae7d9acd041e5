"""Reading what :mod:`hwdash.probe` publishes, and joining it to NVML's processes.

A probe file names its PID; the monitor joins it to NVML's process rows by PID (only where NVML's
PIDs are this machine's, see :func:`hwdash.telemetry.host_sampler.in_host_pid_namespace`) and to a
GPU by UUID, never by index: ``CUDA_VISIBLE_DEVICES`` renumbers devices inside the process, and
``torch`` prints a UUID without NVML's ``GPU-`` prefix. A file whose process is gone (or whose PID
now belongs to a later process) is removed; a file not rewritten for a while is not believed.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from hwdash.probe import FORMAT, probe_dir, process_start_ticks
from hwdash.telemetry.types import RETRIES_WARN_S, TorchSample


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

    def device(self, gpu_uuid: str | None) -> TorchDevice | None:
        """The device with this NVML UUID (None when the process has not used it)."""
        key = uuid_key(gpu_uuid)
        if key is None:
            return None
        return next((device for device in self.devices if uuid_key(device.uuid) == key), None)


def _int(value: Any) -> int:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def parse_reading(data: Any) -> ProbeReading | None:
    """A probe file's object, or None when it is not one this version understands."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return None
    pid = data.get("pid")
    written = data.get("written_at")
    if not isinstance(pid, int) or not isinstance(written, (int, float)):
        return None
    devices = []
    for item in data.get("devices") or ():
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
    """The probe files of this user: read each round, stale and orphaned ones dealt with."""

    def __init__(
        self,
        directory: Path | None = None,
        *,
        clock: Callable[[], float] = time.time,
        proc_root: str = "/proc",
        pid_alive: Callable[[int, Any], bool] | None = None,
    ) -> None:
        self.directory = directory if directory is not None else probe_dir()
        self._clock = clock
        self._proc_root = proc_root
        self._pid_alive = pid_alive or (lambda pid, ticks: _pid_state(pid, ticks, proc_root))

    def read(self) -> dict[int, ProbeReading]:
        """Fresh readings by PID. Files of exited processes are removed; files not rewritten
        within five intervals (and 5 s) are skipped; unreadable ones are skipped quietly."""
        try:
            names = os.listdir(self.directory)
        except OSError:
            return {}
        now = self._clock()
        readings: dict[int, ProbeReading] = {}
        for name in names:
            stem, _dot, suffix = name.partition(".")
            if suffix != "json" or not stem.isdigit():
                continue
            path = self.directory / name
            try:
                data = json.loads(path.read_bytes())
            except (OSError, ValueError):
                continue
            reading = parse_reading(data)
            if reading is None or reading.pid != int(stem):
                continue
            if not self._pid_alive(reading.pid, data.get("start_ticks")):
                with contextlib.suppress(OSError):
                    path.unlink()  # its process is gone; nobody else will remove it
                continue
            if now - reading.written_at > 5 * reading.interval_s + 5:
                continue  # the process lives but its probe stopped answering
            readings[reading.pid] = reading
        return readings


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
