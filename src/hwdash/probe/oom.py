"""Why the run ran out of memory: the caching allocator's own record, kept by the probe.

Opt-in, never on by default: ``hwdash.probe.start(record_oom=True)``, ``HWDASH_RECORD_OOM=1`` or
``python -m hwdash.probe --record-oom``. Then, on the first publish round after the script has
initialised CUDA (the probe never does), :class:`OomRecorder` turns on PyTorch's allocator history
(``torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python",
max_entries=N)``: every allocation's Python stack, a ring of the last N alloc/free events;
N = :data:`DEFAULT_ENTRIES` or ``$HWDASH_OOM_ENTRIES``; see PyTorch's "Understanding CUDA Memory
Usage" and the docstring of ``_record_memory_history`` in ``torch/cuda/memory.py``) and attaches an
out-of-memory observer (``torch._C._cuda_attach_out_of_memory_observer``). The caching allocator
calls the observer with ``(device, requested bytes, the device's total or the allowed maximum when
a memory fraction is set, bytes free on the device)`` just before it raises ``OutOfMemoryError``,
with its own lock released (``c10/cuda/CUDACachingAllocator.cpp``), so the stack that failed is
still live. The observer pickles ``torch.cuda.memory._snapshot()`` into the private probe folder as
``<pid>-oom-<n>.pickle`` (:func:`hwdash.telemetry.probe_files.snapshot_name`; mode 0600, opened
with ``O_NOFOLLOW``, written to a temporary name and renamed), keeps the newest
``$HWDASH_OOM_KEEP`` (3) of this process and says the path on stderr. ``SIGUSR2`` asks for one on
demand: the handler only sets a flag (chaining a previous Python handler), and the probe's thread
dumps at its next round. ``hwdash oom PATH`` reads the file. The snapshots outlive the process (the
probe file does not): they are what the user reads after the crash.

The probe file's ``"oom"`` object (present only when recording was asked for) is
:meth:`OomRecorder.state`: ``{"recording": bool, "snapshots": [{"path", "at", "reason": "oom" |
"signal", "bytes"}], "error": str | null}``.

Only the standard library is imported; torch is reached through the module the probe is given
(``sys.modules["torch"]``, which the script imported). A torch without CUDA (a CPU-only build) is
refused with one line on stderr and ``"error"``. Nothing here raises into the training process: a
failure is published as ``"error"`` and said once on stderr.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hwdash.telemetry.probe_files import MAX_OOM_SNAPSHOTS, private_dir, snapshot_name

__all__ = [
    "DEFAULT_ENTRIES",
    "DEFAULT_KEEP",
    "ENTRIES_ENV",
    "KEEP_ENV",
    "RECORD_ENV",
    "OomRecorder",
    "OomSettingError",
    "OomSettings",
    "cuda_build_problem",
    "requested",
    "settings_from_env",
]

RECORD_ENV = "HWDASH_RECORD_OOM"
"""Set to 1 (or true/yes/on) to record as if ``start(record_oom=True)`` was called."""
ENTRIES_ENV = "HWDASH_OOM_ENTRIES"
"""The allocator history's ring size (alloc/free events kept)."""
KEEP_ENV = "HWDASH_OOM_KEEP"
"""How many snapshot files of this process are kept (the oldest is removed)."""
DEFAULT_ENTRIES = 100_000
"""PyTorch keeps ``sys.maxsize`` events by default; a long run needs a bound. 100,000 is the number
PyTorch's "Understanding CUDA Memory Usage" page uses in its examples."""
DEFAULT_KEEP = 3
MAX_ENTRIES = 10**9
"""More events than this is a typo (each entry costs host memory, "several KB" per PyTorch)."""

NATIVE_CALLS = (
    "_cuda_record_memory_history",
    "_cuda_memorySnapshot",
    "_cuda_attach_out_of_memory_observer",
)
"""``torch._C`` functions a torch built with CUDA has (``torch/csrc/cuda/Module.cpp``): the first
two are behind ``torch.cuda.memory._record_memory_history`` and ``_snapshot``, the third is called
directly."""
_TRUE = {"1", "true", "yes", "on"}


