"""``hwdash monitor``: GPU memory, processes and host load on the command line, with alerts.

* ``--once``: one readable snapshot (GPUs, processes, host); with ``--json`` one JSON object.
* otherwise it streams: one line per GPU per ``--interval`` (``--count N`` to stop), or JSON lines with
  ``--json`` (suitable for ``| tee run.log``). Alert actions fire in this mode: each event is appended to
  the alert log (``$XDG_STATE_HOME/hwdash/alerts.jsonl``) and ``--on-alert CMD`` runs for raised and lost
  alerts (see :mod:`hwdash.telemetry.alert_actions` for its environment).
* ``--alert-threshold`` takes a percent (``90``) or a fraction (``0.9``): values up to 1 are fractions,
  values above 1 and up to 100 are percents. The rule applies to every GPU and to every MIG instance.
* A GPU without a fresh memory reading for three intervals (at least 5 s) raises a ``blind`` alert:
  NVML hangs, or the GPU's memory cannot be read. It clears (``recovered``) when data flows again.
* Every string from outside (GPU, MIG and process names, users, command lines) is printed as text,
  never as rich markup.
* Without an NVIDIA driver it prints the host and one line saying so, and exits 0.

This module holds the flags, their checks and the sampling loop; what it prints (the ``--once``
tables, the streaming lines, ``--watch`` frames, JSON lines) is in :mod:`hwdash.commands.monitor_print`.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hwdash.commands.monitor_print import (
    ENTER_WATCH,
    ERASE_BELOW,
    ERASE_LINE,
    HOME,
    LEAVE_WATCH,
    PIPED_WIDTH,
    StreamLines,
    emit_json,
    gpu_line,
    host_line,
    print_readable,
    torch_line,
    watch_frame,
)
from hwdash.core.live.alerts import (
    BLIND_INTERVALS,
    BLIND_MINIMUM_S,
    DEFAULT_HYSTERESIS,
    DEFAULT_THRESHOLD,
    AlertEngine,
    AlertRule,
    blind_after_for,
)
from hwdash.errors import UsageError
from hwdash.telemetry.alert_actions import (
    AlertActions,
    AlertCommand,
    AlertLog,
    default_alert_log_path,
    mark_alert_states,
)
from hwdash.telemetry.history import History
from hwdash.telemetry.snapshot_json import snapshot_to_dict
from hwdash.telemetry.source import DEMO_SCENARIO, fake_scenario_from, make_sampler
from hwdash.telemetry.types import Sampler
from hwdash.telemetry.webhooks import WebhookSender, parse_webhook_urls

if TYPE_CHECKING:
    from hwdash.telemetry.history_ring import HistoryRing
    from hwdash.telemetry.replay import ReplaySampler

#: What the monitor prints lives in :mod:`hwdash.commands.monitor_print`; its public names are
#: importable from here as before.
__all__ = [
    "ENTER_WATCH",
    "ERASE_BELOW",
    "ERASE_LINE",
    "HOME",
    "LEAVE_WATCH",
    "PIPED_WIDTH",
    "add_parser",
    "add_sampling_arguments",
    "build_rule",
    "check_watch",
    "gpu_line",
    "host_line",
    "open_replay",
    "open_source",
    "parse_blind_after",
    "parse_count",
    "parse_forecast",
    "parse_fraction",
    "parse_interval",
    "parse_speed",
    "print_readable",
    "run",
    "torch_line",
    "watch_frame",
    "with_subset",
]


def add_parser(subparsers: Any) -> None:
    """Register the subcommand."""
    parser = subparsers.add_parser(
        "monitor",
        help="live GPU memory, processes and host load, with alerts",
        description=(
            "Watch GPU memory pressure (1 - free/total), utilization, processes and the host. "
            "Streams one line per GPU per interval until Ctrl-C or --count."
        ),
    )
    parser.add_argument("--once", action="store_true", help="print one snapshot and exit")
    parser.add_argument("--json", action="store_true", help="JSON (one object, or JSON lines)")
    parser.add_argument(
        "--watch",
        action="store_true",
        help="redraw the --once tables in place every interval, like `gpustat -i` (a terminal only)",
    )
    parser.add_argument(
        "--count",
        default=None,
        metavar="N",
        help="stop after N samples (default: until Ctrl-C); with --once: take N samples "
        "--interval apart and print the last (GPM activity needs two, the health rules a window)",
    )
    parser.add_argument(
        "--alert-hysteresis",
        default=None,
        metavar="P",
        help="points below the threshold at which an alert clears: percent (5) or fraction "
        "(0.05); above 0",
    )
    parser.add_argument(
        "--alert-log",
        default=None,
        metavar="PATH",
        help="where alert events are appended as JSON lines (default "
        "$XDG_STATE_HOME/hwdash/alerts.jsonl)",
    )
    add_sampling_arguments(
        parser,
        demo_help=f"use the packaged {DEMO_SCENARIO} scenario (memory climbs past 90%% in ~60 s)",
    )
    add_price_argument(parser)


def add_price_argument(parser: argparse.ArgumentParser) -> None:
    """``--price``: the monitor and the dashboard hold probed runs against their plans."""
    parser.add_argument(
        "--price",
        default=None,
        metavar="USD",
        help="this machine's price per hour, for each probed run's cost (default: the price of "
        "the flavor its plan names; a run is charged its share of the machine's GPUs)",
    )


def add_sampling_arguments(
    parser: argparse.ArgumentParser, *, demo_help: str, ssh: bool = True
) -> None:
    """Flags shared by ``hwdash monitor``, the dashboard and (``ssh=False``: it serves this
    machine's GPUs) the exporter: where samples come from, how often, and what an alert is and
    does."""
    _add_pace_and_alert_arguments(parser)
    _add_source_arguments(parser, demo_help=demo_help, ssh=ssh)
    add_history_arguments(parser)


def add_history_arguments(parser: argparse.ArgumentParser) -> None:
    """The history ring's flags (:mod:`hwdash.telemetry.history_ring`)."""
    parser.add_argument(
        "--history-dir",
        default=None,
        metavar="DIR",
        help="where this box's history is recorded (default $HWDASH_HISTORY_DIR, else "
        "$XDG_STATE_HOME/hwdash/history); naming one records a fake scenario too",
    )
    parser.add_argument(
        "--history-max-age",
        default=None,
        metavar="AGE",
        help="keep the history's 1-minute points this long (7d, 36h, 2w; default 7d)",
    )
    parser.add_argument(
        "--history-max-size",
        default=None,
        metavar="SIZE",
        help="cap the history directory at SIZE (50M, 1G; default 200M)",
    )
    parser.add_argument(
        "--no-history",
        action="store_true",
        help="record no history (another hwdash process on this box may still record it)",
    )


def add_webhook_argument(parser: argparse.ArgumentParser) -> None:
    """``--webhook URL`` (repeatable): where alert events are posted."""
    parser.add_argument(
        "--webhook",
        action="append",
        default=None,
        metavar="URL",
        help=(
            "POST each alert event as JSON (a `text` line for Slack/Mattermost plus the alert "
            "log's fields) to URL, http or https; repeatable; env:NAME reads the URL from "
            "variable NAME; default: the URLs in HWDASH_WEBHOOK"
        ),
    )


def _add_pace_and_alert_arguments(parser: argparse.ArgumentParser) -> None:
    """How often to sample, which GPUs, what raises an alert and what runs then; ``--replay``'s
    pace."""
    parser.add_argument(
        "--interval", default="1", metavar="S", help="seconds between samples (default 1)"
    )
    parser.add_argument(
        "--alert-threshold",
        default=None,
        metavar="P",
        help="memory pressure that raises an alert: percent (90) or fraction (0.9); default 90",
    )
    parser.add_argument(
        "--blind-after",
        default=None,
        metavar="S",
        help=f"seconds without a fresh memory reading before a GPU raises a 'blind' alert "
        f"(default {BLIND_INTERVALS} intervals, at least {BLIND_MINIMUM_S:g} s; "
        f"never under {BLIND_INTERVALS} intervals)",
    )
    parser.add_argument(
        "--on-alert",
        default=None,
        metavar="CMD",
        help=(
            "shell command run for each raised, lost or blind alert, with HWDASH_KIND, "
            "HWDASH_GPU, HWDASH_MIG, HWDASH_PRESSURE, HWDASH_USED_BYTES, HWDASH_TOTAL_BYTES, "
            "HWDASH_MESSAGE in its environment; at most 4 run at once"
        ),
    )
    add_webhook_argument(parser)
    parser.add_argument(
        "--gpus",
        default=None,
        metavar="LIST",
        help="only these GPUs: indices or UUIDs, e.g. 0,2 (default: CUDA_VISIBLE_DEVICES when "
        "set, else all; 'all' shows every GPU)",
    )
    parser.add_argument(
        "--alert-forecast",
        default=None,
        metavar="S",
        help="also raise the alert when a GPU's memory is forecast to be full within S seconds "
        "at its current climb (robust trend over the last 2 minutes)",
    )
    parser.add_argument(
        "--speed",
        default=None,
        metavar="X",
        help="with --replay: X times the recorded pace (default 1; 0 = as fast as possible)",
    )


def _add_source_arguments(
    parser: argparse.ArgumentParser, *, demo_help: str, ssh: bool = True
) -> None:
    """Where samples come from, one of: a fake NVML scenario, the demo, Prometheus, SSH hosts, a
    recording (the driver's NVML without any)."""
    if ssh:
        parser.add_argument(
            "--ssh-config",
            default=None,
            metavar="FILE",
            help="with --ssh: the ssh client config to use (ssh -F FILE; default: ssh's own, "
            "~/.ssh/config)",
        )
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--fake-nvml",
        default=None,
        metavar="PATH",
        help="use a fake NVML scenario (file or packaged name) instead of the driver; "
        "also HWDASH_FAKE_NVML",
    )
    source.add_argument("--demo", action="store_true", help=demo_help)
    source.add_argument(
        "--prometheus",
        default=None,
        metavar="URL",
        help="read every GPU of a cluster from a Prometheus server (dcgm-exporter, hwdash "
        "exporter or nvitop-exporter series); credentials from HWDASH_PROMETHEUS_TOKEN or "
        "HWDASH_PROMETHEUS_USER/HWDASH_PROMETHEUS_PASSWORD",
    )
    if ssh:
        source.add_argument(
            "--ssh",
            default=None,
            metavar="HOSTS",
            help="read the GPUs of other boxes over SSH (the system ssh client, your own config and "
            "keys): HOST[,HOST...] or @FILE (one host a line); each runs `hwdash monitor --json` "
            "when installed there, else nvidia-smi",
        )
    source.add_argument(
        "--replay",
        default=None,
        metavar="FILE",
        help="replay what `hwdash monitor --json` recorded (JSON lines), or a history "
        "directory (e.g. ~/.local/state/hwdash/history), instead of sampling",
    )


