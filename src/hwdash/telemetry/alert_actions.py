"""What happens when an alert fires: a JSON line in the alert log and the user's ``--on-alert`` command.

Both are I/O, so they live here and not in :mod:`hwdash.core.live.alerts`. Neither ever ends the monitor or
blocks sampling: a log that cannot be written and a command that fails are logged and forgotten.

The command runs as ``sh -c CMD`` with the alert in its environment, never in the command text, so a
GPU or process name can never inject shell code::

    HWDASH_EVENT        raised | lost | blind
    HWDASH_KIND         the same (the name the docs use for it)
    HWDASH_GPU          GPU index, e.g. 0
    HWDASH_MIG          MIG slot the alert is about, e.g. 3 (empty for a whole GPU)
    HWDASH_GPU_NAME     e.g. NVIDIA A100-SXM4-80GB
    HWDASH_PRESSURE     memory pressure 0..1 with 4 decimals, e.g. 0.9312 (empty when unknown)
    HWDASH_USED_BYTES   total - free (used plus reserved), bytes (empty when unknown)
    HWDASH_TOTAL_BYTES  total memory, bytes (empty when unknown)
    HWDASH_MESSAGE      one readable line

The command gets the rest of hwdash's environment too, less the credentials hwdash reads
(:data:`CREDENTIAL_ENV`: the Prometheus token, user and password of ``--prometheus``): a webhook
script has no use for them, and a script that logs or forwards its environment would leak them.

Commands run in the background (``subprocess.Popen``); their output goes to hwdash's stderr so it never
mixes with ``--json`` lines on stdout. At most :data:`MAX_RUNNING_COMMANDS` run at once: an event that
finds them all still running (a webhook that hangs, eight GPUs crossing together) is skipped and
counted, never queued without bound. :meth:`AlertActions.close` gives running commands a few seconds to
finish on exit, then leaves them running on their own (a slow webhook still gets delivered).

Each line of the alert log carries the host name and the monitor's PID, so the log of two monitors
on one box (or a log copied off several boxes) can be told apart.

``--webhook URL`` posts every event, clearings and recoveries included (a phone learns that the alert is
over), as the same record plus a ``text`` line, from :class:`hwdash.telemetry.webhooks.WebhookSender`'s
own thread: handling an event only queues it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from hwdash.core.live.alerts import AlertEngine, AlertEvent
from hwdash.core.strict_json import finite_or_none
from hwdash.telemetry.prometheus_source import PASSWORD_ENV, TOKEN_ENV, USER_ENV
from hwdash.telemetry.types import GpuSample, GpuState, Snapshot
from hwdash.telemetry.webhooks import WebhookSender

log = logging.getLogger(__name__)

#: Event kinds that run the user's command (a clearing or recovery is logged but pages no one).
COMMAND_EVENT_KINDS = frozenset({"raised", "lost", "blind"})

CREDENTIAL_ENV = (TOKEN_ENV, USER_ENV, PASSWORD_ENV)
"""Variables holding hwdash's credentials: never passed to an ``--on-alert`` command."""

MAX_RUNNING_COMMANDS = 4
"""Alert commands allowed to run at once; further events are skipped (and counted) until one ends."""


def default_alert_log_path(
    environ: Mapping[str, str] | None = None, *, simulated: bool = False
) -> Path:
    """``$XDG_STATE_HOME/hwdash/alerts.jsonl``, by default ``~/.local/state/hwdash/alerts.jsonl``;
    ``alerts-simulated.jsonl`` beside it for fake scenarios (``--demo``), so simulated alerts
    never mix with a real box's."""
    env = os.environ if environ is None else environ
    state_home = env.get("XDG_STATE_HOME", "").strip()
    base = Path(state_home) if state_home else Path.home() / ".local" / "state"
    return base / "hwdash" / ("alerts-simulated.jsonl" if simulated else "alerts.jsonl")


def alert_record(event: AlertEvent, host: str | None = None) -> dict[str, Any]:
    """An event as the alert log writes it (and a webhook posts it): the event's fields, the
    host name and this process's PID; readings that are not finite become None."""
    record = {**event.to_dict(), "host": host or socket.gethostname(), "pid": os.getpid()}
    result: dict[str, Any] = finite_or_none(record)
    return result


class AlertLog:
    """Appends each alert event as one JSON line."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or default_alert_log_path()
        self.host = socket.gethostname()
        """Written on every line with the monitor's PID."""

    def append(self, event: AlertEvent, record: dict[str, Any] | None = None) -> bool:
        """Write one line (``record``: the event's :func:`alert_record`, when the caller has it);
        False (and a logged warning) when the file cannot be written."""
        if record is None:
            record = alert_record(event, self.host)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(record, sort_keys=True, allow_nan=False) + "\n")
        except (OSError, ValueError) as exc:  # ValueError: a NaN in the event
            log.warning("cannot write alert log %s: %s", self.path, exc)
            return False
        return True


