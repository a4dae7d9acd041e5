"""Fixtures and hooks shared by every test folder."""

from __future__ import annotations

import os
from collections.abc import Generator

import pytest

REQUIRE_VALIDATE = "HWDASH_REQUIRE_VALIDATE"
"""Set to 1 (``.ci/run`` does, after installing the ``validate`` extra), a test marked
``validate`` that skips fails instead: the libraries it checks against must be there."""


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
