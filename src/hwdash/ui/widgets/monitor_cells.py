"""Small widgets the monitor pane is built from: a text cell that repaints only when its text changes,
a memory bar, and a sparkline renderer.

Redrawing only what changed is what keeps the dashboard cheap over SSH: every number lives in its own
fixed-size cell, and a cell whose text is unchanged is never refreshed, so Textual sends nothing for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import groupby

from rich.text import Text
from textual.widget import Widget
from textual.widgets import Static

#: Eight heights of a sparkline column, lowest first (a space is "nothing").
SPARK_LEVELS = " ▁▂▃▄▅▆▇█"


class TextCell(Static):
    """A one-line Static that ignores updates that would not change what is shown."""

    def __init__(
        self,
        text: str | Text = "",
        *,
        id: str | None = None,
        classes: str = "",
        fixed_height: bool = True,
    ) -> None:
        super().__init__(text, id=id, classes=classes, markup=False)
        self._shown: str | Text = text
        self._fixed_height = fixed_height

    @property
    def shown(self) -> str:
        """The plain text on screen (what tests read)."""
        return self._shown.plain if isinstance(self._shown, Text) else self._shown

    def show(self, text: str | Text) -> bool:
        """Display ``text``; returns whether anything changed (and was repainted)."""
        if text == self._shown:
            return False
        self._shown = text
        # Most cells have a fixed size in the CSS, so new text never needs a layout pass.
        self.update(text, layout=not self._fixed_height)
        return True


def sparkline(values: tuple[float, ...], width: int) -> str:
    """The last ``width`` values (each 0..1) as block characters, right-aligned, padded with spaces."""
    if width <= 0:
        return ""
    recent = values[-width:]
    top = len(SPARK_LEVELS) - 1
    chars = []
    for value in recent:
        clamped = min(1.0, max(0.0, value))
        # Any non-zero value shows at least the lowest block, so "a little" never looks like "none".
        level = round(clamped * top)
        if clamped > 0 and level == 0:
            level = 1
        chars.append(SPARK_LEVELS[level])
    return " " * (width - len(chars)) + "".join(chars)


@dataclass(frozen=True)
class BarModel:
    """What a memory bar draws, in bytes (None when unknown)."""

    total: int | None = None
    """Memory of the GPU."""
    reserved: int | None = None
    """Reserved by the driver (drawn apart from ``used``)."""
    used: int | None = None
    """Used by processes."""
    threshold: float = 0.9
    """Where the alert tick is drawn (fraction of total)."""
    plan: int | None = None
    """The plan's expected per-GPU total, drawn as a marker."""
    alert: bool = False
    """Draw in the alert colour."""
    message: str | None = None
    """Draw this text instead of a bar (a lost GPU, memory not readable)."""


#: Styles of the bar's parts (Rich styles: the bar is rendered text, not CSS).
USED_STYLE = "#5fba7d"
WARM_STYLE = "#e0b050"
ALERT_STYLE = "bold #ff5f5f"
RESERVED_STYLE = "#8a8aa0"
FREE_STYLE = "#3a3a48"
TICK_STYLE = "bold #ff5f5f"
PLAN_STYLE = "bold #c792ea"


def bar_cells(model: BarModel, width: int) -> tuple[str, ...]:
    """The bar as one code per cell: ``r`` reserved, ``u`` used, ``f`` free, ``t`` tick, ``p`` plan.

    Pure, so the widget can compare the codes of two samples and repaint only when they differ.
    """
    if width <= 0 or model.total is None or model.total <= 0 or model.message is not None:
        return ()
    scale = width / model.total
    reserved_cells = round((model.reserved or 0) * scale)
    used_cells = round(((model.reserved or 0) + (model.used or 0)) * scale) - reserved_cells
    reserved_cells = min(reserved_cells, width)
    used_cells = max(0, min(used_cells, width - reserved_cells))
    cells = ["r"] * reserved_cells + ["u"] * used_cells
    cells += ["f"] * (width - len(cells))
    tick = min(width - 1, int(model.threshold * width))
    if cells[tick] == "f":
        cells[tick] = "t"
    if model.plan is not None and model.plan > 0:
        cells[min(width - 1, int(model.plan * scale))] = "p"
    return tuple(cells)


class MemoryBar(Widget):
    """One line: reserved, used and free memory, the alert tick and the plan's marker."""

    DEFAULT_CSS = """
    MemoryBar { height: 1; min-width: 8; }
    """

    def __init__(self, *, id: str | None = None, classes: str = "") -> None:
        super().__init__(id=id, classes=classes)
        self._model = BarModel()
        self._drawn: tuple[object, ...] | None = None

    @property
    def model(self) -> BarModel:
        """What the bar currently shows."""
        return self._model

    def show(self, model: BarModel) -> bool:
        """Display ``model``; repaint only if the drawn cells or colour change."""
        self._model = model
        drawn = self._drawn_key(self.size.width)
        if drawn == self._drawn:
            return False
        self._drawn = drawn
        self.refresh()
        return True

    def _drawn_key(self, width: int) -> tuple[object, ...]:
        model = self._model
        return (width, bar_cells(model, width), model.message, self._used_style(model))

    @staticmethod
    def _used_style(model: BarModel) -> str:
        if model.alert:
            return ALERT_STYLE
        taken = (model.reserved or 0) + (model.used or 0)
        if model.total and model.used is not None and taken / model.total >= model.threshold - 0.1:
            return WARM_STYLE
        return USED_STYLE

    def render(self) -> Text:
        width = self.size.width
        self._drawn = self._drawn_key(width)
        model = self._model
        if model.message is not None:
            return Text(model.message[:width], style=ALERT_STYLE if model.alert else "italic")
        cells = bar_cells(model, width)
        if not cells:
            return Text("n/a".ljust(width), style="italic")
        used_style = self._used_style(model)
        glyphs = {
            "r": ("▒", RESERVED_STYLE),
            "u": ("█", used_style),
            "f": ("─", FREE_STYLE),
            "t": ("│", TICK_STYLE),
            "p": ("┃", PLAN_STYLE),
        }
        text = Text()
        # One span per run of equal cells: a span per cell would repeat the colour escape codes
        # for every character sent to the terminal.
        for code, run in groupby(cells):
            char, style = glyphs[code]
            text.append(char * len(list(run)), style)
        return text


class SparkCell(Widget):
    """A sparkline of values in 0..1 that fills the cell's width; repaints only when it changes."""

    DEFAULT_CSS = """
    SparkCell { height: 1; }
    """

    def __init__(self, *, id: str | None = None, classes: str = "") -> None:
        super().__init__(id=id, classes=classes)
        self._values: tuple[float, ...] = ()
        self._drawn: str | None = None

    @property
    def shown(self) -> str:
        """The characters on screen."""
        return sparkline(self._values, self.size.width)

    def show(self, values: tuple[float, ...]) -> bool:
        """Display ``values`` (oldest first); returns whether the drawn characters changed."""
        self._values = values
        drawn = sparkline(values, self.size.width)
        if drawn == self._drawn:
            return False
        self._drawn = drawn
        self.refresh()
        return True

    def render(self) -> Text:
        self._drawn = sparkline(self._values, self.size.width)
        return Text(self._drawn, style="#5fafd7")