def alert_environment(event: AlertEvent, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment an ``--on-alert`` command gets: the caller's less :data:`CREDENTIAL_ENV`,
    plus the ``HWDASH_*`` variables of the alert."""
    env = dict(os.environ if base is None else base)
    for name in CREDENTIAL_ENV:
        env.pop(name, None)

    def text(value: int | None) -> str:
        return "" if value is None else str(value)

    env.update(
        {
            "HWDASH_EVENT": event.kind,
            # A diagnosis's rule (throttled, xid, ...); a memory alert's crossing (raised, lost...).
            "HWDASH_KIND": event.diagnosis or event.kind,
            "HWDASH_GPU": str(event.gpu_index),
            "HWDASH_MIG": text(event.mig_index),
            "HWDASH_GPU_NAME": event.gpu_name or "",
            "HWDASH_PRESSURE": "" if event.pressure is None else f"{event.pressure:.4f}",
            "HWDASH_USED_BYTES": text(event.used_bytes),
            "HWDASH_TOTAL_BYTES": text(event.total_bytes),
            "HWDASH_MESSAGE": event.message,
        }
    )
    return env


def _stderr_target() -> int:
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # stderr replaced (tests, pythonw)
        return subprocess.DEVNULL


class AlertCommand:
    """Runs the user's command for each event, in the background, through ``sh -c``."""

    def __init__(self, command: str, *, max_running: int = MAX_RUNNING_COMMANDS) -> None:
        if max_running < 1:
            raise ValueError("max_running must be at least 1")
        self.command = command
        self.max_running = max_running
        """Commands allowed to run at once."""
        self._running: list[subprocess.Popen[bytes]] = []
        self.started = 0
        """How many commands were started (for the monitor's summary and tests)."""
        self.failed = 0
        """How many could not start or exited non-zero."""
        self.skipped = 0
        """How many events found ``max_running`` commands still running and were not sent."""

    def run(self, event: AlertEvent) -> None:
        """Start the command for one event; never waits for it."""
        self.reap()
        if len(self._running) >= self.max_running:
            self.skipped += 1
            log.warning(
                "alert command skipped for %r: %d earlier ones still running (%d skipped so far)",
                event.message,
                len(self._running),
                self.skipped,
            )
            return
        try:
            process = subprocess.Popen(
                ["sh", "-c", self.command],  # the command text is the user's; the data is in env
                env=alert_environment(event),
                stdin=subprocess.DEVNULL,
                stdout=_stderr_target(),
                stderr=_stderr_target(),
                start_new_session=True,  # Ctrl-C in the terminal does not kill a half-sent alert
            )
        except OSError as exc:
            self.failed += 1
            log.warning("cannot start alert command %r: %s", self.command, exc)
            return
        self.started += 1
        self._running.append(process)

    def reap(self) -> None:
        """Forget finished commands, logging the ones that failed."""
        still_running = []
        for process in self._running:
            status = process.poll()
            if status is None:
                still_running.append(process)
            elif status != 0:
                self.failed += 1
                log.warning("alert command %r exited with status %s", self.command, status)
        self._running = still_running

    @property
    def running(self) -> int:
        """Commands still running."""
        self.reap()
        return len(self._running)

    def close(self, timeout_s: float = 5.0) -> None:
        """Wait up to ``timeout_s`` in all for running commands, then leave the rest running."""
        deadline = time.monotonic() + timeout_s
        for process in self._running:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                process.wait(remaining)
            except subprocess.TimeoutExpired:
                break
        self.reap()
        if self._running:
            log.warning(
                "%d alert command(s) still running after %.0f s; leaving them to finish",
                len(self._running),
                timeout_s,
            )


class AlertActions:
    """The alert log, the optional command and the optional webhooks, fed with each round's events."""

    def __init__(
        self,
        log_file: AlertLog | None,
        command: AlertCommand | None,
        webhooks: WebhookSender | None = None,
        *,
        host: str | None = None,
    ) -> None:
        self.log_file = log_file
        self.command = command
        self.webhooks = webhooks
        """Posts every event to the ``--webhook`` URLs (None: none given)."""
        self.host = host or (log_file.host if log_file is not None else socket.gethostname())
        """The host name each record carries (the exporter's ``--hostname``; else this machine's)."""

    def handle(self, events: Iterable[AlertEvent]) -> None:
        """Log every event and queue it for the webhooks; run the command for raised, lost and
        blind ones. Never waits on the network."""
        for event in events:
            record = alert_record(event, self.host)
            if self.log_file is not None:
                self.log_file.append(event, record)
            if self.webhooks is not None:
                self.webhooks.post(record)
            if self.command is not None and event.kind in COMMAND_EVENT_KINDS:
                self.command.run(event)
        if self.command is not None:
            self.command.reap()

    def close(self, timeout_s: float = 5.0) -> None:
        """Give running commands, and webhooks still queued, up to ``timeout_s`` each to finish."""
        if self.command is not None:
            self.command.close(timeout_s)
        if self.webhooks is not None:
            self.webhooks.close(timeout_s)


def _marked(gpu: GpuSample, engine: AlertEngine) -> GpuSample:
    mig = tuple(
        dataclasses.replace(instance, state=GpuState.ALERT)
        if engine.is_active(gpu.index, instance.index)
        else instance
        for instance in gpu.mig
    )
    state = gpu.state
    if state in (GpuState.OK, GpuState.ERROR) and engine.is_blind(gpu.index):
        state = GpuState.BLIND
    elif state == GpuState.OK and (
        engine.is_active(gpu.index) or any(m.state == GpuState.ALERT for m in mig)
    ):
        state = GpuState.ALERT
    if state == gpu.state and mig == gpu.mig:
        return gpu
    return dataclasses.replace(gpu, state=state, mig=mig)


def mark_alert_states(snapshot: Snapshot, engine: AlertEngine) -> Snapshot:
    """The snapshot with the alert rule's verdicts: ``alert`` on GPUs (and MIG instances) with an
    active pressure alert (a GPU whose MIG instance is in alert is in alert too), ``blind`` on GPUs
    without fresh data for too long."""
    gpus = tuple(_marked(gpu, engine) for gpu in snapshot.gpus)
    return dataclasses.replace(snapshot, gpus=gpus)
