"""The form's selects at the edges of their life: set while they are being built, torn down while
they are being built (both raised ``NoMatches`` from Textual's ``Select`` under load: a plan loaded
into the planner while it was mounted, a quit right after the first frame)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from snapshot_apps.fake_dashboard import fake_app
from textual import events
from textual._context import active_message_pump
from textual.app import App, ComposeResult
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Select
from textual.widgets._select import SelectCurrent

from hwdash.core.plan import Method, Plan
from hwdash.ui.widgets.form_select import FormSelect

CHOICES = [("first", "a"), ("second", "b")]


class OneSelect(App[None]):
    def __init__(self, select: Select[Any]) -> None:
        super().__init__()
        self.select = select

    def compose(self) -> ComposeResult:
        yield self.select


class SetWhileBuilt(FormSelect):
    """Set at the moment its parts exist and the line showing the choice has no label yet."""

    async def mount_composed_widgets(self, widgets: list[Widget]) -> None:
        mounting = self.mount_all(widgets)  # the parts are attached, not built
        self.value = "b"
        await mounting


class TornDownWhileBuilt(FormSelect):
    """Its parts removed before its mount handler runs, as the app's teardown does on a quit."""

    async def mount_composed_widgets(self, widgets: list[Widget]) -> None:
        await self.mount_all(widgets)
        await self.remove_children()


class LabelTornDownWhileBuilt(FormSelect):
    """The teardown got as far as the label of the line showing the choice (removed first)."""

    async def mount_composed_widgets(self, widgets: list[Widget]) -> None:
        await self.mount_all(widgets)
        await self.query_one(SelectCurrent).remove_children()


def shown(select: Select[Any]) -> str:
    return str(select.query_one(SelectCurrent).label)


async def test_a_value_set_while_the_select_is_built_is_kept_and_shown() -> None:
    select = SetWhileBuilt(CHOICES, value="a", allow_blank=False)
    async with OneSelect(select).run_test() as pilot:
        await pilot.pause()
        assert select.value == "b" and shown(select) == "second"
        select.value = "a"  # and it goes on working as a Select
        assert shown(select) == "first"


@pytest.mark.parametrize("kind", [TornDownWhileBuilt, LabelTornDownWhileBuilt])
async def test_a_select_torn_down_while_built_mounts_quietly(kind: type[FormSelect]) -> None:
    select = kind(CHOICES, value="b", allow_blank=False)
    async with OneSelect(select).run_test() as pilot:
        await pilot.pause()
        assert select.is_mounted and select.value == "b"
        assert not select.query("SelectCurrent > #label")


async def test_a_plan_loaded_while_the_planner_form_is_built_fills_it(tmp_path: Path) -> None:
    """``load_plan`` at the exact moment the method select has its parts but no label yet."""
    app, _clock = fake_app("h100x8", data_dir=tmp_path, start_s=30, initial_tab="planner")
    loaded: list[bool] = []

    def load_at_the_moment(message: Message) -> None:
        if loaded or not isinstance(message, events.Compose):
            return
        pump = active_message_pump.get()
        parent = getattr(pump, "parent", None)
        if isinstance(pump, SelectCurrent) and getattr(parent, "id", None) == "plan-method":
            loaded.append(True)
            app.planner.load_plan(Plan(model="qwen2.5-7b", method=Method.QLORA), "chosen")

    async with app.run_test(size=(120, 36), message_hook=load_at_the_moment) as pilot:
        await pilot.pause()
        assert loaded
        method = app.query_one("#plan-method", Select)
        assert method.value is Method.QLORA and shown(method) == "qlora"
        assert app.planner.report is not None and app.planner.report.plan.method is Method.QLORA
