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
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hwdash.core.live.alerts import (
    BLIND_INTERVALS,
    BLIND_MINIMUM_S,
    DEFAULT_HYSTERESIS,
    DEFAULT_THRESHOLD,
    AlertEngine,
    AlertEvent,
    AlertRule,
    blind_after_for,
)
from hwdash.core.strict_json import finite_or_none
from hwdash.core.units import (
    format_bytes,
    format_forecast,
    format_gib_pair,
    format_power,
    format_temperature,
)
from hwdash.errors import UsageError
from hwdash.telemetry.alert_actions import (
    AlertActions,
    AlertCommand,
    AlertLog,
    default_alert_log_path,
    mark_alert_states,
)
from hwdash.telemetry.cluster import (
    gpu_count_text,
    gpu_label,
    hosts_fullest_first,
    source_text,
)
from hwdash.telemetry.history import History
from hwdash.telemetry.snapshot_json import snapshot_to_dict
from hwdash.telemetry.source import DEMO_SCENARIO, fake_scenario_from, make_sampler
from hwdash.telemetry.types import (
    GpuSample,
    GpuState,
    HostSample,
    ProcessSample,
    Sampler,
    Snapshot,
)

if TYPE_CHECKING:
    from rich.console import Console

    from hwdash.telemetry.replay import ReplaySampler

PIPED_WIDTH = 132
"""Columns of the ``--once`` tables when stdout is not a terminal."""


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
        "--count", default=None, metavar="N", help="stop after N samples (default: until Ctrl-C)"
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


def add_sampling_arguments(parser: argparse.ArgumentParser, *, demo_help: str) -> None:
    """Flags shared by ``hwdash monitor`` and the dashboard: where samples come from, how often,
    and what an alert is and does."""
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
    source.add_argument(
        "--replay",
        default=None,
        metavar="FILE",
        help="replay what `hwdash monitor --json` recorded (JSON lines) instead of sampling",
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
    """The sampler of ``--prometheus`` (``--replay``: :func:`open_replay`); None for NVML."""
    url = getattr(args, "prometheus", None)
    if url is None:
        return None
    from hwdash.telemetry.prometheus_source import PrometheusSampler

    return PrometheusSampler(url)


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


# -- text output ----------------------------------------------------------------------------------


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0f}%"


def _memory(gpu: GpuSample) -> str:
    if gpu.total_bytes is None or gpu.free_bytes is None:
        return "mem n/a"
    taken = gpu.total_bytes - gpu.free_bytes
    pressure = gpu.pressure or 0.0
    return f"mem {format_gib_pair(taken, gpu.total_bytes, compact=True):>14} {pressure:6.1%}"


def _gpu_number(gpu: GpuSample) -> str:
    """``3``, or ``node-c:1`` for a cluster's GPU (its host and its number there)."""
    return gpu_label(gpu.host, gpu.host_gpu, gpu.index)


def _shown_order(gpus: tuple[GpuSample, ...]) -> list[GpuSample]:
    """This machine's GPUs by index; a cluster's hosts fullest first (as the dashboard shows)."""
    if not any(gpu.host for gpu in gpus):
        return list(gpus)
    return [gpu for _host, members in hosts_fullest_first(gpus) for gpu in members]


def gpu_line(gpu: GpuSample, clock: str) -> str:
    """One streaming line for one GPU (plain text: written to stdout, never through rich)."""
    head = f"{clock} gpu{_gpu_number(gpu)} {gpu.name or 'unknown GPU'}"
    if gpu.state in (GpuState.LOST, GpuState.ERROR):
        reason = "; ".join(f"{name}: {why}" for name, why in gpu.errors) or gpu.state.value
        return f"{head} {gpu.state.value.upper()} ({reason})"
    if gpu.state == GpuState.BLIND and gpu.pressure is None:
        return f"{head} BLIND (no memory reading)"
    temperature = "n/a" if gpu.temperature_c is None else format_temperature(gpu.temperature_c)
    power = "n/a" if gpu.power_w is None else format_power(gpu.power_w)
    processes = len(gpu.processes)
    line = (
        f"{head} {_memory(gpu)} util {_percent(gpu.utilization_gpu)} {temperature} {power} "
        f"procs {processes}"
    )
    if gpu.forecast_full_s is not None:
        line += f" full in ~{gpu.forecast_full_s:.0f}s at this climb"
    if gpu.memory_source == "host":
        line += " (host RAM: unified memory)"
    for mig in gpu.mig:
        pressure = "n/a" if mig.pressure is None else f"{mig.pressure:.1%}"
        alert = " ALERT" if mig.state == GpuState.ALERT else ""
        line += f" | mig{mig.index} {pressure}{alert}"
    if gpu.state in (GpuState.ALERT, GpuState.BLIND):
        line += f" {gpu.state.value.upper()}"
    return line


