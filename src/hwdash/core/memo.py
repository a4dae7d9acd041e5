"""Values derived from immutable objects that cannot be hashed, kept by the objects' identity.

Catalog entries (pydantic models holding lists and dicts) are frozen but not hashable, so
``functools.lru_cache`` cannot key on them. :class:`IdentityMemo` keys on ``id(owner)`` and keeps
the owner itself beside the value, so the id cannot be reused by another object while the entry
lives; it is cleared when it reaches its limit.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class IdentityMemo(Generic[V]):
    """``get(owner, compute, *extra)``: ``compute()`` once per (owner object, extra key)."""

    def __init__(self, limit: int = 256) -> None:
        self._limit = limit
        self._entries: dict[tuple[Hashable, ...], tuple[object, V]] = {}

    def get(self, owner: object, compute: Callable[[], V], *extra: Hashable) -> V:
        key = (id(owner), *extra)
        known = self._entries.get(key)
        if known is not None and known[0] is owner:
            return known[1]
        value = compute()
        if len(self._entries) >= self._limit:
            self._entries.clear()
        self._entries[key] = (owner, value)
        return value
