"""The probe file's protocol, shared by its writer (:mod:`hwdash.probe`, in the training process)
and its reader (:mod:`hwdash.telemetry.probes`, in the monitor): where the files live, the private
folder, the layout's version and how a PID is told from a later process with the same number.

Standard library only: the training process imports it with the probe.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path

FORMAT = 1
"""Version of the file's layout (readers skip files of another version)."""

DEFAULT_INTERVAL_S = 1.0
THREAD_NAME = "hwdash-probe"
REWRITE_S = 3.0
"""An unchanged reading is rewritten this often (readers skip files older than 5 intervals + 5 s)."""

MAX_OOM_SNAPSHOTS = 16
"""A probe keeps (and its file lists) at most this many allocator snapshots of its process."""
SNAPSHOT_SUFFIX = ".pickle"
"""Allocator snapshots are pickles, as ``torch.cuda.memory._dump_snapshot`` writes them."""
_MAX_SNAPSHOT_NUMBER_DIGITS = 9


class ProbeDirError(OSError):
    """The probe folder cannot be used safely (another user's, a symlink, open to others)."""


def probe_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where probes publish: ``$XDG_RUNTIME_DIR/hwdash/probes`` (a per-user, private folder on
    systemd machines, per the XDG Base Directory specification), else ``hwdash-<uid>/probes`` under
    the temporary folder (created with mode 0700 by :func:`private_dir`)."""
    env = os.environ if environ is None else environ
    runtime = env.get("XDG_RUNTIME_DIR", "").strip()
    if runtime and os.path.isabs(runtime) and os.path.isdir(runtime):
        return Path(runtime) / "hwdash" / "probes"
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(tempfile.gettempdir()) / f"hwdash-{uid}" / "probes"


def snapshot_name(pid: int, number: int) -> str:
    """The file name of a process's ``number``-th allocator snapshot: ``<pid>-oom-<n>.pickle``
    (not ``<pid>.json``: readers of probe files pass it by)."""
    return f"{pid}-oom-{number}{SNAPSHOT_SUFFIX}"


def is_snapshot_name(name: str, pid: int) -> bool:
    """Whether ``name`` is exactly what :func:`snapshot_name` gives for ``pid`` (ASCII digits, no
    leading zero, no folder part)."""
    prefix = f"{pid}-oom-"
    if not (name.startswith(prefix) and name.endswith(SNAPSHOT_SUFFIX)):
        return False
    number = name[len(prefix) : -len(SNAPSHOT_SUFFIX)]
    return (
        number.isascii()
        and number.isdigit()
        and not number.startswith("0")
        and len(number) <= _MAX_SNAPSHOT_NUMBER_DIGITS
    )


def private_dir(path: Path) -> Path:
    """Create ``path`` (and the folder above it) with mode 0700 and check it is ours.

    A folder in a shared temporary directory could have been made by someone else to read or plant
    probe files: it must be a real folder (not a symlink), owned by this user, closed to others.
    """
    for folder in (path.parent, path):
        folder.mkdir(mode=0o700, exist_ok=True)
        info = os.lstat(folder)
        if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
            raise ProbeDirError(f"{folder} is not a folder")
        if hasattr(os, "getuid") and info.st_uid != os.getuid():
            raise ProbeDirError(f"{folder} belongs to another user")
        if info.st_mode & 0o077:
            os.chmod(folder, 0o700)  # ours, but open to others: close it
    return path


def process_start_ticks(pid: int | str = "self", proc_root: str = "/proc") -> int | None:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22, see
    proc(5)); with the PID it names one process even after the number is reused. None off Linux."""
    try:
        with open(f"{proc_root}/{pid}/stat", "rb") as stat:
            text = stat.read().decode("ascii", "replace")
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after the last ')'.
    fields = text.rpartition(")")[2].split()
    try:
        return int(fields[19])  # field 22 overall: the 20th after the name and state
    except (IndexError, ValueError):
        return None
