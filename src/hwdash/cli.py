"""The ``hwdash`` command line: argument parsing and dispatch. The UI is imported lazily.

``hwdash`` alone opens the dashboard; ``hwdash plan|catalog|monitor|compare|exporter|runs|report|oom``
are subcommands, each
in its own module under :mod:`hwdash.commands` with ``add_parser(subparsers)`` and ``run(args)``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import NoReturn

from hwdash import __version__
from hwdash.commands.shared_args import add_dashboard_arguments as add_dashboard_arguments
from hwdash.errors import CatalogError, UsageError

#: Subcommand modules under hwdash.commands, in the order ``--help`` lists them.
SUBCOMMANDS = ("plan", "catalog", "monitor", "compare", "exporter", "runs", "report", "oom")


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: a wrong value is said in one line and where help is, not
    under a usage summary that runs to twenty lines for ``hwdash plan``."""

    def error(self, message: str) -> NoReturn:
        # "argument --batch: ..." becomes "--batch: ...", as hwdash's own checks say it.
        message = message.removeprefix("argument ")
        self.exit(2, f"{self.prog}: error: {message}\n(`{self.prog} --help` lists the options)\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser, subcommands included. With ``only`` (the subcommand about to run), the other
    subcommands are registered by name alone: their modules (the planner's pydantic models, the
    catalog) are not imported, so ``hwdash monitor --once`` starts without them."""
    parser = Parser(
        prog="hwdash",
        description=(
            "Will this training run fit on that GPU, what will it cost, and is it about to OOM "
            "right now? Without a subcommand, opens the dashboard."
        ),
    )
    parser.add_argument("--version", action="version", version=f"hwdash {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    for name in SUBCOMMANDS:
        if only is not None and name != only:
            subparsers.add_parser(name)  # a placeholder: this run does not use it
            continue
        module = importlib.import_module(f"hwdash.commands.{name}")
        module.add_parser(subparsers)
    dashboard = importlib.import_module("hwdash.commands.dashboard")
    dashboard.add_arguments(parser)
    return parser


def _top_level_value_options() -> set[str]:
    """The dashboard's flags that take a value (``--tab monitor``: ``monitor`` is that value)."""
    parser = Parser(prog="hwdash", add_help=False)
    importlib.import_module("hwdash.commands.dashboard").add_arguments(parser)
    return {
        option
        for action in parser._actions  # argparse keeps no public list of its actions
        if action.nargs != 0
        for option in action.option_strings
    }


def find_subcommand(given: Sequence[str]) -> str | None:
    """The subcommand in ``given``: the first word that is not a flag or a flag's value (None for
    the dashboard). ``hwdash --tab monitor`` opens the dashboard on the monitor tab."""
    takes_value: set[str] | None = None  # read from the dashboard's parser at the first flag
    skip = False
    for arg in given:
        if skip:
            skip = False
        elif arg == "--":
            return None
        elif arg.startswith("-") and len(arg) > 1:
            name = arg.split("=", 1)[0]
            if "=" in arg or not name.startswith("--"):
                continue
            if takes_value is None:
                takes_value = _top_level_value_options()
            # argparse accepts an unambiguous prefix (--ta for --tab) as the flag itself.
            matches = [option for option in takes_value if option.startswith(name)]
            skip = name in takes_value or len(matches) == 1
        else:
            return arg if arg in SUBCOMMANDS else None
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hwdash`` console script. Returns the exit status."""
    given = list(sys.argv[1:] if argv is None else argv)
    chosen = find_subcommand(given)
    if chosen in SUBCOMMANDS:
        # --catalog (and --version/--help) mean the same before a subcommand; the dashboard's
        # own flags (--demo, --fake-nvml, --interval...) would be parsed and then ignored.
        before = [
            arg.split("=", 1)[0]
            for arg in given[: given.index(chosen)]
            if arg.startswith("-") and arg.split("=", 1)[0] not in ("--catalog", "-h", "--help")
        ]
        if before:
            # `hwdash --demo monitor` would parse --demo as the dashboard's flag and ignore it.
            print(
                f"hwdash: error: {' '.join(before)} must come after the subcommand: "
                f"hwdash {chosen} {' '.join(given[: given.index(chosen)])} ...",
                file=sys.stderr,
            )
            return 2
    help_asked = any(arg in ("-h", "--help") for arg in given) and chosen is None
    starting_dashboard = chosen is None and not help_asked
    if not starting_dashboard:
        return _dispatch(given, chosen, help_asked)
    from hwdash.ui import startup_gc

    startup_gc.pause()  # the dashboard starts: see the module (the app resumes it)
    try:
        return _dispatch(given, chosen, help_asked)
    finally:
        startup_gc.cancel()  # an error (or --version) before the first frame


def _dispatch(given: list[str], chosen: str | None, help_asked: bool) -> int:
    """Parse ``given`` and run the subcommand (or the dashboard)."""
    # The dashboard (no subcommand) registers the subcommands by name only, as a subcommand run
    # does for the others: the planner's modules load when the planner is built, not at start.
    parser = build_parser(None if help_asked else (chosen or "dashboard"))
    args = parser.parse_args(given)
    args.argv = given  # which flags were typed (``hwdash plan --from``: typed flags win)
    name = args.command or "dashboard"
    module = importlib.import_module(f"hwdash.commands.{name}")
    # Errors are said in one style whoever finds them, argparse or hwdash: "hwdash plan: error:".
    prog = f"hwdash {args.command}" if args.command else "hwdash"
    try:
        status: int = module.run(args)
    except UsageError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
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
