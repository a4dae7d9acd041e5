"""The dashboard quits when its terminal goes away instead of spinning on end-of-file.

Textual's input thread reads end-of-file in a loop once the other end of the terminal is closed
(a dropped SSH link, a closed tmux pane, without a SIGHUP reaching us): before the check, hwdash
stayed alive at a full core forever.
"""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from hwdash.ui.app import TERMINAL_HUNG_UP_EXIT
from hwdash.ui.screen_diff import terminal_hung_up

HWDASH = Path(sys.executable).parent / "hwdash"


def test_a_terminal_is_hung_up_only_once_its_other_end_is_closed() -> None:
    master, slave = pty.openpty()
    try:
        assert not terminal_hung_up(slave)
        os.write(master, b"x")  # input waiting is not a hang-up
        assert not terminal_hung_up(slave)
        os.close(master)
        assert terminal_hung_up(slave)
    finally:
        os.close(slave)


def test_a_closed_descriptor_counts_as_gone() -> None:
    read_end, write_end = os.pipe()
    os.close(write_end)
    os.close(read_end)
    assert terminal_hung_up(read_end)


@pytest.mark.skipif(not HWDASH.exists(), reason="hwdash is not installed in this environment")
@pytest.mark.parametrize("tab", ["monitor", "planner"])
def test_the_dashboard_exits_when_its_terminal_is_closed(tmp_path: Path, tab: str) -> None:
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    env = dict(
        os.environ,
        TERM="xterm-256color",
        XDG_STATE_HOME=str(tmp_path),
        XDG_DATA_HOME=str(tmp_path),
    )
    child = subprocess.Popen(
        [str(HWDASH), "--fake-nvml", "a100x8-sawtooth", "--tab", tab, "--no-bell"],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        start_new_session=True,  # no controlling terminal: closing it sends no SIGHUP
    )
    os.close(slave)
    try:
        seen = b""
        deadline = time.monotonic() + 30
        while b"Monitor" not in seen and time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                seen += os.read(master, 65536)
        assert b"Monitor" in seen, "the dashboard never drew its tabs"
        os.close(master)
        master = -1
        assert child.wait(15) == TERMINAL_HUNG_UP_EXIT
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        if master >= 0:
            os.close(master)
