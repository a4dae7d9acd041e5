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
    """Format a dollar amount, always to the cent: ``$0.19``, ``$30.00``, ``$1,234.50``."""
    if dollars is None:
        return "-"
    return f"${dollars:,.2f}"


# --------------------------------------------------------------------------------------------------
# Display formats shared by the dashboard, ``hwdash monitor`` and the planner's sentences: one
# spelling for each unit (issue 16). Tables whose heading names the unit print bare numbers.
# --------------------------------------------------------------------------------------------------


def _binary_unit(n: float) -> tuple[float, str]:
    """The divisor and name of the unit ``n`` bytes read best in: GiB, TiB from 1024 GiB."""
    return (TIB, "TiB") if abs(n) >= TIB else (GIB, "GiB")


def format_gib(n: float, *, signed: bool = False) -> str:
    """Memory for display: ``76.9 GiB`` (``1.2 TiB`` from 1024 GiB); ``+3.1 GiB`` when ``signed``."""
    divisor, name = _binary_unit(n)
    return f"{n / divisor:+.1f} {name}" if signed else f"{n / divisor:.1f} {name}"


def format_gib_pair(
    part: float, total: float, *, compact: bool = False, joiner: str | None = None
) -> str:
    """A part of a whole in the whole's unit: ``76.9 / 80.0 GiB`` (``76.9/80.0 GiB`` compact,
    ``76.9 of 80.0 GiB`` with ``joiner=" of "``)."""
    divisor, name = _binary_unit(total)
    separator = joiner if joiner is not None else "/" if compact else " / "
    return f"{part / divisor:.1f}{separator}{total / divisor:.1f} {name}"


def format_temperature(celsius: float) -> str:
    """A temperature: ``64°C``."""
    return f"{celsius:.0f}°C"


def format_power(watts: float, limit: float | None = None, *, compact: bool = False) -> str:
    """Power draw: ``310 W``, with the limit ``310 / 400 W`` (``310/400 W`` compact)."""
    if limit is None:
        return f"{watts:.0f} W"
    separator = "/" if compact else " / "
    return f"{watts:.0f}{separator}{limit:.0f} W"


def format_forecast(seconds: float | None, *, compact: bool = False) -> str:
    """Time until something happens (the OOM forecast): ``45 s``, ``12 min``, ``2.5 h`` (``45s``,
    ``12m``, ``2.5h`` compact, for a narrow column); empty when there is no forecast."""
    if seconds is None:
        return ""
    space = "" if compact else " "
    if seconds < 90:
        return f"{seconds:.0f}{space}s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f}{space}{'m' if compact else 'min'}"
    return f"{seconds / 3600:.1f}{space}h"
