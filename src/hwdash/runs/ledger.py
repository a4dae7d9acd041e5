"""The runs ledger: one JSON object a line for each run that ended, appended, locked, never rewritten.

``$XDG_STATE_HOME/hwdash/runs.jsonl`` (by default ``~/.local/state/hwdash/runs.jsonl``; the variable
``HWDASH_RUNS`` names another file). The training process appends its record when it ends, so this
module imports the standard library and :mod:`hwdash.core.strict_json` only.

Writing (:func:`append`): the folder is made private (0700), the file opened without following a
link and created 0600, locked with ``flock`` and the whole line written with one ``os.write``: two
runs that end together never interleave. A line a crashed writer left without its newline is ended
before the new one, so the new record is not glued to it.

Reading (:func:`read`) is tolerant and strict at once. A line that is cut short, not JSON (a ``NaN``
included: :func:`hwdash.core.strict_json.loads`), not an object or without a version is skipped with
a warning that names its line number; a record of a newer version is kept, marked ``_newer``, and
read for the fields this version knows. The file and its folder must belong to this user and be
writable by no one else (the folder may also be root's, or sticky like ``/tmp``); a link is refused.
The newest records are found by reading the file backwards in blocks, so ``last=50`` of a 100 MB
ledger reads a few blocks, not the file.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import stat
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hwdash.core import strict_json
from hwdash.errors import UsageError

VERSION = 1
"""The record format this hwdash writes and reads in full."""
ENV_PATH = "HWDASH_RUNS"
"""Environment variable naming the ledger file (tests, users with a shared disk)."""
MAX_LINE_BYTES = 64 * 1024
"""A record is about a kilobyte; a line larger than this is refused by :func:`append` and skipped by
:func:`read` (so a reader never holds an unbounded line)."""
MAX_DEPTH = 16
"""A record nests three levels (object, ``gpus`` list, GPU object); room for later fields."""
BLOCK_BYTES = 256 * 1024
"""How much :func:`read` reads at a time, from the end of the file backwards."""
SINCE_SLACK_S = 86400.0
"""Records are appended when a run ends, so the file is in order of ``ended``. A ``since`` read stops
after :data:`SINCE_STOP_AFTER` records in a row that ended this much before the cutoff (a day covers
a clock that stepped back)."""
SINCE_STOP_AFTER = 50
"""Old records in a row that end a ``since`` read: one record with a wrong clock (``ended`` 0) does
not hide the older runs of the window behind it."""
MAX_WARNINGS = 10
"""Warnings kept per read; further skipped lines are only counted (:attr:`LedgerRead.skipped`)."""
EFFECTIVE_USER = -1
"""``owner_uid``'s default: this process's effective user."""

RECORD_KEYS = (
    "version",
    "id",
    "host",
    "user",
    "pid",
    "command",
    "started",
    "ended",
    "duration_s",
    "exit",
    "gpus",
    "plan",
    "model",
    "method",
    "steps",
    "tokens",
    "tokens_estimated",
    "samples",
    "tokens_per_s",
    "mfu",
    "flops_per_token",
    "peak_tflops",
    "energy_kwh",
    "price_per_hour",
    "cost_usd",
    "measured_peak_bytes",
    "measured_peak_allocated_bytes",
    "planned_peak_bytes",
    "peak_error",
)
"""Every key of a version-1 record (issue 26's design); null where unknown."""

_READ_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_NONBLOCK", 0)  # a FIFO named runs.jsonl must not block the command
    | getattr(os, "O_CLOEXEC", 0)
)
# O_RDWR, not O_WRONLY: under the lock the writer reads the file's last byte (a torn line is ended).
_APPEND_FLAGS = (
    os.O_RDWR
    | os.O_APPEND
    | os.O_CREAT
    | getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_CLOEXEC", 0)
)


class LedgerError(UsageError):
    """The ledger cannot be used (another user's file, a link, a line too large); the message says
    which file and why. Exit status 2 on the command line."""


