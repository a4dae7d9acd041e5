"""Flags more than one command takes: imported by :mod:`hwdash.cli` and by the commands, so neither
imports the other for them."""

from __future__ import annotations

import argparse


def add_dashboard_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags shared by the dashboard (``hwdash``) and ``hwdash compare``/``monitor``."""
    parser.add_argument(
        "--catalog",
        action="append",
        default=[],
        metavar="DIR",
        help="extra catalog folder or file; adds or overrides entries by id (repeatable)",
    )
