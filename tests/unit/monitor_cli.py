"""Running ``hwdash monitor`` and ``hwdash plan`` in-process for the command-line tests."""

from __future__ import annotations

import pytest

from hwdash.cli import main


def run_monitor(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``hwdash monitor ARGS``: the exit status, standard output and standard error."""
    status = main(["monitor", *args])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def run_plan(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``hwdash plan ARGS``: the exit status, standard output and standard error."""
    status = main(["plan", *args])
    captured = capsys.readouterr()
    return status, captured.out, captured.err
