"""Errors that end a command with a one-line message and exit status 2 (never a traceback)."""

from __future__ import annotations


class UsageError(Exception):
    """Bad input from the user: a wrong flag value, an unknown model. Exit status 2."""

    def __init__(self, message: str, *, flag: str | None = None) -> None:
        self.flag = flag
        super().__init__(f"{flag}: {message}" if flag else message)