# -- argument checks ------------------------------------------------------------------------------


def parse_interval(text: str) -> float:
    """Seconds between samples, > 0."""
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"{text!r} is not a number of seconds", flag="--interval") from None
    if not value > 0 or value != value or value == float("inf"):
        raise UsageError(f"must be a positive number of seconds, got {text}", flag="--interval")
    return value


def parse_blind_after(text: str | None, interval: float) -> float:
    """Seconds without fresh data before a GPU is blind: the default for the interval, or the
    flag's value, which may not be under three intervals (one slow round is not blindness)."""
    if text is None:
        return blind_after_for(interval)
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"{text!r} is not a number of seconds", flag="--blind-after") from None
    lowest = BLIND_INTERVALS * interval
    if value != value or value == float("inf") or value < lowest * (1 - 1e-9):
        raise UsageError(
            f"must be at least {BLIND_INTERVALS} intervals ({lowest:g} s) and finite, got {text}",
            flag="--blind-after",
        )
    return value


def parse_count(text: str | None) -> int | None:
    """Number of samples, >= 1, or None for no limit."""
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"{text!r} is not a whole number", flag="--count") from None
    if value < 1:
        raise UsageError(f"must be at least 1, got {value}", flag="--count")
    return value


def parse_fraction(
    text: str | None, default: float, flag: str, *, allow_zero: bool = False
) -> float:
    """A percent (above 1, up to 100) or a fraction (up to 1), returned as a fraction."""
    if text is None:
        return default
    try:
        value = float(text.strip().rstrip("%"))
    except ValueError:
        raise UsageError(f"{text!r} is not a percent (90) or fraction (0.9)", flag=flag) from None
    if value != value or value < 0 or (value == 0 and not allow_zero) or value > 100:
        lowest = "0" if allow_zero else "above 0"
        raise UsageError(
            f"must be {lowest} and at most 100 (percent) or 1 (fraction), got {text}", flag=flag
        )
    return value / 100 if value > 1 else value


