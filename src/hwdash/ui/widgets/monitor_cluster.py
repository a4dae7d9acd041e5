"""Every GPU of a cluster (a Prometheus or SSH source), one line each, grouped by host, hottest first.

A single widget drawing its own lines (Textual's line API): only the lines on screen are rendered,
each line is cached by its text, and a round that changes a few GPUs repaints a few lines, so 100
hosts x 8 GPUs stay cheap (``bench/cluster_bench.py``). Hosts are ordered by their fullest GPU, the
GPUs of a host by pressure; a host whose data stopped is marked stale on its heading and its rows.
A GPU with health diagnoses in force on its host (``hwdash exporter``'s ``hwdash_gpu_diagnosis*``
series) has a second line under it in the host's own words: the first diagnosis, its hint and how
many more, cut to the width (as the GPU card's detail line says it on this machine).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rich.segment import Segment
from rich.style import Style
from textual.geometry import Region, Size
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widget import Widget

from hwdash.telemetry.cluster import hosts_fullest_first
from hwdash.telemetry.types import GpuSample, GpuState
from hwdash.ui.sampling import short_gpu_name
from hwdash.ui.widgets.monitor_cells import BarModel, bar_runs
from hwdash.ui.widgets.monitor_gpu import (
    fit_text,
    forecast_text,
    gib_pair_text,
    percent_text,
    power_text,
    reading_styles,
    temperature_text,
)

#: Columns of a GPU line after the bar: (width, alignment).
BAR_MIN = 10
HOST_WIDTH = 16
NAME_WIDTH = 17


@dataclass(frozen=True)
class ClusterLine:
    """One line of the table: a host heading or one GPU."""

    kind: str
    """``gpu`` (one line per GPU) or ``diagnosis`` (under a GPU with diagnoses in force)."""
    text: tuple[str, ...]
    """The cells' text (what the line's cache is keyed on)."""
    bar: BarModel | None = None
    alert: bool = False
    stale: bool = False
    colours: tuple[str, str, str] = ("", "", "")
    """Utilization, temperature and power coloured by load (as on this machine's GPU rows)."""


def cluster_lines(gpus: tuple[GpuSample, ...], threshold: float) -> list[ClusterLine]:
    """One line per GPU, grouped by host (the host whose fullest GPU is fullest first), each host's
    GPUs fullest first; the host's name is on its first line (32 GPUs fit a 120x40 screen)."""
    lines: list[ClusterLine] = []
    for host, members in hosts_fullest_first(gpus):
        for place, gpu in enumerate(members):
            note = gpu.host_stale
            stale = note is not None
            host_cell = ""
            if place == 0:
                # An SSH host whose connection is gone says so (ssh_source's "unreachable: ...").
                mark = " (unreachable)" if note and note.startswith("unreachable") else " (stale)"
                host_cell = host + (mark if stale else "")
            taken = None
            if gpu.total_bytes is not None and gpu.free_bytes is not None:
                taken = gpu.total_bytes - gpu.free_bytes
            memory = gib_pair_text(taken, gpu.total_bytes, wide=False)
            alert = gpu.state is not GpuState.OK
            used = gpu.used_bytes
            if used is None and taken is not None:
                used = taken - (gpu.reserved_bytes or 0)
            bar = BarModel(
                total=gpu.total_bytes,
                reserved=gpu.reserved_bytes,
                used=used,
                threshold=threshold,
                alert=alert,
                message="GPU lost" if gpu.state is GpuState.LOST else None,
            )
            number = "?" if gpu.host_gpu is None else str(gpu.host_gpu)
            text = (
                host_cell,
                f"{number:>2} {short_gpu_name(gpu.name)}",
                percent_text(None if gpu.pressure is None else gpu.pressure * 100),
                memory,
                forecast_text(gpu.forecast_full_s),
                percent_text(gpu.utilization_gpu),
                temperature_text(gpu),
                power_text(gpu, wide=False),
            )
            lines.append(
                ClusterLine(
                    "gpu", text, bar=bar, alert=alert, stale=stale, colours=reading_styles(gpu)
                )
            )
            if gpu.diagnoses:
                lines.append(ClusterLine("diagnosis", (diagnosis_text(gpu),), stale=stale))
    return lines


def diagnosis_text(gpu: GpuSample) -> str:
    """``⚠ <message> (+N more); <hint>``: the GPU's first diagnosis, the count of the others before
    the hint so a narrow screen that cuts the line still shows it."""
    first = gpu.diagnoses[0]
    more = f" (+{len(gpu.diagnoses) - 1} more)" if len(gpu.diagnoses) > 1 else ""
    hint = f"; {first.hint}" if first.hint else ""
    return f"⚠ {first.message}{more}{hint}"


RIGHT_MARGIN = 4
"""Cells a line leaves free at its right end (two are the scroll bar's when the table is taller
than the screen)."""
DIAGNOSIS_INDENT = HOST_WIDTH + 4
"""Where a diagnosis line starts: under the GPU's name (the host column and the GPU's number)."""

#: Widths of the cells after the name: pressure, memory, forecast, util, temp, power.
CELL_WIDTHS = (4, 13, 5, 4, 5, 6)
#: What each column of a line holds, said once above the table (the GPU view's words).
HEADINGS = ("host", "GPU", "memory", "full", "in use", "OOM", "util", "temp", "power")


def cluster_bar_width(width: int) -> int:
    """The memory bar's width in a table ``width`` cells wide (what is left after the cells)."""
    cells = sum(CELL_WIDTHS) + len(CELL_WIDTHS)
    return max(BAR_MIN, width - HOST_WIDTH - NAME_WIDTH - cells - RIGHT_MARGIN)


def heading_text(width: int) -> str:
    """The column headings over a table ``width`` cells wide, aligned with its lines."""
    host, name, bar, *cells = HEADINGS
    text = fit_text(host, HOST_WIDTH, "left") + " " + fit_text(name, NAME_WIDTH, "left") + " "
    text += fit_text(bar, cluster_bar_width(width), "left")
    for title, size in zip(cells, CELL_WIDTHS, strict=True):
        text += " " + fit_text(title, size, "right")
    return text


class ClusterHeading(Widget):
    """One line of column headings over :class:`ClusterTable`, laid out with the table's widths."""

    DEFAULT_CSS = """
    ClusterHeading { height: 1; text-style: bold; }
    """

    def __init__(self, table: ClusterTable, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.table = table

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        if y != 0:
            return Strip.blank(width, self.rich_style)
        text = heading_text(self.table.size.width or width)
        return Strip([Segment(text, self.rich_style)]).crop_extend(0, width, self.rich_style)


class ClusterTable(ScrollView, can_focus=True):
    """The cluster's GPUs (see the module); scroll with the arrows, the wheel or page keys."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "cluster-table--host",
        "cluster-table--alert",
        "cluster-table--stale",
        "cluster-table--diagnosis",
    }
    DEFAULT_CSS = """
    ClusterTable { height: 1fr; min-height: 3; }
    ClusterTable > .cluster-table--host { text-style: bold; color: $accent; }
    ClusterTable > .cluster-table--diagnosis { color: $warning; }
    ClusterTable > .cluster-table--alert { color: $error; text-style: bold; }
    ClusterTable > .cluster-table--stale { text-style: dim italic; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.lines: list[ClusterLine] = []
        self._strips: dict[tuple[object, ...], Strip] = {}
        self._drawn: dict[int, tuple[object, ...]] = {}

    def show(self, gpus: tuple[GpuSample, ...], threshold: float) -> None:
        """Bring the table in line with these GPUs, repainting only the lines that changed."""
        self.lines = cluster_lines(gpus, threshold)
        self.virtual_size = Size(self.size.width, len(self.lines))
        if not self.is_mounted:
            return
        width = self.size.width
        for y in range(self.size.height):
            if self._drawn.get(y) != self._line_key(y):
                self.refresh(Region(0, y, width, 1))

    def _line_key(self, y: int) -> tuple[object, ...]:
        index = self.scroll_offset.y + y
        if index >= len(self.lines):
            return ("blank", self.size.width)
        line = self.lines[index]
        return (self.size.width, line)

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._strips.clear()
        self._drawn.clear()

    def watch_scroll_y(self, old: float, new: float) -> None:
        super().watch_scroll_y(old, new)
        self.refresh()

    def render_line(self, y: int) -> Strip:
        key = self._line_key(y)
        self._drawn[y] = key
        strip = self._strips.get(key)
        if strip is None:
            if len(self._strips) > 512:
                self._strips.clear()
            strip = self._strips[key] = self._build(key)
        return strip

    def _build(self, key: tuple[object, ...]) -> Strip:
        width = self.size.width
        base = self.rich_style
        if key[0] == "blank":
            return Strip.blank(width, base)
        line = key[1]
        assert isinstance(line, ClusterLine)
        style = base
        host_style = base + self.get_component_rich_style("cluster-table--host", partial=True)
        if line.alert:
            style += self.get_component_rich_style("cluster-table--alert", partial=True)
        if line.stale:
            style += self.get_component_rich_style("cluster-table--stale", partial=True)
        if line.kind == "diagnosis":
            style += self.get_component_rich_style("cluster-table--diagnosis", partial=True)
            text = fit_text(line.text[0], width - DIAGNOSIS_INDENT - RIGHT_MARGIN, "left")
            segments = [Segment(" " * DIAGNOSIS_INDENT, base), Segment(text, style)]
            return Strip(segments).crop_extend(0, width, base)
        bar_width = cluster_bar_width(width)
        segments = [
            Segment(fit_text(line.text[0], HOST_WIDTH, "left") + " ", host_style),
            Segment(fit_text(line.text[1], NAME_WIDTH, "left") + " ", style),
        ]
        if line.bar is not None:
            for text, bar_style in bar_runs(line.bar, bar_width):
                segments.append(Segment(text, base + Style.parse(bar_style) if bar_style else base))
        # An alert or a stale host colours the whole line; else the readings show their load.
        colours = ("",) * 3 + (line.colours if not (line.alert or line.stale) else ("",) * 3)
        for text, size, colour in zip(line.text[2:], CELL_WIDTHS, colours, strict=True):
            cell_style = style + Style.parse(colour) if colour else style
            segments.append(Segment(" " + fit_text(text, size, "right"), cell_style))
        return Strip(segments).crop_extend(0, width, base)
