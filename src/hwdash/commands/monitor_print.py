"""What ``hwdash monitor`` prints: the ``--once`` tables, the streaming lines, ``--watch`` frames
and JSON lines.

Every string from outside (GPU, MIG and process names, users, command lines) is printed as text,
never as rich markup.
"""

from __future__ import annotations

import json
import sys
from datetime import datetime
from typing import TYPE_CHECKING, Any

from hwdash.core.live.alerts import AlertEvent
from hwdash.core.live.diagnoses import xid_catalog
from hwdash.core.strict_json import finite_or_none
from hwdash.core.units import (
    format_bytes,
    format_forecast,
    format_gib_pair,
    format_power,
    format_temperature,
)
from hwdash.runs.display import plan_label, run_lines
from hwdash.telemetry.cluster import (
    gpu_count_text,
    gpu_label,
    hosts_fullest_first,
    source_text,
)
from hwdash.telemetry.types import (
    GpuSample,
    GpuState,
    HostSample,
    MigSample,
    ProcessSample,
    Snapshot,
)

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

PIPED_WIDTH = 132
"""Columns of the ``--once`` tables when stdout is not a terminal."""

HEALTH_WIDTH = 80
"""The most columns the ``--once`` health lines take (they wrap under their text, not under the
GPU's number), piped or not: a log read at 80 columns reads them whole."""

XIDS_SHOWN = 3
"""Xid events shown per GPU by ``--once``, newest first (the JSON carries every kept one)."""


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
    # ``gpu3`` on this machine; a cluster's GPU is ``node-c:1`` (not ``gpunode-c:1``).
    prefix = "gpu" if gpu.host is None else ""
    head = f"{clock} {prefix}{_gpu_number(gpu)} {gpu.name or 'unknown GPU'}"
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
    """``HH:MM:SS`` of a snapshot's time; ``??:??:??`` for one the C library cannot hold (a
    replayed line may carry any number, 2**63 included)."""
    try:
        return datetime.fromtimestamp(timestamp).strftime("%H:%M:%S")
    except (OverflowError, OSError, ValueError):
        return "??:??:??"


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
        console.print(_gpu_table(snapshot))
        health = _health_table(snapshot)
        if health is not None:
            console.print(health, width=min(console.width, HEALTH_WIDTH))
        _print_processes(console, snapshot)
        _print_gpu_notes(console, snapshot)
    for message in snapshot.errors:
        if snapshot.nvml.available or message != snapshot.nvml.error:  # said above already
            console.print(f"warning: {message}")
    for alert in alerts:
        console.print(f"ALERT: {alert.message}")
    if snapshot.nvml.source is None:  # this machine's host line; a cluster's hosts have none here
        console.print(host_line(snapshot.host, "").strip())


def _gpu_table(snapshot: Snapshot) -> Table:
    """The GPU table: a row per GPU (the shown order) and one per MIG instance under it; an
    "OOM in" column when any GPU has a forecast."""
    from rich.table import Table
    from rich.text import Text

    gpus = Table(show_edge=False, pad_edge=False)
    forecasts = any(gpu.forecast_full_s is not None for gpu in snapshot.gpus)
    titles = ["GPU", "name", "memory", "reserved", "pressure", "util", "temp", "power"]
    if forecasts:
        titles.insert(5, "OOM in")
    for title in titles:
        gpus.add_column(title, justify="left" if title == "name" else "right", no_wrap=True)
    gpus.add_column("state")
    for gpu in _shown_order(snapshot.gpus):
        gpus.add_row(*(Text(cell) for cell in _gpu_cells(gpu, forecasts)))
        for mig in gpu.mig:
            gpus.add_row(*(Text(cell) for cell in _mig_cells(gpu, mig, forecasts)))
    return gpus