def build_rule(args: argparse.Namespace, interval: float) -> AlertRule:
    """The alert rule from the flags. A hysteresis of 0 is refused: a reading that jitters around
    the threshold would raise and clear an alert (and run ``--on-alert``) on every other sample."""
    threshold = parse_fraction(args.alert_threshold, DEFAULT_THRESHOLD, "--alert-threshold")
    hysteresis = parse_fraction(args.alert_hysteresis, DEFAULT_HYSTERESIS, "--alert-hysteresis")
    if hysteresis >= threshold:
        raise UsageError(
            f"hysteresis ({hysteresis:.0%}) must be smaller than the threshold ({threshold:.0%})",
            flag="--alert-hysteresis",
        )
    return AlertRule(
        threshold=threshold,
        hysteresis=hysteresis,
        blind_after_s=parse_blind_after(args.blind_after, interval),
        forecast_s=parse_forecast(args.alert_forecast),
    )


def parse_forecast(text: str | None) -> float | None:
    """``--alert-forecast``: seconds, > 0 (None: no forecast alert)."""
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"{text!r} is not a number of seconds", flag="--alert-forecast") from None
    if not 0 < value < float("inf"):
        raise UsageError(
            f"must be a positive number of seconds, got {text}", flag="--alert-forecast"
        )
    return value


