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

**Progress.** The training loop calls :func:`step` once per optimizer step
(``hwdash.probe.step(tokens=N)``; also ``samples=``, ``sequences=``, ``estimated=True`` when the
tokens are a batch x length estimate, ``step=`` to give the step number). The file's ``"run"``
object then says the step, the tokens so far, ``tokens_per_s`` and ``step_time_s`` over the last
minute, and the time of the first and last step. **Tokens per second rule**: over the steps that
ended in the 60 s up to the latest step (at least its last 3 steps), leaving out steps longer than
5 times the window's median step duration (a checkpoint save, an evaluation), the tokens of the kept
steps divided by the sum of their durations; ``step_time_s`` is the median step duration. See
:mod:`hwdash.probe.progress`. A step costs a monotonic clock read, integer additions and a bounded
deque append under a lock that the publishing thread holds only to copy the counters.

**Plan and totals.** ``start(plan="name or path", max_steps=..., total_tokens=...)``, the
``HWDASH_PLAN`` environment variable (the default plan), ``python -m hwdash.probe --plan ...`` and
:func:`set_total` say what the run is measured against (``"plan"``, ``"max_steps"``,
``"total_tokens"`` in the ``"run"`` object).

**Energy.** The probe reads NVML's total energy counter of its GPUs (the ones ``read_torch`` lists)
through :class:`hwdash.telemetry.nvml_energy.EnergyMeter`, keeps each GPU's counter from when it
first saw it, and publishes ``energy_j``: the joules its GPUs used since (the whole GPU's counter:
another process on the same GPU is counted too). NVML never initialises CUDA; a missing driver or
counter gives null.

**End of run.** On :func:`stop` or at exit, the process that started the probe (never a forked
DataLoader worker) builds :meth:`Probe.final_record` once and hands it to the runs ledger
(``hwdash.runs.recorder.record_run``); a run that never stepped and never used CUDA is not recorded.
Its ``exit`` is ``"oom"`` when the allocator counted an out-of-memory error or the process died of
``OutOfMemoryError``, ``"error"`` for another uncaught exception, else ``"normal"``.

**Why it ran out of memory.** ``start(record_oom=True)`` (or ``HWDASH_RECORD_OOM=1``, or
``python -m hwdash.probe --record-oom``) records the caching allocator's history once the script
has initialised CUDA, and dumps a snapshot to the probe folder on an out-of-memory error and on
``SIGUSR2``; the file's ``"oom"`` object lists them. See :mod:`hwdash.probe.oom`.
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

from hwdash.probe.oom import OomRecorder
from hwdash.probe.oom import requested as oom_requested
from hwdash.probe.progress import Progress, ProgressSnapshot
from hwdash.probe.record import (
    RECORD_KEYS,
    RECORD_VERSION,
    command_line,
    exit_kind,
    gpus_of,
    hand_to_ledger,
    host_and_user,
    run_id,
)
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
    "looks_like_path",
    "plan_reference",
    "private_dir",
    "probe_dir",
    "process_start_ticks",
    "read_torch",
    "set_step",
    "set_total",
    "start",
    "step",
    "stop",
]

PLAN_ENV = "HWDASH_PLAN"
"""The environment variable that names the run's plan when ``start()`` is given none."""


def world_size(environ: Mapping[str, str] | None = None) -> int | None:
    """The job's process count as torchrun, accelerate and DeepSpeed's launcher set it
    (``WORLD_SIZE``); None for a single process or a value that is not a positive number."""
    text = (os.environ if environ is None else environ).get("WORLD_SIZE", "").strip()
    return int(text) if text.isdigit() and 0 < int(text) <= 1_000_000 else None


def plan_reference(plan: str | os.PathLike[str] | None) -> str | None:
    """A plan reference as the probe publishes it: a saved plan's name as given, a plan file's
    path made absolute (a reference with a folder separator or a ``.json``/``.toml`` ending is a
    path), None for nothing or blanks."""
    if plan is None:
        return None
    text = os.fspath(plan).strip()
    if not text:
        return None
    if looks_like_path(text):
        return os.path.abspath(os.path.expanduser(text))
    return text


