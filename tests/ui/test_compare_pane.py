"""Pilot tests of the compare view: saved plans side by side, rename, delete, load back."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.text import Text
from textual.app import App, ComposeResult
from textual.widgets import DataTable, Input, Static

from hwdash.core.catalog import Catalog, load_catalog
from hwdash.core.plan import Method, Plan
from hwdash.core.planning.fit import evaluate_plan
from hwdash.core.plans.store import PlanStore, PlanSummary
from hwdash.core.units import format_bytes
from hwdash.ui.compare_pane import HIGH_STYLE, LOW_STYLE, ComparePane
from hwdash.ui.widgets.planner_dialogs import ConfirmDialog, NameDialog

SMALL = Plan(model="qwen2.5-0.5b", method=Method.LORA, examples=5000)
BIG = Plan(model="qwen2.5-7b", method=Method.FULL, zero=2, gpus=2, examples=5000)


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog(include_user=False)


@pytest.fixture
def store(tmp_path: Path, catalog: Catalog) -> PlanStore:
    store = PlanStore(tmp_path / "plans.json")
    for name, plan in (("small", SMALL), ("big", BIG)):
        store.save(name, plan, summary=PlanSummary.from_report(evaluate_plan(plan, catalog)))
    return store


class CompareApp(App[None]):
    def __init__(self, store: PlanStore, catalog: Catalog) -> None:
        super().__init__()
        self.store = store
        self.catalog = catalog
        self.loaded: list[tuple[Plan, str]] = []

    def compose(self) -> ComposeResult:
        yield ComparePane(self.store, self.catalog)

    def on_compare_pane_load_plan(self, message: ComparePane.LoadPlan) -> None:
        self.loaded.append((message.plan, message.name))


def cell(table: DataTable, row: str, column: int) -> Text:  # type: ignore[type-arg]
    value = table.get_cell_at(
        (table.get_row_index(row), column)  # type: ignore[arg-type]
    )
    assert isinstance(value, Text)
    return value


async def test_two_plans_side_by_side_with_differences_marked(
    store: PlanStore, catalog: Catalog
) -> None:
    app = CompareApp(store, catalog)
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await pilot.pause()
        pane = app.query_one(ComparePane)
        table = pane.table
        assert [str(c.label) for c in table.columns.values()] == ["small", "big"]
        small = evaluate_plan(SMALL, catalog)
        big = evaluate_plan(BIG, catalog)
        total_small = cell(table, "total", 0)
        total_big = cell(table, "total", 1)
        assert total_small.plain.strip() == format_bytes(small.estimate.per_gpu.total)
        assert total_big.plain.strip() == format_bytes(big.estimate.per_gpu.total)
        # The smaller per-GPU total is green, the larger red.
        low, high = (
            (total_small, total_big)
            if small.estimate.per_gpu.total < big.estimate.per_gpu.total
            else (total_big, total_small)
        )
        assert str(low.style) == LOW_STYLE
        assert str(high.style) == HIGH_STYLE
        # Under the totals, a bar per plan: the larger plan's bar is full, the smaller one shorter.
        bars = [cell(table, "total-bar", i).plain.rstrip() for i in (0, 1)]
        bigger = 0 if small.estimate.per_gpu.total > big.estimate.per_gpu.total else 1
        assert set(bars[bigger]) == {"█"}
        assert len(bars[1 - bigger]) < len(bars[bigger])
        # Text rows: the second column differs from the first, so it is highlighted.
        assert cell(table, "model", 0).style == ""
        assert cell(table, "model", 1).style != ""
        assert cell(table, "best", 0).plain == (small.recommended or "none fits")
        assert cell(table, "status", 0).plain == "current"


async def test_the_total_bars_are_scaled_by_value_not_by_column_width(
    tmp_path: Path, catalog: Catalog
) -> None:
    # The same plan twice, once under a short name and once under a long one (a wide column),
    # and a plan half as large: equal totals draw equal bars; the bars compare the values.
    store = PlanStore(tmp_path / "plans.json")
    summary = PlanSummary.from_report(evaluate_plan(BIG, catalog))
    store.save("big", BIG, summary=summary)
    store.save("the same big plan under a long name", BIG, summary=summary)
    store.save("small", SMALL, summary=PlanSummary.from_report(evaluate_plan(SMALL, catalog)))
    app = CompareApp(store, catalog)
    async with app.run_test(size=(160, 24)) as pilot:
        await pilot.pause()
        table = app.query_one(ComparePane).table
        widths = [column.width for column in table.columns.values()]
        assert widths[0] != widths[1]  # the long name widens its column
        bars = [cell(table, "total-bar", i).plain.rstrip() for i in range(3)]
        assert bars[0] == bars[1]
        small_total = evaluate_plan(SMALL, catalog).estimate.per_gpu.total
        big_total = evaluate_plan(BIG, catalog).estimate.per_gpu.total
        expected = small_total / big_total * len(bars[0])  # cells, eighths included
        assert abs(len(bars[2]) - expected) <= 1  # full cells plus at most one partial cell


async def test_rename_with_r(store: PlanStore, catalog: Catalog) -> None:
    app = CompareApp(store, catalog)
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await pilot.pause()
        pane = app.query_one(ComparePane)
        pane.table.focus()
        await pilot.press("right")  # the second column: "big"
        assert pane.selected_plan() is not None and pane.selected_plan().name == "big"  # type: ignore[union-attr]
        await pilot.press("r")
        await pilot.pause()
        assert isinstance(app.screen, NameDialog)
        # A taken name is refused in the dialog.
        await pilot.press("end", "ctrl+u", *"small", "enter")
        await pilot.pause()
        assert isinstance(app.screen, NameDialog)
        assert "already exists" in str(app.screen.query_one("#name-hint", Static).render())
        await pilot.press("end", "ctrl+u", *"qwen 7b full", "enter")
        await pilot.pause()
        assert not isinstance(app.screen, NameDialog)
        assert store.names() == ["small", "qwen 7b full"]
        assert [str(c.label) for c in pane.table.columns.values()] == ["small", "qwen 7b full"]
        assert pane.selected_plan() is not None and pane.selected_plan().name == "qwen 7b full"  # type: ignore[union-attr]


async def test_delete_with_d_asks_first(store: PlanStore, catalog: Catalog) -> None:
    app = CompareApp(store, catalog)
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await pilot.pause()
        pane = app.query_one(ComparePane)
        pane.table.focus()
        await pilot.press("d")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmDialog)
        await pilot.press("n")
        await pilot.pause()
        assert store.names() == ["small", "big"]
        await pilot.press("d")
        await pilot.pause()
        await pilot.press("y")
        await pilot.pause()
        assert store.names() == ["big"]
        assert [str(c.label) for c in pane.table.columns.values()] == ["big"]
        assert any("Deleted 'small'" in n.message for n in app._notifications)
        await pilot.press("d")
        await pilot.pause()
        await pilot.press("y")
        await pilot.pause()
        assert store.list() == []
        assert pane.has_class("-empty")
        assert app.query_one("#compare-empty").display


async def test_enter_and_l_post_load_plan(store: PlanStore, catalog: Catalog) -> None:
    app = CompareApp(store, catalog)
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await pilot.pause()
        app.query_one(ComparePane).table.focus()
        await pilot.press("right", "enter")
        await pilot.pause()
        assert app.loaded == [(BIG, "big")]
        await pilot.press("left", "l")
        await pilot.pause()
        assert app.loaded[-1] == (SMALL, "small")


async def test_refresh_picks_up_plans_saved_elsewhere(store: PlanStore, catalog: Catalog) -> None:
    app = CompareApp(store, catalog)
    async with app.run_test(size=(120, 30), notifications=True) as pilot:
        await pilot.pause()
        pane = app.query_one(ComparePane)
        PlanStore(store.path).save("third", Plan(model="phi-2"))
        pane.refresh_plans()
        await pilot.pause()
        assert [str(c.label) for c in pane.table.columns.values()] == ["small", "big", "third"]


async def test_unevaluable_plan_shows_its_cached_summary(tmp_path: Path, catalog: Catalog) -> None:
    store = PlanStore(tmp_path / "plans.json")
    config = tmp_path / "model" / "config.json"
    config.parent.mkdir()
    plan = Plan(model=str(config))
    cached = PlanSummary(
        model_name="gone-model",
        memory={"weights": 10 * 2**30, "total": 12 * 2**30},
        gpus=1,
        best_flavor="a10g-large",
        hours=2.0,
        cost=3.0,
    )
    store.save("vanished", plan, summary=cached)
    store.save("small", SMALL)
    app = CompareApp(store, catalog)
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        await pilot.pause()
        pane = app.query_one(ComparePane)
        table = pane.table
        assert cell(table, "total", 0).plain.strip() == "12.0 GiB"
        assert cell(table, "status", 0).plain == "cached"
        assert cell(table, "best", 0).plain == "a10g-large"
        assert cell(table, "status", 1).plain == "current"
        problems = str(app.query_one("#compare-problems", Static).render())
        assert "vanished" in problems


async def test_broken_plans_file_is_reported_not_fatal(tmp_path: Path, catalog: Catalog) -> None:
    path = tmp_path / "plans.json"
    path.write_text("{broken")
    app = CompareApp(PlanStore(path), catalog)
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await pilot.pause()
        assert app.query_one(ComparePane).has_class("-empty")
        assert any("left as it is" in n.message for n in app._notifications)
        assert path.read_text() == "{broken"  # showing the list never moves the file
        assert not list(tmp_path.glob("plans.json.bak-*"))
        assert not app.query(Input)


async def test_save_in_the_planner_compare_and_load_back_in_the_app(
    tmp_path: Path, catalog: Catalog
) -> None:
    from hwdash.ui.app import make_app
    from hwdash.ui.planner_pane import PlannerPane

    store = PlanStore(tmp_path / "plans.json")
    app = make_app(catalog=catalog, sampler=None, plan_store=store, alert_log=False)
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        await pilot.pause()
        planner = app.query_one(PlannerPane)
        planner.load_plan(SMALL)
        await pilot.pause()
        planner.query_one("#plan-batch", Input).focus()
        await pilot.press("ctrl+s")  # works while typing in a field
        await pilot.pause()
        await pilot.press("end", "ctrl+u", *"first", "enter")
        await pilot.pause()
        assert store.names() == ["first"]
        planner.load_plan(BIG)
        await pilot.pause()
        await pilot.press("escape", "c")
        await pilot.pause()
        compare = app.query_one(ComparePane)
        assert app.active_tab == "compare"
        assert compare.table.has_focus
        assert [str(c.label) for c in compare.table.columns.values()] == ["first"]
        await pilot.press("enter")
        await pilot.pause()
        assert app.active_tab == "planner"
        assert planner.report is not None and planner.report.plan == SMALL
        assert app.query_one("#plan-model", Input).value == SMALL.model