def parse_speed(text: str | None) -> float:
    """``--speed``: a factor >= 0 (0: as fast as possible)."""
    if text is None:
        return 1.0
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"{text!r} is not a number", flag="--speed") from None
    if not 0 <= value < float("inf"):
        raise UsageError(f"must be 0 or more, got {text}", flag="--speed")
    return value


def with_subset(sampler: Sampler, args: argparse.Namespace) -> Sampler:
    """``sampler`` showing only ``--gpus`` (or ``CUDA_VISIBLE_DEVICES``) when set."""
    import os

    from hwdash.telemetry.subset import SubsetSampler, selection_from

    entries, source = selection_from(getattr(args, "gpus", None), os.environ)
    if entries is None or source is None:
        return sampler
    return SubsetSampler(sampler, entries, source)


def open_source(args: argparse.Namespace) -> Sampler | None:
    """The sampler of ``--prometheus`` or ``--ssh`` (``--replay``: :func:`open_replay`); None for
    NVML."""
    hosts = getattr(args, "ssh", None)
    config = getattr(args, "ssh_config", None)
    if hosts is None:
        if config is not None:
            raise UsageError("only applies with --ssh HOSTS", flag="--ssh-config")
    else:
        return open_ssh(hosts, config, parse_interval(args.interval))
    url = getattr(args, "prometheus", None)
    if url is None:
        return None
    from hwdash.telemetry.prometheus_source import PrometheusSampler

    return PrometheusSampler(url)


def history_ring(args: argparse.Namespace, *, simulated: bool) -> HistoryRing | None:
    """The history ring the flags ask for, its lock not yet taken; None with ``--no-history``, and
    for a simulated box (a fake scenario, ``--demo``) unless ``--history-dir`` names a directory.
    Bad values are usage errors naming their flag."""
    from hwdash.telemetry.history_ring import (
        DEFAULT_MAX_AGE_S,
        DEFAULT_MAX_SIZE_BYTES,
        HistoryRing,
        default_history_dir,
        parse_max_age,
        parse_max_size,
    )

    max_age, max_size = DEFAULT_MAX_AGE_S, DEFAULT_MAX_SIZE_BYTES
    for flag, attribute in (
        ("--history-max-age", "history_max_age"),
        ("--history-max-size", "history_max_size"),
    ):
        text = getattr(args, attribute, None)
        if text is None:
            continue
        try:
            if attribute == "history_max_age":
                max_age = parse_max_age(text)
            else:
                max_size = parse_max_size(text)
        except ValueError as exc:
            raise UsageError(str(exc), flag=flag) from None
    explicit = getattr(args, "history_dir", None)
    if explicit is not None and not explicit.strip():
        raise UsageError("the directory is empty", flag="--history-dir")
    if getattr(args, "no_history", False) or (simulated and explicit is None):
        return None
    directory = Path(explicit).expanduser() if explicit else default_history_dir()
    return HistoryRing(directory, max_age_s=max_age, max_size_bytes=max_size)


def with_history(
    sampler: Sampler, args: argparse.Namespace, *, simulated: bool
) -> tuple[Sampler, HistoryRing | None]:
    """``sampler`` recording this box's history (:func:`history_ring`), and the ring: open when
    this process records, else with a :attr:`~HistoryRing.note` saying why not (another process
    holds the lock); (``sampler``, None) when none is kept. Give it this machine's own sampler
    only: never a replay or a Prometheus source."""
    ring = history_ring(args, simulated=simulated)
    if ring is None:
        return sampler, None
    from hwdash.telemetry.history_ring import RecordingSampler

    ring.open()
    return RecordingSampler(sampler, ring), ring


