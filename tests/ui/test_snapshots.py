"""SVG snapshots of the dashboard at 80x24 and 120x36 on fake GPUs with a frozen clock.

Scenario time only moves when a test steps it, the sampling thread only samples when asked, and the
host reads fixed numbers, so every run draws the same screen. Update the baselines after a deliberate
change with ``pytest tests/ui/test_snapshots.py --snapshot-update`` and look at the diff report.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from snapshot_apps.fake_dashboard import fake_app, replay
from textual.pilot import Pilot

from hwdash.ui.app import TabName

SnapCompare = Callable[..., bool]

#: The plan drawn on the monitor's bars in every snapshot: 60 GiB per GPU.
PLAN_BYTES = 60 * 1024**3


def _case(
    scenario: str,
    tmp_path: Path,
    *,
    until_s: float,
    step_s: float = 2.0,
    tab: TabName = "monitor",
    keys: tuple[str, ...] = (),
) -> tuple[Any, Callable[[Pilot[None]], Awaitable[None]]]:
    # Snapshots stamped with scenario time: with wall-clock stamps a slow machine spreads the
    # replay over more real seconds, and the OOM forecast (which needs 15 s of readings) appeared
    # on a loaded CI run and not on an idle one.
    app, clock = fake_app(
        scenario, data_dir=tmp_path, start_s=0.0, initial_tab=tab, scenario_time=True
    )

    async def run_before(pilot: Pilot[None]) -> None:
        await replay(pilot, app, clock, until_s=until_s, step_s=step_s)
        # A fixed plan on the bars, so estimator changes do not redraw the monitor's baselines.
        app.monitor.set_plan_expectation(PLAN_BYTES, "example")
        if keys:
            await pilot.press(*keys)
        await pilot.pause()

    return app, run_before


@pytest.mark.parametrize("size", [(80, 24), (120, 36)])
def test_monitor_climbing(snap_compare: SnapCompare, tmp_path: Path, size: tuple[int, int]) -> None:
    app, run_before = _case("a100x4-training", tmp_path, until_s=40)
    assert snap_compare(app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", [(80, 24), (120, 36)])
def test_monitor_in_alert(snap_compare: SnapCompare, tmp_path: Path, size: tuple[int, int]) -> None:
    app, run_before = _case("a100x4-training", tmp_path, until_s=70)
    assert snap_compare(app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", [(80, 24), (120, 36)])
def test_monitor_eight_gpus(
    snap_compare: SnapCompare, tmp_path: Path, size: tuple[int, int]
) -> None:
    app, run_before = _case("h100x8", tmp_path, until_s=30, step_s=3)
    assert snap_compare(app, terminal_size=size, run_before=run_before)


def test_monitor_uses_the_room_at_200x60(snap_compare: SnapCompare, tmp_path: Path) -> None:
    app, run_before = _case("h100x8", tmp_path, until_s=60, step_s=2)
    assert snap_compare(app, terminal_size=(200, 60), run_before=run_before)


def test_monitor_lost_gpu(snap_compare: SnapCompare, tmp_path: Path) -> None:
    app, run_before = _case("gpu-lost", tmp_path, until_s=24)
    assert snap_compare(app, terminal_size=(120, 36), run_before=run_before)


def test_monitor_unsupported_fields(snap_compare: SnapCompare, tmp_path: Path) -> None:
    app, run_before = _case("consumer-unsupported", tmp_path, until_s=20)
    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)


def test_monitor_without_a_driver(snap_compare: SnapCompare, tmp_path: Path) -> None:
    app, run_before = _case("no-driver", tmp_path, until_s=0)
    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)


def test_alert_status_line_over_another_tab(snap_compare: SnapCompare, tmp_path: Path) -> None:
    # The compare tab (no saved plans) rather than the planner, whose numbers follow the estimator;
    # tests/ui/test_monitor_pane.py checks the line on the planner tab.
    app, run_before = _case("a100x4-training", tmp_path, until_s=70, step_s=10, tab="compare")
    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)


def test_help_screen(snap_compare: SnapCompare, tmp_path: Path) -> None:
    app, run_before = _case("a100x4-training", tmp_path, until_s=0, keys=("question_mark",))
    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)


def test_monitor_with_probed_processes_and_a_forecast(
    snap_compare: SnapCompare, tmp_path: Path
) -> None:
    # Snapshots stamped with scenario time, so the forecast sees the scenario's minutes. At 132 s
    # GPU 3 climbs again after its restart (a forecast) while GPUs 0-2 have levelled off near 96%
    # (none: the forecast follows the current climb, issue 22).
    app, clock = fake_app(
        "a100x4-training", data_dir=tmp_path, start_s=0.0, initial_tab="monitor", scenario_time=True
    )

    async def run_before(pilot: Pilot[None]) -> None:
        await replay(pilot, app, clock, until_s=132, step_s=4)

    assert snap_compare(app, terminal_size=(120, 36), run_before=run_before)


def test_cluster_of_32_gpus_at_120x40(snap_compare: SnapCompare, tmp_path: Path) -> None:
    from snapshot_apps.fake_dashboard import cluster_app, wait_for_frames

    app = cluster_app()

    async def run_before(pilot: Pilot[None]) -> None:
        await wait_for_frames(pilot, app, 1)
        await pilot.pause()

    assert snap_compare(app, terminal_size=(120, 40), run_before=run_before)
