"""Keys that always work: tab switching from anywhere but a text field, the planner's keys from the
tab bar, a help screen that lists every key, and app keys that stay in an 80-column footer."""

from __future__ import annotations

import re
from pathlib import Path

from snapshot_apps.fake_dashboard import fake_app, wait_for_frames
from textual.binding import Binding
from textual.containers import ScrollableContainer
from textual.scroll_view import ScrollView
from textual.widgets import Input, Static
from textual.widgets._footer import FooterKey

from hwdash.ui.app import HELP_TEXT, DashboardTabs, HwdashApp
from hwdash.ui.compare_pane import ComparePane
from hwdash.ui.monitor_pane import MonitorPane
from hwdash.ui.planner_pane import PlannerPane
from hwdash.ui.widgets.monitor_process_detail import ProcessDetailScreen
from hwdash.ui.widgets.monitor_processes import ProcessTable
from hwdash.ui.widgets.planner_dialogs import ConfirmDialog, NameDialog
from hwdash.ui.widgets.planner_flavors import FlavorTable
from hwdash.ui.widgets.tab_bar import TabBar

KEY_SHOWN = {
    "question_mark": "?",
    "left_square_bracket": "[",
    "right_square_bracket": "]",
    "left_curly_bracket": "{",
    "right_curly_bracket": "}",
}
"""Textual's names of keys that the help and the README write as the character."""


async def test_tab_then_m_c_p_switch_tabs_and_the_first_tab_reaches_a_field(
    tmp_path: Path,
) -> None:
    app, _clock = fake_app("h100x8", data_dir=tmp_path, start_s=30, initial_tab="planner")
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.pause()
        assert isinstance(app.focused, TabBar)
        await pilot.press("tab")
        # No container takes a focus stop: the first tab lands on the first form field.
        assert app.focused is not None and app.focused.id == "plan-model"
        await pilot.press("escape", "m")
        assert app.active_tab == "monitor"
        await pilot.press("c")
        assert app.active_tab == "compare"
        await pilot.press("p")
        assert app.active_tab == "planner"


async def test_m_and_c_switch_from_the_fits_only_checkbox_and_the_provider_select(
    tmp_path: Path,
) -> None:
    # The two share a row: hiding the planner moved the focus to the other one, which pulled the
    # planner back on screen, so m and c only bounced the focus between them.
    app, _clock = fake_app("h100x8", data_dir=tmp_path, start_s=30, initial_tab="planner")
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.pause()
        for selector in ("#plan-fits-only", "#plan-provider"):
            for tab_key, tab in (("m", "monitor"), ("c", "compare")):
                app.query_one(selector).focus()
                await pilot.pause()
                await pilot.press(tab_key)
                await pilot.pause()
                assert app.active_tab == tab, selector
                # The tab bar has the focus, so the next tab key works at once.
                assert isinstance(app.focused, TabBar)
                await pilot.press("p")
                assert app.active_tab == "planner"


async def test_no_container_takes_a_focus_stop(tmp_path: Path) -> None:
    app, _clock = fake_app("h100x8", data_dir=tmp_path, start_s=30, initial_tab="planner")
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for_frames(pilot, app, 1)
        for key, tab in (("p", "planner"), ("c", "compare"), ("m", "monitor")):
            await pilot.press(key)
            await pilot.pause()
            assert app.active_tab == tab
            chain = app.screen.focus_chain
            assert chain, tab
            # Scrolling containers, not widgets that scroll their own content (inputs, tables).
            containers = [
                w
                for w in chain
                if isinstance(w, ScrollableContainer) and not isinstance(w, ScrollView)
            ]
            assert not containers, (tab, containers)


async def test_planner_keys_work_from_the_tab_bar(tmp_path: Path) -> None:
    app, _clock = fake_app("h100x8", data_dir=tmp_path, start_s=30, initial_tab="planner")
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.pause()
        assert isinstance(app.focused, TabBar)  # where focus starts, and where escape leaves it
        table = app.query_one(FlavorTable)
        await pilot.press("2")
        assert table.sort_by == "time"
        await pilot.press("3")
        assert table.sort_by == "memory"
        provider = table.provider
        await pilot.press("v")
        assert table.provider != provider
        fits_only = table.fits_only
        await pilot.press("o")
        assert table.fits_only != fits_only
        await pilot.press("s")
        await pilot.pause()
        assert type(app.screen).__name__ == "NameDialog"