def _gpu_cells(gpu: GpuSample, forecasts: bool) -> list[str]:
    """One GPU's row of the GPU table."""
    memory = "n/a"
    if gpu.total_bytes is not None and gpu.free_bytes is not None:
        taken = gpu.total_bytes - gpu.free_bytes
        memory = format_gib_pair(taken, gpu.total_bytes, compact=True)
    reserved = "n/a" if gpu.reserved_bytes is None else format_bytes(gpu.reserved_bytes)
    pressure = "n/a" if gpu.pressure is None else f"{gpu.pressure:.1%}"
    temperature = "n/a" if gpu.temperature_c is None else format_temperature(gpu.temperature_c)
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
    return row


def activity_words(gpu: GpuSample) -> str | None:
    """How busy the GPU really is, in words: GPM's ``SM active 71%, tensor 48%, DRAM 55% (GPM)``
    (Hopper and later, from the second sample on), else NVML's utilization said to be what it is
    (the share of time any kernel ran, however few SMs it used), as the dashboard's GPU row says
    it (:func:`hwdash.ui.widgets.monitor_gpu.activity_text`); None without either."""
    activity = gpu.activity
    if activity is None or activity.sm_active is None:
        return None
    if activity.source != "gpm":
        return f"utilization {activity.sm_active:.0f}% (not SM activity)"
    parts = [f"SM active {activity.sm_active:.0f}%"]
    for label, value in (("tensor", activity.tensor_active), ("DRAM", activity.dram_active)):
        if value is not None:
            parts.append(f"{label} {value:.0f}%")
    return ", ".join(parts) + " (GPM)"


def _age_text(seconds: float) -> str:
    """How long ago, roughly: ``4 s``, ``12 min``, ``3 h``."""
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.0f} h"


def health_lines(gpu: GpuSample, now: float) -> list[str]:
    """What ``--once`` says under a GPU's row beyond the table: its real activity (with its NVLinks
    when it has any), its newest Xid events with their meaning, and what the health rules say
    (kind: message; hint). Empty when there is nothing to say: NVML's plain utilization alone is
    the table's util column already, so it is said (as not SM activity) only on a GPU that has
    another line."""
    lines: list[str] = []
    first = [words] if (words := activity_words(gpu)) else []
    if gpu.nvlink is not None and gpu.nvlink.links > 0:
        first.append(f"NVLink {gpu.nvlink.active}/{gpu.nvlink.links} up")
    if first:
        lines.append("; ".join(first))
    events = list(gpu.xid_events or ())
    catalog = xid_catalog()
    for event in reversed(events[-XIDS_SHOWN:]):
        entry = catalog.get(event.xid)
        meaning = "not in hwdash's Xid list" if entry is None else entry.meaning
        lines.append(f"Xid {event.xid} ({_age_text(now - event.at)} ago): {meaning}")
    if len(events) > XIDS_SHOWN:
        lines.append(f"(+{len(events) - XIDS_SHOWN} older Xid events: see --json)")
    for diagnosis in gpu.diagnoses:
        hint = f"; {diagnosis.hint}" if diagnosis.hint else ""
        lines.append(f"{diagnosis.kind}: {diagnosis.message}{hint}")
    plain_utilization = gpu.activity is not None and gpu.activity.source == "utilization"
    if plain_utilization and lines == [words]:
        return []  # NVML's utilization and nothing else: the util column says it
    return lines


def _health_table(snapshot: Snapshot) -> Table | None:
    """Per GPU, in the GPU table's order, its :func:`health_lines`, the GPU named once on its
    first line and each line wrapping under its own text; None when no GPU has anything to say."""
    from rich.table import Table
    from rich.text import Text

    grid = Table.grid(padding=(0, 2))
    grid.add_column(no_wrap=True)
    grid.add_column(overflow="fold")
    rows = 0
    for gpu in _shown_order(snapshot.gpus):
        for place, line in enumerate(health_lines(gpu, snapshot.timestamp)):
            grid.add_row(Text("" if place else f"GPU {_gpu_number(gpu)}"), Text(line))
            rows += 1
    return grid if rows else None


