"""Probe tests never write to the user's runs ledger: ``HWDASH_RUNS`` points into the test's folder
(a probe records its run when it stops; subprocesses inherit the variable)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _private_runs_ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWDASH_RUNS", str(tmp_path / "runs.jsonl"))
    monkeypatch.delenv("HWDASH_PLAN", raising=False)
