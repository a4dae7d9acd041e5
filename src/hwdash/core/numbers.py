"""Numbers typed by a user, read the same way on the command line and in the dashboard's form.

Text is never rewritten: ``4.5`` for a whole number is refused with the reason, not read as 45 or 4.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


def is_ascii_whole(text: str) -> bool:
    """Whether ``text`` is one or more ASCII digits: what ``int`` reads back. ``str.isdigit`` also
    takes ``²`` and other Unicode digits, on which ``int`` raises."""
    return bool(text) and all("0" <= ch <= "9" for ch in text)


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


#: Pydantic's bound errors in our words (the planner form and ``hwdash plan`` say them alike).
_BOUND_WORDS = {
    "greater_than_equal": ("at least", "ge"),
    "greater_than": ("more than", "gt"),
    "less_than_equal": ("at most", "le"),
    "less_than": ("less than", "lt"),
}


def validation_phrase(problem: Mapping[str, Any]) -> str:
    """One pydantic error (an item of ``ValidationError.errors()``) as a short phrase: ``must be at
    least 1`` instead of "Input should be greater than or equal to 1"."""
    context = problem.get("ctx") or {}
    if problem.get("type") in _BOUND_WORDS:
        words, key = _BOUND_WORDS[problem["type"]]
        bound = context.get(key)
        return (
            f"must be {words} {bound:g}" if isinstance(bound, float) else f"must be {words} {bound}"
        )
    return str(problem.get("msg", "")).removeprefix("Value error, ")