@dataclass
class LedgerRead:
    """What :func:`read` found: records oldest first, warnings about skipped lines."""

    path: Path
    records: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    skipped: int = 0
    """Lines skipped (cut short, not JSON, not a record), warned or not."""
    exists: bool = True
    """False when there is no ledger file yet (nothing recorded)."""
    more: bool = False
    """True when ``last`` stopped the read before the start of the file (older records exist)."""


def ledger_path(environ: Mapping[str, str] | None = None) -> Path:
    """``$HWDASH_RUNS``, else ``$XDG_STATE_HOME/hwdash/runs.jsonl``, by default
    ``~/.local/state/hwdash/runs.jsonl`` (beside the monitor's ``alerts.jsonl``)."""
    env = os.environ if environ is None else environ
    override = env.get(ENV_PATH, "").strip()
    if override:
        return Path(override).expanduser()
    state_home = env.get("XDG_STATE_HOME", "").strip()
    base = Path(state_home) if state_home else Path.home() / ".local" / "state"
    return base / "hwdash" / "runs.jsonl"


def make_id(host: str, pid: int, started: float) -> str:
    """A run's id: the first 12 hex digits of sha256 of ``host:pid:repr(started)``."""
    return hashlib.sha256(f"{host}:{pid}:{started!r}".encode()).hexdigest()[:12]


def encode(record: Mapping[str, Any]) -> bytes:
    """One ledger line (ending in a newline), ``version`` set to :data:`VERSION` when absent.
    Raises ``ValueError`` for a NaN or infinity and for a line over :data:`MAX_LINE_BYTES`."""
    document = dict(record)
    document.setdefault("version", VERSION)
    try:
        text = strict_json.dumps(document)
    except TypeError as exc:  # a value JSON has no spelling for (a Path, a set)
        raise ValueError(f"a ledger record must be plain JSON: {exc}") from None
    data = (text + "\n").encode("ascii")  # ensure_ascii: plain bytes
    if len(data) > MAX_LINE_BYTES:
        raise ValueError(
            f"a ledger record of {len(data)} bytes is over the limit of {MAX_LINE_BYTES} bytes"
        )
    return data


def append(record: Mapping[str, Any], path: Path | None = None) -> None:
    """Append ``record`` as one line, under an exclusive ``flock``, in one ``os.write``.

    Raises ``ValueError`` (a record that cannot be a line), :class:`LedgerError` (the path is a link
    or not a regular file) or ``OSError`` (the disk)."""
    path = ledger_path() if path is None else path
    data = encode(record)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    _close_folder(path.parent)
    try:
        handle = os.open(path, _APPEND_FLAGS, 0o600)
    except OSError as exc:
        if _is_link(path):
            raise LedgerError(f"runs ledger {path} is a symbolic link; not written") from None
        raise exc
    try:
        if not stat.S_ISREG(os.fstat(handle).st_mode):
            raise LedgerError(f"runs ledger {path} is not a regular file; not written")
        fcntl.flock(handle, fcntl.LOCK_EX)  # released when the descriptor is closed
        size = os.fstat(handle).st_size
        if size and os.pread(handle, 1, size - 1) != b"\n":
            data = b"\n" + data  # a writer died mid-line: keep this record on a line of its own
        written = os.write(handle, data)
        if written != len(data):
            raise OSError(f"runs ledger {path}: wrote {written} of {len(data)} bytes (disk full?)")
    finally:
        os.close(handle)


def _is_link(path: Path) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(path).st_mode)
    except OSError:
        return False


def _effective_uid() -> int | None:
    return os.geteuid() if hasattr(os, "geteuid") else None


_OPEN_TO_OTHERS = stat.S_IWGRP | stat.S_IWOTH


