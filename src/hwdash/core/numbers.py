"""Numbers typed by a user, read the same way on the command line and in the dashboard's form.

Text is never rewritten: ``4.5`` for a whole number is refused with the reason, not read as 45 or 4.
"""

from __future__ import annotations

import math


def parse_whole_number(text: str) -> int:
    """``text`` as a whole number (``12``, ``-3``; ``1e9`` and ``4.5`` are refused)."""
    cleaned = text.strip()
    try:
        return int(cleaned)
    except ValueError:
        raise ValueError(f"'{cleaned}' is not a whole number") from None


def parse_number(text: str) -> float:
    """``text`` as a finite number (``0.5``, ``1e-3``; ``0.1.2``, ``nan`` and ``inf`` are refused)."""
    cleaned = text.strip()
    try:
        value = float(cleaned)
    except ValueError:
        raise ValueError(f"'{cleaned}' is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"'{cleaned}' is not a finite number")
    return value
