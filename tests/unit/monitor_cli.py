"""Running ``hwdash monitor`` in-process for the monitor's command-line tests."""

from __future__ import annotations

import pytest

from hwdash.cli import main


def run_monitor(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``hwdash monitor ARGS``: the exit status, standard output and standard error."""
    status = main(["monitor", *args])
    captured = capsys.readouterr()
    return status, captured.out, captured.err
