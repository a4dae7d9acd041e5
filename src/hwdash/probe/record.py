"""The end of a probed run: its exit kind and the raw record the probe hands to the runs ledger.

:meth:`hwdash.probe.Probe.final_record` builds the record from what the probe saw; this module holds
the parts that need no probe: the keys, the exit kind, the GPUs as NVML names them, and the hand-off
to :func:`hwdash.runs.recorder.record_run` (imported at the end of the run only, never raising).
"""

from __future__ import annotations

import getpass
import hashlib
import importlib
import os
import shlex
import socket
import sys
from collections.abc import Iterable, Mapping
from typing import Any

# The ledger's own definitions (its module imports the standard library only).
from hwdash.runs.ledger import RECORD_KEYS as RECORD_KEYS
from hwdash.runs.ledger import VERSION as RECORD_VERSION

__all__ = ["RECORD_KEYS", "RECORD_VERSION"]
from hwdash.telemetry.nvml_energy import nvml_uuid

COMMAND_CHARS = 1000
"""The command line is cut to this many characters."""

OOM_CLASS = "OutOfMemoryError"
"""torch.OutOfMemoryError (torch.cuda.OutOfMemoryError) matched by name: the probe never imports torch."""


def command_line(argv: Iterable[str] | None = None) -> str:
    """The interpreter and ``sys.argv`` as a shell would read them back, at most :data:`COMMAND_CHARS` characters."""
    words = [os.path.basename(sys.executable) or "python", *(sys.argv if argv is None else argv)]
    return shlex.join(words)[:COMMAND_CHARS]


def exit_kind(uncaught: type[BaseException] | None, ooms: int) -> str:
    """``"oom"`` when the allocator counted an out-of-memory error or the run died of one,
    ``"error"`` for another uncaught exception, else ``"normal"``."""
    if ooms > 0 or (uncaught is not None and _is_oom(uncaught)):
        return "oom"
    return "normal" if uncaught is None else "error"


def _is_oom(kind: type[BaseException]) -> bool:
    return any(cls.__name__ == OOM_CLASS for cls in kind.__mro__)


def run_id(host: str, pid: int, started: float) -> str:
    """The record's id: the first 12 hex digits of sha256 of ``host:pid:started``."""
    return hashlib.sha256(f"{host}:{pid}:{started!r}".encode()).hexdigest()[:12]


def host_and_user() -> tuple[str, str | None]:
    """This machine's name and the user running the process (None when it cannot be told)."""
    try:
        user: str | None = getpass.getuser()
    except Exception:  # no login name and no passwd entry (a bare container)
        user = None
    return socket.gethostname(), user


def gpus_of(devices: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The run's GPUs (uuid as NVML spells it, name, CUDA index), by index."""
    listed = sorted(devices.values(), key=lambda device: int(device.get("index") or 0))
    return [
        {
            "uuid": None if not device.get("uuid") else nvml_uuid(str(device["uuid"])),
            "name": device.get("name"),
            "index": device.get("index"),
        }
        for device in listed
    ]


def hand_to_ledger(raw: dict[str, Any]) -> None:
    """Give the record to :func:`hwdash.runs.recorder.record_run`; never raises (a missing
    recorder, a full disk or a refused ledger must not turn a finished run into a failed one)."""
    try:
        # Imported by name: the lead's module (issue 26) may not exist yet in a given checkout.
        recorder = importlib.import_module("hwdash.runs.recorder")
        recorder.record_run(raw)
    except ImportError:
        pass
    except Exception as exc:
        print(f"hwdash.probe: the run was not recorded: {exc}", file=sys.stderr)
