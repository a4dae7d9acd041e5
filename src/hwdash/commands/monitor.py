"""``hwdash monitor``: placeholder until its issue lands."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(subparsers: Any) -> None:
    """Register the subcommand."""
    subparsers.add_parser("monitor", help="(not built yet)")


def run(args: argparse.Namespace) -> int:
    """Run the subcommand."""
    print("not built yet")
    return 1