def say_history(ring: HistoryRing | None, program: str = "hwdash") -> None:
    """One quiet stderr line when the history is not being recorded (another process records
    this box, or the directory cannot be written)."""
    if ring is not None and ring.note:
        sys.stderr.write(f"{program}: {ring.note}\n")


def open_ssh(hosts: str, config: str | None, interval: float) -> Sampler:
    """The ``--ssh`` sampler (its reader threads start here); a bad host or file is a usage
    error."""
    from hwdash.telemetry.ssh_source import SshSampler, parse_hosts

    path = None
    if config is not None:
        path = Path(config).expanduser()
        if not path.is_file():
            raise UsageError(f"{path} is not a file", flag="--ssh-config")
    return SshSampler(parse_hosts(hosts), interval_s=interval, config=path)


def open_replay(args: argparse.Namespace) -> ReplaySampler | None:
    """The ``--replay`` sampler (warnings about a cut last line go to stderr), or None."""
    if args.replay is None:
        if args.speed is not None:
            raise UsageError("only applies with --replay FILE", flag="--speed")
        return None
    from hwdash.telemetry.replay import ReplaySampler

    sampler, warnings = ReplaySampler.from_file(Path(args.replay), speed=parse_speed(args.speed))
    for warning in warnings:
        print(f"hwdash: warning: {warning}", file=sys.stderr)
    return sampler


# -- the command ----------------------------------------------------------------------------------


def check_watch(args: argparse.Namespace, *, terminal: bool) -> None:
    """``--watch`` redraws a terminal: refuse it with ``--once`` or ``--json`` and off a terminal."""
    if not getattr(args, "watch", False):
        return
    for other in ("once", "json"):
        if getattr(args, other, False):
            raise UsageError(f"cannot be combined with --{other}", flag="--watch")
    if not terminal:
        raise UsageError(
            "redraws a terminal, and standard output is not one; for a log use "
            "`hwdash monitor` (a line per GPU) or `hwdash monitor --json`",
            flag="--watch",
        )


def webhook_urls(args: argparse.Namespace, scenario: str | None) -> tuple[str, ...]:
    """The ``--webhook`` URLs, else ``HWDASH_WEBHOOK``'s unless the samples are simulated (a fake
    scenario or ``--replay``: see :func:`hwdash.telemetry.webhooks.parse_webhook_urls`)."""
    simulated = (
        fake_scenario_from(scenario) is not None or getattr(args, "replay", None) is not None
    )
    return parse_webhook_urls(getattr(args, "webhook", None), simulated=simulated)


def open_webhooks(urls: tuple[str, ...]) -> WebhookSender | None:
    """The sender of ``--webhook`` (or ``HWDASH_WEBHOOK``) URLs, checked by
    :func:`hwdash.telemetry.webhooks.parse_webhook_urls`; None when there are none."""
    return WebhookSender(urls) if urls else None


def parse_price(text: str | None) -> float | None:
    """``--price``: US dollars per hour, 0 or more; None when not given."""
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1e6:
        raise UsageError(
            f"--price: {text!r} is not a price per hour in US dollars (e.g. 2.5)", flag="--price"
        )
    return value


def watch_runs(sampler: Sampler, args: argparse.Namespace) -> Sampler:
    """The sampler with each probed run held against its plan (:mod:`hwdash.runs.watch`)."""
    from hwdash.runs.watch import RunWatcher

    return RunWatcher(sampler, price=parse_price(getattr(args, "price", None)))


