"""The ``hwdash`` command line: argument parsing and dispatch. The UI is imported lazily.

``hwdash`` alone opens the dashboard; ``hwdash plan|catalog|monitor|compare`` are subcommands, each
in its own module under :mod:`hwdash.commands` with ``add_parser(subparsers)`` and ``run(args)``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from hwdash import __version__
from hwdash.core.catalog import CatalogError
from hwdash.errors import UsageError

#: Subcommand modules under hwdash.commands, in the order ``--help`` lists them.
SUBCOMMANDS = ("plan", "catalog", "monitor", "compare")


def add_dashboard_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags shared by the dashboard (``hwdash``) and ``hwdash compare``/``monitor``."""
    parser.add_argument(
        "--catalog",
        action="append",
        default=[],
        metavar="DIR",
        help="extra catalog folder or file; adds or overrides entries by id (repeatable)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The full parser, subcommands included."""
    parser = argparse.ArgumentParser(
        prog="hwdash",
        description=(
            "Will this training run fit on that GPU, what will it cost, and is it about to OOM "
            "right now? Without a subcommand, opens the dashboard."
        ),
    )
    parser.add_argument("--version", action="version", version=f"hwdash {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        module = importlib.import_module(f"hwdash.commands.{name}")
        module.add_parser(subparsers)
    dashboard = importlib.import_module("hwdash.commands.dashboard")
    dashboard.add_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hwdash`` console script. Returns the exit status."""
    parser = build_parser()
    given = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(given)
    args.argv = given  # which flags were typed (``hwdash plan --from``: typed flags win)
    name = args.command or "dashboard"
    module = importlib.import_module(f"hwdash.commands.{name}")
    try:
        status: int = module.run(args)
    except UsageError as exc:
        print(f"hwdash: error: {exc}", file=sys.stderr)
        return 2
    except CatalogError as exc:
        print(f"hwdash: catalog error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `hwdash monitor --json | head` closes the pipe: that is not an error.
        sys.stderr.close()
        return 0
    return status
