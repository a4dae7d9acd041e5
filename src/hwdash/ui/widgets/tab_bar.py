"""The dashboard's tab bar: the tab titles on one line and a rule under them, as one widget.

It draws what Textual's ``TabbedContent`` drew (a title per tab, the active one bright, a rule
whose segment under the active title is lit, the active title on the cursor colour while the bar
has the focus), but as a single widget painting two lines. ``TabbedContent`` builds a ``Tabs``
widget, a widget per title and an animated underline, each with its own styles: measured on the
dashboard's start (the full-frame time of bench/ui_bench.py), that was about 15 ms of the first frame.

Keys while it has the focus: left / right choose the previous / next tab. A click on a title
chooses that tab. The bar only reports the choice (:class:`TabBar.Chosen`); its owner switches.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from rich.segment import Segment
from textual import events
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.reactive import reactive
from textual.strip import Strip
from textual.widget import Widget


class TabBar(Widget, can_focus=True):
    """Titles of ``tabs`` (id, title) side by side, with ``active`` marked."""

    DEFAULT_CSS = """
    TabBar {
        height: 2;
        width: 1fr;
        & > .tab-bar--title { color: $foreground 50%; }
        & > .tab-bar--active { color: $foreground; }
        & > .tab-bar--rule { color: $foreground 10%; }
        & > .tab-bar--rule-active { color: $block-cursor-background; }
        &:focus > .tab-bar--active {
            color: $block-cursor-foreground;
            background: $block-cursor-background;
            text-style: $block-cursor-text-style;
        }
        &:focus > .tab-bar--rule { color: $foreground 30%; }
        &:ansi > .tab-bar--title { text-style: dim; }
        &:ansi > .tab-bar--active { text-style: not dim bold; }
    }
    """

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "tab-bar--title",
        "tab-bar--active",
        "tab-bar--rule",
        "tab-bar--rule-active",
    }

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("left", "step(-1)", "Previous tab", show=False),
        Binding("right", "step(1)", "Next tab", show=False),
    ]

    ALLOW_SELECT = False

    active: reactive[str] = reactive("")
    """Id of the tab marked as shown."""

    class Chosen(Message):
        """The user chose ``tab`` (a key or a click on the bar)."""

        def __init__(self, tab_bar: TabBar, tab: str) -> None:
            super().__init__()
            self.tab_bar = tab_bar
            self.tab = tab

        @property
        def control(self) -> TabBar:
            return self.tab_bar

    def __init__(
        self,
        tabs: Sequence[tuple[str, str]],
        active: str,
        *,
        id: str | None = None,
    ) -> None:
        super().__init__(id=id)
        if not tabs:
            raise ValueError("a tab bar needs at least one tab")
        self.tabs = tuple(tabs)
        self.set_reactive(TabBar.active, active)

    def title_spans(self) -> list[tuple[str, int, int]]:
        """(tab id, first column, column after the last) of each title, padding included."""
        spans = []
        x = 0
        for tab, title in self.tabs:
            width = len(title) + 2  # one column of padding either side
            spans.append((tab, x, x + width))
            x += width
        return spans

    def render_line(self, y: int) -> Strip:
        """Line 0: the titles; line 1: the rule, lit under the active title."""
        width = self.size.width
        if y > 1 or width <= 0:
            return Strip.blank(width, self.rich_style)
        names = dict(self.tabs)
        segments: list[Segment] = []
        end = 0
        for tab, start, stop in self.title_spans():
            is_active = tab == self.active
            if y == 0:
                role = "tab-bar--active" if is_active else "tab-bar--title"
                segments.append(Segment(f" {names[tab]} ", self.get_component_rich_style(role)))
            elif is_active:
                # Lit under the title's letters; its padding keeps the plain rule.
                rule = self.get_component_rich_style("tab-bar--rule")
                lit = self.get_component_rich_style("tab-bar--rule-active")
                segments += [
                    Segment("╸", rule),  # half-width ends: the lit part stands out
                    Segment("━" * (stop - start - 2), lit),
                    Segment("╺", rule),
                ]
            else:
                segments.append(
                    Segment("━" * (stop - start), self.get_component_rich_style("tab-bar--rule"))
                )
            end = stop
        if width > end:
            if y == 0:
                segments.append(Segment(" " * (width - end), self.rich_style))
            else:
                rule = self.get_component_rich_style("tab-bar--rule")
                segments.append(Segment("━" * (width - end), rule))
        return Strip(Segment.simplify(segments)).crop(0, width)

    def tab_at(self, x: int) -> str | None:
        """The tab whose title covers column ``x`` (None between or after them)."""
        for tab, start, stop in self.title_spans():
            if start <= x < stop:
                return tab
        return None

    def on_click(self, event: events.Click) -> None:
        tab = self.tab_at(event.x)
        if tab is not None:
            self.post_message(self.Chosen(self, tab))

    def action_step(self, step: int) -> None:
        """Choose the previous (-1) or next (+1) tab, wrapping around."""
        ids = [tab for tab, _title in self.tabs]
        index = ids.index(self.active) if self.active in ids else 0
        self.post_message(self.Chosen(self, ids[(index + step) % len(ids)]))

    def watch_active(self) -> None:
        self.refresh()