def run(args: argparse.Namespace) -> int:
    """Run the subcommand."""
    check_watch(args, terminal=sys.stdout.isatty())
    interval = parse_interval(args.interval)
    count = parse_count(args.count)
    rule = build_rule(args, interval)
    scenario = DEMO_SCENARIO if args.demo else args.fake_nvml
    urls = webhook_urls(args, scenario)  # a bad URL is said before sampling
    replay = open_replay(args)
    source: Sampler | None = replay if replay is not None else open_source(args)
    simulated = fake_scenario_from(scenario) is not None or replay is not None
    ring: HistoryRing | None = None
    if source is None:
        local: Sampler = make_sampler(scenario, round_timeout_s=max(0.5, min(2.0, interval * 2)))
        if not args.once:  # one reading is no history
            local, ring = with_history(local, args, simulated=simulated)
        source = watch_runs(local, args)
    sampler: Sampler = with_subset(source, args)
    engine = AlertEngine(rule)
    if args.once:
        return _run_once(args, sampler, engine, interval=interval, count=count or 1)
    say_history(ring)
    log_path = (
        Path(args.alert_log) if args.alert_log else default_alert_log_path(simulated=simulated)
    )
    command = AlertCommand(args.on_alert) if args.on_alert else None
    webhooks = open_webhooks(urls)
    actions = AlertActions(AlertLog(log_path), command, webhooks)
    watch = getattr(args, "watch", False)
    if watch:
        sys.stdout.write(ENTER_WATCH)
    try:
        _stream(args, sampler, engine, actions, interval=interval, count=count, replay=replay)
    finally:
        if watch:
            sys.stdout.write(LEAVE_WATCH)
            sys.stdout.flush()
        sampler.close()
        actions.close()
        if command is not None and command.skipped:
            sys.stderr.write(
                f"hwdash: {command.skipped} alert command(s) skipped: "
                f"{command.max_running} were still running\n"
            )
        if webhooks is not None:
            sys.stderr.write(f"hwdash: {webhooks.stats().summary()}\n")
    return 0


def _run_once(
    args: argparse.Namespace,
    sampler: Sampler,
    engine: AlertEngine,
    *,
    interval: float = 1.0,
    count: int = 1,
) -> int:
    """``--once``: one snapshot, readable or as one JSON object; 1 when a server could not be
    read, else 0. With ``--count N`` it is the last of N samples ``interval`` apart: GPM's activity
    is measured between two samples, and the health rules (Xid, throttling...) see every round."""
    try:
        # No wait for the host's CPU percent: a one-shot reports it only when the round took
        # long enough to measure it (HostSampler.MIN_CPU_WINDOW_S), else n/a with the load.
        snapshot = sampler.sample()
        next_at = time.monotonic()
        for _ in range(count - 1):
            next_at = _wait_until(next_at + interval)
            snapshot = sampler.sample()
    finally:
        sampler.close()
    engine.update(snapshot)
    snapshot = mark_alert_states(snapshot, engine)
    if args.json:
        emit_json(snapshot_to_dict(snapshot, engine.active))
    else:
        print_readable(snapshot, engine.active)
    if snapshot.nvml.source is not None and not snapshot.nvml.available:
        # A server that cannot be reached (or has no GPU series): the script saw nothing.
        # (No driver on this machine is not an error: the monitor says so and exits 0.)
        return 1
    return 0


def _stream(
    args: argparse.Namespace,
    sampler: Sampler,
    engine: AlertEngine,
    actions: AlertActions,
    *,
    interval: float,
    count: int | None,
    replay: ReplaySampler | None,
) -> None:
    """Sample every ``interval`` (a recording at its own pace) until ``count`` rounds, the
    recording's end or Ctrl-C: forecasts, alerts and their actions, then JSON lines, a ``--watch``
    frame or the streaming lines."""
    history = History(interval_s=interval)
    watch = getattr(args, "watch", False)
    lines = StreamLines()
    rounds = 0
    next_at = time.monotonic()
    while True:
        snapshot = sampler.sample()
        history.add(snapshot)
        snapshot = history.with_forecasts(snapshot)
        events = engine.update(snapshot)
        snapshot = mark_alert_states(snapshot, engine)
        actions.handle(events)
        if args.json:
            payload = snapshot_to_dict(snapshot, engine.active, events)
            if actions.webhooks is not None:
                # Counted so far (deliveries finish on their own thread, after the round).
                payload["webhooks"] = actions.webhooks.stats().to_dict()
            emit_json(payload)
        elif watch:
            size = shutil.get_terminal_size()
            sys.stdout.write(watch_frame(snapshot, engine.active, size.columns, size.lines))
            sys.stdout.flush()
        else:
            lines.write(snapshot, events)
        rounds += 1
        if count is not None and rounds >= count:
            return
        if replay is not None:
            if replay.finished:
                return
            time.sleep(replay.wait_s())
            continue
        next_at = _wait_until(next_at + interval)


def _wait_until(next_at: float) -> float:
    """Sleep until ``next_at`` (monotonic seconds) and return it; when that has passed already,
    return now instead: a stream that fell behind does not catch up in a burst."""
    delay = next_at - time.monotonic()
    if delay > 0:
        time.sleep(delay)
        return next_at
    return time.monotonic()  # fell behind: do not try to catch up in a burst
