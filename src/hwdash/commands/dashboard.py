"""``hwdash`` with no subcommand: the Textual dashboard (issue 4). Textual is imported lazily."""

from __future__ import annotations

import argparse
import sys

from hwdash.cli import add_dashboard_arguments


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Top-level flags of the dashboard."""
    add_dashboard_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """Open the dashboard."""
    print("hwdash: the dashboard is not built yet; try `hwdash plan --help`", file=sys.stderr)
    return 1
