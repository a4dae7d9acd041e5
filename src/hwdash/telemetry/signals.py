"""Sending SIGTERM or SIGKILL to a GPU process from the monitor, with the checks a shared box needs.

The dashboard asks for a confirmation naming the process first; this module decides whether the
signal may be sent at all and sends it:

* never to a PID this monitor cannot see (another container or PID namespace: the same number is
  another process here);
* never to another user's process unless this monitor runs as root (the kernel would refuse too,
  but saying so beforehand is clearer than ``EPERM``);
* never to a process that is no longer the one shown: the PID is looked up again just before the
  signal and its command line must still match (PIDs are reused);
* in a fake NVML scenario the processes are made up, so nothing is sent at all;
* ``--readonly`` turns the whole feature off.
"""

from __future__ import annotations

import os
import signal
from typing import Literal, Protocol

from hwdash.telemetry.types import ProcessSample

SignalName = Literal["TERM", "KILL"]


class SignalRefused(Exception):
    """The signal was not sent; the message says why, in words for the user."""


def current_user() -> str | None:
    """This monitor's user name (None when the system cannot say)."""
    try:
        import pwd

        return pwd.getpwuid(os.geteuid()).pw_name
    except (ImportError, KeyError, OSError):
        return None


def refusal(process: ProcessSample, *, user: str | None, root: bool) -> str | None:
    """Why ``process`` may not be signalled from here, or None when it may."""
    if not process.verifiable:
        return f"PID {process.pid} is a host PID this container cannot check: no signal sent"
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
    """The real thing: ``os.kill`` after checking the PID is still the process shown."""

    simulated = False

    def __init__(self, *, user: str | None = None, root: bool | None = None) -> None:
        self.user = current_user() if user is None else user
        self.root = (os.geteuid() == 0) if root is None else root

    def send(self, process: ProcessSample, name: SignalName) -> str:
        reason = refusal(process, user=self.user, root=self.root)
        if reason is not None:
            raise SignalRefused(reason)
        import psutil

        try:
            now = psutil.Process(process.pid)
            command = " ".join(now.cmdline())
        except psutil.NoSuchProcess:
            raise SignalRefused(f"PID {process.pid} has already exited") from None
        except psutil.AccessDenied:
            command = None
        if process.cmdline and command is not None and command != process.cmdline:
            raise SignalRefused(
                f"PID {process.pid} now runs another command (the process ended and its number "
                "was reused): no signal sent"
            )
        number = signal.SIGKILL if name == "KILL" else signal.SIGTERM
        try:
            os.kill(process.pid, number)
        except ProcessLookupError:
            raise SignalRefused(f"PID {process.pid} has already exited") from None
        except PermissionError:
            raise SignalRefused(f"not permitted to signal PID {process.pid}") from None
        return f"SIG{name} sent to PID {process.pid}"


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
