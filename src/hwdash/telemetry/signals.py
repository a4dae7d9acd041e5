"""Sending SIGTERM or SIGKILL to a GPU process from the monitor, with the checks a shared box needs.

The dashboard asks for a confirmation naming the process first; this module decides whether the
signal may be sent at all and sends it:

* never to a PID that has exited although NVML still lists it (nothing is left to signal);
* never to a PID this monitor cannot see (another container or PID namespace: the same number is
  another process here);
* never to another user's process unless this monitor runs as root (the kernel would refuse too,
  but saying so beforehand is clearer than ``EPERM``);
* never to a process that is no longer the one shown (PIDs are reused): its start time, recorded
  when the row was sampled, must equal the start time of the process holding the PID now, and its
  command line must still match. Where the platform has pidfds (Linux 5.3+, Python 3.9+) the
  process is pinned first with ``os.pidfd_open`` and checked after: the signal then goes through
  that descriptor (``signal.pidfd_send_signal``) to the process checked, or to nobody if it has
  exited meanwhile; its number cannot be handed to another process in between. Elsewhere
  ``os.kill`` follows the same checks (a short window remains there);
* in a fake NVML scenario the processes are made up, so nothing is sent at all;
* ``--readonly`` turns the whole feature off.
"""

from __future__ import annotations

import errno
import os
import signal
from typing import Literal, Protocol

from hwdash.telemetry.types import ProcessSample

SignalName = Literal["TERM", "KILL"]


class SignalRefused(Exception):
    """The signal was not sent; the message says why, in words for the user."""


START_TIME_TOLERANCE_S = 0.01
"""How far two readings of one process's start time may differ. psutil gives the start time in
clock ticks since boot plus the boot time (psutil/_pslinux.py ``create_time``), so readings of the
same process agree; psutil's own PID-reuse check relies on the same 0.01 s precision on Linux
(``Process._get_ident`` in psutil/__init__.py). A process that took the PID of an exited one
started later than that."""


def current_user(euid: int | None = None) -> str | None:
    """The name of user ``euid`` (default: this monitor's effective user); None when the system
    cannot say."""
    try:
        import pwd

        return pwd.getpwuid(os.geteuid() if euid is None else euid).pw_name
    except (ImportError, KeyError, OSError):
        return None


def pidfd_available() -> bool:
    """Whether Python offers pidfds here (the kernel may still lack them: see OsSignaller)."""
    return hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal")


def refusal(process: ProcessSample, *, user: str | None, root: bool) -> str | None:
    """Why ``process`` may not be signalled from here, or None when it may."""
    if not process.verifiable:
        return f"PID {process.pid} is a host PID this container cannot check: no signal sent"
    if process.exited:
        return (
            f"PID {process.pid} has exited (gone from /proc); NVML still lists its memory: "
            "no signal to send"
        )
    if not process.visible:
        return f"PID {process.pid} is not visible from here (another container): no signal sent"
    if root:
        return None
    if process.user is None or user is None or process.user != user:
        owner = process.user or "an unknown user"
        return f"PID {process.pid} belongs to {owner}; only root may signal other users' processes"
    return None


class Signaller(Protocol):
    """Sends a signal to a process the user confirmed; raises :class:`SignalRefused`."""

    simulated: bool

    def send(self, process: ProcessSample, name: SignalName) -> str:
        """Send it; returns what to tell the user."""
        ...


