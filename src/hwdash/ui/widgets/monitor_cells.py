"""Small widgets the monitor pane is built from: a text cell that repaints only when its text changes,
a memory bar, and a sparkline renderer.

Redrawing only what changed is what keeps the dashboard cheap over SSH: every number lives in its own
fixed-size cell, and a cell whose text is unchanged is never refreshed, so Textual sends nothing for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import groupby

from rich.text import Text
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


#: Colours of a reading's intensity, as nvitop shows them (``INTENSITY2COLOR`` in nvitop's device
#: module: light green, moderate yellow, heavy red).
INTENSITY_STYLES = ("green", "yellow", "red")
#: Utilization (%) where a GPU's load turns moderate and heavy: nvitop's defaults
#: (``GPU_UTILIZATION_THRESHOLDS = (10, 75)``, also its ``NVITOP_GPU_UTILIZATION_THRESHOLDS``).
UTILIZATION_THRESHOLDS = (10.0, 75.0)
#: Temperature (°C) shown as warm and hot. NVIDIA's data-center GPUs begin to slow their clocks in
#: the high 80s (``nvidia-smi -q``, "GPU Slowdown Temp"); these margins under it are our choice.
TEMPERATURE_THRESHOLDS = (70.0, 85.0)
#: Power draw as a fraction of the power limit: from 75% the GPU works hard, from 95% it is at its
#: cap and the driver holds its clocks down (power capping, ``nvidia-smi -q`` "Clocks Event
#: Reasons: SW Power Cap"). Our choice of margins.
POWER_THRESHOLDS = (0.75, 0.95)


def intensity_style(value: float | None, thresholds: tuple[float, float]) -> str:
    """The colour of a reading: green under the first threshold, yellow under the second, red from
    it; no colour when the reading is unknown."""
    if value is None:
        return ""
    moderate, heavy = thresholds
    if value >= heavy:
        return INTENSITY_STYLES[2]
    return INTENSITY_STYLES[1] if value >= moderate else INTENSITY_STYLES[0]


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


#: Colour of the sparkline.
SPARK_STYLE = "#5fafd7"

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


def bar_used_style(model: BarModel) -> str:
    """The colour of the used part: alert, warm (within 10 points of the threshold) or normal."""
    if model.alert:
        return ALERT_STYLE
    taken = (model.reserved or 0) + (model.used or 0)
    if model.total and model.used is not None and taken / model.total >= model.threshold - 0.1:
        return WARM_STYLE
    return USED_STYLE


def bar_runs(model: BarModel, width: int) -> list[tuple[str, str]]:
    """The bar as (text, Rich style) runs, one per stretch of equal cells (a run per cell would
    repeat the colour codes for every character sent to the terminal)."""
    if model.message is not None:
        text = model.message[:width].ljust(width)
        return [(text, ALERT_STYLE if model.alert else "italic")]
    cells = bar_cells(model, width)
    if not cells:
        return [("n/a".ljust(width), "italic")]
    glyphs = {
        "r": ("▒", RESERVED_STYLE),
        "u": ("█", bar_used_style(model)),
        "f": ("─", FREE_STYLE),
        "t": ("│", TICK_STYLE),
        "p": ("┃", PLAN_STYLE),
    }
    runs = []
    for code, run in groupby(cells):
        char, style = glyphs[code]
        runs.append((char * len(list(run)), style))
    return runs
