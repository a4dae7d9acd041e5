"""The GPU process table: GPU, PID, user, GPU memory, CPU, RSS and command, sortable.

Rows are keyed by (GPU, PID); each sample updates only the cells whose text changed, adds new
processes and removes the ones that ended, so an idle table sends nothing to the terminal.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import total_ordering
from typing import ClassVar, cast

from rich.cells import cell_len, set_cell_size
from rich.segment import Segment
from rich.text import Text
from textual import events
from textual.binding import Binding, BindingType
from textual.geometry import Region, Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from hwdash.core.units import format_bytes, format_gib, format_gib_pair
from hwdash.runs.display import run_cell
from hwdash.telemetry.history import process_key
from hwdash.telemetry.types import ProcessSample
from hwdash.ui.widgets.monitor_cells import sparkline

#: Marker for a PID that psutil cannot see from here (another container or PID namespace).
OTHER_CONTAINER = "(other container)"
#: Marker for a PID gone from /proc that NVML still lists with its memory (the process exited).
EXITED = "(exited; NVML still lists its memory)"
#: Marker for a host PID seen from inside a container: the local process of that number is another.
HOST_PID = "(host PID, not checkable here)"
#: Marker for a process with both a compute and a graphics context (listed once).
BOTH_CONTEXTS = "(C+G)"

#: (column key, heading, width) in display order.
PROCESS_COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("gpu", "GPU", 3),
    ("pid", "PID", 7),
    ("user", "User", 8),
    ("gpu_memory", "GPU mem", 8),
    ("trend", "Trend", 8),
    ("torch", "Alloc/Rsv", 14),
    ("run", "Speed  ETA", 15),
    ("sm", "SM%", 4),
    ("cpu", "CPU", 4),
    ("rss", "RSS", 8),
    ("command", "Command", 24),
)
COLUMN_KEYS = tuple(key for key, _heading, _width in PROCESS_COLUMNS)
#: The memory sparkline needs this many columns (below, the command keeps the room).
TREND_MIN_WIDTH = 110
#: The run's speed and time to finish need this many columns (below, the detail shows them).
RUN_MIN_WIDTH = 100
#: Marker before a process whose allocator is retrying allocations (an OOM is near).
RETRYING = "!"


def active_columns(
    width: int, *, torch: bool, run: bool = False, sm: bool = False
) -> tuple[str, ...]:
    """The columns shown at ``width``: the trend only where there is room, PyTorch's
    allocated/reserved only when some process runs :mod:`hwdash.probe`, a run's speed and time to
    finish when some probe reports progress and there is room."""
    return tuple(
        key
        for key in COLUMN_KEYS
        if (key != "trend" or width >= TREND_MIN_WIDTH)
        and (key != "torch" or torch)
        and (key != "run" or (run and width >= RUN_MIN_WIDTH))
        and (key != "sm" or sm)
    )


@total_ordering
@dataclass(frozen=True)
class ProcessCell:
    """A table cell: the text shown and the value it sorts by (unknown values sort first)."""

    text: str
    sort_value: tuple[int, float | str] = field(default=(0, 0.0))
    style: str = ""

    def __rich__(self) -> Text:
        return Text(self.text, style=self.style, no_wrap=True, overflow="ellipsis")

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, ProcessCell):
            return NotImplemented
        return self.sort_value < other.sort_value


def _number(value: float | None) -> tuple[int, float | str]:
    return (0, 0.0) if value is None else (1, float(value))


def _word(value: str | None) -> tuple[int, float | str]:
    return (0, "") if value is None else (1, value.lower())


def _torch_cell(process: ProcessSample) -> ProcessCell:
    torch = process.torch
    if torch is None:
        return ProcessCell("", (0, 0.0))
    text = format_gib_pair(torch.allocated_bytes, torch.reserved_bytes, compact=True)
    if torch.retries_rising:
        return ProcessCell(RETRYING + text, _number(torch.allocated_bytes), "bold red")
    return ProcessCell(text, _number(torch.allocated_bytes))


def _trend_cell(history: tuple[int | None, ...], total: int | None) -> ProcessCell:
    if not total:
        return ProcessCell("", (0, 0.0))
    values = tuple(used / total for used in history if used is not None)
    growth = values[-1] - values[0] if len(values) > 1 else 0.0
    return ProcessCell(sparkline(values, 8), _number(growth))


def process_cells(
    process: ProcessSample,
    history: tuple[int | None, ...] = (),
    total_bytes: int | None = None,
) -> dict[str, ProcessCell]:
    """The cells of one process row, by column key; ``history`` is its used memory over time,
    drawn as a share of ``total_bytes`` (its GPU's memory)."""
    hidden = not process.visible
    unknown = "?" if hidden else "n/a"
    command = process.cmdline or process.name or ""
    if not process.verifiable:
        command = f"{HOST_PID} {command}".rstrip()
    elif process.exited:
        command = f"{EXITED} {command}".rstrip()
    elif hidden:
        command = f"{OTHER_CONTAINER} {command}".rstrip()
    if process.kind == "compute+graphics":
        command = f"{BOTH_CONTEXTS} {command}"
    if process.container:
        command = f"[{process.container}] {command}"
    memory = process.used_bytes
    gpu = str(process.gpu_index)
    if process.mig_index is not None:
        gpu += f"/{process.mig_index}"
    return {
        "gpu": ProcessCell(
            gpu, _number(process.gpu_index + (process.mig_index or 0) / 10), style=""
        ),
        "pid": ProcessCell(str(process.pid), _number(process.pid)),
        "user": ProcessCell(process.user or unknown, _word(process.user)),
        "gpu_memory": ProcessCell("n/a" if memory is None else format_gib(memory), _number(memory)),
        "trend": _trend_cell(history, total_bytes),
        "torch": _torch_cell(process),
        "sm": ProcessCell(
            "" if process.sm_percent is None else f"{process.sm_percent:.0f}%",
            _number(process.sm_percent),
        ),
        "run": (
            ProcessCell("", (0, 0.0))
            if process.run is None
            else ProcessCell(run_cell(process.run), _number(process.run.tokens_per_s))
        ),
        "cpu": ProcessCell(
            unknown if process.cpu_percent is None else f"{process.cpu_percent:.0f}%",
            _number(process.cpu_percent),
        ),
        "rss": ProcessCell(
            unknown if process.rss_bytes is None else format_bytes(process.rss_bytes),
            _number(process.rss_bytes),
        ),
        "command": ProcessCell(command, _word(command), "italic dim" if hidden else ""),
    }


def process_row_key(process: ProcessSample) -> str:
    """``gpu:pid``, or ``gpu/slot:pid`` for a process on a MIG device."""
    return process_key(process.gpu_index, process.mig_index, process.pid)


class ProcessTable(ScrollView, can_focus=True):
    """Processes on every GPU, one line each under a heading line. Click a heading to sort by it
    (again to reverse); up/down move the cursor.

    The table draws its own lines: a line is rebuilt and refreshed only when its text changes, so
    the one process whose memory ticks up repaints one line, and an idle table draws nothing.
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up", "cursor_up", "Up", show=False),
        Binding("down", "cursor_down", "Down", show=False),
        Binding("home", "cursor_first", "First", show=False),
        Binding("end", "cursor_last", "Last", show=False),
    ]
    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "process-table--header",
        "process-table--cursor",
        "process-table--hidden",
    }
    DEFAULT_CSS = """
    ProcessTable { height: auto; max-height: 100%; }
    ProcessTable > .process-table--header { text-style: bold; color: $text-muted; }
    ProcessTable > .process-table--cursor { background: $block-cursor-blurred-background; }
    ProcessTable:focus > .process-table--cursor {
        background: $block-cursor-background; color: $block-cursor-foreground;
    }
    ProcessTable > .process-table--hidden { text-style: italic dim; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.sort_column = "gpu"
        """Column key the rows are ordered by (by GPU at first: an order that does not reshuffle,
        and repaint the whole table, every time two processes' memory cross)."""
        self.sort_reverse = False
        """Descending order."""
        self.cursor_row = 0
        """Index of the highlighted row."""
        self._rows: dict[str, dict[str, ProcessCell]] = {}
        self._order: list[str] = []
        self._drawn: dict[int, tuple[object, ...]] = {}
        self._torch_shown = False
        self._run_shown = False
        self._sm_shown = False
        self._strips: dict[tuple[object, ...], Strip] = {}

    # -- what the pane and the tests call -----------------------------------------------------

    @property
    def row_count(self) -> int:
        """Number of processes listed."""
        return len(self._order)

    @property
    def row_keys_in_order(self) -> list[str]:
        """Row keys (``gpu:pid``) top to bottom (what tests read)."""
        return list(self._order)

    def get_row(self, key: str) -> list[ProcessCell]:
        """The cells of one row, in the order of the columns shown."""
        cells = self._rows[key]
        return [cells[column] for column in self.columns]

    def get_cells(self, key: str) -> dict[str, ProcessCell]:
        """Every cell of one row (shown or not), by column key."""
        return dict(self._rows[key])

    @property
    def columns(self) -> tuple[str, ...]:
        """Keys of the columns shown at the table's width."""
        return active_columns(
            self.size.width, torch=self._torch_shown, run=self._run_shown, sm=self._sm_shown
        )

    def show(
        self,
        processes: tuple[ProcessSample, ...],
        histories: Callable[[str], tuple[int | None, ...]] | None = None,
        totals: dict[int, int | None] | None = None,
    ) -> None:
        """Bring the table in line with these processes, touching only what changed;
        ``histories`` gives a row's used-memory history, ``totals`` each GPU's memory."""
        rows = {}
        for process in processes:
            key = process_row_key(process)
            rows[key] = process_cells(
                process,
                histories(key) if histories is not None else (),
                (totals or {}).get(process.gpu_index),
            )
        self.show_cells(rows)

    def show_cells(self, wanted: dict[str, dict[str, ProcessCell]]) -> None:
        """Bring the table in line with these rows (key ``gpu:pid``), repainting only what changed."""
        self._rows = dict(wanted)
        self._torch_shown = any(cells["torch"].text for cells in self._rows.values())
        self._run_shown = any(cells["run"].text for cells in self._rows.values() if "run" in cells)
        self._sm_shown = any(cells["sm"].text for cells in self._rows.values() if "sm" in cells)
        self._order = self._sorted_keys()
        self.cursor_row = min(self.cursor_row, max(0, len(self._order) - 1))
        self.virtual_size = Size(self.size.width, len(self._order) + 1)
        self._refresh_changed()

    def sort_by(self, column: str, *, reverse: bool | None = None) -> None:
        """Order rows by ``column`` (a key of :data:`PROCESS_COLUMNS`)."""
        if column not in COLUMN_KEYS:
            raise ValueError(f"no process column {column!r}")
        if reverse is None:
            # Numbers read best largest first; words alphabetically.
            reverse = column in ("gpu_memory", "trend", "torch", "cpu", "rss")
        self.sort_column = column
        self.sort_reverse = reverse
        self._order = self._sorted_keys()
        self._refresh_changed()

    def action_next_sort(self) -> None:
        """Sort by the next column."""
        shown = self.columns
        index = shown.index(self.sort_column) if self.sort_column in shown else -1
        self.sort_by(shown[(index + 1) % len(shown)])
        heading = dict(PROCESS_COLUMNS_HEADINGS)[self.sort_column]
        self.notify(f"processes sorted by {heading}", timeout=2)

    def action_reverse_sort(self) -> None:
        """Reverse the order."""
        self.sort_by(self.sort_column, reverse=not self.sort_reverse)

    def action_cursor_up(self) -> None:
        self._move_cursor(self.cursor_row - 1)

    def action_cursor_down(self) -> None:
        self._move_cursor(self.cursor_row + 1)

    def action_cursor_first(self) -> None:
        self._move_cursor(0)

    def action_cursor_last(self) -> None:
        self._move_cursor(len(self._order) - 1)

    # -- layout and drawing -------------------------------------------------------------------

    def _sorted_keys(self) -> list[str]:
        rows = self._rows

        def order(key: str) -> tuple[ProcessCell, ProcessCell, ProcessCell]:
            cells = rows[key]
            return (cells[self.sort_column], cells["gpu"], cells["pid"])

        return sorted(rows, key=order, reverse=self.sort_reverse)

    def _widths(self, width: int) -> list[tuple[str, int, int]]:
        """(column key, x, width) with one cell of padding each side; the command takes the rest."""
        shown = self.columns
        fixed = sum(_WIDTHS[key] + 2 for key in shown if key != "command") + 4
        command = max(16, width - fixed)
        layout = []
        x = 0
        for key in shown:
            size = command if key == "command" else _WIDTHS[key]
            layout.append((key, x + 1, size))
            x += size + 2
        return layout

    def _move_cursor(self, row: int) -> None:
        if not self._order:
            return
        self.cursor_row = max(0, min(row, len(self._order) - 1))
        self.scroll_to_region(
            Region(0, self.cursor_row + 1, 1, 1).grow((1, 0, 1, 0)), animate=False
        )
        self._refresh_changed()

    def _line_key(self, y: int) -> tuple[object, ...]:
        """What line ``y`` of the widget shows (equal keys draw equal lines)."""
        width = self.size.width
        if y == 0:
            return ("heading", width, self.sort_column, self.sort_reverse, self.columns)
        index = self.scroll_offset.y + y - 1
        if index >= len(self._order):
            return ("blank", width)
        key = self._order[index]
        cells = self._rows[key]
        cursor = index == self.cursor_row and self.has_focus
        return ("row", width, cursor, tuple(cells[column] for column in self.columns))

    def _refresh_changed(self) -> None:
        if not self.is_mounted:
            return
        width = self.size.width
        for y in range(self.size.height):
            key = self._line_key(y)
            if self._drawn.get(y) != key:
                self.refresh(Region(0, y, width, 1))

    def on_resize(self, event: events.Resize) -> None:
        self.virtual_size = Size(event.size.width, len(self._order) + 1)
        self._drawn.clear()
        self._strips.clear()
        self.refresh()

    def on_focus(self) -> None:
        self._refresh_changed()

    def on_blur(self) -> None:
        self._refresh_changed()

    def watch_scroll_y(self, old: float, new: float) -> None:
        super().watch_scroll_y(old, new)
        self.refresh()

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._strips.clear()
        self._drawn.clear()

    def render_line(self, y: int) -> Strip:
        key = self._line_key(y)
        self._drawn[y] = key
        strip = self._strips.get(key)
        if strip is None:
            if len(self._strips) > 256:
                self._strips.clear()
            strip = self._strips[key] = self._build_line(key)
        return strip

    def _build_line(self, key: tuple[object, ...]) -> Strip:
        width = self.size.width
        base = self.rich_style
        if key[0] == "blank":
            return Strip.blank(width, base)
        layout = self._widths(width)
        segments: list[Segment] = []
        if key[0] == "heading":
            style = base + self.get_component_rich_style("process-table--header", partial=True)
            for column, _x, size in layout:
                heading = dict(PROCESS_COLUMNS_HEADINGS)[column]
                if column == self.sort_column:
                    heading += " ▼" if self.sort_reverse else " ▲"
                segments.append(Segment(" " + set_cell_size(heading, size) + " ", style))
            return Strip(segments).crop_extend(0, width, base)
        cursor = bool(key[2])
        cells = cast(tuple[ProcessCell, ...], key[3])
        style = base
        if cursor:
            style += self.get_component_rich_style("process-table--cursor", partial=True)
        hidden = self.get_component_rich_style("process-table--hidden", partial=True)
        for (_column, _x, size), cell in zip(layout, cells, strict=True):
            text = cell.text
            if cell_len(text) > size:
                text = set_cell_size(text, size - 1) + "…"
            cell_style = style + hidden if cell.style else style
            segments.append(Segment(" " + set_cell_size(text, size) + " ", cell_style))
        return Strip(segments).crop_extend(0, width, base)

    def on_click(self, event: events.Click) -> None:
        """A click on a heading sorts by it (again: reverses); on a row, moves the cursor there."""
        if event.y == 0:
            for column, x, size in self._widths(self.size.width):
                if x - 1 <= event.x < x + size + 1:
                    event.stop()
                    if column == self.sort_column:
                        self.sort_by(column, reverse=not self.sort_reverse)
                    else:
                        self.sort_by(column)
                    return
            return
        self._move_cursor(self.scroll_offset.y + event.y - 1)


PROCESS_COLUMNS_HEADINGS = tuple((key, heading) for key, heading, _width in PROCESS_COLUMNS)
_WIDTHS = {key: width for key, _heading, width in PROCESS_COLUMNS}
PROCESS_COLUMNS_WIDTHS = tuple((key, width) for key, _heading, width in PROCESS_COLUMNS)
