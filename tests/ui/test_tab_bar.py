"""The dashboard's own tab bar: what it draws, clicks on a title, left/right from the bar."""

from __future__ import annotations

from pathlib import Path

from rich.color import Color
from snapshot_apps.fake_dashboard import fake_app, wait_for_frames
from textual.strip import Strip

from hwdash.ui.widgets.tab_bar import TabBar


def _columns_in(strip: Strip, color: Color | None) -> list[int]:
    """The columns of ``strip`` drawn in ``color``."""
    columns, x = [], 0
    for segment in strip:
        width = len(segment.text)
        if segment.style is not None and segment.style.color == color:
            columns += range(x, x + width)
        x += width
    return columns


def test_each_title_covers_its_padded_columns_and_nothing_between() -> None:
    bar = TabBar(
        [("planner", "Planner"), ("compare", "Compare"), ("monitor", "Monitor")], "monitor"
    )
    assert bar.title_spans() == [("planner", 0, 9), ("compare", 9, 18), ("monitor", 18, 27)]
    assert bar.tab_at(0) == "planner"
    assert bar.tab_at(8) == "planner"
    assert bar.tab_at(9) == "compare"
    assert bar.tab_at(26) == "monitor"
    assert bar.tab_at(27) is None


async def test_the_bar_draws_the_titles_and_lights_the_rule_under_the_shown_tab(
    tmp_path: Path,
) -> None:
    app, _clock = fake_app("a100x4-training", data_dir=tmp_path, initial_tab="monitor")
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for_frames(pilot, app, 1)
        bar = app.query_one(TabBar)
        titles, rule = (bar.render_line(y) for y in range(2))
        assert titles.text.startswith(" Planner  Compare  Monitor ")
        assert rule.text == "━" * 18 + "╸" + "━" * 7 + "╺" + "━" * 53
        lit = bar.get_component_rich_style("tab-bar--rule-active")
        # The rule is lit under "Monitor" (columns 19..25) only, not its padding.
        lit_columns = _columns_in(rule, lit.color)
        assert lit_columns == list(range(19, 26))
        await pilot.press("p")
        await pilot.pause()
        rule = bar.render_line(1)
        lit_columns = _columns_in(rule, lit.color)
        assert lit_columns == list(range(1, 8))


async def test_a_click_on_a_title_shows_that_tab(tmp_path: Path) -> None:
    app, _clock = fake_app("a100x4-training", data_dir=tmp_path, initial_tab="monitor")
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for_frames(pilot, app, 1)
        assert await pilot.click(TabBar, offset=(12, 0))  # on "Compare"
        await pilot.pause()
        assert app.active_tab == "compare"
        assert await pilot.click(TabBar, offset=(3, 0))  # on "Planner"
        await pilot.pause()
        assert app.active_tab == "planner"
        assert await pilot.click(TabBar, offset=(60, 0))  # past the titles: nothing
        await pilot.pause()
        assert app.active_tab == "planner"


async def test_left_and_right_on_the_bar_step_through_the_tabs_and_wrap(tmp_path: Path) -> None:
    app, _clock = fake_app("a100x4-training", data_dir=tmp_path, initial_tab="planner")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert isinstance(app.focused, TabBar)
        seen = []
        for _ in range(3):
            await pilot.press("right")
            await pilot.pause()
            seen.append(app.active_tab)
        assert seen == ["compare", "monitor", "planner"]
        await pilot.press("left")
        await pilot.pause()
        assert app.active_tab == "monitor"
        assert isinstance(app.focused, TabBar)  # the bar keeps the focus: the keys go on working
