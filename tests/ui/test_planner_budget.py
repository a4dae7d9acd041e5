"""The planner's ``budget $`` row (``--budget``): typed in the form, it feeds the plan and the table."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_planner_max import PlannerApp
from textual.widgets import Input

from hwdash.core.catalog import Catalog, load_catalog
from hwdash.core.plan import Method, Plan
from hwdash.core.plans.store import PlanStore
from hwdash.ui.planner_pane import PlannerPane


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog(include_user=False)


async def test_budget_typed_in_the_form_marks_flavors_over_it(
    catalog: Catalog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    plan = Plan(model="qwen2.5-7b", method=Method.FULL, examples=20_000)
    app = PlannerApp(catalog, PlanStore(), plan)
    async with app.run_test(size=(100, 60), notifications=True) as pilot:
        await pilot.pause()
        pane = app.query_one(PlannerPane)
        assert pane.report is not None and pane.report.plan.budget is None
        budget = app.query_one("#plan-budget", Input)
        budget.focus()
        await pilot.pause()
        await pilot.press(*"10")
        await pilot.pause()
        assert pane.errors == {}
        report = pane.report
        assert report is not None and report.plan.budget == 10.0
        assert any(fit.over_budget for fit in report.flavors)
        assert not any(fit.over_budget for fit in report.flavors if fit.cost and fit.cost <= 10)
