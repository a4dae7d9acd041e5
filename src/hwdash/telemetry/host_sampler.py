"""The host sampler (psutil): CPU, load, RAM, swap, and what the host knows about each GPU process.

CPU percentages use psutil's non-blocking form (``interval=None``), which measures since the previous
call: the sampler primes the counters when it is built, so the first real sample already means
something, and it never sleeps. Per-process CPU works the same way, which is why ``psutil.Process``
objects are kept between rounds (a new PID reads ``None`` for CPU on its first round).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

import psutil

from hwdash.telemetry.containers import container_of
from hwdash.telemetry.types import HostSample


@dataclass(frozen=True)
class HostProcessInfo:
    """What the host knows about one PID."""

    visible: bool
    """False when the host cannot see the PID (it runs in another container or PID namespace, or
    it has exited)."""
    exited: bool = False
    """The PID has exited: no process holds it here (or only a zombie, awaiting its parent)."""
    name: str | None = None
    user: str | None = None
    cmdline: str | None = None
    cpu_percent: float | None = None
    """Percent of one core since the previous round; None on the first round of a PID."""
    rss_bytes: int | None = None
    container: str | None = None
    """The container the process runs in (see :mod:`hwdash.telemetry.containers`)."""
    started_at: float | None = None
    """psutil's ``create_time`` (seconds since the epoch): with the PID, which process this is."""


INVISIBLE = HostProcessInfo(visible=False)
EXITED = HostProcessInfo(visible=False, exited=True)
T = TypeVar("T")

INITIAL_PID_NAMESPACE_INODE = 0xEFFFFFFC
"""Inode number of the kernel's first PID namespace (``PROC_PID_INIT_INO`` in the kernel's
include/linux/proc_ns.h, fixed since Linux 3.8): ``/proc/self/ns/pid`` links to ``pid:[4026531836]``
on the host and in containers started with the host's PID namespace (``--pid=host``)."""


def in_host_pid_namespace(proc_root: str | os.PathLike[str] = "/proc") -> bool:
    """Whether this process shares the host's PID namespace, where NVML's PIDs mean what they say.

    NVML reports host PIDs; in a container with its own PID namespace the same numbers name other,
    unrelated processes (or none). When the link cannot be read (not Linux, a locked-down /proc)
    the answer is True: nothing is known to be wrong.
    """
    try:
        link = os.readlink(os.path.join(proc_root, "self", "ns", "pid"))
    except OSError:
        return True
    inode = link.rpartition("[")[2].rstrip("]")
    return not inode.isdigit() or int(inode) == INITIAL_PID_NAMESPACE_INODE


class ProcessTable(Protocol):
    """Looks up GPU PIDs on the host."""

    def lookup(self, pids: set[int]) -> dict[int, HostProcessInfo]:
        """Information for each PID; PIDs the host cannot see map to ``visible=False``."""
        ...