def _process_gpu(process: ProcessSample) -> str:
    """``0``, ``0/3 GI 5 CI 0`` for a process on MIG slot 3 of GPU 0, or ``node-c:1`` for a
    process on GPU 1 of a cluster's host node-c."""
    if process.host is not None:
        return gpu_label(process.host, process.host_gpu, process.gpu_index)
    if process.mig_index is None:
        return str(process.gpu_index)
    ids = ""
    if process.gpu_instance_id is not None:
        ids = f" GI {process.gpu_instance_id} CI {process.compute_instance_id}"
    return f"{process.gpu_index}/{process.mig_index}{ids}"


_KIND_LETTERS = {"compute": "C", "graphics": "G", "compute+graphics": "C+G"}


def host_line(host: HostSample | None, clock: str) -> str:
    """One streaming line for the host."""
    if host is None:
        return f"{clock} host n/a"
    ram = "n/a"
    if host.ram_used_bytes is not None and host.ram_total_bytes is not None:
        ram = format_gib_pair(host.ram_used_bytes, host.ram_total_bytes, compact=True)
    load = "n/a" if host.load_average is None else f"{host.load_average[0]:.2f}"
    return f"{clock} host cpu {_percent(host.cpu_percent)} ram {ram} load {load}"


def _clock_text(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp).strftime("%H:%M:%S")


def torch_line(process: ProcessSample) -> str:
    """What a probed process's PyTorch allocator says, in one line (see :mod:`hwdash.probe`)."""
    torch = process.torch
    assert torch is not None
    step = "" if torch.step is None else f", step {torch.step}"
    fragmented = torch.fragmentation
    cache = f"cache {format_bytes(torch.cache_bytes)}"
    if fragmented is not None:
        cache += f", {fragmented:.0%} of the pool fragmented"
    text = (
        f"PID {process.pid} on GPU {_process_gpu(process)} (PyTorch{step}): allocated "
        f"{format_bytes(torch.allocated_bytes)}, reserved {format_bytes(torch.reserved_bytes)} "
        f"({cache})"
    )
    if torch.max_allocated_bytes is not None:  # a cluster's series carry no peak
        text += f", peak allocated {format_bytes(torch.max_allocated_bytes)}"
    if torch.alloc_retries:
        text += f"; {torch.alloc_retries} alloc retries"
        if torch.retries_rising:
            text += " and rising: the allocator frees its cache to fit allocations, an OOM is near"
    if torch.ooms:
        text += f"; {torch.ooms} out-of-memory errors caught"
    return text