def _folder_problem(info: os.stat_result, owner_uid: int | None, strict: bool) -> str | None:
    """Why the ledger's folder is not trusted, or None. Root's folders and sticky folders (``/tmp``,
    where only a file's owner may replace it) are trusted; the file itself is checked apart."""
    if not stat.S_ISDIR(info.st_mode):
        return "is not a folder"
    if owner_uid is not None and info.st_uid not in (owner_uid, 0):
        return f"belongs to uid {info.st_uid}, not {owner_uid}"
    sticky = bool(info.st_mode & stat.S_ISVTX)
    if strict and info.st_mode & _OPEN_TO_OTHERS and not sticky:
        return f"is writable by other users (mode {stat.S_IMODE(info.st_mode):o}; chmod go-w it)"
    return None


def _file_problem(info: os.stat_result, owner_uid: int | None, strict: bool) -> str | None:
    if not stat.S_ISREG(info.st_mode):
        return "is not a regular file"
    if owner_uid is not None and info.st_uid != owner_uid:
        return f"belongs to uid {info.st_uid}, not {owner_uid}"
    if strict and info.st_mode & _OPEN_TO_OTHERS:
        return f"is writable by other users (mode {stat.S_IMODE(info.st_mode):o}; chmod go-w it)"
    return None


def _close_folder(folder: Path) -> None:
    """hwdash's own state folder, if a umask of 002 left it group-writable, loses that write bit
    (as :func:`hwdash.telemetry.probe_files.private_dir` does): the reader refuses such a folder.
    A folder named otherwise (``HWDASH_RUNS=~/runs.jsonl``: the home folder) is left alone."""
    with contextlib.suppress(OSError):
        info = os.lstat(folder)
        ours = hasattr(os, "geteuid") and info.st_uid == os.geteuid()
        open_to_others = info.st_mode & _OPEN_TO_OTHERS and not info.st_mode & stat.S_ISVTX
        if folder.name == "hwdash" and ours and stat.S_ISDIR(info.st_mode) and open_to_others:
            os.chmod(folder, stat.S_IMODE(info.st_mode) & ~_OPEN_TO_OTHERS)


def open_trusted(
    path: Path,
    owner_uid: int | None = EFFECTIVE_USER,
    *,
    strict: bool = True,
    what: str = "runs ledger",
) -> int | None:
    """A read descriptor of ``path`` once it and its folder pass the checks; None when there is no
    such file. Raises :class:`LedgerError` saying why a file is refused. ``strict=False`` lets
    group or others write the file and folder (the monitor's alert log is made with the umask)."""
    owner = _effective_uid() if owner_uid == EFFECTIVE_USER else owner_uid
    try:
        folder = os.stat(path.parent)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise LedgerError(f"{what} folder {path.parent}: {exc.strerror or exc}") from None
    problem = _folder_problem(folder, owner, strict)
    if problem is not None:
        raise LedgerError(f"{what} not read: its folder {path.parent} {problem}")
    try:
        handle = os.open(path, _READ_FLAGS)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if _is_link(path):
            raise LedgerError(f"{what} not read: {path} is a symbolic link") from None
        raise LedgerError(f"{what} {path}: {exc.strerror or exc}") from None
    # Checked after the open, through the descriptor: the file read is the file checked.
    problem = _file_problem(os.fstat(handle), owner, strict)
    if problem is not None:
        os.close(handle)
        raise LedgerError(f"{what} not read: {path} {problem}")
    return handle


def lines_backwards(
    handle: int, size: int, block: int = BLOCK_BYTES
) -> Iterator[tuple[int, bytes | None]]:
    """``(offset, line)`` for each line of the first ``size`` bytes of the file, the last first,
    without its newline. ``line`` is None for a line over :data:`MAX_LINE_BYTES` (never held whole
    in memory). A last line without a newline is yielded as it is (see :func:`read`)."""
    position = size
    carry = b""  # the data from ``position`` up to the first newline after it
    oversized = False  # ``carry`` was dropped: the line it belongs to is over the limit
    while position > 0:
        start = max(0, position - block)
        chunk = os.pread(handle, position - start, start)
        if len(chunk) != position - start:  # the file shrank: it is never rewritten, so stop
            break
        position = start
        pieces = (chunk + carry).split(b"\n")
        carry = pieces[0]  # may begin in the block before
        if len(pieces) > 1:
            offset = start + len(pieces[0]) + 1
            found: list[tuple[int, bytes | None]] = []
            for piece in pieces[1:]:
                found.append((offset, piece if len(piece) <= MAX_LINE_BYTES else None))
                offset += len(piece) + 1
            if oversized:  # the last piece is the head of the line whose rest was dropped
                found[-1] = (found[-1][0], None)
                oversized = False
            yield from reversed(found)
        if len(carry) > MAX_LINE_BYTES:
            carry, oversized = b"", True
    if oversized:
        yield 0, None
    elif carry:
        yield 0, carry if len(carry) <= MAX_LINE_BYTES else None


