"""JSON text that is JSON: NaN and infinities never reach an output.

RFC 8259 has no NaN or Infinity, yet Python's :func:`json.dumps` writes them unless told not to, and
a reader such as ``jq`` then fails on hwdash's output. Validated inputs keep every number finite; these
helpers are the guard for the day a computation slips: :func:`dumps` refuses the document with a
one-line error that says where the bad number is (exit status 2, never a traceback, never half a
document on stdout), and :func:`finite_or_none` turns such numbers into ``null`` for streams that must
keep going (a monitor's ``--json`` lines, an alert log).

The other direction, :func:`loads`, reads JSON that someone else may have written (a probe file, a
replay line): Python's :func:`json.loads` accepts ``NaN`` and ``Infinity``, turns ``1e999`` into an
infinity, raises on integers past 4,300 digits (``sys.get_int_max_str_digits``) and recurses once per
nesting level; :func:`loads` refuses all of these with :class:`UntrustedJsonError`, a ``ValueError``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from hwdash.errors import UsageError


class UntrustedJsonError(ValueError):
    """JSON text that :func:`loads` refuses: a non-finite or oversized number, or too deep."""


class NonFiniteNumberError(UsageError, ValueError):
    """A document about to be written as JSON holds NaN or an infinity. Exit status 2 on the CLI;
    a ``ValueError`` too, for callers that catch what :func:`json.dumps` raises."""

    def __init__(self, where: str, value: float) -> None:
        self.where = where
        """Where in the document the number is, e.g. ``flavors[3].cost``."""
        super().__init__(
            f"refusing to write JSON: {where} is {value!r}, which is not a JSON number "
            "(this is a bug in hwdash: please report it with the command line)"
        )


def _is_bad(value: Any) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def first_non_finite(document: Any) -> tuple[str, float] | None:
    """Where the first NaN or infinity is (``flavors[3].cost``) and its value, or None."""
    stack: list[tuple[str, Any]] = [("", document)]
    while stack:  # iterative: a deep document cannot exhaust the recursion limit
        path, value = stack.pop()
        if _is_bad(value):
            return path or "the document", value
        if isinstance(value, Mapping):
            items = [(f"{path}.{key}" if path else str(key), item) for key, item in value.items()]
        elif isinstance(value, (list, tuple)):
            items = [(f"{path}[{index}]", item) for index, item in enumerate(value)]
        else:
            continue
        stack.extend(reversed(items))
    return None


def dumps(
    document: Any, *, indent: int | None = None, sort_keys: bool = False, ensure_ascii: bool = True
) -> str:
    """``document`` as strict JSON text; :class:`NonFiniteNumberError` names a NaN or infinity."""
    try:
        return json.dumps(
            document, indent=indent, sort_keys=sort_keys, ensure_ascii=ensure_ascii, allow_nan=False
        )
    except ValueError:
        found = first_non_finite(document)
        if found is None:  # not a number problem (a circular reference): a real bug, let it show
            raise
        raise NonFiniteNumberError(*found) from None


def finite_or_none(document: Any) -> Any:
    """A copy of ``document`` with every NaN or infinity replaced by None (``null``).

    Mappings become dicts and tuples become lists, as :mod:`json` would write them anyway.
    """
    if _is_bad(document):
        return None
    if isinstance(document, Mapping):
        return {key: finite_or_none(value) for key, value in document.items()}
    if isinstance(document, (list, tuple)):
        return [finite_or_none(value) for value in document]
    return document


def _refuse_constant(name: str) -> Any:
    raise UntrustedJsonError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999 overflows to an infinity
        raise UntrustedJsonError(f"the number {text[:24]} is out of range")
    return value


def loads(text: str | bytes, *, max_depth: int = 32, max_int_digits: int = 20) -> Any:
    """Parse JSON from an untrusted source: numbers finite (no ``NaN``, ``Infinity``, ``1e999``),
    integers of at most ``max_int_digits`` digits (20 holds any 64-bit value), arrays and objects
    nested at most ``max_depth`` deep. Raises :class:`UntrustedJsonError` for those, and
    :class:`json.JSONDecodeError` (also a ``ValueError``) for text that is not JSON."""

    def bounded_int(digits: str) -> int:
        if len(digits) - digits.startswith("-") > max_int_digits:
            raise UntrustedJsonError(
                f"an integer of {len(digits)} characters (more than {max_int_digits} digits)"
            )
        return int(digits)

    try:
        document = json.loads(
            text, parse_constant=_refuse_constant, parse_float=_finite_float, parse_int=bounded_int
        )
    except RecursionError:  # the C scanner recurses per level: a deep document ends it first
        raise UntrustedJsonError(f"nested more than {max_depth} levels deep") from None
    stack: list[tuple[int, Any]] = [(1, document)]
    while stack:  # iterative: the depth check itself must not recurse
        depth, value = stack.pop()
        if isinstance(value, (dict, list)):
            if depth > max_depth:
                raise UntrustedJsonError(f"nested more than {max_depth} levels deep")
            children = value.values() if isinstance(value, dict) else value
            stack.extend((depth + 1, child) for child in children)
    return document
