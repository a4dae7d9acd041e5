"""``hwdash exporter``: serve what the monitor sees to Prometheus (see :mod:`hwdash.telemetry.exporter`).

    hwdash exporter                        # http://127.0.0.1:9835/metrics
    hwdash exporter --listen 0.0.0.0:9835  # beyond this machine: the user's explicit choice
    hwdash exporter --process-details      # also each GPU process's user name and command line

One sampling loop (the monitor's sampler, with its round timeout) keeps the last snapshot, with the
alert rule's states and the OOM forecast; a scrape only reads it. Alert events run ``--on-alert`` and
go to the ``--webhook`` URLs as in ``hwdash monitor`` (the exporter writes no alert log).
"""

from __future__ import annotations

import argparse
import ipaddress
import socket
import sys
import time
from typing import Any, NoReturn

from hwdash.core.live.alerts import AlertEngine
from hwdash.errors import UsageError

DEFAULT_LISTEN = "127.0.0.1:9835"


def add_parser(subparsers: Any) -> None:
    """Register the subcommand."""
    from hwdash.commands.monitor import add_sampling_arguments

    parser = subparsers.add_parser(
        "exporter",
        help="serve GPU metrics to Prometheus (dcgm-exporter's names, plus hwdash_* series)",
        description=(
            "Serve the monitor's view as Prometheus metrics: per GPU under dcgm-exporter's names "
            "and units (DCGM_FI_DEV_FB_USED in MiB, ..., and the health readings: PCIe link, "
            "ECC, remapped rows, clock-event reasons, energy), plus hwdash_* series for pressure, "
            "alert state, the health diagnoses, the OOM forecast, per-process memory and "
            "utilization and the PyTorch probe's numbers."
        ),
    )
    parser.add_argument(
        "--listen",
        default=DEFAULT_LISTEN,
        metavar="HOST:PORT",
        help=f"address to serve /metrics on (default {DEFAULT_LISTEN}: this machine only)",
    )
    parser.add_argument(
        "--hostname",
        default=None,
        metavar="NAME",
        help="the Hostname label (default: this machine's host name)",
    )
    parser.add_argument(
        "--process-details",
        action="store_true",
        help="label per-process series with the user name and command line (off by default: "
        "anyone who can scrape /metrics would read them)",
    )
    parser.add_argument(
        "--alert-hysteresis", default=None, metavar="P", help="as for hwdash monitor"
    )
    add_sampling_arguments(
        parser, demo_help="serve the packaged demo scenario (no GPU needed)", ssh=False
    )


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9835`` for IPv6) into its parts."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host:
        raise UsageError(f"{text!r} is not HOST:PORT", flag="--listen")
    host = host.strip("[]")
    try:
        port = int(port_text)
    except ValueError:
        raise UsageError(f"{port_text!r} is not a port number", flag="--listen") from None
    if not 0 < port < 65536:
        raise UsageError(f"port {port} is out of range (1-65535)", flag="--listen")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if host != "localhost":
            raise UsageError(
                f"{host!r} is not an IP address or localhost", flag="--listen"
            ) from None
    return host, port


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted."""
    from hwdash.commands.monitor import (
        build_rule,
        open_replay,
        open_source,
        open_webhooks,
        parse_interval,
        say_history,
        webhook_urls,
        with_history,
        with_subset,
    )
    from hwdash.telemetry.alert_actions import AlertActions, AlertCommand
    from hwdash.telemetry.exporter import SnapshotCollector
    from hwdash.telemetry.source import DEMO_SCENARIO, fake_scenario_from, make_sampler

    interval = parse_interval(args.interval)
    rule = build_rule(args, interval)
    scenario = DEMO_SCENARIO if args.demo else args.fake_nvml
    urls = webhook_urls(args, scenario)
    host, port = parse_listen(args.listen)
    hostname = args.hostname or socket.gethostname()
    replay = open_replay(args) or open_source(args)
    collector = SnapshotCollector(hostname, process_details=args.process_details)
    server = _listen(host, port, collector)
    ring = None
    sampler: Any = replay
    if sampler is None:
        sampler, ring = with_history(
            make_sampler(scenario, round_timeout_s=max(0.5, min(2.0, interval * 2))),
            args,
            simulated=fake_scenario_from(scenario) is not None,
        )
    sampler = with_subset(sampler, args)
    engine = AlertEngine(rule)
    on_alert = getattr(args, "on_alert", None)
    webhooks = open_webhooks(urls)
    actions = AlertActions(
        None, AlertCommand(on_alert) if on_alert else None, webhooks, host=hostname
    )
    print(
        f"hwdash exporter: serving http://{args.listen}/metrics as Hostname={hostname}",
        file=sys.stderr,
    )
    say_history(ring, "hwdash exporter")
    try:
        _serve(sampler, engine, actions, collector, interval)
    except KeyboardInterrupt:
        return 0
    finally:
        sampler.close()
        server.shutdown()
        actions.close()
        if webhooks is not None:
            print(f"hwdash exporter: {webhooks.stats().summary()}", file=sys.stderr)


def _listen(host: str, port: int, collector: Any) -> Any:
    """The HTTP server serving ``collector`` on ``host:port``; a port in use is a usage error."""
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    try:
        server, _thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise UsageError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}", flag="--listen"
        ) from None
    return server


def _serve(sampler: Any, engine: Any, actions: Any, collector: Any, interval: float) -> NoReturn:
    """Sample every ``interval`` seconds until interrupted: forecasts, alert actions (which queue
    webhooks and never wait on the network), and the collector's newest snapshot."""
    from hwdash.telemetry.alert_actions import mark_alert_states
    from hwdash.telemetry.history import History

    history = History(interval_s=interval)
    next_at = time.monotonic()
    while True:
        snapshot = sampler.sample()
        history.add(snapshot)
        snapshot = history.with_forecasts(snapshot)
        actions.handle(engine.update(snapshot))
        collector.update(mark_alert_states(snapshot, engine))
        next_at += interval
        time.sleep(max(0.0, next_at - time.monotonic()))