def _mig_cells(gpu: GpuSample, mig: MigSample, forecasts: bool) -> list[str]:
    """One MIG instance's row of the GPU table, under its GPU's."""
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
    return mig_cells


def _print_processes(console: Console, snapshot: Snapshot) -> None:
    """The process table of every GPU (none when no GPU has a process), then a line per process
    whose PyTorch allocator was probed."""
    from rich.table import Table
    from rich.text import Text

    processes = [process for gpu in _shown_order(snapshot.gpus) for process in gpu.processes]
    if not processes:
        return
    table = Table(show_edge=False, pad_edge=False)
    for title in ("GPU", "PID", "type", "user", "GPU memory", "CPU", "RSS", "command"):
        table.add_column(
            title,
            justify="left" if title in ("user", "command", "type") else "right",
            no_wrap=title != "command",
        )
    for process in processes:
        used = "n/a" if process.used_bytes is None else format_bytes(process.used_bytes)
        cells = (
            _process_gpu(process),
            str(process.pid),
            _KIND_LETTERS.get(process.kind, process.kind),
            process.user or "n/a",
            used,
            _percent(process.cpu_percent),
            "n/a" if process.rss_bytes is None else format_bytes(process.rss_bytes),
            _command_text(process),
        )
        table.add_row(*(Text(cell) for cell in cells))
    console.print(table)
    for process in processes:
        if process.torch is not None:
            console.print(torch_line(process))
        if process.run is not None:
            console.print(
                Text(
                    f"PID {process.pid} run against its plan ({plan_label(process.run.plan)}):\n"
                    + "\n".join(f"  {line}" for line in run_lines(process.run))
                )
            )


def _command_text(process: ProcessSample) -> str:
    """The process's command line, with what this host cannot check about it and its container."""
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
    return command


def _print_gpu_notes(console: Console, snapshot: Snapshot) -> None:
    """Per GPU: the readings its driver does not support, host-RAM memory, an unreliable process
    list."""
    for gpu in snapshot.gpus:
        unsupported = [name for name, why in gpu.errors if why == "not supported"]
        if unsupported and gpu.state in (GpuState.OK, GpuState.ALERT, GpuState.BLIND):
            console.print(f"GPU {gpu.index}: not supported by the driver: {', '.join(unsupported)}")
        if gpu.memory_source == "host":
            console.print(f"GPU {gpu.index}: {dict(gpu.errors).get('memory', '')}")
        if not gpu.processes_reliable:
            console.print(f"GPU {gpu.index}: process list {dict(gpu.errors)['processes']}")


class StreamLines:
    """The streaming text: per round a line per GPU (the host's when there is none), the warnings
    and the alert events; no driver is said once, on the first round."""

    def __init__(self) -> None:
        self.said_no_driver = False

    def write(self, snapshot: Snapshot, events: list[AlertEvent]) -> None:
        """Write one round's lines to stdout and flush."""
        clock = _clock_text(snapshot.timestamp)
        lines: list[str] = []
        said_now = False
        if not snapshot.nvml.available and not self.said_no_driver:
            lines.append(snapshot.nvml.error or "NVML is not available")
            self.said_no_driver = said_now = True
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
    clock = _clock_text(snapshot.timestamp)
    console.print(f"hwdash monitor --watch  {clock}  (Ctrl-C quits)")
    print_readable(snapshot, alerts, console)
    lines = buffer.getvalue().rstrip("\n").split("\n")[: max(1, height)]
    return HOME + (ERASE_LINE + "\n").join(lines) + ERASE_LINE + ERASE_BELOW


def emit_json(payload: dict[str, Any]) -> None:
    """One JSON object on a line of its own, flushed (``--json``: one object, or JSON lines)."""
    # NaN and Infinity are not JSON: a reading that is not finite becomes null and the stream goes on.
    sys.stdout.write(json.dumps(finite_or_none(payload), allow_nan=False) + "\n")
    sys.stdout.flush()
