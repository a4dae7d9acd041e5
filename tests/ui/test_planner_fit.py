"""The make-it-fit dialog as drawn: each option's kind is set off from its figures."""

from __future__ import annotations

import re

import pytest
from textual.app import App
from textual.widgets import OptionList

from hwdash.core.catalog import Catalog, load_catalog
from hwdash.core.models.config import resolve_model
from hwdash.core.plan import Method, Plan
from hwdash.core.planning.fit_options import find_fit_options
from hwdash.ui.widgets.planner_fit import FitOptionsDialog


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog(include_user=False)


@pytest.mark.parametrize("size", [(80, 24), (120, 40), (200, 60)])
async def test_the_kind_of_an_option_never_runs_into_its_numbers(
    catalog: Catalog, size: tuple[int, int]
) -> None:
    # Issue 23: "keeps the experiment18.9 GiB". Options that keep and that change the experiment.
    plan = Plan(model="qwen2.5-7b", method=Method.LORA, seq=8192, grad_ckpt=True)
    model = resolve_model(plan.model, catalog)
    search = find_fit_options(plan, model, catalog, "l4x1", [catalog.flavors["l4x1"]])
    assert {option.keeps_experiment for option in search.options} == {True, False}

    class DialogApp(App[None]):
        def on_mount(self) -> None:
            self.push_screen(FitOptionsDialog(search, "l4x1"))

    app = DialogApp()
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        options = app.screen.query_one(OptionList)
        lines = []
        for index in range(len(search.options)):
            options.highlighted = index  # scroll every option into view
            await pilot.pause()
            lines += [options.render_line(y).text for y in range(options.size.height)]
    labelled = [line for line in lines if "the experiment" in line]
    assert labelled
    # The label, then a separator, then the figures: whitespace alone is lost when a line wraps or
    # is copied out of the terminal.
    for line in labelled:
        assert re.search(r"(keeps|changes) the experiment · \d+\.\d GiB/GPU", line), line
    # Copied as the terminal shows it (lines joined): no label runs into a number.
    assert not re.search(r"experiment\s*\d", "".join(line.strip() for line in lines))


async def test_when_nothing_fits_the_dialog_shows_the_closest_options_without_applying_them(
    catalog: Catalog,
) -> None:
    plan = Plan(model="llama-3.1-70b", method=Method.FULL, seq=1024)
    model = resolve_model(plan.model, catalog)
    search = find_fit_options(plan, model, catalog, "t4-small", [catalog.flavors["t4-small"]])
    assert not search.options and len(search.closest) == 3
    chosen: list[object] = []

    class DialogApp(App[None]):
        def on_mount(self) -> None:
            self.push_screen(FitOptionsDialog(search, "t4-small"), chosen.append)

    app = DialogApp()
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        closest = app.screen.query_one("#fit-closest", OptionList)
        shown = [closest.render_line(y).text for y in range(closest.size.height)]
        assert any("changes the experiment · " in line for line in shown)
        assert "least over" in str(app.screen.query_one("#fit-closest-title").render())
        closest.focus()
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, FitOptionsDialog) and chosen == []  # nothing applied
        await pilot.press("escape")
        await pilot.pause()
        assert chosen == [None]
