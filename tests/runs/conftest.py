"""Fixtures of the runs ledger tests: a state folder of the test's own and realistic records."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``$XDG_STATE_HOME`` of the test's own, no ``HWDASH_RUNS``: the ledger is
    ``<state>/hwdash/runs.jsonl`` and the alert log ``<state>/hwdash/alerts.jsonl``."""
    folder = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(folder))
    monkeypatch.delenv("HWDASH_RUNS", raising=False)
    monkeypatch.setenv("COLUMNS", "200")
    return folder
