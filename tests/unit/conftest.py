"""Fixtures shared by the unit tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No user catalog or plans file from the machine running the tests, and a terminal wide
    enough that rich never folds a line a test reads."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.delenv("HWDASH_CATALOG", raising=False)
    monkeypatch.setenv("COLUMNS", "160")


@pytest.fixture
def private_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A state folder of the test's own (alert logs, the process-name memory) and no fake NVML
    scenario from the environment; the folder's path."""
    state = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    monkeypatch.delenv("HWDASH_FAKE_NVML", raising=False)
    return state


@pytest.fixture
def quiet_machine(isolated_home: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """No GPU on "this machine" (the fake NVML's no-driver scenario), and no user catalog, plans
    or data folder from the machine running the tests."""
    monkeypatch.setenv("HWDASH_FAKE_NVML", "no-driver")
