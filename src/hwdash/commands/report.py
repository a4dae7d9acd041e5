"""``hwdash report [--since 12h] [-o FILE.md] [--json]``: the morning-after summary of the runs
ledger and the monitor's alert log (:mod:`hwdash.runs.report` builds it; this module reads the files
and writes the output)."""

from __future__ import annotations

import argparse
import os
import socket
import stat
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from hwdash.core import strict_json
from hwdash.errors import UsageError
from hwdash.runs import ledger
from hwdash.runs.report import (
    apply_history,
    build_report,
    report_json,
    report_markdown,
    report_text,
    since_cutoff,
)
from hwdash.telemetry.alert_actions import default_alert_log_path

MAX_ALERT_LINE_BYTES = 16 * 1024
"""An alert-log line is a few hundred bytes; a longer one is not read."""


def add_parser(subparsers: Any) -> None:
    """Register the subcommand."""
    parser = subparsers.add_parser(
        "report",
        help="the morning-after summary: runs, GPUs, alerts, idle time, energy, cost",
        description=(
            "Summarise a window of the runs ledger and the monitor's alert log: per run (speed, "
            "MFU, measured vs planned peak, energy, cost, exit) and per GPU (runs, peak, alerts, "
            "idle time, energy, cost). Text on standard output; -o writes Markdown."
        ),
    )
    parser.add_argument(
        "--since",
        default="12h",
        metavar="WHEN",
        help="start of the window: a duration back from now (30m, 12h, 2d) or an ISO date "
        "(2026-11-25 or 2026-11-25T18:00, local time); default 12h",
    )
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print the report as one JSON object")
    output.add_argument(
        "-o",
        "--output",
        default=None,
        metavar="FILE.md",
        help="write the report as Markdown to FILE.md (created 0644; an existing regular file "
        "is replaced)",
    )
    parser.add_argument(
        "--alert-log",
        default=None,
        metavar="PATH",
        help="the monitor's alert log (default $XDG_STATE_HOME/hwdash/alerts.jsonl)",
    )
    parser.add_argument(
        "--history-dir",
        default=None,
        metavar="DIR",
        help="this box's history ring, for each GPU's busy/idle time and peak (default "
        "$HWDASH_HISTORY_DIR, else $XDG_STATE_HOME/hwdash/history)",
    )


def read_history_use(
    args: argparse.Namespace, since: float, until: float
) -> tuple[Any, str | None]:
    """(per-GPU use from the history ring within the window, its directory) or ([], None) when it
    holds nothing there."""
    from hwdash.telemetry.history_ring import default_history_dir, gpu_use, read_history

    explicit = getattr(args, "history_dir", None)
    directory = Path(explicit).expanduser() if explicit else default_history_dir()
    if not directory.is_dir():
        return [], None
    found = read_history(directory, since=since, until=until)
    uses = gpu_use(found.points, since, until)
    return (uses, str(directory)) if uses else ([], None)


def read_alerts(path: Path, since: float) -> tuple[list[dict[str, Any]], list[str]]:
    """Alert-log events at or after ``since`` (newest lines read first, the older part of the log
    left unread) and warnings. A log that cannot be read is a warning, never an error: the report
    is of the runs first."""
    try:
        handle = ledger.open_trusted(path, strict=False, what="alert log")
    except ledger.LedgerError as exc:
        return [], [str(exc)]
    if handle is None:
        return [], []
    events: list[dict[str, Any]] = []
    skipped = old_in_a_row = 0
    try:
        size = os.fstat(handle).st_size
        for offset, line in ledger.lines_backwards(handle, size):
            if line is None or not line.strip() or len(line) > MAX_ALERT_LINE_BYTES:
                skipped += line is None
                continue
            if offset + len(line) >= size:
                continue  # the monitor is writing it now
            try:
                event = strict_json.loads(line, max_depth=4)
            except ValueError:  # UnicodeDecodeError too
                skipped += 1
                continue
            stamp = ledger.as_number(event, "timestamp") if isinstance(event, dict) else None
            if stamp is None:
                skipped += 1
                continue
            old_in_a_row = old_in_a_row + 1 if stamp < since - ledger.SINCE_SLACK_S else 0
            if old_in_a_row >= ledger.SINCE_STOP_AFTER:
                break  # the log is in time order (give or take a stepped clock), as the ledger
            if stamp >= since:
                events.append(event)
    finally:
        os.close(handle)
    warnings = [f"{path}: {skipped} line(s) skipped (not alert events)"] if skipped else []
    return events[::-1], warnings


def write_markdown(path: Path, text: str) -> None:
    """Write ``text`` to ``path``: created 0644, or an existing regular file replaced; a link, a
    folder or a device is refused."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        info = None
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}", flag="-o") from None
    if info is not None and not stat.S_ISREG(info.st_mode):
        raise UsageError(f"{path} exists and is not a regular file; not overwritten", flag="-o")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
    try:
        handle = os.open(path, flags, 0o644)
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}", flag="-o") from None


def run(args: argparse.Namespace, *, stdout: TextIO | None = None) -> int:
    """Build the report of the window and print or write it."""
    out = sys.stdout if stdout is None else stdout
    until = time.time()
    since = since_cutoff(args.since, until)
    result = ledger.read(since=since)
    alert_path = Path(args.alert_log) if args.alert_log else default_alert_log_path()
    alerts, alert_warnings = read_alerts(alert_path, since)
    report = build_report(result.records, alerts, since, until)
    report.sources = {"ledger": str(result.path), "alert log": str(alert_path)}
    uses, history_dir = read_history_use(args, since, until)
    if history_dir is not None:
        apply_history(report, uses, socket.gethostname())
        report.sources["history"] = history_dir
    report.warnings = [*result.warnings, *alert_warnings]
    if result.skipped > sum("skipped:" in warning for warning in result.warnings):
        report.warnings.append(f"{result.path}: {result.skipped} line(s) skipped in all")
    if args.json:
        out.write(strict_json.dumps(report_json(report), indent=2) + "\n")
    elif args.output:
        write_markdown(Path(args.output), report_markdown(report))
        out.write(
            f"wrote the report of {len(report.runs)} run(s) and {len(report.alerts)} alert(s) "
            f"to {args.output}\n"
        )
    else:
        out.write(report_text(report))
    return 0
