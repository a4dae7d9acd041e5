"""Ledger records as table rows: the one spelling ``hwdash runs`` and ``hwdash report`` share.

Pure: records in, strings out. Records come from :func:`hwdash.runs.ledger.read`, which keeps what a
newer or careless writer put there, so every field is checked with :func:`hwdash.runs.ledger.as_number`
and :func:`hwdash.runs.ledger.as_text` before it is shown: a field of the wrong type shows as ``-``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

from hwdash.core.units import format_bytes, format_money
from hwdash.runs.ledger import as_number, as_text

COLUMNS = (
    "ID",
    "ENDED",
    "TIME",
    "RUN",
    "TOK/S",
    "MFU",
    "PEAK",
    "PLANNED",
    "ERR",
    "KWH",
    "COST",
    "EXIT",
)
"""The columns of a run's row, in order."""
_LEFT = {"ID", "ENDED", "RUN", "EXIT"}
"""Columns of text, aligned left; the others are numbers, aligned right."""
RUN_WIDTH = 40
"""A command longer than this is cut (``hwdash runs show ID`` has it whole)."""
NEWER_MARK = "*"
NEWER_NOTE = f"{NEWER_MARK} from a newer hwdash: the fields this version reads are shown"
SHOWN_BELOW = 1e15
"""A number of this size or more (tokens/s, kWh, dollars) is not a measurement: shown as ``-``."""
MAX_BYTES = 2**63
"""Byte counts at or above this (a signed 64-bit counter's limit) are shown as ``-``."""


def believable(value: float | None, limit: float = SHOWN_BELOW) -> float | None:
    """``value`` when it is finite and below ``limit`` in size, else None (shown as ``-``)."""
    return value if value is not None and math.isfinite(value) and abs(value) < limit else None


def format_time(wall: float | None) -> str:
    """A wall time as local ``YYYY-MM-DD HH:MM``; ``-`` when unknown."""
    if wall is None:
        return "-"
    try:
        return time.strftime("%Y-%m-%d %H:%M", time.localtime(wall))
    except (OverflowError, OSError, ValueError):  # a year past what the C library holds
        return "-"


def format_duration(seconds: float | None) -> str:
    """``45s``, ``12m``, ``3h05m``, ``2d04h``; ``-`` when unknown."""
    if believable(seconds) is None or seconds is None or seconds < 0:
        return "-"
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    minutes, _ = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def duration_of(record: Mapping[str, Any]) -> float | None:
    """``duration_s``, else ``ended - started``."""
    duration = as_number(record, "duration_s")
    if duration is None:
        started, ended = as_number(record, "started"), as_number(record, "ended")
        if started is not None and ended is not None:
            duration = ended - started
    return duration


def peak_error(record: Mapping[str, Any]) -> float | None:
    """``peak_error`` as recorded, else measured / planned - 1 when both peaks are known."""
    error = as_number(record, "peak_error")
    if error is not None:
        return error
    measured = as_number(record, "measured_peak_bytes")
    planned = as_number(record, "planned_peak_bytes")
    if measured is None or not planned:
        return None
    return measured / planned - 1


def describe(record: Mapping[str, Any], width: int = RUN_WIDTH) -> str:
    """What ran: ``model method`` when known, else the plan's name, else the command (cut)."""
    model, method = as_text(record, "model"), as_text(record, "method")
    if model:
        text = f"{model} {method}" if method else model
    else:
        text = as_text(record, "plan") or as_text(record, "command") or "-"
    text = " ".join(text.split())  # a newline in a command must not break the table
    return text if len(text) <= width else text[: width - 1] + "…"


def _number(value: float | None, spec: str, suffix: str = "") -> str:
    value = believable(value)
    return "-" if value is None else f"{value:{spec}}{suffix}"


def bytes_cell(value: float | None) -> str:
    """A byte count in binary units; ``-`` when unknown or past any real memory."""
    value = believable(value, MAX_BYTES)
    return "-" if value is None else format_bytes(value)


def money_cell(value: float | None) -> str:
    """Dollars to the cent; ``-`` when unknown or past belief."""
    return format_money(believable(value))


def run_cells(record: Mapping[str, Any], width: int = RUN_WIDTH) -> list[str]:
    """One run's cells, in the order of :data:`COLUMNS`."""
    run_id = as_text(record, "id") or "?"
    if record.get("_newer"):
        run_id += NEWER_MARK
    mfu = as_number(record, "mfu")
    measured = as_number(record, "measured_peak_bytes")
    planned = as_number(record, "planned_peak_bytes")
    error = peak_error(record)
    return [
        run_id,
        format_time(as_number(record, "ended")),
        format_duration(duration_of(record)),
        describe(record, width),
        _number(as_number(record, "tokens_per_s"), ",.0f"),
        _number(None if mfu is None else mfu * 100, ".1f", "%"),
        bytes_cell(measured),
        bytes_cell(planned),
        _number(None if error is None else error * 100, "+.1f", "%"),
        _number(as_number(record, "energy_kwh"), ".2f"),
        money_cell(as_number(record, "cost_usd")),
        as_text(record, "exit") or "-",
    ]


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]], left: set[str]) -> str:
    """Rows under a header, columns padded to their widest cell; text columns aligned left."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = []
    for row in [header, *rows]:
        cells = [
            cell.ljust(width) if name in left else cell.rjust(width)
            for cell, width, name in zip(row, widths, header, strict=True)
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines) + "\n"


def markdown_cell(text: str) -> str:
    """A cell of a Markdown table: pipes escaped, on one line."""
    return " ".join(text.split()).replace("\\", "\\\\").replace("|", "\\|")


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]], left: set[str]) -> str:
    """A GitHub-flavoured Markdown table; number columns aligned right."""
    rule = [":---" if name in left else "---:" for name in header]
    lines = [
        "| " + " | ".join(markdown_cell(cell) for cell in row) + " |"
        for row in [header, rule, *rows]
    ]
    lines[1] = "| " + " | ".join(rule) + " |"
    return "\n".join(lines) + "\n"


NARROW_DROP = ("PLANNED", "KWH", "ENDED", "COST", "MFU", "TOK/S")
"""Columns left out, in this order, until a text table fits the terminal (``runs show`` has all)."""


def _fit(
    header: Sequence[str], rows: Sequence[Sequence[str]], width: int
) -> tuple[list[str], list[list[str]]]:
    """The header and rows without the :data:`NARROW_DROP` columns a ``width`` cannot hold."""
    keep = list(range(len(header)))

    def table_width() -> int:
        return sum(max(len(row[i]) for row in [header, *rows]) + 2 for i in keep) - 2

    for name in NARROW_DROP:
        if table_width() <= width:
            break
        keep.remove(list(header).index(name))
    return [header[i] for i in keep], [[row[i] for i in keep] for row in rows]


def runs_table(
    records: Sequence[Mapping[str, Any]], *, markdown: bool = False, width: int | None = None
) -> str:
    """The runs as a table (text or Markdown), with a note under it when one is from a newer hwdash.
    A text table wider than ``width`` (the terminal) leaves out :data:`NARROW_DROP` columns."""
    rows = [run_cells(record) for record in records]
    if markdown or width is None:
        table = (markdown_table if markdown else text_table)(COLUMNS, rows, _LEFT)
    else:
        header, rows = _fit(COLUMNS, rows, width)
        table = text_table(header, rows, _LEFT)
    if any(record.get("_newer") for record in records):
        table += ("\n" if markdown else "") + NEWER_NOTE + "\n"
    return table
