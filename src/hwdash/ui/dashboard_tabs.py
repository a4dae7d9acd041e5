"""The dashboard's tabs: the tab bar over the planner, compare and monitor pages, forwarding the
planner's keys to the planner pane while its tab is shown.

May import Textual, :mod:`hwdash.ui.planner_keys` and :mod:`hwdash.ui.widgets.tab_bar` (not the panes:
the app hands it the first pane and mounts the others).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Container, Vertical
from textual.message import Message
from textual.widget import Widget
from textual.widgets import ContentSwitcher, Input

from hwdash.ui.planner_keys import PLANNER_BINDINGS
from hwdash.ui.widgets.tab_bar import TabBar

TabName = Literal["planner", "compare", "monitor"]
TAB_NAMES: tuple[TabName, ...] = ("planner", "compare", "monitor")


class TabPage(Container):
    """What one tab shows (its pane is mounted into it)."""


class DashboardTabs(Vertical):
    """The tab bar over the three pages, forwarding the planner's keys to the planner pane
    while its tab is shown.

    Focus starts on the tab bar, and escape leaves a field for it: from there (and from anywhere
    in the planner tab but a text field) the planner's keys work; inside the pane, the pane's own
    bindings answer first. Escape, shown in the footer while a text field has focus, leaves it.
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        *(
            Binding(
                binding.key,
                f"planner({binding.action!r})",
                binding.description,
                show=binding.show,
                group=binding.group,
            )
            for binding in PLANNER_BINDINGS
        ),
        Binding("escape", "leave_field", "Leave field"),
    ]

    class TabActivated(Message):
        """The tab shown changed to ``tab``."""

        def __init__(self, tab: str) -> None:
            super().__init__()
            self.tab = tab

    def __init__(self, initial: TabName, first_pane: Widget) -> None:
        super().__init__(id="tabs")
        self._active: str = initial
        self._first_pane = first_pane

    def compose(self) -> ComposeResult:
        yield TabBar([(tab, tab.capitalize()) for tab in TAB_NAMES], self._active, id="tab-bar")
        with ContentSwitcher(initial=self._active):
            for tab in TAB_NAMES:
                with TabPage(id=tab):
                    # The other tabs get their panes when first shown (the app mounts them).
                    if tab == self._active:
                        yield self._first_pane

    @property
    def active(self) -> str:
        """Id of the tab shown."""
        return self._active

    @active.setter
    def active(self, tab: str) -> None:
        if tab == self._active:
            return
        self._active = tab
        self.query_one(ContentSwitcher).current = tab
        self.tab_bar.active = tab
        self.post_message(self.TabActivated(tab))

    @property
    def tab_bar(self) -> TabBar:
        return self.query_one(TabBar)

    def get_pane(self, tab: str) -> TabPage:
        """The page of ``tab``."""
        return self.query_one(f"#{tab}", TabPage)

    async def on_tab_bar_chosen(self, event: TabBar.Chosen) -> None:
        event.stop()
        await self.app.run_action(f"show_tab({event.tab!r})")

    def _planner_pane(self) -> Widget | None:
        """The planner pane, when its tab is shown."""
        if self.active != "planner":
            return None
        pane = self.get_pane("planner")
        return pane.children[0] if pane.children else None

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """The planner's keys only while the planner is shown; escape (shown in the footer) only
        in a text field: elsewhere the app's escape, not shown, takes the focus to the tab bar."""
        if action == "planner":
            return self._planner_pane() is not None
        if action == "leave_field":
            return isinstance(self.screen.focused, Input)
        return True

    async def action_planner(self, action: str) -> None:
        """Run one of the planner pane's actions on it."""
        pane = self._planner_pane()
        if pane is not None:
            await self.app.run_action(action, pane)

    def action_leave_field(self) -> None:
        """Leave a text field for the tab bar, where the single-letter keys work again."""
        self.screen.set_focus(self.tab_bar)