def print_readable(
    snapshot: Snapshot, alerts: list[AlertEvent], console: Console | None = None
) -> None:
    """The ``--once`` view: GPU table, process table, host summary (rich); ``--watch`` passes the
    console that records each frame."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    # Piped output (no terminal) gets a fixed, roomy width instead of rich's default of 80 columns.
    # Markup is off: GPU, MIG and process names, users and command lines come from outside and
    # may hold brackets (``[/x]`` would end rich with MarkupError; ``[bold]`` would style).
    if console is None:
        console = Console(
            highlight=False, markup=False, width=None if sys.stdout.isatty() else PIPED_WIDTH
        )
    if not snapshot.nvml.available:
        console.print(snapshot.nvml.error or "NVML is not available")
    else:
        bindings = snapshot.nvml.bindings_version
        console.print(
            f"{source_text(snapshot.nvml)}, {snapshot.subset or gpu_count_text(snapshot.gpus)}"
            + (f", nvidia-ml-py {bindings}" if bindings else "")
        )
        gpus = Table(show_edge=False, pad_edge=False)
        forecasts = any(gpu.forecast_full_s is not None for gpu in snapshot.gpus)
        titles = ["GPU", "name", "memory", "reserved", "pressure", "util", "temp", "power"]
        if forecasts:
            titles.insert(5, "OOM in")
        for title in titles:
            gpus.add_column(title, justify="left" if title == "name" else "right", no_wrap=True)
        gpus.add_column("state")
        for gpu in _shown_order(snapshot.gpus):
            memory = "n/a"
            if gpu.total_bytes is not None and gpu.free_bytes is not None:
                taken = gpu.total_bytes - gpu.free_bytes
                memory = format_gib_pair(taken, gpu.total_bytes, compact=True)
            reserved = "n/a" if gpu.reserved_bytes is None else format_bytes(gpu.reserved_bytes)
            pressure = "n/a" if gpu.pressure is None else f"{gpu.pressure:.1%}"
            temperature = (
                "n/a" if gpu.temperature_c is None else format_temperature(gpu.temperature_c)
            )
            power = "n/a" if gpu.power_w is None else format_power(gpu.power_w, gpu.power_limit_w)
            state = gpu.state.value
            if gpu.state in (GpuState.LOST, GpuState.ERROR) and gpu.errors:
                state += ": " + gpu.errors[0][1]
            if gpu.memory_source == "host":
                memory += " host RAM"
            row = [
                _gpu_number(gpu),
                gpu.name or "unknown",
                memory,
                reserved,
                pressure,
                _percent(gpu.utilization_gpu),
                temperature,
                power,
                state,
            ]
            if forecasts:
                row.insert(5, format_forecast(gpu.forecast_full_s))
            gpus.add_row(*(Text(cell) for cell in row))
            for mig in gpu.mig:
                mig_memory = "n/a"
                if mig.total_bytes is not None and mig.free_bytes is not None:
                    taken = mig.total_bytes - mig.free_bytes
                    mig_memory = format_gib_pair(taken, mig.total_bytes, compact=True)
                ids = ""
                if mig.gpu_instance_id is not None:
                    ids = f" GI {mig.gpu_instance_id}"
                mig_cells = [
                    f"{gpu.index}/{mig.index}",
                    f"  {mig.name or 'MIG'}{ids}",
                    mig_memory,
                    "",
                    "n/a" if mig.pressure is None else f"{mig.pressure:.1%}",
                    "",
                    "",
                    "",
                    mig.state.value,
                ]
                if forecasts:
                    mig_cells.insert(5, "")
                gpus.add_row(*(Text(cell) for cell in mig_cells))
        console.print(gpus)
        processes = [process for gpu in _shown_order(snapshot.gpus) for process in gpu.processes]
        if processes:
            table = Table(show_edge=False, pad_edge=False)
            for title in ("GPU", "PID", "type", "user", "GPU memory", "CPU", "RSS", "command"):
                table.add_column(
                    title,
                    justify="left" if title in ("user", "command", "type") else "right",
                    no_wrap=title != "command",
                )
            for process in processes:
                used = "n/a" if process.used_bytes is None else format_bytes(process.used_bytes)
                command = process.cmdline or process.name or ""
                if process.host is not None:
                    pass  # another machine's process: its PID is never looked up here
                elif not process.verifiable:
                    command = f"{command} (host PID: not checkable from this container)".strip()
                elif process.exited:
                    command = f"{command} (exited; NVML still lists its memory)".strip()
                elif not process.visible:
                    command = f"{command} (PID not visible on this host)".strip()
                if process.container:
                    command = f"[{process.container}] {command}"
                cells = (
                    _process_gpu(process),
                    str(process.pid),
                    _KIND_LETTERS.get(process.kind, process.kind),
                    process.user or "n/a",
                    used,
                    _percent(process.cpu_percent),
                    "n/a" if process.rss_bytes is None else format_bytes(process.rss_bytes),
                    command,
                )
                table.add_row(*(Text(cell) for cell in cells))
            console.print(table)
            for process in processes:
                if process.torch is not None:
                    console.print(torch_line(process))
        for gpu in snapshot.gpus:
            unsupported = [name for name, why in gpu.errors if why == "not supported"]
            if unsupported and gpu.state in (GpuState.OK, GpuState.ALERT, GpuState.BLIND):
                console.print(
                    f"GPU {gpu.index}: not supported by the driver: {', '.join(unsupported)}"
                )
            if gpu.memory_source == "host":
                console.print(f"GPU {gpu.index}: {dict(gpu.errors).get('memory', '')}")
            if not gpu.processes_reliable:
                console.print(f"GPU {gpu.index}: process list {dict(gpu.errors)['processes']}")
    for message in snapshot.errors:
        if snapshot.nvml.available or message != snapshot.nvml.error:  # said above already
            console.print(f"warning: {message}")
    for alert in alerts:
        console.print(f"ALERT: {alert.message}")
    if snapshot.nvml.source is None:  # this machine's host line; a cluster's hosts have none here
        console.print(host_line(snapshot.host, "").strip())


# -- the command ----------------------------------------------------------------------------------


#: Terminal sequences of ``--watch``: the alternate screen (the shell's screen comes back on exit),
#: cursor home, erase to the end of the line / of the screen, hide and show the cursor (ECMA-48 and
#: xterm's private modes 1049 and 25).
ENTER_WATCH = "\x1b[?1049h\x1b[?25l"
LEAVE_WATCH = "\x1b[?25h\x1b[?1049l"
HOME = "\x1b[H"
ERASE_LINE = "\x1b[K"
ERASE_BELOW = "\x1b[J"


def watch_frame(snapshot: Snapshot, alerts: list[AlertEvent], width: int, height: int) -> str:
    """One ``--watch`` frame: the ``--once`` tables drawn over the last frame from the top left,
    each line erased to its end and the rest of the screen cleared (nothing of a longer last frame
    stays), cut to the terminal's height."""
    import io

    from rich.console import Console

    buffer = io.StringIO()
    console = Console(
        file=buffer,
        width=width,
        highlight=False,
        markup=False,
        force_terminal=True,
        color_system="standard",
        legacy_windows=False,
    )
    clock = time.strftime("%H:%M:%S", time.localtime(snapshot.timestamp))
    console.print(f"hwdash monitor --watch  {clock}  (Ctrl-C quits)")
    print_readable(snapshot, alerts, console)
    lines = buffer.getvalue().rstrip("\n").split("\n")[: max(1, height)]
    return HOME + (ERASE_LINE + "\n").join(lines) + ERASE_LINE + ERASE_BELOW


