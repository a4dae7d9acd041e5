"""The real signaller on children this test starts (``sleep``): never the test runner itself."""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
from collections.abc import Iterator

import psutil
import pytest

from hwdash.telemetry.host_sampler import PsutilProcessTable
from hwdash.telemetry.signals import OsSignaller, SignalRefused
from hwdash.telemetry.system_sampler import _join
from hwdash.telemetry.types import ProcessSample

ME = os.geteuid()
OTHER_UID = 65534 if ME != 65534 else 65533
"""A uid that is neither root nor this test's user (``nobody`` on most systems)."""
PIDFD = hasattr(os, "pidfd_open") and hasattr(signal, "pidfd_send_signal")


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    """A sleeping child; killed and reaped at the end whatever the test did."""
    process = subprocess.Popen(["sleep", "60"])
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)


def listed(child: subprocess.Popen[bytes]) -> ProcessSample:
    """The child as the monitor lists it: NVML's row joined with the real host process table."""
    row = ProcessSample(pid=child.pid, gpu_index=0, kind="compute", used_bytes=1)
    return _join(row, PsutilProcessTable().lookup({child.pid})[child.pid])


def signalled_by(child: subprocess.Popen[bytes]) -> int | None:
    """The signal that ended the child (None: still running after a short wait)."""
    try:
        code = child.wait(5)
    except subprocess.TimeoutExpired:
        return None
    return -code if code < 0 else None


def test_a_row_records_when_its_process_started(child: subprocess.Popen[bytes]) -> None:
    row = listed(child)
    assert row.started_at == psutil.Process(child.pid).create_time()
    assert row.started_at is not None and row.started_at > psutil.boot_time()


@pytest.mark.parametrize(("name", "number"), [("TERM", signal.SIGTERM), ("KILL", signal.SIGKILL)])
def test_the_named_signal_reaches_the_listed_child(
    child: subprocess.Popen[bytes], name: str, number: int
) -> None:
    message = OsSignaller(euid=ME).send(listed(child), name)  # type: ignore[arg-type]
    assert message == f"SIG{name} sent to PID {child.pid}"
    assert signalled_by(child) == number


def test_a_reused_pid_is_refused_by_its_start_time(child: subprocess.Popen[bytes]) -> None:
    """The row says the process started 5 s later than the one now holding the PID (same command
    line, same user): the PID was reused, so nothing is sent."""
    row = listed(child)
    assert row.started_at is not None
    for wrong in (row.started_at + 5.0, row.started_at - 5.0):
        reused = ProcessSample(**{**row.__dict__, "started_at": wrong})
        with pytest.raises(SignalRefused, match="started at another time"):
            OsSignaller(euid=ME).send(reused, "KILL")
    assert child.poll() is None  # still running: no signal reached it


def test_a_row_without_a_start_time_is_not_signalled(child: subprocess.Popen[bytes]) -> None:
    unknown = ProcessSample(**{**listed(child).__dict__, "started_at": None})
    with pytest.raises(SignalRefused, match="cannot tell whether PID"):
        OsSignaller(euid=ME).send(unknown, "TERM")
    assert child.poll() is None


def test_an_exited_child_is_refused(child: subprocess.Popen[bytes]) -> None:
    row = listed(child)
    child.kill()
    child.wait(10)  # reaped: the PID is free
    with pytest.raises(SignalRefused, match="has already exited"):
        OsSignaller(euid=ME).send(row, "TERM")


def test_root_is_decided_from_the_effective_uid(child: subprocess.Popen[bytes]) -> None:
    """Another user's process: refused for a user who is not root, sent for root (uid 0)."""
    row = listed(child)  # owned by this test's user
    assert row.user == pwd.getpwuid(ME).pw_name
    default = OsSignaller()
    assert (default.user, default.root) == (pwd.getpwuid(ME).pw_name, ME == 0)
    someone = OsSignaller(euid=OTHER_UID)
    assert not someone.root
    with pytest.raises(SignalRefused, match="only root may signal other users' processes"):
        someone.send(row, "KILL")
    assert child.poll() is None
    root = OsSignaller(euid=0)
    assert (root.user, root.root) == ("root", True)
    if row.user != "root":  # root may signal another user's process (here: this test's own)
        root.send(row, "TERM")
        assert signalled_by(child) == signal.SIGTERM


PATHS = [
    pytest.param(True, id="pidfd", marks=pytest.mark.skipif(not PIDFD, reason="no pidfd here")),
    pytest.param(False, id="os.kill"),
]


@pytest.mark.parametrize("pidfd", PATHS)
def test_both_ways_of_sending_check_the_start_time(
    child: subprocess.Popen[bytes], pidfd: bool
) -> None:
    row = listed(child)
    assert row.started_at is not None
    signaller = OsSignaller(euid=ME, pidfd=pidfd)
    assert signaller.uses_pidfd is pidfd
    reused = ProcessSample(**{**row.__dict__, "started_at": row.started_at + 1.0})
    with pytest.raises(SignalRefused, match="started at another time"):
        signaller.send(reused, "KILL")
    assert child.poll() is None
    signaller.send(row, "TERM")
    assert signalled_by(child) == signal.SIGTERM
