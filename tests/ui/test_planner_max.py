"""The planner's "max" column (``x``): each flavor's ``hwdash plan --max`` answer, at 80x24."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.app import App, ComposeResult

from hwdash.core.catalog import Catalog, load_catalog
from hwdash.core.plan import Method, Plan
from hwdash.core.planning.max_fit import MaxField, find_max
from hwdash.core.plans.store import PlanStore
from hwdash.ui.planner_pane import PlannerPane
from hwdash.ui.widgets.planner_flavors import FlavorTable


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog(include_user=False)


class PlannerApp(App[None]):
    def __init__(self, catalog: Catalog, store: PlanStore, initial: Plan) -> None:
        super().__init__()
        self.catalog = catalog
        self.store = store
        self.initial = initial

    def compose(self) -> ComposeResult:
        yield PlannerPane(self.catalog, self.store, initial=self.initial)


def _column(table: FlavorTable, key: str) -> dict[str, str]:
    """The cells of column ``key``, by flavor id."""
    return {
        str(row.value): str(table.get_cell(row, key))
        for row in table.rows
        if str(row.value) != "--no-flavor--"
    }


@pytest.mark.parametrize(
    ("method", "second"), [(Method.LORA, "batch"), (Method.INFERENCE, "concurrency")]
)
async def test_x_cycles_the_max_column_and_its_cells_are_the_cli_answers(
    catalog: Catalog,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    method: Method,
    second: str,
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    plan = Plan(model="qwen2.5-7b", method=method, seq=2048, grad_ckpt=method is Method.LORA)
    model = catalog.models["qwen2.5-7b"]
    app = PlannerApp(catalog, PlanStore(), plan)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        table = app.query_one(FlavorTable)
        table.focus()
        await pilot.pause()
        assert "max" not in [str(key.value) for key in table.columns]
        headings = {"batch": "batch↑", "concurrency": "conc↑"}
        for name, heading in (("seq", "seq↑"), (second, headings[second]), ("gpus", "gpus↓")):
            await pilot.press("x")
            await pilot.pause()
            labels = [column.label.plain for column in table.columns.values()]
            assert heading in labels, labels
            # on screen at 80x24 without scrolling: the column comes right after the verdict
            index = labels.index(heading)
            widths = [column.get_render_width(table) for column in table.columns.values()]
            assert sum(widths[: index + 1]) <= table.scrollable_content_region.width
            cells = _column(table, "max")
            assert set(cells) == {fit.flavor.id for fit in table.shown}
            field = MaxField(name)
            for flavor_id in ("l4x1", "a10g-large", "h200", "cpu-basic"):
                answer = find_max(
                    app.query_one(PlannerPane).report.plan, model, catalog, flavor_id, field
                )  # type: ignore[union-attr]
                expected = "none" if answer.value is None else str(answer.value)
                assert cells[flavor_id] == expected, (heading, flavor_id)
        await pilot.press("x")  # and off again
        await pilot.pause()
        assert "max" not in [str(key.value) for key in table.columns]