class OsSignaller:
    """The real thing: the signal goes to the PID only while it is still the process shown.

    ``euid`` is the effective user the monitor runs as (default ``os.geteuid()``): user 0 is
    root, who may signal every user's processes; anyone else only their own. ``pidfd=False``
    sends with ``os.kill`` even where pidfds exist.
    """

    simulated = False

    def __init__(
        self,
        *,
        user: str | None = None,
        root: bool | None = None,
        euid: int | None = None,
        pidfd: bool | None = None,
    ) -> None:
        effective = os.geteuid() if euid is None else euid
        self.user = current_user(effective) if user is None else user
        self.root = (effective == 0) if root is None else root
        self.uses_pidfd = pidfd_available() if pidfd is None else (pidfd and pidfd_available())

    def send(self, process: ProcessSample, name: SignalName) -> str:
        reason = refusal(process, user=self.user, root=self.root)
        if reason is not None:
            raise SignalRefused(reason)
        if process.started_at is None:
            raise SignalRefused(
                f"cannot tell whether PID {process.pid} is still the process listed (its start "
                "time is unknown): no signal sent"
            )
        number = signal.SIGKILL if name == "KILL" else signal.SIGTERM
        pinned = self._pin(process.pid)
        try:
            # After pinning: the descriptor holds the process that had the PID when it was opened,
            # which is the one listed if the PID still belongs to it now (a PID is reused only
            # after its process ends, and the listed process is older than any reuse).
            self._check_identity(process)
            if pinned is not None:
                signal.pidfd_send_signal(pinned, number)
            else:
                os.kill(process.pid, number)
        except ProcessLookupError:
            raise SignalRefused(f"PID {process.pid} has already exited") from None
        except PermissionError:
            raise SignalRefused(f"not permitted to signal PID {process.pid}") from None
        finally:
            if pinned is not None:
                os.close(pinned)
        return f"SIG{name} sent to PID {process.pid}"

    def _pin(self, pid: int) -> int | None:
        """A pidfd for ``pid``, or None where pidfds are not available (then ``os.kill``)."""
        if not self.uses_pidfd:
            return None
        try:
            return os.pidfd_open(pid)
        except ProcessLookupError:
            raise SignalRefused(f"PID {pid} has already exited") from None
        except OSError as exc:
            if exc.errno in (errno.ENOSYS, errno.EPERM):
                # A kernel before 5.3 (ENOSYS), or a seccomp profile that forbids the call (Docker's
                # default answers EPERM for calls it does not know): send with os.kill instead.
                self.uses_pidfd = False
                return None
            raise SignalRefused(f"cannot open PID {pid}: {exc.strerror}") from None

    def _check_identity(self, process: ProcessSample) -> None:
        """Refuse unless the process holding the PID now is the one listed."""
        import psutil

        try:
            now = psutil.Process(process.pid)
            started_at = now.create_time()
        except psutil.NoSuchProcess:
            raise SignalRefused(f"PID {process.pid} has already exited") from None
        except psutil.AccessDenied:
            raise SignalRefused(
                f"cannot read when PID {process.pid} started, so cannot tell whether it is still "
                "the process listed: no signal sent"
            ) from None
        assert process.started_at is not None  # send() refused rows without one
        if abs(started_at - process.started_at) > START_TIME_TOLERANCE_S:
            raise SignalRefused(
                f"PID {process.pid} started at another time than the process listed (that "
                "process ended and its number was reused): no signal sent"
            )
        try:
            command: str | None = " ".join(now.cmdline())
        except psutil.NoSuchProcess:
            raise SignalRefused(f"PID {process.pid} has already exited") from None
        except psutil.AccessDenied:
            command = None
        if process.cmdline and command and command != process.cmdline:
            raise SignalRefused(
                f"PID {process.pid} now runs another command (the process ended and its number "
                "was reused): no signal sent"
            )


class SimulatedSignaller:
    """For fake NVML scenarios: the same checks, and nothing sent (the PIDs are made up, and the
    same numbers may be real processes on this machine)."""

    simulated = True

    def __init__(self, *, user: str | None = None, root: bool = True) -> None:
        self.user = user
        self.root = root
        self.sent: list[tuple[int, SignalName]] = []

    def send(self, process: ProcessSample, name: SignalName) -> str:
        reason = refusal(process, user=self.user, root=self.root)
        if reason is not None:
            raise SignalRefused(reason)
        self.sent.append((process.pid, name))
        return f"simulated: SIG{name} not sent to PID {process.pid} (a fake scenario's process)"
