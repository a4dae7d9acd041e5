"""The GPU process table: GPU, PID, user, GPU memory, CPU, RSS and command, sortable.

Rows are keyed by (GPU, PID); each sample updates only the cells whose text changed, adds new
processes and removes the ones that ended, so an idle table sends nothing to the terminal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import total_ordering

from rich.text import Text
from textual import events
from textual.coordinate import Coordinate
from textual.widgets import DataTable
from textual.widgets.data_table import ColumnKey, RowKey

from hwdash.core.units import format_bytes
from hwdash.telemetry.types import ProcessSample

#: Marker for a PID that psutil cannot see from here (another container or PID namespace).
OTHER_CONTAINER = "(other container)"
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
    ("cpu", "CPU", 4),
    ("rss", "RSS", 8),
    ("command", "Command", 24),
)
#: Columns other than the command, with one cell of padding each side, plus the scrollbar.
_FIXED_WIDTH = sum(width + 2 for key, _h, width in PROCESS_COLUMNS if key != "command") + 4
COLUMN_KEYS = tuple(key for key, _heading, _width in PROCESS_COLUMNS)


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


def process_cells(process: ProcessSample) -> dict[str, ProcessCell]:
    """The cells of one process row, by column key."""
    hidden = not process.visible
    unknown = "?" if hidden else "n/a"
    command = process.cmdline or process.name or ""
    if not process.verifiable:
        command = f"{HOST_PID} {command}".rstrip()
    elif hidden:
        command = f"{OTHER_CONTAINER} {command}".rstrip()
    if process.kind == "compute+graphics":
        command = f"{BOTH_CONTEXTS} {command}"
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
        "gpu_memory": ProcessCell(
            "n/a" if memory is None else format_bytes(memory, unit="GiB"), _number(memory)
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
    gpu = str(process.gpu_index)
    if process.mig_index is not None:
        gpu += f"/{process.mig_index}"
    return f"{gpu}:{process.pid}"


class ProcessTable(DataTable[ProcessCell]):
    """Processes on every GPU. Click a heading to sort by it (again to reverse)."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, cursor_type="row", zebra_stripes=False)
        self.sort_column = "gpu"
        """Column key the rows are ordered by (by GPU at first: an order that does not reshuffle,
        and repaint the whole table, every time two processes' memory cross)."""
        self.sort_reverse = False
        """Descending order."""
        self._rows: dict[str, dict[str, ProcessCell]] = {}
        self._command_width = 0

    def on_mount(self) -> None:
        self._add_columns(dict(PROCESS_COLUMNS_WIDTHS)["command"])

    def _add_columns(self, command_width: int) -> None:
        self._command_width = command_width
        for key, heading, width in PROCESS_COLUMNS:
            self.add_column(heading, key=key, width=command_width if key == "command" else width)

    def on_resize(self, event: events.Resize) -> None:
        """Give the command column whatever width the other columns leave."""
        command_width = max(16, event.size.width - _FIXED_WIDTH)
        if command_width == self._command_width:
            return
        rows = self._rows
        self.clear(columns=True)
        self._rows = {}
        self._add_columns(command_width)
        self.show_cells(rows)

    @property
    def row_keys_in_order(self) -> list[str]:
        """Row keys (``gpu:pid``) top to bottom (what tests read)."""
        return [str(row.key.value) for row in self.ordered_rows]

    def show(self, processes: tuple[ProcessSample, ...]) -> None:
        """Bring the table in line with these processes, touching only what changed."""
        self.show_cells({process_row_key(process): process_cells(process) for process in processes})

    def show_cells(self, wanted: dict[str, dict[str, ProcessCell]]) -> None:
        """Bring the table in line with these rows (key ``gpu:pid``), touching only what changed."""
        for key in list(self._rows):
            if key not in wanted:
                self.remove_row(key)
                del self._rows[key]
        for key, cells in wanted.items():
            old = self._rows.get(key)
            if old is None:
                self.add_row(*(cells[column] for column in COLUMN_KEYS), key=key)
            else:
                for column in COLUMN_KEYS:
                    if old[column] != cells[column]:
                        self._set_cell(key, column, cells[column])
            self._rows[key] = cells
        if self.row_keys_in_order != self._sorted_keys():
            self._apply_sort()

    def _sorted_keys(self) -> list[str]:
        """Row keys in the order the current sort asks for (same rule as :meth:`_apply_sort`)."""
        rows = self._rows

        def order(key: str) -> tuple[ProcessCell, ProcessCell, ProcessCell]:
            cells = rows[key]
            return (cells[self.sort_column], cells["gpu"], cells["pid"])

        return sorted(rows, key=order, reverse=self.sort_reverse)

    def _set_cell(self, row_key: str, column_key: str, value: ProcessCell) -> None:
        """Change one cell and repaint only that cell.

        ``DataTable.update_cell`` repaints the whole table, which for a table of eight processes
        whose memory ticks up every second is most of the bytes the dashboard sends. This does
        what it does (textual 8.x: store the value, bump the update counter that keys the render
        caches) but refreshes only the cell's region; if those internals ever change, it falls
        back to ``update_cell``.
        """
        data = getattr(self, "_data", None)
        if not isinstance(data, dict) or not hasattr(self, "_update_count"):
            self.update_cell(row_key, column_key, value)
            return
        row = RowKey(row_key)
        column = ColumnKey(column_key)
        data[row][column] = value
        self._update_count += 1
        self.refresh_coordinate(Coordinate(self.get_row_index(row), self.get_column_index(column)))

    def sort_by(self, column: str, *, reverse: bool | None = None) -> None:
        """Order rows by ``column`` (a key of :data:`PROCESS_COLUMNS`)."""
        if column not in COLUMN_KEYS:
            raise ValueError(f"no process column {column!r}")
        if reverse is None:
            # Numbers read best largest first; words alphabetically.
            reverse = column in ("gpu_memory", "cpu", "rss")
        self.sort_column = column
        self.sort_reverse = reverse
        self._apply_sort()

    def _apply_sort(self) -> None:
        if self.row_count:
            self.sort(self.sort_column, "gpu", "pid", reverse=self.sort_reverse)

    def action_next_sort(self) -> None:
        """Sort by the next column."""
        index = COLUMN_KEYS.index(self.sort_column)
        self.sort_by(COLUMN_KEYS[(index + 1) % len(COLUMN_KEYS)])
        heading = dict(PROCESS_COLUMNS_HEADINGS)[self.sort_column]
        self.notify(f"processes sorted by {heading}", timeout=2)

    def action_reverse_sort(self) -> None:
        """Reverse the order."""
        self.sort_by(self.sort_column, reverse=not self.sort_reverse)

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        """Clicking a heading sorts by it; clicking it again reverses."""
        event.stop()
        column = str(event.column_key.value)
        if column == self.sort_column:
            self.sort_by(column, reverse=not self.sort_reverse)
        else:
            self.sort_by(column)


PROCESS_COLUMNS_HEADINGS = tuple((key, heading) for key, heading, _width in PROCESS_COLUMNS)
PROCESS_COLUMNS_WIDTHS = tuple((key, width) for key, _heading, width in PROCESS_COLUMNS)
