"""``hwdash`` with no subcommand: the Textual dashboard (planner, compare, monitor).

Flags: ``--demo`` (the packaged 4x A100 scenario), ``--fake-nvml PATH`` (or ``HWDASH_FAKE_NVML``),
``--interval``, ``--alert-threshold``, ``--catalog``, ``--no-bell``, ``--on-alert CMD`` and
``--webhook URL``; they mean what they mean for ``hwdash monitor``. Textual is imported only once the flags are known to be good and
a terminal is there to draw on.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, TextIO

from hwdash.commands.shared_args import add_dashboard_arguments
from hwdash.core.live.alerts import DEFAULT_THRESHOLD
from hwdash.errors import UsageError

if TYPE_CHECKING:
    from hwdash.core.catalog import Catalog
    from hwdash.telemetry.signals import Signaller
    from hwdash.ui.app import HwdashApp

NO_TERMINAL_MESSAGE = (
    "the dashboard needs a terminal, and standard output is not one. "
    "For scripts and pipes use `hwdash plan ...` (add --json) or `hwdash monitor --once`."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Top-level flags of the dashboard."""
    add_dashboard_arguments(parser)
    from hwdash.commands.monitor import add_price_argument, add_sampling_arguments

    add_sampling_arguments(
        parser,
        demo_help="run on a simulated 4x A100 box whose memory climbs past 90%% (no GPU needed)",
    )
    add_price_argument(parser)
    parser.add_argument(
        "--no-bell", action="store_true", help="do not ring the terminal bell on an alert"
    )
    parser.add_argument(
        "--readonly",
        action="store_true",
        help="never send signals: the monitor's k (SIGTERM) and K (SIGKILL) keys are turned off",
    )
    parser.add_argument(
        "--tab",
        choices=["planner", "compare", "monitor"],
        default=None,
        help="the tab shown first (default: monitor when NVML shows a GPU, else planner)",
    )


def _signaller(args: argparse.Namespace, *, simulated: bool) -> Signaller | None:
    """Who sends the monitor's SIGTERM/SIGKILL: nobody with ``--readonly``; in a fake scenario a
    stand-in that sends nothing (its PIDs are made up and may be real processes here)."""
    from hwdash.telemetry.signals import OsSignaller, SimulatedSignaller

    if getattr(args, "readonly", False):
        return None
    return SimulatedSignaller() if simulated else OsSignaller()


def choose_tab(
    asked: Literal["planner", "compare", "monitor"] | None, sampler: Any
) -> tuple[Literal["planner", "compare", "monitor"], Any]:
    """The tab asked for, else the monitor when one sample shows a GPU, else the planner; and the
    sample taken to decide (None when none was), which the dashboard shows as its first frame."""
    if asked is not None:
        return asked, None
    snapshot = sampler.sample()
    return ("monitor" if snapshot.gpus else "planner"), snapshot


def run(
    args: argparse.Namespace,
    *,
    stdout: TextIO | None = None,
    initial_tab: Literal["planner", "compare", "monitor"] | None = None,
) -> int:
    """Check the flags, build the app with :func:`hwdash.ui.app.make_app`, run it.

    ``initial_tab`` is the tab shown first (``hwdash compare`` passes ``"compare"``); ``--tab``
    chooses it too; otherwise the monitor when NVML shows a GPU (a training box), else the
    planner.
    """
    from hwdash.ui import startup_gc

    startup_gc.pause()  # until the first frame is on screen (see the module)
    try:
        return _run(args, stdout=stdout, initial_tab=initial_tab)
    finally:
        startup_gc.cancel()  # ended before its first frame (an error): no freeze; else a no-op


def _run(
    args: argparse.Namespace,
    *,
    stdout: TextIO | None,
    initial_tab: Literal["planner", "compare", "monitor"] | None,
) -> int:
    app, sampler = build_app(args, stdout=stdout, initial_tab=initial_tab)
    try:
        app.run()
    finally:
        app.finish()
        sampler.close()
        _say_history(sampler)
    if app.catalog_error is not None:
        raise app.catalog_error
    return 0 if app.return_code in (None, 0) else int(app.return_code)


def _say_history(sampler: Any) -> None:
    """After the screen closes: one line when this dashboard recorded no history because another
    hwdash process records this box (or the directory could not be written)."""
    from hwdash.commands.monitor import say_history

    say_history(getattr(sampler, "ring", None))


def build_app(
    args: argparse.Namespace,
    *,
    stdout: TextIO | None,
    initial_tab: Literal["planner", "compare", "monitor"] | None,
) -> tuple[HwdashApp, Any]:
    """The app the parsed flags ask for and its sampler (close it after the app has run); raises
    :class:`UsageError` for bad flags or when ``stdout`` is not a terminal."""
    interval, forecast, threshold, blind_after = _alert_settings(args)
    from hwdash.commands.monitor import webhook_urls
    from hwdash.telemetry.source import DEMO_SCENARIO

    # Checked before the screen opens; HWDASH_WEBHOOK is not read for a simulated box.
    webhooks = webhook_urls(args, DEMO_SCENARIO if args.demo else args.fake_nvml)
    scenario, loaded = _scenario(args)
    out = sys.stdout if stdout is None else stdout
    if not out.isatty():
        raise UsageError(NO_TERMINAL_MESSAGE)

    from hwdash.telemetry.alert_actions import default_alert_log_path

    sampler, replay, remote, interval = _open_sampler(args, scenario, loaded, interval)
    tab, first_snapshot = _first_tab(args, initial_tab, sampler)
    catalog = _catalog(args, tab)
    from hwdash.ui.app import make_app

    app = make_app(
        catalog=catalog,
        sampler=sampler,
        interval=interval,
        alert_threshold=threshold,
        blind_after_s=blind_after,
        on_alert=args.on_alert,
        webhooks=webhooks,
        bell=not args.no_bell,
        plan_store=None,  # opened when the planner or compare pane is built
        first_snapshot=first_snapshot,
        initial_tab=tab,
        signaller=None
        if replay is not None or remote is not None
        else _signaller(args, simulated=scenario is not None),
        alert_forecast_s=forecast,
        # Simulated alerts (--demo, fake scenarios) go to their own log, never the real one.
        alert_log=default_alert_log_path(simulated=True)
        if scenario is not None or replay is not None
        else None,
    )
    ring = getattr(sampler, "ring", None)  # the history ring (read even while another writes)
    if ring is not None:
        app.time_cursor.directory = ring.directory
    return app, sampler