def _emit_json(payload: dict[str, Any]) -> None:
    # NaN and Infinity are not JSON: a reading that is not finite becomes null and the stream goes on.
    sys.stdout.write(json.dumps(finite_or_none(payload), allow_nan=False) + "\n")
    sys.stdout.flush()


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


def run(args: argparse.Namespace) -> int:
    """Run the subcommand."""
    check_watch(args, terminal=sys.stdout.isatty())
    interval = parse_interval(args.interval)
    count = parse_count(args.count)
    rule = build_rule(args, interval)
    scenario = DEMO_SCENARIO if args.demo else args.fake_nvml
    replay = open_replay(args)
    source = replay if replay is not None else open_source(args)
    sampler: Sampler = with_subset(
        source
        if source is not None
        else make_sampler(scenario, round_timeout_s=max(0.5, min(2.0, interval * 2))),
        args,
    )
    engine = AlertEngine(rule)
    history = History(interval_s=interval)
    watch = getattr(args, "watch", False)
    if args.once:
        try:
            # No wait for the host's CPU percent: a one-shot reports it only when the round took
            # long enough to measure it (HostSampler.MIN_CPU_WINDOW_S), else n/a with the load.
            snapshot = sampler.sample()
        finally:
            sampler.close()
        engine.update(snapshot)
        snapshot = mark_alert_states(snapshot, engine)
        if args.json:
            _emit_json(snapshot_to_dict(snapshot, engine.active))
        else:
            print_readable(snapshot, engine.active)
        if snapshot.nvml.source is not None and not snapshot.nvml.available:
            # A server that cannot be reached (or has no GPU series): the script saw nothing.
            # (No driver on this machine is not an error: the monitor says so and exits 0.)
            return 1
        return 0

    simulated = fake_scenario_from(scenario) is not None or replay is not None
    log_path = (
        Path(args.alert_log) if args.alert_log else default_alert_log_path(simulated=simulated)
    )
    command = AlertCommand(args.on_alert) if args.on_alert else None
    actions = AlertActions(AlertLog(log_path), command)
    said_no_driver = False
    rounds = 0
    next_at = time.monotonic()
    if watch:
        sys.stdout.write(ENTER_WATCH)
    try:
        while True:
            snapshot = sampler.sample()
            history.add(snapshot)
            snapshot = history.with_forecasts(snapshot)
            events = engine.update(snapshot)
            snapshot = mark_alert_states(snapshot, engine)
            actions.handle(events)
            if args.json:
                _emit_json(snapshot_to_dict(snapshot, engine.active, events))
            elif watch:
                size = shutil.get_terminal_size()
                sys.stdout.write(watch_frame(snapshot, engine.active, size.columns, size.lines))
                sys.stdout.flush()
            else:
                clock = _clock_text(snapshot.timestamp)
                lines: list[str] = []
                said_now = False
                if not snapshot.nvml.available and not said_no_driver:
                    lines.append(snapshot.nvml.error or "NVML is not available")
                    said_no_driver = said_now = True
                stale = " (stale)" if snapshot.stale else ""
                lines.extend(gpu_line(gpu, clock) + stale for gpu in snapshot.gpus)
                if not snapshot.gpus:
                    lines.append(host_line(snapshot.host, clock))
                lines.extend(
                    f"{clock} warning: {message}"
                    for message in snapshot.errors
                    if not (said_now and message == snapshot.nvml.error)
                )
                lines.extend(f"{clock} ALERT {event.kind}: {event.message}" for event in events)
                sys.stdout.write("\n".join(lines) + "\n")
                sys.stdout.flush()
            rounds += 1
            if count is not None and rounds >= count:
                break
            if replay is not None:
                if replay.finished:
                    break
                time.sleep(replay.wait_s())
                continue
            next_at += interval
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            else:
                next_at = time.monotonic()  # fell behind: do not try to catch up in a burst
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
    return 0