async def test_planner_keys_type_into_a_text_field(tmp_path: Path) -> None:
    app, _clock = fake_app("h100x8", data_dir=tmp_path, start_s=30, initial_tab="planner")
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.pause()
        field = app.query_one("#plan-model", Input)
        field.focus()
        field.value = ""
        await pilot.press("s", "m", "2")
        assert field.value == "sm2"
        assert app.active_tab == "planner"


async def test_o_sorts_processes_on_the_monitor_only(tmp_path: Path) -> None:
    app, _clock = fake_app("h100x8", data_dir=tmp_path, start_s=30, initial_tab="monitor")
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_for_frames(pilot, app, 1)
        table = app.query_one(ProcessTable)
        before = table.sort_column
        await pilot.press("o")
        assert table.sort_column != before


def _help_keys() -> dict[str, set[str]]:
    """The keys the help lists, by section: a key line is two spaces, the keys (``a / b``), two
    spaces or more, what they do; a section starts with its bold title."""
    sections: dict[str, set[str]] = {}
    section = ""
    for line in HELP_TEXT.splitlines():
        title = re.match(r"\[b\](\w+)\[/b\]", line)
        if title:
            section = title.group(1)
            continue
        keys = re.match(r"  (\S+(?: / \S+)*)  ", line)
        if keys:
            sections.setdefault(section, set()).update(keys.group(1).split(" / "))
    return sections


#: Where the help lists each class's keys (the app's own keys: any section).
HELP_SECTIONS: tuple[tuple[type[object], str | None], ...] = (
    (HwdashApp, None),
    (DashboardTabs, None),
    (TabBar, None),
    (PlannerPane, "Planner"),
    (ComparePane, "Compare"),
    (MonitorPane, "Monitor"),
    (ProcessTable, "Monitor"),
)


def test_the_help_lists_every_key_in_its_section() -> None:
    sections = _help_keys()
    assert {"Everywhere", "Monitor", "Planner", "Compare"} <= set(sections)
    everywhere = set().union(*sections.values())
    for owner, section in HELP_SECTIONS:
        listed = sections[section] if section else everywhere
        bindings = [b for b in owner.BINDINGS if isinstance(b, Binding)]
        assert bindings, owner
        for binding in bindings:
            for key in binding.key.split(","):
                shown = KEY_SHOWN.get(key.strip(), key.strip())
                assert shown in listed, f"{owner.__name__}: {shown} is not in the help"


def test_the_help_fits_its_box_at_80_columns() -> None:
    # 80 columns less the border, padding and scroll bar: a longer line wraps without its indent.
    plain = re.sub(r"\[/?b\]", "", HELP_TEXT)
    assert max(len(line) for line in plain.splitlines()) <= 72


async def test_the_app_keys_stay_in_an_80_column_footer(tmp_path: Path) -> None:
    app, _clock = fake_app("h100x8", data_dir=tmp_path, start_s=30, initial_tab="planner")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        app.query_one(FlavorTable).focus()  # the planner's own keys are in the footer too
        wanted = {"p", "c", "m", "question_mark", "q"}
        visible: set[str] = set()
        for _ in range(100):  # the footer is laid out again after the focus moves (a frame later)
            await pilot.pause(0.02)
            footer_keys = [key for key in app.screen.query(FooterKey) if key.region.width > 0]
            visible = {key.key for key in footer_keys if key.region.right <= 80}
            if wanted <= visible:
                break
        assert wanted <= visible, visible


def _footer_keys(app: HwdashApp) -> dict[str, str]:
    """The keys the footer shows on an 80-column screen, and what it says for each."""
    return {
        key.key: key.description
        for key in app.screen.query(FooterKey)
        if key.region.width > 0 and key.region.right <= 80
    }