def _alert_settings(args: argparse.Namespace) -> tuple[float, float | None, float, float]:
    """(interval, alert forecast, alert threshold, blind after) from the flags, checked as
    ``hwdash monitor`` checks them; an empty ``--on-alert`` is refused."""
    # Flag checks shared with `hwdash monitor`, so both accept and reject the same values.
    from hwdash.commands.monitor import (
        parse_blind_after,
        parse_forecast,
        parse_fraction,
        parse_interval,
    )

    interval = parse_interval(args.interval)
    forecast = parse_forecast(args.alert_forecast)
    threshold = parse_fraction(args.alert_threshold, DEFAULT_THRESHOLD, "--alert-threshold")
    blind_after = parse_blind_after(args.blind_after, interval)
    if args.on_alert is not None and not args.on_alert.strip():
        raise UsageError("the command is empty", flag="--on-alert")
    return interval, forecast, threshold, blind_after


def _scenario(args: argparse.Namespace) -> tuple[Any, Any]:
    """(the fake scenario asked by ``--demo`` or ``--fake-nvml``, loaded) or (None, None); a
    missing or broken scenario is a usage error, before the screen."""
    from hwdash.telemetry.source import DEMO_SCENARIO, fake_scenario_from

    scenario = fake_scenario_from(DEMO_SCENARIO if args.demo else args.fake_nvml)
    loaded = None
    if scenario is not None:
        from hwdash.telemetry.fake_nvml import load_any_scenario

        # A missing or broken scenario is a usage error, before the screen. A compiled one
        # (.json) loads without pydantic.
        loaded = load_any_scenario(scenario)
    return scenario, loaded


def _open_sampler(
    args: argparse.Namespace, scenario: Any, loaded: Any, interval: float
) -> tuple[Any, Any, Any, float]:
    """(the sampler, the ``--replay`` recording or None, the ``--prometheus`` source or None, the
    interval): a recording is shown at its own pace, its median gap over ``--speed``."""
    from hwdash.commands.monitor import (
        open_replay,
        open_source,
        watch_runs,
        with_history,
        with_subset,
    )
    from hwdash.telemetry.source import make_sampler

    replay = open_replay(args)
    remote = open_source(args) if replay is None else None  # --prometheus
    # Runs are held against their plans on this machine's sampler (inside --gpus, so the subset
    # stays the outer sampler the app and the first-sample check look for).
    inner: Any = replay or remote
    if inner is None:
        # This box's history is recorded under the runs' view (what NVML and the host say).
        local, _ring = with_history(
            make_sampler(scenario, loaded=loaded), args, simulated=scenario is not None
        )
        inner = watch_runs(local, args)
    sampler: Any = with_subset(inner, args)
    if replay is not None:
        # The recording's own pace: its median gap between snapshots, over --speed.
        gaps = sorted(
            later.timestamp - earlier.timestamp
            for earlier, later in zip(replay.snapshots, replay.snapshots[1:], strict=False)
        )
        gap = gaps[len(gaps) // 2] if gaps else interval
        interval = max(0.05, gap / replay.speed) if replay.speed else 0.05
    return sampler, replay, remote, interval


def _first_tab(
    args: argparse.Namespace,
    initial_tab: Literal["planner", "compare", "monitor"] | None,
    sampler: Any,
) -> tuple[Literal["planner", "compare", "monitor"], Any]:
    """The tab shown first (:func:`choose_tab`) and the first snapshot, if one was taken."""
    tab, first_snapshot = choose_tab(getattr(args, "tab", None) or initial_tab, sampler)
    from hwdash.telemetry.subset import SubsetSampler

    if first_snapshot is None and isinstance(sampler, SubsetSampler) and not sampler.checked:
        # --gpus (or CUDA_VISIBLE_DEVICES) is held against the GPUs on its first sample: taken
        # here, so a GPU that is not there is said before the screen opens (and shown first).
        first_snapshot = sampler.sample()
    return tab, first_snapshot


def _catalog(args: argparse.Namespace, tab: str) -> Catalog | Callable[[], Catalog]:
    """The catalog, read now; on the monitor a function that reads it when the planner or compare
    tab is first shown (a broken file then ends the app with the same message and exit 2)."""

    def read_catalog() -> Catalog:
        from hwdash.core.catalog import load_catalog

        return load_catalog(args.catalog)

    # On the monitor the catalog (and pydantic) is read when the planner is built, on its tab's
    # first showing; a broken file then ends the app with the same message and exit 2.
    return read_catalog if tab == "monitor" else read_catalog()
