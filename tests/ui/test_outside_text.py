"""Strings from outside (GPU, MIG and process names, users, command lines, plan and catalog names)
are shown as text in the dashboard, never parsed as markup: `[/x]` does not crash it, `[bold]` is
shown as typed."""

from __future__ import annotations

from pathlib import Path

from snapshot_apps.fake_dashboard import fake_app, replay, step
from textual.widgets import Label, Static

from hwdash.core.catalog import load_catalog
from hwdash.core.plan import Plan
from hwdash.core.plans.store import PlanStore
from hwdash.ui.app import HwdashApp, make_app
from hwdash.ui.widgets.planner_dialogs import ConfirmDialog, NameDialog
from hwdash.ui.widgets.planner_flavors import FlavorTable
from hwdash.ui.widgets.planner_trace import TraceView

DATA = Path(__file__).resolve().parent.parent / "data"
#: GPU, MIG and process names, a user and a command line that look like markup.
HOSTILE_SCENARIO_FILE = DATA / "scenarios" / "hostile-names.toml"
#: An accelerator, a flavor and a model whose ids and names look like markup.
HOSTILE_CATALOG = DATA / "catalog_hostile"
HOSTILE_MODEL_ID = "evil[/x]model"
HOSTILE_MODEL_NAME = "Evil [bold]Model[/bold] [/x] \\\\"
PLAN_NAME = "[/x] [bold]run[/bold]"

EVIL_CATALOG = """
[[accelerator]]
id = "evil[/x]gpu"
name = "Evil [bold]GPU[/bold] [/x]"
vendor = "nvidia"
kind = "gpu"
memory_gb = 24
bf16 = true
bf16_tflops = 100
source = "test"

[[flavor]]
id = "evil[/x]box"
name = "Evil box"
provider = "local"
accelerator = "evil[/x]gpu"
gpu_count = 1
source = "test"
"""


async def test_the_monitor_shows_hostile_names_as_typed(tmp_path: Path) -> None:
    app, clock = fake_app(str(HOSTILE_SCENARIO_FILE), data_dir=tmp_path, initial_tab="monitor")
    async with app.run_test(size=(160, 40), notifications=True) as pilot:
        await replay(pilot, app, clock, until_s=10, step_s=10)
        # Only the MIG slice is in alert: the banner and the line above the tabs name it as typed.
        assert "GPU 1/0 MIG [blink]1g[/blink] is 100% full" in app.monitor.banner_cell.shown
        assert "GPU 1 H100 [/] MIG [blink]1g[/blink] at 100%" in app.alert_status.shown
        await step(pilot, app, clock, 30)  # GPU 0 and the MIG slice are over 90% now
        card = app.monitor.gpu_cards[0]
        assert "[bold]A100[/bold] [/x]" in card.name_cell.shown
        assert "[blink]1g[/blink]" in app.monitor.gpu_cards[1].detail_cell.shown
        table = app.monitor.process_table
        (row,) = [table.get_row(key) for key in table.row_keys_in_order]
        texts = [cell.text for cell in row]
        assert "[red]eve" in texts
        assert "python [/x] train.py --tag [bold]run[/bold]" in texts
        toast = "\n".join(n.message for n in app._notifications)
        assert "[bold]A100[/bold] [/x]" in toast
        # A saved plan loaded into the planner is drawn on the monitor under its own name.
        app.planner.load_plan(Plan(model="qwen2.5-0.5b"), PLAN_NAME)
        await pilot.pause()
        assert f"Plan {PLAN_NAME}:" in app.monitor.plan_cell.shown


async def test_planner_and_compare_show_hostile_catalog_and_plan_names(
    tmp_path: Path, monkeypatch: object
) -> None:
    overlay = tmp_path / "evil.toml"
    overlay.write_text(EVIL_CATALOG)
    catalog = load_catalog([overlay], include_user=False)
    store = PlanStore(tmp_path / "plans.json")
    app = make_app(catalog=catalog, sampler=None, plan_store=store, alert_log=False, bell=False)
    async with app.run_test(size=(160, 40), notifications=True) as pilot:
        await pilot.pause()
        table = app.query_one(FlavorTable)
        row = table.get_row("evil[/x]box")
        assert "evil[/x]box" in str(row[1]) and "Evil [bold]GPU[/bold] [/x]" in str(row[8])
        app.planner.save_current("[/x] [bold]run[/bold]")
        await pilot.pause()
        assert any("[/x] [bold]run[/bold]" in n.message for n in app._notifications)
        await pilot.press("c")
        await pilot.pause()
        assert [saved.name for saved in app.compare.plans] == ["[/x] [bold]run[/bold]"]
    assert store.names() == ["[/x] [bold]run[/bold]"]


