"""What nvitop and gpustat users expect to see at a glance (issue 16): readings coloured by how hard
the GPU works, and checkboxes whose on and off states differ without colour."""

from __future__ import annotations

from pathlib import Path

from rich.style import Style
from snapshot_apps.fake_dashboard import fake_app

from hwdash.telemetry.types import GpuSample, GpuState
from hwdash.ui.widgets.check import Check
from hwdash.ui.widgets.monitor_cells import intensity_style
from hwdash.ui.widgets.monitor_gpu import GpuCard, reading_styles

GIB = 1024**3


def sample(utilization: float, temperature: float, power: float) -> GpuSample:
    return GpuSample(
        index=0,
        name="NVIDIA A100-SXM4-80GB",
        uuid=None,
        state=GpuState.OK,
        total_bytes=80 * GIB,
        free_bytes=40 * GIB,
        used_bytes=40 * GIB,
        utilization_gpu=utilization,
        temperature_c=temperature,
        power_w=power,
        power_limit_w=400,
    )


def test_intensity_follows_the_thresholds_at_their_edges() -> None:
    assert intensity_style(None, (10, 75)) == ""
    assert intensity_style(9.9, (10, 75)) == "green"
    assert intensity_style(10, (10, 75)) == "yellow"
    assert intensity_style(74.9, (10, 75)) == "yellow"
    assert intensity_style(75, (10, 75)) == "red"


def test_utilization_temperature_and_power_are_coloured_by_load() -> None:
    assert reading_styles(sample(5, 40, 60)) == ("green", "green", "green")
    assert reading_styles(sample(50, 75, 320)) == ("yellow", "yellow", "yellow")
    assert reading_styles(sample(99, 88, 395)) == ("red", "red", "red")
    unknown = GpuSample(index=0, name=None, uuid=None, state=GpuState.OK, power_w=100)
    assert reading_styles(unknown) == ("", "", "")  # no limit: no share to colour


async def test_a_busy_gpus_row_draws_its_readings_in_red(tmp_path: Path) -> None:
    app, _clock = fake_app("h100x8", data_dir=tmp_path, start_s=30, initial_tab="monitor")
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.pause()
        card = app.query_one(GpuCard)
        # Shown and drawn without yielding to the event loop: a frame from the sampling thread
        # cannot replace this sample in between.
        card.show(sample(99, 88, 395), (), wide=False, threshold=0.9, plan_bytes=None)
        strip = card.render_line(0)
        red = Style.parse("red").color
        coloured = {seg.text.strip() for seg in strip if seg.style and seg.style.color == red}
        assert {"99%", "88°C", "395 W"} <= coloured
        card.show(sample(5, 40, 60), (), wide=False, threshold=0.9, plan_bytes=None)
        strip = card.render_line(0)
        readings = {"5%", "40°C", "60 W"}
        assert not any(
            seg.style and seg.style.color == red and seg.text.strip() in readings for seg in strip
        )


async def test_the_fits_only_box_shows_its_state_without_colour(tmp_path: Path) -> None:
    app, _clock = fake_app("h100x8", data_dir=tmp_path, start_s=30, initial_tab="planner")
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.pause()
        box = app.query_one("#plan-fits-only", Check)
        before = box.value
        text_before = box.render().plain
        await pilot.press("o")
        await pilot.pause()
        assert box.value != before
        text_after = box.render().plain
        on, off = (text_after, text_before) if box.value else (text_before, text_after)
        assert "▐X▌" in on and "▐ ▌" in off


async def test_a_filter_that_leaves_no_flavor_says_so_instead_of_an_empty_table(
    tmp_path: Path,
) -> None:
    from hwdash.ui.widgets.planner_flavors import EMPTY_ROW, FlavorTable

    app, _clock = fake_app("h100x8", data_dir=tmp_path, start_s=30, initial_tab="planner")
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.pause()
        table = app.query_one(FlavorTable)
        assert table.report is not None and table.shown
        table.provider = "hf-tpu"
        table.fits_only = True
        await pilot.pause()
        assert not table.shown  # the starting plan fits no TPU flavor
        row = table.get_row(EMPTY_ROW)
        text = " ".join(str(cell) for cell in row)
        assert "no flavor of TPU fits" in text
        assert f"the recommended {table.report.recommended} is filtered out" in text
        table.provider = "all"
        table.fits_only = False
        await pilot.pause()
        assert table.shown and EMPTY_ROW not in table.rows


def test_cluster_lines_colour_readings_unless_the_line_is_in_alert_or_stale() -> None:
    from dataclasses import replace

    from hwdash.ui.widgets.monitor_cluster import cluster_lines

    busy = replace(sample(99, 88, 395), host="node-a", host_gpu=0)
    calm = replace(sample(5, 40, 60), index=1, host="node-b", host_gpu=0)
    lines = {line.text[0]: line for line in cluster_lines((busy, calm), 0.9)}
    assert lines["node-a"].colours == ("red", "red", "red")
    assert lines["node-b"].colours == ("green", "green", "green")
