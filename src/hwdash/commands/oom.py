"""``hwdash oom SNAPSHOT [--json] [--device N] [--top K]``: why a run ran out of memory, read from
a PyTorch CUDA memory snapshot (:mod:`hwdash.runs.oom_snapshot`, :mod:`hwdash.runs.oom_analysis`)."""

from __future__ import annotations

import argparse
import os
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
        "--plan",
        metavar="NAME|FILE",
        help="hold the snapshot against this plan (a saved plan or a plan file; default: the plan "
        "of the ledger's run that left the snapshot)",
    )
    parser.add_argument(
        "--fit",
        metavar="FLAVOR",
        help="the smallest changes that make the plan fit FLAVOR at the measured need (default: "
        "the plan's flavor, when it names one)",
    )
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
    against = _against_plan(args, report)
    if args.json:
        document = report.to_json()
        if against is not None:
            document["plan"] = _plan_json(*against)
        out.write(strict_json.dumps(document, indent=2) + "\n")
        return 0
    out.write(report_text(report, args.snapshot))
    if against is not None:
        _print_against(out, *against)
    return 0


def plan_of_snapshot(path: str) -> str | None:
    """The plan of the run whose ledger record names this snapshot (newest first), or None."""
    from hwdash.runs import ledger

    wanted = os.path.realpath(path)
    try:
        records = ledger.read(last=2000).records
    except (OSError, ValueError):
        return None
    for record in reversed(records):
        named = record.get("oom_snapshot")
        if isinstance(named, str) and os.path.realpath(named) == wanted:
            plan = record.get("plan")
            return plan if isinstance(plan, str) and plan else None
    return None


def _against_plan(args: argparse.Namespace, report: Any) -> tuple[Any, Any, Any] | None:
    """(the comparison, the make-it-fit search or None, the catalog) when a plan is known:
    ``--plan``, else the plan of the ledger's run that left this snapshot."""
    from hwdash.core.catalog import load_catalog
    from hwdash.runs.oom_plan import compare, fit_measured
    from hwdash.runs.plans import read_plan_reference

    reference = args.plan or plan_of_snapshot(args.snapshot)
    if reference is None:
        return None
    name, plan = read_plan_reference(reference)
    catalog = load_catalog()
    comparison = compare(report, name, plan, catalog)
    target = args.fit or (plan.flavors[0] if len(plan.flavors) == 1 else None)
    if target is None:
        return comparison, None, catalog
    if target not in catalog.flavors:
        raise UsageError(f"unknown flavor {target!r} (hwdash catalog lists them)", flag="--fit")
    return comparison, fit_measured(comparison, catalog, target), catalog


def _plan_json(comparison: Any, search: Any, catalog: Any) -> dict[str, Any]:
    from hwdash.commands.plan_args import plan_arguments

    document: dict[str, Any] = comparison.to_json()
    if search is None:
        document["fit"] = None
        return document
    framework = catalog.framework_for(comparison.plan)
    document["fit"] = {
        "target": search.target,
        "fits_already": search.fits_already,
        "options": [
            option.to_json(plan_arguments(option.plan, framework)) for option in search.options
        ],
    }
    return document


def _print_against(out: TextIO, comparison: Any, search: Any, catalog: Any) -> None:
    """The categories beside the plan, the surprise, and the options for the measured need."""
    from rich.console import Console

    from hwdash.commands.plan_fit import render_options
    from hwdash.runs.oom_plan import comparison_lines

    out.write("\n" + "\n".join(comparison_lines(comparison)) + "\n")
    factor = comparison.factor
    if search is None:
        out.write("  give --fit FLAVOR for the smallest changes that fit the measured need\n")
        return
    out.write("\n")
    console = Console(file=out, width=100, highlight=False, color_system=None)
    render_options(
        search,
        console,
        framework=catalog.framework_for(comparison.plan),
        why=f"the measured need, {max(1.0, factor or 1.0):.2f}x the plan's",
    )