def test_plan_names_with_brackets_print_in_hwdash_compare(
    tmp_path: Path, capsys: object, monkeypatch: object
) -> None:
    import pytest

    from hwdash.cli import main

    assert isinstance(monkeypatch, pytest.MonkeyPatch)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    PlanStore().save("[/x] [bold]run[/bold]", Plan(model="qwen2.5-0.5b"))
    assert main(["compare", "--list"]) == 0
    assert isinstance(capsys, pytest.CaptureFixture)
    assert "[/x] [bold]run[/bold]" in capsys.readouterr().out


def hostile_dashboard(tmp_path: Path) -> tuple[HwdashApp, PlanStore]:
    """The dashboard on the hostile catalog overlay, with a plan saved under a hostile name."""
    catalog = load_catalog([HOSTILE_CATALOG], include_user=False)
    store = PlanStore(tmp_path / "plans.json")
    store.save(PLAN_NAME, Plan(model=HOSTILE_MODEL_ID))
    app = make_app(
        catalog=catalog,
        sampler=None,
        plan_store=store,
        alert_log=False,
        bell=False,
        initial_tab="compare",
    )
    return app, store


async def test_compare_rename_and_delete_dialogs_quote_a_hostile_plan_name(tmp_path: Path) -> None:
    app, store = hostile_dashboard(tmp_path)
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await pilot.pause()
        pane = app.compare
        assert [column.label.plain for column in pane.table.columns.values()] == [PLAN_NAME]
        assert pane.table.get_cell("model", "plan-0").plain == HOSTILE_MODEL_NAME
        pane.table.focus()
        await pilot.press("r")
        await pilot.pause()
        assert isinstance(app.screen, NameDialog)
        hint = app.screen.query_one("#name-hint", Static)
        assert str(hint.render()) == f"rename '{PLAN_NAME}'"
        await pilot.press("escape")
        await pilot.pause()
        await pilot.press("d")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmDialog)
        question = app.screen.query_one("#confirm-question", Label)
        assert str(question.render()) == f"Delete the saved plan '{PLAN_NAME}'?"
        await pilot.press("y")
        await pilot.pause()
        assert any(n.message == f"Deleted '{PLAN_NAME}'" for n in app._notifications)
    assert store.names() == []


async def test_the_save_dialog_quotes_a_hostile_name_that_is_taken(tmp_path: Path) -> None:
    app, store = hostile_dashboard(tmp_path)
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await pilot.press("p")
        await pilot.pause()
        app.planner.save_current()
        await pilot.pause()
        assert isinstance(app.screen, NameDialog)
        await pilot.press("end", "ctrl+u", *PLAN_NAME)
        await pilot.pause()
        hint = app.screen.query_one("#name-hint", Static)
        assert str(hint.render()) == f"that name is taken: will save as '{PLAN_NAME} (2)'"
        await pilot.press("enter")
        await pilot.pause()
    assert store.names() == [PLAN_NAME, f"{PLAN_NAME} (2)"]


async def test_the_trace_spinner_names_a_hostile_model_as_typed(tmp_path: Path) -> None:
    app, _store = hostile_dashboard(tmp_path)
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await pilot.press("p")
        app.planner.load_plan(Plan(model=HOSTILE_MODEL_ID))
        await pilot.pause()
        assert app.planner.report is not None
        assert app.planner.report.model.name == HOSTILE_MODEL_NAME
        app.planner.action_trace()
        label = app.query_one("#trace-running-label", Label)
        assert str(label.render()) == f"tracing {HOSTILE_MODEL_NAME} on fake tensors ..."
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert not app.query_one(TraceView).running