class PsutilProcessTable:
    """The real host view of PIDs, through psutil."""

    def __init__(self, proc_root: str = "/proc") -> None:
        self._processes: dict[int, psutil.Process] = {}
        self._containers: dict[int, str | None] = {}
        """Each PID's container, read once (a process does not change container)."""
        self._proc_root = proc_root

    def _read(self, pid: int) -> HostProcessInfo:
        process = self._processes.get(pid)
        first_round = False
        if process is None or not process.is_running():  # is_running also catches PID reuse
            try:
                process = psutil.Process(pid)
            except psutil.ZombieProcess:
                self._processes.pop(pid, None)
                return EXITED
            except psutil.NoSuchProcess:
                self._processes.pop(pid, None)
                return EXITED if not _pid_exists(pid) else INVISIBLE
            except psutil.AccessDenied:
                return HostProcessInfo(visible=True)
            self._processes[pid] = process
            first_round = True
        try:
            with process.oneshot():
                name = _quietly(process.name)
                user = _quietly(process.username)
                arguments = _quietly(process.cmdline)
                memory = _quietly(process.memory_info)
                cpu = _quietly(lambda: process.cpu_percent(interval=None))
                started_at = _quietly(process.create_time)
                status = _quietly(process.status)
        except psutil.NoSuchProcess:
            self._processes.pop(pid, None)
            return EXITED if not _pid_exists(pid) else INVISIBLE
        if status == psutil.STATUS_ZOMBIE:
            # Exited, not yet reaped by its parent: nothing left to show or signal.
            self._processes.pop(pid, None)
            return EXITED
        if first_round or pid not in self._containers:
            found = container_of(pid, self._proc_root)
            self._containers[pid] = None if found is None else found.short
        return HostProcessInfo(
            visible=True,
            name=name,
            user=user,
            cmdline=" ".join(arguments) if arguments else None,
            cpu_percent=None if first_round or cpu is None else float(cpu),
            rss_bytes=None if memory is None else int(memory.rss),
            container=self._containers[pid],
            started_at=started_at,
        )

    def lookup(self, pids: set[int]) -> dict[int, HostProcessInfo]:
        for gone in set(self._processes) - pids:
            del self._processes[gone]
            self._containers.pop(gone, None)
        return {pid: self._read(pid) for pid in pids}


def _pid_exists(pid: int) -> bool:
    """Whether a process holds ``pid`` in this PID namespace, even one whose ``/proc`` entry is
    hidden from us (``hidepid``): signal 0 checks without sending anything (kill(2): ESRCH when no
    process has the PID, EPERM when one does that we may not signal)."""
    if os.name != "posix":
        # Windows' os.kill terminates the process whatever the signal number: ask psutil.
        return bool(psutil.pid_exists(pid))
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # EPERM: it exists; anything else: nothing known to be wrong
    return True


def _quietly(read: Callable[[], T]) -> T | None:
    """Call a psutil getter; AccessDenied gives None (NoSuchProcess propagates)."""
    try:
        return read()
    except (psutil.AccessDenied, psutil.ZombieProcess):
        return None


class HostSampler:
    """CPU, load, memory and swap of this machine, plus a process table for GPU PIDs."""

    MIN_CPU_WINDOW_S = 0.1
    """CPU percentages over a shorter window than this are noise (the kernel counts in 10 ms
    ticks): such a reading is left unknown rather than shown as 0% or 100%."""

    def __init__(self, process_table: ProcessTable | None = None) -> None:
        self.process_table: ProcessTable = process_table or PsutilProcessTable()
        psutil.cpu_percent(interval=None)  # prime: the next call measures from here
        psutil.cpu_percent(interval=None, percpu=True)
        self._cpu_since = time.monotonic()

    def sample(self) -> HostSample:
        """One reading; never blocks."""
        now = time.monotonic()
        window = now - self._cpu_since
        self._cpu_since = now
        overall: float | None = psutil.cpu_percent(interval=None)
        per_core = psutil.cpu_percent(interval=None, percpu=True)
        if window < self.MIN_CPU_WINDOW_S:
            overall, per_core = None, []
        try:
            load: tuple[float, float, float] | None = os.getloadavg()
        except (OSError, AttributeError):  # Windows without psutil's emulation
            load = None
        memory = psutil.virtual_memory()
        swap = psutil.swap_memory()
        return HostSample(
            cpu_percent=None if overall is None else float(overall),
            per_cpu_percent=tuple(float(value) for value in per_core),
            load_average=load,
            ram_total_bytes=int(memory.total),
            ram_used_bytes=int(memory.total - memory.available),
            ram_available_bytes=int(memory.available),
            swap_total_bytes=int(swap.total),
            swap_used_bytes=int(swap.used),
        )

    def processes(self, pids: set[int]) -> dict[int, HostProcessInfo]:
        """Host information for GPU PIDs."""
        return self.process_table.lookup(pids)
