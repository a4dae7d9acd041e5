"""Fixtures and hooks shared by every test folder."""

from __future__ import annotations

import os
from collections.abc import Generator

import pytest

REQUIRE_VALIDATE = "HWDASH_REQUIRE_VALIDATE"
"""Set to 1 (``.ci/run`` does, after installing the ``validate`` extra), a test marked
``validate`` that skips fails instead: the libraries it checks against must be there."""


@pytest.fixture(autouse=True)
def _private_state(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No test reads or writes the user's runs ledger (``hwdash plan`` reads it, a probe that stops
    and a monitor that clears a dead run's probe file write it; subprocesses inherit this)."""
    monkeypatch.setenv("HWDASH_RUNS", str(tmp_path_factory.mktemp("ledger") / "runs.jsonl"))
    # No test records into (or reports from) the user's history ring or alert log: a monitor on
    # the real NVML records by default (hwdash.telemetry.history_ring).
    state = tmp_path_factory.mktemp("state")
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    monkeypatch.setenv("HWDASH_HISTORY_DIR", str(state / "hwdash" / "history"))
    # HWDASH_WEBHOOK: no test posts the alerts of its fake GPUs to the user's chat.
    for name in ("HWDASH_PLAN", "HWDASH_PRICE", "HWDASH_WEBHOOK"):
        monkeypatch.delenv(name, raising=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    required = os.environ.get(REQUIRE_VALIDATE) == "1"
    if (
        required
        and report.skipped
        and not hasattr(report, "wasxfail")  # an expected failure is reported as a skip too
        and item.get_closest_marker("validate") is not None
    ):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = (
            f"{reason}\n{REQUIRE_VALIDATE}=1 and this test skipped: install the validate extra "
            "(pip install -e '.[validate]')"
        )
    return report
