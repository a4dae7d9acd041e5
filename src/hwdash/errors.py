"""Errors that end a command with a one-line message and exit status 2 (never a traceback)."""

from __future__ import annotations


class UsageError(Exception):
    """Bad input from the user: a wrong flag value, an unknown model. Exit status 2."""

    def __init__(self, message: str, *, flag: str | None = None) -> None:
        self.flag = flag
        # "--gpus 3 is not a multiple of ..." names its flag already: not "--gpus: --gpus 3 ...".
        named = flag is None or message.startswith(f"{flag} ")
        super().__init__(message if named else f"{flag}: {message}")


class CatalogError(Exception):
    """A catalog file cannot be used. The message names the file, the entry and the field.

    Defined here (not in :mod:`hwdash.core.catalog`) so the command line can catch it without
    importing the catalog's pydantic models; ``hwdash.core.catalog`` re-exports it.
    """

    def __init__(
        self, path: object, message: str, *, entry: str | None = None, field: str | None = None
    ) -> None:
        self.path = str(path)
        self.entry = entry
        self.field = field
        self.reason = message
        where = self.path
        if entry is not None:
            where += f": {entry}"
        if field is not None:
            where += f": field '{field}'"
        super().__init__(f"{where}: {message}")
