"""``hwdash runs [--json] [--last N] [--since 12h]`` and ``hwdash runs show ID [--json]``: the runs
ledger (:mod:`hwdash.runs.ledger`), one line per run that ended with the hwdash probe in it."""

from __future__ import annotations

import argparse
import shutil
import sys
from typing import Any, TextIO

from hwdash.core import strict_json
from hwdash.core.units import format_bytes, format_money
from hwdash.errors import UsageError
from hwdash.runs import ledger
from hwdash.runs.report import since_cutoff
from hwdash.runs.table import NEWER_NOTE, duration_of, format_duration, format_time, runs_table

DEFAULT_LAST = 50
HOW_TO_RECORD = (
    "Runs are recorded when a process with the hwdash probe ends: call `hwdash.probe.start()` in "
    "the training script (or pass `hwdash.probe.hf.HwdashProbeCallback()` to the Hugging Face "
    "Trainer), or start it with `python -m hwdash.probe train.py ARGS...`."
)


def add_parser(subparsers: Any) -> None:
    """Register the subcommand."""
    parser = subparsers.add_parser(
        "runs",
        usage="hwdash runs [--json] [--last N] [--since WHEN]\n       hwdash runs show ID [--json]",
        help="the runs the hwdash probe recorded: speed, MFU, peak vs plan, energy, cost",
        description=(
            "List the runs ledger: one line per run that ended with the hwdash probe in it (id, "
            "end, duration, model or command, tokens/s, MFU, measured vs planned peak, energy, "
            "cost, exit), oldest first. The ledger is $XDG_STATE_HOME/hwdash/runs.jsonl "
            "(~/.local/state/hwdash/runs.jsonl); HWDASH_RUNS names another file. "
            "`hwdash runs show ID` prints one run whole."
        ),
    )
    parser.add_argument("--json", action="store_true", help="print the records as one JSON list")
    parser.add_argument(
        "--last",
        default=None,
        metavar="N",
        help=f"only the newest N runs (default {DEFAULT_LAST})",
    )
    parser.add_argument(
        "--since",
        default=None,
        metavar="WHEN",
        help="only runs that ended since: a duration back from now (30m, 12h, 2d) or an ISO date",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    show = actions.add_parser(
        "show",
        help="one run whole",
        description="Print every field of one run of the ledger.",
    )
    show.add_argument("id", metavar="ID", help="the run's id, or a prefix of it that is unique")
    show.add_argument(
        "--json", dest="show_json", action="store_true", help="print the record as JSON"
    )


def parse_last(text: str | None) -> int:
    """``--last``: a whole number of runs, at least 1."""
    if text is None:
        return DEFAULT_LAST
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"{text!r} is not a whole number of runs", flag="--last") from None
    if value < 1:
        raise UsageError(f"{value} runs shows nothing; give at least 1", flag="--last")
    return value


def _warn(result: ledger.LedgerRead, err: TextIO) -> None:
    for warning in result.warnings:
        err.write(f"hwdash runs: warning: {warning}\n")
    unsaid = result.skipped - sum("skipped:" in warning for warning in result.warnings)
    if unsaid > 0:
        err.write(f"hwdash runs: warning: {unsaid} more line(s) skipped in {result.path}\n")


def run(args: argparse.Namespace, *, stdout: TextIO | None = None) -> int:
    """List the ledger, or show one run."""
    out = sys.stdout if stdout is None else stdout
    if getattr(args, "action", None) == "show":
        return show(args.id, as_json=args.show_json or args.json, out=out)
    last = parse_last(args.last)
    since = None if args.since is None else since_cutoff(args.since)
    result = ledger.read(last=last, since=since)
    _warn(result, sys.stderr)
    if args.json:
        records = [ledger.complete(record) for record in result.records]
        out.write(strict_json.dumps(records, indent=2) + "\n")
        return 0
    if not result.records:
        where = "" if result.exists else " (no file yet)"
        window = "" if args.since is None else f" since {format_time(since)}"
        out.write(f"no runs recorded{window} in {result.path}{where}.\n{HOW_TO_RECORD}\n")
        return 0
    width = shutil.get_terminal_size((0, 0)).columns if out.isatty() else 0
    out.write(runs_table(result.records, width=width or None))
    if result.more:
        out.write(f"(the newest {last} shown; --last N for more)\n")
    return 0


def show(id_prefix: str, *, as_json: bool, out: TextIO) -> int:
    """``hwdash runs show ID``."""
    record, result = ledger.find(id_prefix)
    _warn(result, sys.stderr)
    if as_json:
        out.write(strict_json.dumps(ledger.complete(record), indent=2) + "\n")
        return 0
    out.write(show_text(record))
    return 0


def _value(key: str, value: Any) -> str:
    """One field as ``runs show`` prints it: times local, bytes in GiB, fractions in %."""
    number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
    if value is None:
        return "-"
    if number is not None:
        if key in ("started", "ended"):
            return f"{format_time(number)} ({number})"
        if key.endswith("_bytes"):
            return f"{format_bytes(number)} ({int(number):,} B)"
        if key == "cost_usd" or key == "price_per_hour":
            return format_money(number) + ("/h" if key == "price_per_hour" else "")
        if key in ("mfu", "peak_error"):
            return f"{number * 100:+.1f}%" if key == "peak_error" else f"{number * 100:.1f}%"
        if key == "duration_s":
            return f"{format_duration(number)} ({number} s)"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float) and abs(value) >= 1e7:
        return f"{value:.4g}"
    if isinstance(value, (dict, list)):
        return strict_json.dumps(value)
    return " ".join(str(value).split())


def show_text(record: dict[str, Any]) -> str:
    """Every field of one record, one per line, the GPUs one per line under ``gpus``."""
    document = ledger.complete(record)
    if document.get("duration_s") is None:
        document["duration_s"] = duration_of(record)
    width = max(len(key) for key in document)
    lines = []
    for key, value in document.items():
        if key == "gpus" and ledger.gpus_of(record):
            lines.append("gpus:")
            for gpu in ledger.gpus_of(record):
                lines.append(
                    f"  {gpu.get('index', '?')}  {ledger.as_text(gpu, 'name') or '-'}  "
                    f"{ledger.as_text(gpu, 'uuid') or '-'}"
                )
            continue
        lines.append(f"{key + ':':<{width + 1}} {_value(key, value)}")
    if record.get("_newer"):
        lines.append(NEWER_NOTE.replace("*", "this run is", 1))
    return "\n".join(lines) + "\n"