@dataclass
class _Scan:
    """Line numbers for warnings, worked out only when one is needed (the file is read backwards)."""

    handle: int
    known_offset: int = -1
    known_line: int = 0
    result: LedgerRead = field(default_factory=lambda: LedgerRead(Path()))

    def line_number(self, offset: int) -> int:
        """1-based number of the line starting at ``offset`` (counts newlines before it once)."""
        if self.known_offset < 0:
            self.known_offset, self.known_line = 0, 1
        if offset < self.known_offset:  # going backwards: count only the part between
            self.known_line -= _count_newlines(self.handle, offset, self.known_offset)
        else:
            self.known_line += _count_newlines(self.handle, self.known_offset, offset)
        self.known_offset = offset
        return self.known_line

    def skip(self, offset: int, why: str) -> None:
        self.result.skipped += 1
        if len(self.result.warnings) < MAX_WARNINGS:
            where = self.result.path
            self.result.warnings.append(f"{where}: line {self.line_number(offset)} skipped: {why}")


def _count_newlines(handle: int, start: int, end: int) -> int:
    count = 0
    while start < end:
        chunk = os.pread(handle, min(BLOCK_BYTES * 4, end - start), start)
        if not chunk:
            break
        count += chunk.count(b"\n")
        start += len(chunk)
    return count