class OomSettingError(ValueError):
    """A bad ``HWDASH_OOM_*`` value; the message names the variable."""


@dataclass(frozen=True)
class OomSettings:
    """How much is recorded and kept."""

    entries: int = DEFAULT_ENTRIES
    keep: int = DEFAULT_KEEP


def requested(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``$HWDASH_RECORD_OOM`` asks for recording (1, true, yes or on)."""
    return (os.environ if environ is None else environ).get(RECORD_ENV, "").strip().lower() in _TRUE


def _whole(environ: Mapping[str, str], name: str, default: int, high: int) -> int:
    text = environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= high:
        raise OomSettingError(f"{name}: {text!r} is not a whole number from 1 to {high}")
    return value


def settings_from_env(environ: Mapping[str, str] | None = None) -> OomSettings:
    """``$HWDASH_OOM_ENTRIES`` and ``$HWDASH_OOM_KEEP`` (at most
    :data:`~hwdash.telemetry.probe_files.MAX_OOM_SNAPSHOTS`); raises :class:`OomSettingError`."""
    env = os.environ if environ is None else environ
    return OomSettings(
        entries=_whole(env, ENTRIES_ENV, DEFAULT_ENTRIES, MAX_ENTRIES),
        keep=_whole(env, KEEP_ENV, DEFAULT_KEEP, MAX_OOM_SNAPSHOTS),
    )


def cuda_build_problem(torch: Any) -> str | None:
    """Why this torch cannot record (it has none of the allocator's native calls: a CPU-only
    build), or None. Looks attributes up only: initialises nothing."""
    native = getattr(torch, "_C", None)
    if all(callable(getattr(native, name, None)) for name in NATIVE_CALLS):
        return None
    version = getattr(torch, "__version__", None) or "?"
    return f"torch {version} has no CUDA caching allocator (a CPU-only build): nothing to record"


def _say(message: str) -> None:
    with contextlib.suppress(Exception):  # a closed stderr must not fail the run
        print(f"hwdash.probe: {message}", file=sys.stderr, flush=True)


def _mib(count: int) -> str:
    return f"{count / 2**20:,.1f} MiB"


class _Numbers:
    """Snapshot numbers of this process, shared by every recorder it starts (a probe stopped and
    started again does not overwrite the first one's files); a forked child counts anew."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = -1
        self._last = 0

    def next(self) -> int:
        with self._lock:
            if self._pid != os.getpid():
                self._pid, self._last = os.getpid(), 0
            self._last += 1
            return self._last


_numbers = _Numbers()
_active: OomRecorder | None = None
"""The recorder the attached observer reports to (the allocator's observers cannot be detached)."""
_attached: tuple[int, Any] | None = None
"""(pid, ``torch._C``) the observer is attached to: once per process and torch."""


def _observer(device: int, alloc: int, device_limit: int, device_free: int) -> None:
    """The function the allocator calls on an out-of-memory error (never raises)."""
    recorder = _active
    if recorder is not None:
        recorder.on_oom(device, alloc, device_limit, device_free)


def _attach(torch: Any, recorder: OomRecorder) -> None:
    global _active, _attached
    _active = recorder
    native = torch._C
    if _attached is None or _attached[0] != os.getpid() or _attached[1] is not native:
        native._cuda_attach_out_of_memory_observer(_observer)
        _attached = (os.getpid(), native)


class OomRecorder:
    """The allocator history and the snapshots of one probe (see the module). The probe calls
    :meth:`poll` each round on its thread, :meth:`install_signal` when it starts and
    :meth:`close` when it stops; :meth:`state` is the probe file's ``"oom"`` object."""

    def __init__(
        self,
        directory: Path,
        settings: OomSettings | None = None,
        *,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.directory = Path(os.path.abspath(directory))
        self.settings = settings or OomSettings()
        self.pid = os.getpid()
        self.recording = False
        """Whether the history is on and the observer attached."""
        self.error: str | None = None
        """Why recording was refused or the last snapshot failed (None when all is well)."""
        self._limits: dict[str, int] | None = None
        """The out-of-memory observer's device, limit and free bytes, for the dump it asks for."""
        self.snapshots: list[dict[str, Any]] = []
        """The kept snapshots, oldest first, as the probe file lists them."""
        self._wall_clock = wall_clock
        self._lock = threading.Lock()
        self._torch: Any = None
        self._started_history = False
        self._signalled = False
        self._closed = False
        self._previous_signal: Any = None
        self._signal_installed = False

    @classmethod
    def from_env(cls, directory: Path) -> OomRecorder:
        """A recorder with the environment's settings; a bad value is said on stderr and the
        default used (a training run never fails for its monitor)."""
        try:
            settings = settings_from_env()
        except OomSettingError as problem:
            _say(f"{problem}; using {ENTRIES_ENV}={DEFAULT_ENTRIES}, {KEEP_ENV}={DEFAULT_KEEP}")
            settings = OomSettings()
        return cls(directory, settings)

    def state(self) -> dict[str, Any]:
        """The probe file's ``"oom"`` object."""
        with self._lock:
            snapshots = [dict(entry) for entry in self.snapshots]
        return {"recording": self.recording, "snapshots": snapshots, "error": self.error}

    # -- the probe's thread ---------------------------------------------------------------------
    def poll(self, torch: Any) -> None:
        """One publish round: start recording once CUDA is initialised (or refuse a torch without
        CUDA, once), and dump the snapshot ``SIGUSR2`` asked for. Never raises."""
        if self._closed or torch is None or os.getpid() != self.pid:
            return
        try:
            if not self.recording and self.error is None:
                self._try_start(torch)
        except Exception as exc:
            self._fail(f"recording not started: {type(exc).__name__}: {exc}")
            self._stop_history()
        if self._signalled:
            self._signalled = False
            if self.recording:
                self.dump("signal")
            else:
                why = self.error or "recording has not started (CUDA not used yet)"
                _say(f"SIGUSR2: no allocator snapshot: {why}")

    def _try_start(self, torch: Any) -> None:
        problem = cuda_build_problem(torch)
        if problem is not None:
            self.error = problem
            _say(f"out-of-memory recording refused: {problem}")
            return
        if not torch.cuda.is_initialized():
            return  # the script has not used CUDA yet: the probe never initialises it
        self._torch = torch
        if not self._history_on(torch):
            torch.cuda.memory._record_memory_history(
                enabled="all", context="alloc", stacks="python", max_entries=self.settings.entries
            )
            self._started_history = True
        _attach(torch, self)
        self.recording = True

    @staticmethod
    def _history_on(torch: Any) -> bool:
        """Whether the script turned the history on itself (then it is left as it was set)."""
        enabled = getattr(torch._C, "_cuda_isHistoryEnabled", None)
        return bool(enabled()) if callable(enabled) else False

    # -- the training thread, inside the allocator's out-of-memory path ---------------------------
    def on_oom(self, device: int, alloc: int, device_limit: int, device_free: int) -> None:
        """Dump a snapshot before the ``OutOfMemoryError`` unwinds the stack (the allocator's
        arguments: the device, the bytes requested, the device's total or allowed maximum, the
        bytes free). Never raises."""
        if self._closed or not self.recording or os.getpid() != self.pid:
            return
        try:
            self._limits = {"device": device, "limit": device_limit, "free": device_free}
            entry = self.dump("oom", announce=False)
            if entry is not None:
                _say(
                    f"CUDA out of memory on device {device} ({_mib(alloc)} requested,"
                    f" {_mib(device_free)} free of {_mib(device_limit)}):"
                    f" allocator snapshot in {entry['path']}"
                    f" (read it with: hwdash oom {entry['path']})"
                )
        except Exception:  # dump() reports its own failures; nothing may reach the allocator
            pass

    # -- dumping -----------------------------------------------------------------------------
    def dump(self, reason: str, *, announce: bool = True) -> dict[str, Any] | None:
        """Pickle ``torch.cuda.memory._snapshot()`` to the next ``<pid>-oom-<n>.pickle`` and list
        it (``reason``: ``"oom"`` or ``"signal"``); the entry, or None when it failed (published
        as ``"error"``, said on stderr). Never raises."""
        try:
            snapshot = self._torch.cuda.memory._snapshot()
            limits, self._limits = self._limits, None
            if isinstance(snapshot, dict) and limits is not None:
                # What the observer knew and the snapshot does not hold: the device's total (or
                # the allowed maximum under a memory fraction), read back by hwdash oom.
                snapshot = {
                    **snapshot,
                    "hwdash": {
                        "device": int(limits["device"]),
                        "device_limit_bytes": int(limits["limit"]),
                        "device_free_bytes": int(limits["free"]),
                    },
                }
            entry = self._write(snapshot, reason)
        except Exception as exc:
            self._fail(f"{reason} snapshot not written: {type(exc).__name__}: {exc}")
            return None
        if announce:
            _say(
                f"allocator snapshot in {entry['path']} (read it with: hwdash oom {entry['path']})"
            )
        return entry

    def _write(self, snapshot: Any, reason: str) -> dict[str, Any]:
        name = snapshot_name(self.pid, _numbers.next())
        path = self.directory / name
        temporary = self.directory / f".{name}.tmp"
        private_dir(self.directory)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
        handle = os.open(temporary, flags | getattr(os, "O_CLOEXEC", 0), 0o600)
        try:
            if hasattr(os, "fchmod"):  # a leftover temporary file keeps its mode through O_TRUNC
                os.fchmod(handle, 0o600)
            with os.fdopen(handle, "wb") as out:
                handle = -1  # the file object closes it
                pickle.dump(snapshot, out)  # as torch.cuda.memory._dump_snapshot writes it
                size = out.tell()
            os.replace(temporary, path)
        except BaseException:
            if handle >= 0:
                os.close(handle)
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
        entry = {"path": str(path), "at": self._wall_clock(), "reason": reason, "bytes": size}
        with self._lock:
            self.snapshots.append(entry)
            dropped = self.snapshots[: -self.settings.keep]
            del self.snapshots[: -self.settings.keep]
        for old in dropped:
            with contextlib.suppress(OSError):
                os.unlink(old["path"])
        return entry

    def _fail(self, message: str) -> None:
        if self.error != message:
            _say(message)
        self.error = message

    # -- SIGUSR2 ----------------------------------------------------------------------------------
    def install_signal(self) -> bool:
        """Make ``SIGUSR2`` ask for a snapshot; only from the main thread (where Python runs
        signal handlers), chaining the handler that was there. A handler set outside Python
        (``signal.getsignal`` gives None) is left alone. Whether it was installed."""
        if not hasattr(signal, "SIGUSR2") or self._signal_installed:
            return False
        if threading.current_thread() is not threading.main_thread():
            return False
        previous = signal.getsignal(signal.SIGUSR2)
        if previous is None:
            return False
        try:
            signal.signal(signal.SIGUSR2, self._on_signal)
        except (ValueError, OSError):
            return False
        self._previous_signal, self._signal_installed = previous, True
        return True

    def _on_signal(self, signum: int, frame: Any) -> None:
        # A flag only: no I/O and no torch call inside a signal handler (the probe's thread dumps).
        self._signalled = True
        previous = self._previous_signal
        if callable(previous):
            previous(signum, frame)

    def _restore_signal(self) -> None:
        if not self._signal_installed or threading.current_thread() is not threading.main_thread():
            return
        with contextlib.suppress(ValueError, OSError, TypeError):
            if signal.getsignal(signal.SIGUSR2) == self._on_signal:  # nobody replaced it since
                signal.signal(signal.SIGUSR2, self._previous_signal)
        self._signal_installed = False

    # -- the end -----------------------------------------------------------------------------
    def close(self) -> None:
        """Stop: the observer reports to nobody, ``SIGUSR2`` gets its handler back (from the main
        thread), the history is turned off if this recorder turned it on. Never raises."""
        global _active
        if self._closed:
            return
        self._closed = True
        if _active is self:
            _active = None
        self._restore_signal()
        self._stop_history()
        self.recording = False

    def _stop_history(self) -> None:
        if self._started_history and self._torch is not None:
            self._started_history = False
            with contextlib.suppress(Exception):
                self._torch.cuda.memory._record_memory_history(enabled=None)
