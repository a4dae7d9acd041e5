"""The monitor's first full frame comes before the planner's dependencies (issue 28, "Start and
footprint"): ``hwdash monitor`` and the dashboard opened on the monitor draw the GPUs and their
processes without pydantic, the catalog, the estimator or the planning code (nor the HTTP client of
``--webhook``, not asked for). The dashboard builds
its planner (and loads them) when the planner tab is first shown, which then works as ever.

Each check runs in a fresh interpreter (``sys.modules`` of this one has everything) on a compiled
scenario, which the fake reads without pydantic, as a real box runs without the fake's models.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hwdash.telemetry.fake_scenario import compile_scenario, load_scenario

PLANNER_MODULES = (
    "pydantic",
    "hwdash.core.catalog",
    "hwdash.core.estimator",
    "hwdash.core.planning",
    "hwdash.telemetry.fake_scenario",
    "urllib.request",  # --webhook's sender only (with http.client and email: 3.7 MiB)
)


@pytest.fixture
def compiled(tmp_path: Path) -> Path:
    path = tmp_path / "a100x8-sawtooth.json"
    scenario = compile_scenario(load_scenario("a100x8-sawtooth"))
    path.write_text(json.dumps(scenario), encoding="utf-8")
    return path


def _run(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, XDG_DATA_HOME=str(tmp_path), XDG_STATE_HOME=str(tmp_path))
    env.pop("HWDASH_FAKE_NVML", None)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    ("flags", "shown"),
    [(["--once"], "torchrun"), (["--once", "--json"], "torchrun"), (["--count", "2"], "procs 1")],
)
def test_monitor_prints_its_first_frame_without_the_planner(
    flags: list[str], shown: str, compiled: Path, tmp_path: Path
) -> None:
    code = f"""
        import sys
        from hwdash.cli import main
        code = main(["monitor", "--fake-nvml", {str(compiled)!r}, "--interval", "0.1", *{flags!r}])
        loaded = sorted(m for m in {PLANNER_MODULES!r} if m in sys.modules)
        print("LOADED", ",".join(loaded), "EXIT", code)
    """
    result = _run(code, tmp_path)
    assert result.returncode == 0, result.stderr
    assert shown in result.stdout  # the processes, in each view's words
    assert result.stdout.strip().splitlines()[-1] == "LOADED  EXIT 0"


def test_dashboard_draws_the_monitor_before_building_the_planner(
    compiled: Path, tmp_path: Path
) -> None:
    code = f"""
        import asyncio, sys
        from hwdash.cli import build_parser
        from hwdash.commands import dashboard
        from hwdash.ui.app import HwdashApp

        seen = {{}}
        shown = HwdashApp.first_frame_shown

        def spy(app):
            # Called once the monitor's first frame is on screen.
            seen["loaded"] = sorted(m for m in {PLANNER_MODULES!r} if m in sys.modules)
            seen["screen"] = app.export_screenshot()
            return shown(app)

        HwdashApp.first_frame_shown = spy

        class Terminal:
            def isatty(self):
                return True

        args = build_parser("dashboard").parse_args(["--fake-nvml", {str(compiled)!r}, "--no-bell"])
        app, sampler = dashboard.build_app(args, stdout=Terminal(), initial_tab=None)

        async def run():
            async with app.run_test(size=(120, 40)) as pilot:
                while "loaded" not in seen:
                    await pilot.pause(0.05)
                assert app.active_tab == "monitor"
                await pilot.pause(0.5)  # more frames: the planner still is not built
                seen["later"] = sorted(m for m in {PLANNER_MODULES!r} if m in sys.modules)
                await pilot.press("p")
                for _ in range(100):
                    if app.planner.report is not None:
                        break
                    await pilot.pause(0.05)
                print("TAB", app.active_tab, "ESTIMATE", app.planner.report is not None)

        asyncio.run(run())
        sampler.close()
        print("LOADED", ",".join(seen["loaded"]), ",".join(seen["later"]))
        print("ROWS", "torchrun" in seen["screen"], "A100" in seen["screen"])
        print("AFTER", "pydantic" in sys.modules)
    """
    result = _run(code, tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()[-4:]
    assert lines == ["TAB planner ESTIMATE True", "LOADED  ", "ROWS True True", "AFTER True"]
