"""hwdash.core and hwdash.telemetry never import Textual (checked in a fresh interpreter)."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import hwdash.core
import hwdash.telemetry


def _modules(package: object) -> list[str]:
    """The package and every module under it, sub-packages included."""
    name = package.__name__  # type: ignore[attr-defined]
    path = package.__path__  # type: ignore[attr-defined]
    return [name] + [info.name for info in pkgutil.walk_packages(path, prefix=name + ".")]


def test_core_and_telemetry_do_not_import_textual() -> None:
    modules = _modules(hwdash.core) + _modules(hwdash.telemetry) + ["hwdash.commands.monitor"]
    assert "hwdash.telemetry.nvml_sampler" in modules and "hwdash.core.live.alerts" in modules
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "leaked = sorted(m for m in sys.modules if m == 'textual' or m.startswith('textual.'))\n"
        "print(','.join(leaked))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == ""


def test_core_does_not_import_telemetry() -> None:
    code = (
        "import importlib, pkgutil, sys, hwdash.core\n"
        "for info in pkgutil.walk_packages(hwdash.core.__path__, prefix='hwdash.core.'):\n"
        "    importlib.import_module(info.name)\n"
        "print(','.join(sorted(m for m in sys.modules if m.startswith('hwdash.telemetry'))))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == ""


def test_a_training_box_starts_the_monitor_without_the_planner_or_the_fake() -> None:
    """The dashboard opened on the monitor and `hwdash monitor` need neither pydantic (the planner's
    and the scenarios' models) nor the fake NVML until something asks for them."""
    code = (
        "import os, sys\n"
        "os.environ.pop('HWDASH_FAKE_NVML', None)\n"
        "from hwdash.cli import build_parser\n"
        "build_parser('dashboard').parse_args([])\n"
        "build_parser('monitor').parse_args(['monitor', '--once'])\n"
        "import hwdash.commands.dashboard, hwdash.ui.app\n"
        "from hwdash.telemetry.source import make_sampler\n"
        "make_sampler().close()\n"
        "heavy = ('pydantic', 'hwdash.telemetry.fake_nvml', 'hwdash.core.catalog',\n"
        "         'hwdash.ui.planner_pane', 'hwdash.ui.compare_pane')\n"
        "print(','.join(sorted(m for m in sys.modules if m in heavy)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == ""