def looks_like_path(text: str) -> bool:
    """Whether a plan reference names a file rather than a saved plan."""
    return os.sep in text or "/" in text or text.lower().endswith((".json", ".toml"))


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
    """Publishes this process's allocator numbers and its run's progress every ``interval_s``
    seconds, and records the run at its end (see the module)."""

    def __init__(
        self,
        interval_s: float = DEFAULT_INTERVAL_S,
        directory: Path | None = None,
        *,
        torch_module: Callable[[], Any] | None = None,
        plan: str | os.PathLike[str] | None = None,
        max_steps: int | None = None,
        total_tokens: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        nvml: Any = None,
        record_oom: bool = False,
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
        """The training step when something gives it (``set_step``, ``step(step=N)``, the
        Trainer callback); else the run's step is the number of ``step()`` calls."""
        self.last_error: str | None = None
        """Why the last round failed (published in the file; never raised in the training process)."""
        self.rounds = 0
        self._torch = torch_module or (lambda: sys.modules.get("torch"))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._publishing = threading.Lock()
        """One publish at a time: the thread and a caller share the temporary file."""
        self._start_ticks = process_start_ticks()
        self._clock, self._wall_clock = clock, wall_clock
        self.progress = Progress(clock)
        self.plan = plan_reference(plan if plan is not None else os.environ.get(PLAN_ENV))
        self.max_steps = None if max_steps is None else int(max_steps)
        self.total_tokens = None if total_tokens is None else int(total_tokens)
        self.started_at = wall_clock()
        self._started_mono = clock()
        self.command = command_line()
        self._run = _RunDevices(nvml)
        self._uncaught: type[BaseException] | None = None
        self._previous_hook: Any = None
        self._recorded = False
        self._record_lock = threading.Lock()
        self.oom: OomRecorder | None = OomRecorder.from_env(self.directory) if record_oom else None
        """The out-of-memory recorder (:mod:`hwdash.probe.oom`); None when not asked for."""

    # -- progress ---------------------------------------------------------------------------
    def record_step(
        self,
        tokens: int | None = None,
        samples: int | None = None,
        sequences: int | None = None,
        estimated: bool = False,
        step: int | None = None,
    ) -> None:
        """Count one optimizer step (what :func:`hwdash.probe.step` calls)."""
        if step is not None:
            self.step = int(step)
        self.progress.step(tokens, samples, sequences, estimated)

    def _wall(self, monotonic: float | None) -> float | None:
        return None if monotonic is None else self.started_at + (monotonic - self._started_mono)

    def _run_step(self, progress: ProgressSnapshot) -> int | None:
        if self.step is not None:
            return self.step
        return progress.steps or None

    def run_object(self, progress: ProgressSnapshot | None = None) -> dict[str, Any]:
        """The ``"run"`` object of the probe file (the issue-26 spec's keys)."""
        progress = progress or self.progress.snapshot()
        return {
            "started_at": self.started_at,
            "command": self.command,
            "plan": self.plan,
            "step": self._run_step(progress),
            "tokens": progress.tokens,
            "samples": progress.samples,
            "sequences": progress.sequences,
            "tokens_estimated": progress.tokens_estimated,
            "tokens_per_s": progress.tokens_per_s,
            "step_time_s": progress.step_time_s,
            "first_step_at": self._wall(progress.first_step_at),
            "last_step_at": self._wall(progress.last_step_at),
            "max_steps": self.max_steps,
            "total_tokens": self.total_tokens,
            "energy_j": self._run.energy_j(),
            "world_size": world_size(),
            "exit": None,
        }

    # -- publishing -------------------------------------------------------------------------
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
        if cuda == "ready":
            self._run.saw(devices)
        if self.oom is not None:
            self.oom.poll(torch)
        run = self.run_object()
        reading = {
            "format": FORMAT,
            "pid": self.pid,
            "start_ticks": self._start_ticks,
            "written_at": time.time(),
            "interval_s": self.interval_s,
            "cuda": cuda,
            "step": run["step"],
            "devices": devices,
            "error": error,
            "run": run,
        }
        if self.oom is not None:
            reading["oom"] = self.oom.state()
        return reading

    def publish(self, *, force: bool = True) -> None:
        """Write one reading, atomically (readers never see half a file). Without ``force`` an
        unchanged reading is written only every :data:`REWRITE_S` seconds (enough for readers to
        see the probe is alive; most seconds of a steady run then cost no file system call); the
        energy counter, which moves every second, does not count as a change.
        Safe to call while the probe's thread runs (one publish at a time)."""
        with self._publishing:
            self._publish(force)

    def _publish(self, force: bool) -> None:
        reading = self.reading()
        written_at = reading.pop("written_at")
        self.rounds += 1
        unchanged = dict(reading, run=dict(reading["run"], energy_j=None))
        if (
            not force
            and unchanged == self._last_reading
            and written_at - self._last_write < max(REWRITE_S, 2 * self.interval_s)
        ):
            return
        self._last_reading, self._last_write = unchanged, written_at
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

    # -- life cycle -------------------------------------------------------------------------
    def start(self) -> Probe:
        """Start the thread (once); the file is removed and the run recorded at exit."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=THREAD_NAME, daemon=True)
            self._thread.start()
            self._previous_hook = sys.excepthook
            sys.excepthook = self._excepthook
            atexit.register(self.stop)
            if self.oom is not None:
                self.oom.install_signal()
        return self

    def record_oom(self) -> None:
        """Start recording out-of-memory snapshots too (a running probe asked again)."""
        if self.oom is None:
            self.oom = OomRecorder.from_env(self.directory)
            if self._thread is not None:
                self.oom.install_signal()

    def _excepthook(self, kind: type[BaseException], value: BaseException, traceback: Any) -> None:
        self._uncaught = kind  # the run died of it: its exit kind
        (self._previous_hook or sys.__excepthook__)(kind, value, traceback)

    @property
    def alive(self) -> bool:
        """Whether the thread is running."""
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float = 1.0) -> None:
        """Stop publishing, record the run (once) and remove the file; only the process that
        started the probe does the last two (a forked child does neither)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread() and thread.is_alive():
            thread.join(timeout)
        if os.getpid() == self.pid:
            if self.oom is not None:
                self.oom.close()
            self._finish()
            for path in (self.path, self._temporary):
                with contextlib.suppress(OSError):
                    path.unlink()

    def _finish(self) -> None:
        """Record the run once: restore the exception hook, take a last reading, hand the record
        to the ledger. Never raises."""
        with self._record_lock:
            if self._recorded:
                return
            self._recorded = True
        try:
            if sys.excepthook == self._excepthook:
                sys.excepthook = self._previous_hook or sys.__excepthook__
            # The last allocator peaks and energy; skipped if the thread is stuck in a round
            # (a hung driver call) rather than hang the process's exit.
            if self._publishing.acquire(timeout=1.0):
                try:
                    self.reading()
                finally:
                    self._publishing.release()
            if self.progress.snapshot().steps == 0 and not self._run.devices:
                return  # imported, never trained: no run to remember
            hand_to_ledger(self.final_record(exit_kind(self._uncaught, self._run.ooms)))
        except Exception as exc:  # a finished run must not fail because of its record
            print(f"hwdash.probe: the run was not recorded: {exc}", file=sys.stderr)

    def final_record(self, exit: str) -> dict[str, Any]:
        """The raw ledger record of this run (the keys of :data:`RECORD_KEYS`; those the probe
        cannot know, such as MFU, cost and the planned peak, are None for the recorder to fill)."""
        progress = self.progress.snapshot()
        host, user = host_and_user()
        ended = self._wall_clock()
        mean_rate: float | None = None
        if progress.tokens is not None and progress.first_step_at is not None:
            stepping = (progress.last_step_at or 0.0) - progress.first_step_at
            mean_rate = progress.tokens_after_first / stepping if stepping > 0 else None
        energy_j = self._run.energy_j()
        record: dict[str, Any] = dict.fromkeys(RECORD_KEYS)
        record.update(
            version=RECORD_VERSION,
            id=run_id(host, self.pid, self.started_at),
            host=host,
            user=user,
            pid=self.pid,
            command=self.command,
            started=self.started_at,
            ended=ended,
            duration_s=ended - self.started_at,
            exit=exit,
            gpus=gpus_of(self._run.devices),
            plan=self.plan,
            steps=self._run_step(progress) or 0,
            tokens=progress.tokens,
            tokens_estimated=progress.tokens_estimated,
            samples=progress.samples,
            tokens_per_s=mean_rate,
            energy_kwh=None if energy_j is None else energy_j / 3.6e6,  # 1 kWh = 3.6 MJ
            measured_peak_bytes=self._run.peak("max_reserved_bytes"),
            measured_peak_allocated_bytes=self._run.peak("max_allocated_bytes"),
            world_size=world_size(),
        )
        if self.oom is not None and self.oom.snapshots:
            record["oom_snapshot"] = self.oom.snapshots[-1].get("path")
        return record

    def _loop(self) -> None:
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


class _RunDevices:
    """The GPUs a run used (as ``read_torch`` listed them), their peaks, OOM counts and energy."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self._meter: Any = None
        self.devices: dict[str, dict[str, Any]] = {}
        """Key (UUID, or the index when torch gives none) -> the latest reading of the device."""
        self._peaks: dict[str, dict[str, int]] = {}
        self.ooms = 0
        self._baseline: dict[str, int] = {}
        self._latest: dict[str, int] = {}

    def saw(self, devices: list[dict[str, Any]]) -> None:
        """Take one round's devices: peaks, OOMs, and the energy counters."""
        for device in devices:
            key = str(device.get("uuid") or f"index {device.get('index')}")
            self.devices[key] = device
            peaks = self._peaks.setdefault(key, {})
            for name in ("max_reserved_bytes", "max_allocated_bytes"):
                peaks[name] = max(peaks.get(name, 0), int(device.get(name) or 0))
            self.ooms = max(self.ooms, int(device.get("ooms") or 0))
        uuids = [str(device["uuid"]) for device in devices if device.get("uuid")]
        if uuids:
            self._read_energy(uuids)

    def _read_energy(self, uuids: list[str]) -> None:
        try:
            if self._meter is None:
                from hwdash.telemetry.nvml_energy import EnergyMeter

                self._meter = EnergyMeter(self._nvml)
            readings = self._meter.read(uuids)
        except Exception:  # EnergyMeter never raises; an import problem must not either
            return
        for uuid, millijoules in readings.items():
            if millijoules is None:
                continue
            self._baseline.setdefault(uuid, millijoules)
            self._latest[uuid] = millijoules

    def energy_j(self) -> float | None:
        """Joules the run's GPUs used since the probe first saw each (None: no counter)."""
        if not self._baseline:
            return None
        return sum(self._latest[uuid] - base for uuid, base in self._baseline.items()) / 1000

    def peak(self, name: str) -> int | None:
        """The largest ``name`` (an allocator peak) over the run's devices, None for none."""
        values = [peaks[name] for peaks in self._peaks.values() if name in peaks]
        return max(values) if values else None


_probe: Probe | None = None
_lock = threading.Lock()


def start(
    interval_s: float = DEFAULT_INTERVAL_S,
    directory: str | os.PathLike[str] | None = None,
    *,
    plan: str | os.PathLike[str] | None = None,
    max_steps: int | None = None,
    total_tokens: int | None = None,
    record_oom: bool = False,
) -> Probe:
    """Start this process's probe (a second call returns the running one, taking the ``plan``,
    ``max_steps``, ``total_tokens`` and ``record_oom`` it is given). ``plan`` defaults to
    ``$HWDASH_PLAN``; ``record_oom`` (out-of-memory snapshots, :mod:`hwdash.probe.oom`) is also
    turned on by ``HWDASH_RECORD_OOM=1``."""
    global _probe
    record_oom = record_oom or oom_requested()
    with _lock:
        if _probe is None or not _probe.alive or _probe.pid != os.getpid():
            _probe = Probe(
                interval_s,
                None if directory is None else Path(directory),
                plan=plan,
                max_steps=max_steps,
                total_tokens=total_tokens,
                record_oom=record_oom,
            ).start()
            return _probe
        if plan is not None:
            _probe.plan = plan_reference(plan)
        if record_oom:
            _probe.record_oom()
    set_total(max_steps, total_tokens)
    return _probe


def stop() -> None:
    """Stop the probe, record the run and remove the probe's file."""
    global _probe
    with _lock:
        if _probe is not None:
            _probe.stop()
            _probe = None


def step(
    tokens: int | None = None,
    *,
    samples: int | None = None,
    sequences: int | None = None,
    estimated: bool = False,
    step: int | None = None,
) -> None:
    """Count one optimizer step of the running probe (nothing when none runs): the ``tokens``,
    ``samples`` and ``sequences`` it consumed (on every rank together when they are known),
    ``estimated=True`` when the tokens are a batch x length estimate, ``step`` to give the step
    number instead of counting calls. Cheap: no I/O, see the module."""
    running = _probe
    if running is not None:  # Probe.record_step, inlined: one call frame less per step
        if step is not None:
            running.step = int(step)
        running.progress.step(tokens, samples, sequences, estimated)


def set_step(step: int | None) -> None:
    """Record the training step (published with the next reading, also as the run's step)."""
    if _probe is not None:
        _probe.step = None if step is None else int(step)


def set_total(max_steps: int | None = None, total_tokens: int | None = None) -> None:
    """Say how long the run is: its optimizer steps and/or tokens (None leaves a value as it is)."""
    running = _probe
    if running is not None:
        if max_steps is not None:
            running.max_steps = int(max_steps)
        if total_tokens is not None:
            running.total_tokens = int(total_tokens)


def _forget_in_child() -> None:
    # A forked child (a DataLoader worker) has no probe thread and must not remove the parent's file.
    global _probe
    _probe = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)