def parse_line(line: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """A ledger line as a record, or (None, why it is not one)."""
    try:
        text = line.decode("utf-8")  # json.loads would guess UTF-16 from a byte order mark
    except UnicodeDecodeError:
        return None, "not UTF-8 text"
    try:
        document = strict_json.loads(text, max_depth=MAX_DEPTH)
    except ValueError as exc:
        return None, f"not JSON ({str(exc)[:80]})"
    if not isinstance(document, dict):
        return None, f"not a JSON object (a {type(document).__name__})"
    version = document.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        return None, "no version (not a runs ledger record)"
    if version > VERSION:
        document["_newer"] = True
    return document, None


def record_time(record: Mapping[str, Any]) -> float | None:
    """When a run counts for ``since``: its end, else its start (None when neither is a number)."""
    for key in ("ended", "started"):
        value = record.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def read(
    path: Path | None = None,
    *,
    last: int | None = None,
    since: float | None = None,
    owner_uid: int | None = EFFECTIVE_USER,
    keep: Callable[[bytes], bool] | None = None,
) -> LedgerRead:
    """The ledger's records, oldest first. ``last``: only the newest so many; ``since``: only runs
    that ended (or, without an end, started) at or after this wall time. ``keep`` (used by
    :func:`find`) is a cheap test of a raw line before it is parsed. Raises :class:`LedgerError`
    for a file that is not trusted (see the module docstring)."""
    path = ledger_path() if path is None else path
    result = LedgerRead(path)
    handle = open_trusted(path, owner_uid)
    if handle is None:
        result.exists = False
        return result
    scan = _Scan(handle, result=result)
    newest_first: list[dict[str, Any]] = []
    newer = 0
    old_in_a_row = 0
    try:
        size = os.fstat(handle).st_size
        for offset, line in lines_backwards(handle, size):
            if last is not None and len(newest_first) >= last:
                result.more = True
                break
            if line is None:
                scan.skip(offset, f"over {MAX_LINE_BYTES} bytes")
                continue
            if not line.strip() or (keep is not None and not keep(line)):
                continue
            if offset + len(line) >= size:  # the last line has no newline: a writer was cut off
                scan.skip(offset, "cut short (no newline at the end of the file)")
                continue
            record, why = parse_line(line)
            if record is None:
                scan.skip(offset, why or "not a record")
                continue
            when = record_time(record)
            if since is not None and (when is None or when < since):
                if when is not None and when < since - SINCE_SLACK_S:
                    old_in_a_row += 1
                    if old_in_a_row >= SINCE_STOP_AFTER:
                        break  # far older than the window: the rest of the file is older still
                continue
            old_in_a_row = 0
            newer += bool(record.get("_newer"))
            newest_first.append(record)
    finally:
        os.close(handle)
    if newer:
        result.warnings.append(
            f"{path}: {newer} record(s) from a newer hwdash (format above {VERSION}); "
            "showing the fields this version reads"
        )
    result.records = newest_first[::-1]
    return result


def match(records: list[dict[str, Any]], id_prefix: str, path: Path) -> dict[str, Any]:
    """The record whose id starts with ``id_prefix`` (the newest when one id was written twice).
    Raises :class:`LedgerError` when none or several runs match."""
    prefix = id_prefix.strip().lower()
    found: dict[str, dict[str, Any]] = {}
    for record in records:
        run_id = record.get("id")
        if isinstance(run_id, str) and run_id.lower().startswith(prefix):
            found[run_id] = record  # oldest first: the newest of one id wins
    if not found:
        raise LedgerError(f"no run with an id starting {id_prefix!r} in {path}")
    if len(found) > 1:
        ids = sorted(found)
        shown = ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
        raise LedgerError(
            f"{len(ids)} runs have an id starting {id_prefix!r} ({shown}): give more of the id"
        )
    return next(iter(found.values()))


def find(
    id_prefix: str, path: Path | None = None, *, owner_uid: int | None = EFFECTIVE_USER
) -> tuple[dict[str, Any], LedgerRead]:
    """The run whose id starts with ``id_prefix`` (a unique prefix, hex digits) and the read it
    came from (for its warnings). Raises :class:`LedgerError` for no match, an ambiguous prefix
    or a prefix that cannot be an id."""
    path = ledger_path() if path is None else path
    prefix = id_prefix.strip().lower()
    if not prefix or any(char not in "0123456789abcdef" for char in prefix):
        raise LedgerError(f"{id_prefix!r} is not a run id (hex digits, as `hwdash runs` lists)")
    needle = prefix.encode("ascii")
    result = read(path, owner_uid=owner_uid, keep=lambda line: needle in line.lower())
    return match(result.records, prefix, path), result


def as_number(record: Mapping[str, Any], key: str) -> float | None:
    """``record[key]`` when it is a finite number (not a bool), else None: what a display can use
    from a record that may come from a newer or broken writer."""
    value = record.get(key)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        with contextlib.suppress(OverflowError):
            return float(value)
    return None


def as_text(record: Mapping[str, Any], key: str) -> str | None:
    """``record[key]`` when it is a non-empty string, else None."""
    value = record.get(key)
    return value if isinstance(value, str) and value else None


def gpus_of(record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The record's GPUs that are objects (``uuid``, ``name``, ``index`` each checked by the caller)."""
    gpus = record.get("gpus")
    return [gpu for gpu in gpus if isinstance(gpu, dict)] if isinstance(gpus, list) else []


def complete(record: Mapping[str, Any]) -> dict[str, Any]:
    """The record for ``--json``: every key of :data:`RECORD_KEYS` (null where absent), the keys of a
    newer format kept, the reader's own marks (``_newer``) dropped."""
    document: dict[str, Any] = {key: record.get(key) for key in RECORD_KEYS}
    document.update({k: v for k, v in record.items() if not k.startswith("_")})
    return document
