"""Pilot tests of the planner as a new user walks it (issue 23): the flavor table after a save, the
headline kept in view, keys typed in one burst, inference plans, and the export's path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from snapshot_apps.fake_dashboard import fake_app, wait_for_frames, wait_for_hidden_panes
from textual._xterm_parser import XTermParser
from textual.errors import NoWidget
from textual.pilot import Pilot
from textual.widgets import Input, Label, Static

from hwdash.core.plan import Method, Plan
from hwdash.core.planning.fit import evaluate_plan
from hwdash.core.planning.fit_options import find_fit_options
from hwdash.core.units import format_count
from hwdash.ui.app import HwdashApp
from hwdash.ui.planner_pane import PlannerPane
from hwdash.ui.widgets.planner_dialogs import ConfirmDialog
from hwdash.ui.widgets.planner_fit import FitOptionsDialog
from hwdash.ui.widgets.planner_flavors import FlavorTable


def table_lines(table: FlavorTable) -> list[str]:
    """The table as drawn, one string per line (through the table's own render caches)."""
    return [
        "".join(segment.text for segment in table.render_line(y)) for y in range(table.size.height)
    ]


async def test_flavor_columns_keep_their_width_after_a_save(tmp_path: Path) -> None:
    app, _clock = fake_app("a100x4-training", data_dir=tmp_path, initial_tab="planner")
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await wait_for_frames(pilot, app, 1)
        await wait_for_hidden_panes(pilot, app)
        await pilot.press("s")
        await pilot.pause()
        await pilot.press("enter")
        await pilot.pause()
        await pilot.pause()
        assert app.plan_store.list(), "the plan was not saved"
        table = app.planner.query_one(FlavorTable)
        lines = table_lines(table)
        shown = [fit.flavor.id for fit in table.shown][: len(lines) - 1]
        assert len(shown) > 5
        for flavor_id, line in zip(shown, lines[1:], strict=False):
            assert f" {flavor_id} " in line, (flavor_id, line)


def headline_in_view(app: HwdashApp) -> bool:
    """Whether the planner's headline is drawn (its first cell is the headline's, not a scrolled
    container's)."""
    headline = app.planner.query_one("#plan-headline", Static)
    region = headline.region
    if not region:
        return False
    try:
        widget, _ = app.screen.get_widget_at(region.x, region.y)
    except NoWidget:  # scrolled above the screen
        return False
    return widget is headline


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
async def test_headline_stays_in_view_in_the_flavor_table(
    tmp_path: Path, size: tuple[int, int]
) -> None:
    app, _clock = fake_app("a100x4-training", data_dir=tmp_path, initial_tab="planner")
    async with app.run_test(size=size, notifications=True) as pilot:
        await wait_for_frames(pilot, app, 1)
        await wait_for_hidden_panes(pilot, app)
        assert headline_in_view(app)
        table = app.planner.query_one(FlavorTable)
        table.focus()
        await pilot.pause()
        await pilot.press("ctrl+end")
        await pilot.pause()
        assert table.cursor_row == table.row_count - 1
        assert headline_in_view(app)


async def test_headline_stays_in_view_after_a_fit_option(tmp_path: Path) -> None:
    app, _clock = fake_app("a100x4-training", data_dir=tmp_path, initial_tab="planner")
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await wait_for_frames(pilot, app, 1)
        await wait_for_hidden_panes(pilot, app)
        pane = app.planner
        pane.load_plan(Plan(model="llama-3.1-70b", method=Method.FULL, batch=4, seq=4096))
        await pilot.pause()
        table = pane.query_one(FlavorTable)
        table.focus()
        report = pane.report
        assert report is not None
        # The lowest row that some option makes fit: the results scroll down to it.
        row = next(
            index
            for index in reversed(range(len(table.shown)))
            if find_fit_options(
                report.plan,
                report.model,
                pane.catalog,
                table.shown[index].flavor.id,
                [table.shown[index].flavor],
            ).options
        )
        assert row > 10
        table.move_cursor(row=row)
        await pilot.pause()
        await pilot.press("f")
        await pilot.pause()
        assert isinstance(app.screen, FitOptionsDialog)
        await pilot.press("enter")
        await pilot.pause()
        await pilot.pause()
        assert not isinstance(app.screen, FitOptionsDialog)
        assert headline_in_view(app)
        headline = str(pane.query_one("#plan-headline", Static).render())
        assert pane.report is not None and pane.report.model.name in headline


async def type_in_one_burst(app: HwdashApp, pilot: Pilot[None], chunk: str) -> None:
    """Keys as one read from the terminal brings them: the driver's parser splits the chunk and
    the driver posts every event to the app at once, with no pause between them
    (textual/drivers/linux_driver.py feeds each read to ``XTermParser``)."""
    for event in XTermParser().feed(chunk):
        app.post_message(event)
    await pilot.pause()


@pytest.mark.parametrize(
    ("chunk", "expected"),
    [
        ("\x05\x15llama-3.1-8b", "llama-3.1-8b"),  # ctrl+e, ctrl+u: clear, then retype
        ("\x05\x15llama-3.1-8bx\x7f", "llama-3.1-8b"),  # a typo taken back with backspace
    ],
)
async def test_keys_in_one_burst_keep_their_order(
    tmp_path: Path, chunk: str, expected: str
) -> None:
    app, _clock = fake_app("a100x4-training", data_dir=tmp_path, initial_tab="planner")
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await wait_for_frames(pilot, app, 1)
        await wait_for_hidden_panes(pilot, app)
        pane = app.planner
        field = pane.query_one("#plan-model", Input)
        field.focus()
        await pilot.pause()
        await type_in_one_burst(app, pilot, chunk)
        for _ in range(100):  # a loaded machine takes a few rounds to handle the burst
            report = pane.report
            if field.value == expected and report is not None and report.plan.model == expected:
                break
            await pilot.pause(0.02)
        assert field.value == expected
        assert pane.errors == {}
        assert pane.report is not None and pane.report.plan.model == field.value


INFERENCE = Plan(model="qwen2.5-7b", method=Method.INFERENCE, batch=1, seq=2048)


def row_shown(pane: PlannerPane, field: str) -> bool:
    row = pane.query_one(f"#plan-row-{field.replace('_', '-')}")
    return row.display and row.region.height > 0


async def test_inference_form_asks_for_tokens_and_hides_training_rows(tmp_path: Path) -> None:
    app, _clock = fake_app("a100x4-training", data_dir=tmp_path, initial_tab="planner")
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await wait_for_frames(pilot, app, 1)
        await wait_for_hidden_panes(pilot, app)
        pane = app.planner
        pane.load_plan(INFERENCE)
        await pilot.pause()
        await pilot.pause()
        for field in ("grad_ckpt", "grad_accum", "optimizer", "optimizer_impl", "epochs", "loss"):
            assert not row_shown(pane, field), field
        assert row_shown(pane, "tokens")
        assert row_shown(pane, "quant")
        assert pane.report is not None and pane.report.tokens is None
        await pilot.click("#plan-tokens")
        await pilot.press(*"10M")
        await pilot.pause()
        await pilot.pause()
        assert pane.errors == {}
        assert pane.report.plan.tokens == 10_000_000
        expected = evaluate_plan(INFERENCE.model_copy(update={"tokens": 10_000_000}), pane.catalog)
        assert pane.report.tokens == expected.tokens == 10_000_000
        hours = {fit.flavor.id: fit.hours for fit in pane.report.flavors}
        assert hours == {fit.flavor.id: fit.hours for fit in expected.flavors}
        assert any(value is not None for value in hours.values())
        headline = str(pane.query_one("#plan-headline", Static).render())
        assert f"{format_count(10_000_000)} tokens" in headline
        # Back to a training method: the training rows return, the tokens row goes.
        pane.load_plan(INFERENCE.model_copy(update={"method": Method.LORA}))
        await pilot.pause()
        await pilot.pause()
        assert row_shown(pane, "epochs") and not row_shown(pane, "tokens")


async def test_inference_warns_about_examples_as_the_command_line_does(tmp_path: Path) -> None:
    app, _clock = fake_app("a100x4-training", data_dir=tmp_path, initial_tab="planner")
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await wait_for_frames(pilot, app, 1)
        await wait_for_hidden_panes(pilot, app)
        pane = app.planner
        pane.load_plan(INFERENCE.model_copy(update={"examples": 50_000}))
        await pilot.pause()
        await pilot.pause()
        warnings = str(pane.query_one("#plan-warnings", Static).render())
        assert "examples does nothing here" in warnings
        assert "use tokens" in warnings
        pane.load_plan(INFERENCE.model_copy(update={"tokens": 1_000_000}))
        await pilot.pause()
        await pilot.pause()
        warnings = str(pane.query_one("#plan-warnings", Static).render())
        assert "examples does nothing" not in warnings


async def export_with_keys(pilot: Pilot[None], path: str | None = None) -> None:
    """``e``, then (when ``path`` is given) the path field cleared and typed, then enter."""
    await pilot.press("e")
    await pilot.pause()
    if path is not None:
        await pilot.press("tab")  # from the formats to the path
        await pilot.press("ctrl+e", "ctrl+u", *path)
    await pilot.press("enter")
    await pilot.pause()
    await pilot.pause()


async def test_export_goes_to_the_data_folder_and_asks_before_overwriting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data_home = tmp_path / "data"
    started_in = tmp_path / "cwd"
    started_in.mkdir()
    monkeypatch.setenv("XDG_DATA_HOME", str(data_home))
    monkeypatch.chdir(started_in)
    app, _clock = fake_app("a100x4-training", data_dir=tmp_path, initial_tab="planner")
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await wait_for_frames(pilot, app, 1)
        await wait_for_hidden_panes(pilot, app)
        pane = app.planner
        await export_with_keys(pilot)
        assert pane.exported is not None
        assert pane.exported.parent == data_home / "hwdash" / "exports"
        assert pane.exported.is_file()
        assert list(started_in.iterdir()) == []
        # An edited path: the file goes there.
        target = tmp_path / "mine" / "ds.json"
        await export_with_keys(pilot, str(target))
        assert pane.exported == target and target.is_file()
        # The same path again: asked first; "n" keeps the file as it was.
        target.write_text("mine", encoding="utf-8")
        await export_with_keys(pilot, str(target))
        assert isinstance(app.screen, ConfirmDialog)
        assert str(target) in str(app.screen.query_one("#confirm-question", Label).render())
        await pilot.press("n")
        await pilot.pause()
        assert target.read_text(encoding="utf-8") == "mine"
        await export_with_keys(pilot, str(target))
        assert isinstance(app.screen, ConfirmDialog)
        await pilot.press("y")
        await pilot.pause()
        assert target.read_text(encoding="utf-8") != "mine"
        assert json.loads(target.read_text(encoding="utf-8"))  # the DeepSpeed config
