"""The training process's own view of its GPU memory, published for ``hwdash monitor``.

NVML sees what the driver sees: the memory a process holds. PyTorch's caching allocator knows more:
``memory_allocated`` (live tensors), ``memory_reserved`` (the allocator's pool, what NVML counts
minus the CUDA context), the peaks, and how often an allocation had to free the cache and retry
(``num_alloc_retries``: the allocator is thrashing, an out-of-memory error is near). See the PyTorch
documentation, "CUDA semantics: memory management" and :func:`torch.cuda.memory_stats`.

One line in a training script starts it::

    import hwdash.probe; hwdash.probe.start()

or ``python -m hwdash.probe train.py ARGS...`` runs a script with it started, and
:class:`hwdash.probe.hf.HwdashProbeCallback` adds the Trainer's global step.

A daemon thread wakes every ``interval_s`` (1 s by default) and writes one small JSON file,
``<probe dir>/<pid>.json`` (see :func:`probe_dir`), atomically (a temporary file renamed over it),
removed when the process exits. It never initialises CUDA: until the script has (``torch`` imported and
``torch.cuda.is_initialized()``), the file says ``"cuda": "waiting"``. It reads only the calls listed
in :func:`read_torch`, imports neither Textual nor pydantic, and ``mem_get_info`` (which would create a
CUDA context on a device the process has not used) is asked only of devices the allocator already
holds memory on.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hwdash.telemetry.probe_files import (
    DEFAULT_INTERVAL_S,
    FORMAT,
    REWRITE_S,
    THREAD_NAME,
    ProbeDirError,
    private_dir,
    probe_dir,
    process_start_ticks,
)

__all__ = [
    "DEFAULT_INTERVAL_S",
    "FORMAT",
    "REWRITE_S",
    "THREAD_NAME",
    "Probe",
    "ProbeDirError",
    "private_dir",
    "probe_dir",
    "process_start_ticks",
    "read_torch",
    "set_step",
    "start",
    "stop",
]


def _stat(stats: Mapping[str, Any], key: str) -> int:
    value = stats.get(key, 0)
    return int(value) if isinstance(value, (int, float)) else 0


def read_torch(torch: Any) -> tuple[str, list[dict[str, Any]]]:
    """``("waiting", [])`` until the process has initialised CUDA, then ``("ready", devices)``.

    Calls only: ``torch.cuda.is_initialized``, ``is_available``, ``device_count``, ``current_device``,
    ``get_device_properties(i)`` (``uuid``, ``name``, ``total_memory``), ``memory_allocated``,
    ``memory_reserved``, ``max_memory_allocated``, ``max_memory_reserved``, ``memory_stats``
    (``num_alloc_retries``, ``num_ooms``, ``inactive_split_bytes.all.current``) and ``mem_get_info``.
    A device is listed when the allocator holds or has held memory on it, or it is the current one.
    """
    cuda = getattr(torch, "cuda", None)
    if cuda is None or not cuda.is_initialized() or not cuda.is_available():
        return "waiting", []
    current = cuda.current_device()
    devices: list[dict[str, Any]] = []
    for index in range(cuda.device_count()):
        stats = cuda.memory_stats(index)
        reserved = int(cuda.memory_reserved(index))
        max_reserved = int(cuda.max_memory_reserved(index))
        if index != current and reserved == 0 and max_reserved == 0:
            continue  # not a device of this process
        properties = cuda.get_device_properties(index)
        free: int | None = None
        device_total: int | None = None
        if reserved > 0:  # a context exists there already: asking creates nothing
            free, device_total = (int(value) for value in cuda.mem_get_info(index))
        devices.append(
            {
                "index": index,
                "uuid": str(getattr(properties, "uuid", "") or "") or None,
                "name": str(properties.name),
                "total_bytes": int(properties.total_memory),
                "allocated_bytes": int(cuda.memory_allocated(index)),
                "reserved_bytes": reserved,
                "max_allocated_bytes": int(cuda.max_memory_allocated(index)),
                "max_reserved_bytes": max_reserved,
                "alloc_retries": _stat(stats, "num_alloc_retries"),
                "ooms": _stat(stats, "num_ooms"),
                "inactive_split_bytes": _stat(stats, "inactive_split_bytes.all.current"),
                "free_bytes": free,
                "device_total_bytes": device_total,
            }
        )
    return "ready", devices


class Probe:
    """Publishes this process's allocator numbers every ``interval_s`` seconds (see the module)."""

    def __init__(
        self,
        interval_s: float = DEFAULT_INTERVAL_S,
        directory: Path | None = None,
        *,
        torch_module: Callable[[], Any] | None = None,
    ) -> None:
        if not interval_s > 0 or interval_s != interval_s or interval_s == float("inf"):
            raise ValueError(
                f"the probe interval must be a positive number of seconds, got {interval_s}"
            )
        self.interval_s = float(interval_s)
        self.directory = directory if directory is not None else probe_dir()
        self.pid = os.getpid()
        self.path = self.directory / f"{self.pid}.json"
        self._temporary = self.directory / f".{self.pid}.json.tmp"
        self._dir_checked = False
        self._last_reading: dict[str, Any] | None = None
        self._last_write = 0.0
        self.writes = 0
        """Files written so far (``rounds`` counts readings)."""
        self.step: int | None = None
        """The training step, when something sets it (the Trainer callback)."""
        self.last_error: str | None = None
        """Why the last round failed (published in the file; never raised in the training process)."""
        self.rounds = 0
        self._torch = torch_module or (lambda: sys.modules.get("torch"))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._publishing = threading.Lock()
        """One publish at a time: the thread and a caller share the temporary file."""
        self._start_ticks = process_start_ticks()

    def reading(self) -> dict[str, Any]:
        """The object this round publishes."""
        torch = self._torch()
        error: str | None = None
        cuda = "waiting"
        devices: list[dict[str, Any]] = []
        if torch is not None:
            try:
                cuda, devices = read_torch(torch)
            except Exception as exc:  # the training run matters more than its monitor
                error = f"{type(exc).__name__}: {exc}"
        self.last_error = error
        return {
            "format": FORMAT,
            "pid": self.pid,
            "start_ticks": self._start_ticks,
            "written_at": time.time(),
            "interval_s": self.interval_s,
            "cuda": cuda,
            "step": self.step,
            "devices": devices,
            "error": error,
        }

    def publish(self, *, force: bool = True) -> None:
        """Write one reading, atomically (readers never see half a file). Without ``force`` an
        unchanged reading is written only every :data:`REWRITE_S` seconds (enough for readers to
        see the probe is alive; most seconds of a steady run then cost no file system call).
        Safe to call while the probe's thread runs (one publish at a time)."""
        with self._publishing:
            self._publish(force)

    def _publish(self, force: bool) -> None:
        reading = self.reading()
        written_at = reading.pop("written_at")
        self.rounds += 1
        if (
            not force
            and reading == self._last_reading
            and written_at - self._last_write < max(REWRITE_S, 2 * self.interval_s)
        ):
            return
        self._last_reading, self._last_write = dict(reading), written_at
        reading["written_at"] = written_at
        if not self._dir_checked:
            private_dir(self.directory)
            self._dir_checked = True
        data = json.dumps(reading, separators=(",", ":")).encode()
        # A fixed temporary name is safe in a folder only this user can enter (private_dir);
        # O_NOFOLLOW refuses a planted link all the same.
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
        try:
            handle = os.open(self._temporary, flags, 0o600)
        except FileNotFoundError:
            self._dir_checked = False  # the folder was removed (a cleaner of /tmp): make it again
            raise
        try:
            os.write(handle, data)
        finally:
            os.close(handle)
        os.replace(self._temporary, self.path)
        self.writes += 1

    def start(self) -> Probe:
        """Start the thread (once); the file is removed at exit."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
            self._thread.start()
            atexit.register(self.stop)
        return self

    @property
    def alive(self) -> bool:
        """Whether the thread is running."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float = 1.0) -> None:
        """Stop publishing and remove the file (only the process that made it removes it)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread() and thread.is_alive():
            thread.join(timeout)
        if os.getpid() == self.pid:
            for path in (self.path, self._temporary):
                with contextlib.suppress(OSError):
                    path.unlink()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.publish(force=False)
            except OSError as exc:
                # A full disk or a folder we may not use: say it once, keep the run going.
                if self.last_error is None:
                    print(
                        f"hwdash.probe: cannot publish to {self.directory}: {exc}", file=sys.stderr
                    )
                self.last_error = str(exc)
            self._stop.wait(self.interval_s)


_probe: Probe | None = None
_lock = threading.Lock()


def start(
    interval_s: float = DEFAULT_INTERVAL_S, directory: str | os.PathLike[str] | None = None
) -> Probe:
    """Start this process's probe (a second call returns the running one)."""
    global _probe
    with _lock:
        if _probe is None or not _probe.alive or _probe.pid != os.getpid():
            _probe = Probe(interval_s, None if directory is None else Path(directory)).start()
        return _probe


def stop() -> None:
    """Stop the probe and remove its file."""
    global _probe
    with _lock:
        if _probe is not None:
            _probe.stop()
            _probe = None


def set_step(step: int | None) -> None:
    """Record the training step (published with the next reading)."""
    if _probe is not None:
        _probe.step = None if step is None else int(step)


def _forget_in_child() -> None:
    # A forked child (a DataLoader worker) has no probe thread and must not remove the parent's file.
    global _probe
    _probe = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
