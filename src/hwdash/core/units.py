"""Units. Bytes everywhere inside hwdash; these helpers convert only at the edges (input and display)."""

from __future__ import annotations

import math
import re

KIB = 1024
MIB = 1024**2
GIB = 1024**3
TIB = 1024**4
GB = 1000**3

_SUFFIX = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}
_COUNT_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kKmMbBgGtT]?)\s*$")


def parse_count(text: str) -> int:
    """Parse a human count such as ``7B``, ``1.5b``, ``70M`` or ``124000000`` into an integer.

    Raises ``ValueError`` with a readable message when the text is not a count.
    """
    match = _COUNT_RE.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a count (examples: 7B, 1.5B, 70M, 124000000)")
    value = float(match.group(1)) * _SUFFIX[match.group(2).upper()]
    if value <= 0:
        raise ValueError(f"{text!r} must be greater than zero")
    if not math.isfinite(value):  # 400 digits parse as float infinity, which round() refuses
        raise ValueError(f"{text[:20]!r}... is too large to be a count")
    return round(value)


def format_bytes(n: float, *, unit: str = "auto") -> str:
    """Format a byte count for display in binary units (GiB, MiB, KiB)."""
    if unit == "GiB" or (unit == "auto" and abs(n) >= GIB):
        return f"{n / GIB:.1f} GiB"
    if unit == "MiB" or (unit == "auto" and abs(n) >= MIB):
        return f"{n / MIB:.0f} MiB"
    if unit == "KiB" or (unit == "auto" and abs(n) >= KIB):
        return f"{n / KIB:.0f} KiB"
    return f"{n:.0f} B"


def format_count(n: float) -> str:
    """Format a parameter or token count: 7.6B, 494M, 12.3K."""
    for div, suffix in ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "K")):
        if abs(n) >= div:
            value = n / div
            return f"{value:.1f}{suffix}" if value < 100 else f"{value:.0f}{suffix}"
    return f"{n:.0f}"


def format_hours(hours: float | None) -> str:
    """Format a duration in hours: 45 min, 3.2 h, 12 d."""
    if hours is None:
        return "-"
    if hours < 1:
        return f"{hours * 60:.0f} min"
    if hours < 48:
        return f"{hours:.1f} h"
    return f"{hours / 24:.0f} d"


def format_money(dollars: float | None) -> str:
    """Format a dollar amount: $0.19, $30, $1,234."""
    if dollars is None:
        return "-"
    if dollars < 10:
        return f"${dollars:.2f}"
    return f"${dollars:,.0f}"