async def test_from_the_tab_bar_the_planner_footer_names_its_keys_and_the_app_keys(
    tmp_path: Path,
) -> None:
    app, _clock = fake_app("h100x8", data_dir=tmp_path, start_s=30, initial_tab="planner")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await pilot.pause()
        assert isinstance(app.focused, TabBar)
        shown = _footer_keys(app)
        assert {"s", "t", "f", "p", "c", "m", "question_mark", "q"} <= set(shown), shown
        # o shows only the fitting flavors here: the monitor's "sort processes" is not offered.
        assert "Sort processes" not in shown.values()


async def test_while_typing_the_footer_shows_the_keys_that_work_in_a_field(
    tmp_path: Path,
) -> None:
    app, _clock = fake_app("h100x8", data_dir=tmp_path, start_s=30, initial_tab="planner")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        app.query_one("#plan-seq", Input).focus()
        await pilot.pause()
        await pilot.pause()
        shown = _footer_keys(app)
        assert {"ctrl+s", "ctrl+t", "escape"} <= set(shown), shown
        # Letters type into the field: the footer does not offer them.
        assert not {"s", "t", "p", "c", "m"} & set(shown), shown


async def test_ctrl_s_and_ctrl_t_work_from_the_tab_bar(tmp_path: Path) -> None:
    app, _clock = fake_app("h100x8", data_dir=tmp_path, start_s=30, initial_tab="planner")
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.pause()
        assert isinstance(app.focused, TabBar)
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert isinstance(app.screen, NameDialog)
        await pilot.press("escape")
        await pilot.pause()
        pane = app.query_one(PlannerPane)
        assert pane.trace_outcome is None
        await pilot.press("ctrl+t")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert pane.trace_outcome is not None


async def test_the_stale_trace_hint_names_a_key_that_works_in_the_field(tmp_path: Path) -> None:
    app, _clock = fake_app("h100x8", data_dir=tmp_path, start_s=30, initial_tab="planner")
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.pause()
        pane = app.query_one(PlannerPane)
        field = app.query_one("#plan-seq", Input)
        field.focus()
        await pilot.press("ctrl+t")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert pane.trace_outcome is not None and not pane.trace_is_stale
        await pilot.press("end", "backspace", "backspace", "backspace", "backspace", *"1024")
        await pilot.pause()
        assert pane.trace_is_stale
        hint = str(app.query_one("#trace-result", Static).render())
        found = re.search(r"(\S+) traces again", hint)
        assert found is not None, hint
        key = found.group(1)
        await pilot.press(key)  # still in the field
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert app.focused is field and field.value == "1024"
        assert not pane.trace_is_stale


README = Path(__file__).resolve().parents[2] / "README.md"

#: Where the README's keys table lists each class's keys (the app's own, which act on the tab shown:
#: any section).
README_SECTIONS: tuple[tuple[type[object], str | None], ...] = (
    (HwdashApp, None),
    (DashboardTabs, "planner"),
    (TabBar, None),
    (PlannerPane, "planner"),
    (ComparePane, "compare"),
    (MonitorPane, "monitor"),
    (ProcessTable, "monitor"),
    (ProcessDetailScreen, "monitor"),
    (ConfirmDialog, "monitor"),
)


def _readme_keys() -> dict[str, set[str]]:
    """The keys of the README's keys table, by its first column (``| where | `a` / `b` | ... |``)."""
    text = README.read_text(encoding="utf-8")
    table = text.split("### Keys", 1)[1]
    sections: dict[str, set[str]] = {}
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[1].startswith("`"):
            if sections and not line.startswith("|"):
                break  # the end of the table
            continue
        sections.setdefault(cells[0], set()).update(re.findall(r"`([^`]+)`", cells[1]))
    return sections


def test_the_readme_keys_table_lists_every_binding() -> None:
    sections = _readme_keys()
    assert {"everywhere", "monitor", "planner", "compare"} <= set(sections)
    for owner, section in README_SECTIONS:
        bindings = [b for b in getattr(owner, "BINDINGS", []) if isinstance(b, Binding)]
        assert bindings, owner
        for binding in bindings:
            for key in binding.key.split(","):
                shown = KEY_SHOWN.get(key.strip(), key.strip())
                listed = (
                    sections[section] | sections["everywhere"]
                    if section
                    else set().union(*sections.values())
                )
                assert shown in listed, f"{owner.__name__}: {shown} is not in the README's keys"
