"""``hwdash oom SNAPSHOT [--json] [--device N] [--top K]``: why a run ran out of memory, read from
a PyTorch CUDA memory snapshot (:mod:`hwdash.runs.oom_snapshot`, :mod:`hwdash.runs.oom_analysis`)."""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

from hwdash.core import strict_json
from hwdash.errors import UsageError
from hwdash.runs.oom_analysis import DEFAULT_TOP, analyse
from hwdash.runs.oom_snapshot import MAX_SNAPSHOT_BYTES, read_snapshot
from hwdash.runs.oom_text import report_text

MAX_TOP = 1000


def add_parser(subparsers: Any) -> None:
    """Register the subcommand."""
    parser = subparsers.add_parser(
        "oom",
        help="why a run ran out of memory: read a PyTorch CUDA memory snapshot",
        description=(
            "Read a PyTorch CUDA memory snapshot (the hwdash probe's <pid>-oom-<n>.pickle, or "
            "torch.cuda.memory._dump_snapshot's file) and say what filled the device: the failed "
            "request, reserved and allocated bytes, fragmentation, the bytes by category "
            "(parameters, gradients, optimizer states, activations, KV cache, unknown), the top "
            "allocation sites (your frames first) and the largest live blocks. The file is read "
            "with an unpickler that builds only dicts, lists, strings and numbers, and at most "
            f"{MAX_SNAPSHOT_BYTES >> 30} GiB of it."
        ),
    )
    parser.add_argument("snapshot", metavar="SNAPSHOT", help="the snapshot file (a pickle)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--device",
        default=None,
        metavar="N",
        help="the device to report (default: the one that ran out of memory)",
    )
    parser.add_argument(
        "--top",
        default=None,
        metavar="K",
        help=f"how many sites and blocks to list (default {DEFAULT_TOP})",
    )


def _whole(text: str | None, flag: str, *, least: int, most: int) -> int | None:
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"{text!r} is not a whole number", flag=flag) from None
    if not least <= value <= most:
        raise UsageError(f"{value} is out of range ({least} to {most})", flag=flag)
    return value


def run(args: argparse.Namespace, *, stdout: TextIO | None = None) -> int:
    """Read the snapshot and print the report."""
    out = sys.stdout if stdout is None else stdout
    device = _whole(args.device, "--device", least=0, most=1023)
    top = _whole(args.top, "--top", least=1, most=MAX_TOP)
    snapshot = read_snapshot(args.snapshot)
    report = analyse(snapshot, device=device, top=DEFAULT_TOP if top is None else top)
    if args.json:
        out.write(strict_json.dumps(report.to_json(), indent=2) + "\n")
    else:
        out.write(report_text(report, args.snapshot))
    return 0
