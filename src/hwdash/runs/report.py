"""``hwdash report --since 12h``: the morning-after summary of the runs ledger and the alert log.

Pure: ledger records and alert-log events in, a :class:`Report` out, and that report as text,
Markdown or JSON. Reading the files is :mod:`hwdash.commands.report`'s job.

Per run: the row of ``hwdash runs``. Per GPU, by UUID (a run's record names its GPUs): the runs on
it, its peak (the largest peak of those runs; a run records the peak of its fullest GPU), energy and
cost (each run's total split evenly over the run's GPUs: the record holds no per-GPU split), the
alerts raised on it, and its idle time: the part of the window in which no recorded run held it.
Only runs with the probe are recorded, so "idle" means "no recorded run", and the report says so.
Where the history ring (:mod:`hwdash.telemetry.history_ring`) watched a GPU in the window, its busy
and idle time and peak come from those samples instead (:func:`apply_history`).

An alert-log line names its GPU by host and NVML index, not UUID (:mod:`hwdash.telemetry.alert_actions`);
it is put on the GPU a run of the window recorded at that host and index, else listed on its own.
"""

from __future__ import annotations

import datetime as dt
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hwdash.core import strict_json
from hwdash.errors import UsageError
from hwdash.runs.ledger import as_number, as_text, complete, gpus_of
from hwdash.runs.table import (
    believable,
    bytes_cell,
    duration_of,
    format_duration,
    format_time,
    markdown_table,
    money_cell,
    runs_table,
    text_table,
)

ALERT_KINDS = frozenset({"raised", "lost", "blind"})
"""Alert-log events the report counts (those that run ``--on-alert``); clearings are not alerts."""
_UNITS_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.IGNORECASE)
IDLE_NOTE = (
    "idle = the part of the window with no recorded run on that GPU (only runs with the hwdash "
    "probe are recorded)"
)
SPLIT_NOTE = (
    "a GPU's energy and cost are its runs' totals split evenly over each run's GPUs; its peak is "
    "the largest of its runs' peaks (a run records the peak of its fullest GPU)"
)
HISTORY_NOTE = (
    "on a GPU the history ring watched, busy/idle/peak come from its samples instead: busy = a "
    "process on it or utilization above 0, idle = watched and not busy (unwatched time is neither), "
    "peak = the larger of NVML's memory used and its runs' peaks"
)
GPU_COLUMNS = ("GPU", "UUID", "RUNS", "BUSY", "IDLE", "PEAK", "KWH", "COST", "ALERTS")
_GPU_LEFT = {"GPU", "UUID"}


def since_cutoff(text: str, now: float | None = None, *, flag: str = "--since") -> float:
    """The wall time ``--since`` names: a duration back from now (``30m``, ``12h``, ``2d``, ``1w``,
    ``90s``) or an ISO date or time (``2026-11-25``, ``2026-11-25T18:00``; local time unless it
    gives an offset). Raises :class:`UsageError` naming ``flag``."""
    now = time.time() if now is None else now
    found = _DURATION.match(text)
    if found:
        seconds = float(found.group(1)) * _UNITS_S[found.group(2).lower()]
        if seconds <= 0:
            raise UsageError(f"{text!r} is no time at all; give e.g. 12h", flag=flag)
        return now - seconds
    try:
        moment = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(
            f"{text!r} is neither a duration (30m, 12h, 2d) nor an ISO date (2026-11-25T18:00)",
            flag=flag,
        ) from None
    cutoff = moment.timestamp()  # a naive time is local time
    if cutoff > now:
        raise UsageError(f"{text} is in the future", flag=flag)
    return cutoff


@dataclass
class GpuSummary:
    """One GPU over the window."""

    uuid: str | None
    name: str | None
    index: int | None
    host: str | None
    runs: list[str] = field(default_factory=list)
    """Ids of the runs on it, oldest first."""
    intervals: list[tuple[float, float]] = field(default_factory=list)
    peak_measured_bytes: float | None = None
    energy_kwh: float | None = None
    cost_usd: float | None = None
    alerts: list[dict[str, Any]] = field(default_factory=list)
    busy_s: float = 0.0
    idle_s: float = 0.0
    observed_s: float | None = None
    """Seconds of the window the history ring watched it (None: the ring never saw it; busy and
    idle then come from the runs)."""

    def label(self) -> str:
        """``0 NVIDIA H100 80GB HBM3`` (host first when the report covers several)."""
        where = "?" if self.index is None else str(self.index)
        return f"{where} {self.name or 'unknown GPU'}"

    def to_json(self) -> dict[str, Any]:
        """The GPU for ``--json``."""
        return {
            "uuid": self.uuid,
            "name": self.name,
            "index": self.index,
            "host": self.host,
            "runs": self.runs,
            "busy_s": self.busy_s,
            "idle_s": self.idle_s,
            "peak_measured_bytes": self.peak_measured_bytes,
            "energy_kwh": self.energy_kwh,
            "cost_usd": self.cost_usd,
            "alerts": len(self.alerts),
            **({} if self.observed_s is None else {"observed_s": self.observed_s}),
        }


@dataclass
class Report:
    """The summary of a window: its runs, its GPUs, the alerts no run's GPU took, the totals."""

    since: float
    until: float
    runs: list[dict[str, Any]]
    gpus: list[GpuSummary]
    other_alerts: list[dict[str, Any]]
    """Alerts on a GPU no run of the window recorded (or without a GPU index)."""
    alerts: list[dict[str, Any]]
    """Every alert of the window, oldest first."""
    energy_kwh: float | None
    cost_usd: float | None
    sources: dict[str, str] = field(default_factory=dict)
    """Where the data came from: ``ledger``, ``alert_log`` paths."""
    warnings: list[str] = field(default_factory=list)


def _add(total: float | None, value: float | None) -> float | None:
    if value is None:
        return total
    return value if total is None else total + value


def _interval(record: Mapping[str, Any], since: float, until: float) -> tuple[float, float] | None:
    """The part of the window the run covered, or None (times unknown, or outside it)."""
    ended = as_number(record, "ended")
    started = as_number(record, "started")
    duration = duration_of(record)
    if started is None and ended is not None and duration is not None:
        started = ended - duration
    if started is None or ended is None:
        return None
    low, high = max(started, since), min(ended, until)
    return (low, high) if high > low else None


def _union_length(intervals: Sequence[tuple[float, float]]) -> float:
    total, reach = 0.0, float("-inf")
    for low, high in sorted(intervals):
        if high <= reach:
            continue
        total += high - max(low, reach)
        reach = high
    return total


def _gpu_key(host: str | None, gpu: Mapping[str, Any]) -> str | None:
    uuid = gpu.get("uuid")
    if isinstance(uuid, str) and uuid:
        return uuid
    index = gpu.get("index")
    return f"{host}#{index}" if isinstance(index, int) else None


def _place_runs(
    records: Sequence[Mapping[str, Any]], since: float, until: float
) -> dict[str, GpuSummary]:
    gpus: dict[str, GpuSummary] = {}
    for record in records:
        host = as_text(record, "host")
        run_gpus = gpus_of(record)
        keys = [key for key in (_gpu_key(host, gpu) for gpu in run_gpus) if key is not None]
        share = 1 / len(keys) if keys else 0.0
        energy, cost = as_number(record, "energy_kwh"), as_number(record, "cost_usd")
        peak = as_number(record, "measured_peak_bytes")
        span = _interval(record, since, until)
        for gpu in run_gpus:
            key = _gpu_key(host, gpu)
            if key is None:
                continue
            index = gpu.get("index")
            summary = gpus.setdefault(
                key,
                GpuSummary(
                    uuid=as_text(gpu, "uuid"),
                    name=as_text(gpu, "name"),
                    index=index if isinstance(index, int) else None,
                    host=host,
                ),
            )
            summary.runs.append(as_text(record, "id") or "?")
            if span is not None:
                summary.intervals.append(span)
            if peak is not None:
                summary.peak_measured_bytes = max(summary.peak_measured_bytes or 0.0, peak)
            summary.energy_kwh = _add(
                summary.energy_kwh, None if energy is None else energy * share
            )
            summary.cost_usd = _add(summary.cost_usd, None if cost is None else cost * share)
    return gpus


def _place_alerts(
    gpus: dict[str, GpuSummary], alerts: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Put each alert on the GPU a run recorded at its host and index; return the others."""
    by_place: dict[tuple[str | None, Any], GpuSummary] = {
        (gpu.host, gpu.index): gpu for gpu in gpus.values() if gpu.index is not None
    }
    others = []
    for event in alerts:
        host, index = as_text(event, "host"), event.get("gpu_index")
        gpu = by_place.get((host, index))
        if gpu is None and host is None:  # a line without a host: the one GPU of that index
            same = [gpu for (_, number), gpu in by_place.items() if number == index]
            gpu = same[0] if len(same) == 1 else None
        if gpu is None:
            others.append(dict(event))
        else:
            gpu.alerts.append(dict(event))
    return others


def build_report(
    records: Sequence[Mapping[str, Any]],
    alerts: Sequence[Mapping[str, Any]],
    since: float,
    until: float,
) -> Report:
    """The report of the window ``[since, until]``: ``records`` are ledger records (runs that ended
    in it or ran into it), ``alerts`` alert-log events (those outside the window are dropped)."""
    runs = [dict(record) for record in records]
    events = sorted(
        (
            dict(event)
            for event in alerts
            if event.get("kind") in ALERT_KINDS
            and (stamp := as_number(event, "timestamp")) is not None
            and since <= stamp <= until
        ),
        key=lambda event: event["timestamp"],
    )
    gpus = _place_runs(runs, since, until)
    others = _place_alerts(gpus, events)
    window = max(until - since, 0.0)
    for gpu in gpus.values():
        gpu.busy_s = _union_length(gpu.intervals)
        gpu.idle_s = max(window - gpu.busy_s, 0.0)
    energy: float | None = None
    cost: float | None = None
    for record in runs:
        energy = _add(energy, as_number(record, "energy_kwh"))
        cost = _add(cost, as_number(record, "cost_usd"))
    ordered = sorted(
        gpus.values(),
        key=lambda g: (g.host or "", g.index if g.index is not None else -1, g.uuid or ""),
    )
    return Report(since, until, runs, ordered, others, events, energy, cost)


def apply_history(report: Report, uses: Sequence[Any], host: str | None) -> None:
    """Put what the history ring saw (:func:`hwdash.telemetry.history_ring.gpu_use`, this box's
    GPUs, ``host`` being its name) on the report: a GPU it watched takes its busy and idle time
    from the samples and its peak from NVML's memory used when larger than its runs'; a GPU no run
    recorded is added, with the alerts logged on it at ``host``."""
    by_uuid = {gpu.uuid: gpu for gpu in report.gpus if gpu.uuid}
    added = False
    for use in uses:
        gpu = by_uuid.get(use.uuid) if use.uuid else None
        if gpu is None:
            gpu = GpuSummary(uuid=use.uuid, name=use.name, index=use.index, host=host)
            report.gpus.append(gpu)
            added = True
            for event in list(report.other_alerts):
                if event.get("gpu_index") == use.index and as_text(event, "host") in (host, None):
                    gpu.alerts.append(event)
                    report.other_alerts.remove(event)
        gpu.observed_s = use.observed_s
        gpu.busy_s = use.busy_s
        gpu.idle_s = max(use.observed_s - use.busy_s, 0.0)
        if use.peak_used_bytes is not None:
            gpu.peak_measured_bytes = max(gpu.peak_measured_bytes or 0.0, use.peak_used_bytes)
    if added:
        report.gpus.sort(
            key=lambda g: (g.host or "", g.index if g.index is not None else -1, g.uuid or "")
        )


def _notes(report: Report) -> list[str]:
    notes = [IDLE_NOTE, SPLIT_NOTE]
    if any(gpu.observed_s is not None for gpu in report.gpus):
        notes.append(HISTORY_NOTE)
    return notes


def report_json(report: Report) -> dict[str, Any]:
    """The report for ``--json`` (a total that overflowed to infinity is null)."""
    document = {
        "since": report.since,
        "until": report.until,
        "runs": [complete(record) for record in report.runs],
        "gpus": [gpu.to_json() for gpu in report.gpus],
        "alerts": report.alerts,
        "energy_kwh": report.energy_kwh,
        "cost_usd": report.cost_usd,
        "sources": report.sources,
        "warnings": report.warnings,
        "notes": _notes(report),
    }
    cleaned: dict[str, Any] = strict_json.finite_or_none(document)
    return cleaned


def _gpu_rows(report: Report) -> list[list[str]]:
    return [
        [
            (f"{gpu.host}: " if gpu.host and len({g.host for g in report.gpus}) > 1 else "")
            + gpu.label(),
            gpu.uuid or "-",
            str(len(gpu.runs)),
            format_duration(gpu.busy_s),
            format_duration(gpu.idle_s),
            bytes_cell(gpu.peak_measured_bytes),
            "-" if believable(gpu.energy_kwh) is None else f"{gpu.energy_kwh:.2f}",
            money_cell(gpu.cost_usd),
            str(len(gpu.alerts)),
        ]
        for gpu in report.gpus
    ]


def _alert_line(event: Mapping[str, Any]) -> str:
    where = f"GPU {event.get('gpu_index', '?')}"
    host = as_text(event, "host")
    message = " ".join((as_text(event, "message") or "").split())
    return (
        f"{format_time(as_number(event, 'timestamp'))} {host + ' ' if host else ''}{where}: "
        f"{event.get('kind')}: {message}"
    )


def _summary_lines(report: Report) -> list[str]:
    hours = (report.until - report.since) / 3600
    energy = "-" if believable(report.energy_kwh) is None else f"{report.energy_kwh:.2f} kWh"
    return [
        f"{format_time(report.since)} to {format_time(report.until)} ({hours:.1f} h): "
        f"{len(report.runs)} run(s), {len(report.alerts)} alert(s), energy {energy}, "
        f"cost {money_cell(report.cost_usd)}",
        *(f"{name}: {path}" for name, path in report.sources.items()),
    ]


def report_text(report: Report) -> str:
    """The report as plain text for a terminal."""
    parts = ["hwdash report " + _summary_lines(report)[0], *_summary_lines(report)[1:], ""]
    parts.append(f"Runs ({len(report.runs)})")
    parts.append(runs_table(report.runs).rstrip("\n") if report.runs else "no recorded run")
    parts += ["", f"GPUs ({len(report.gpus)})"]
    if report.gpus:
        parts.append(text_table(GPU_COLUMNS, _gpu_rows(report), _GPU_LEFT).rstrip("\n"))
        parts += _notes(report)
    else:
        parts.append("no GPU in a recorded run")
    parts += ["", f"Alerts ({len(report.alerts)})"]
    parts += [_alert_line(event) for event in report.alerts] or ["none"]
    if report.other_alerts:
        parts.append(f"({len(report.other_alerts)} on a GPU no recorded run used)")
    parts += [f"warning: {warning}" for warning in report.warnings]
    return "\n".join(parts) + "\n"


def report_markdown(report: Report) -> str:
    """The report as Markdown (``-o FILE.md``)."""
    first, *sources = _summary_lines(report)
    parts = ["# hwdash report", "", first, ""]
    parts += [f"- {line}" for line in sources]
    parts += ["", f"## Runs ({len(report.runs)})", ""]
    parts.append(runs_table(report.runs, markdown=True) if report.runs else "No recorded run.\n")
    parts += [f"## GPUs ({len(report.gpus)})", ""]
    if report.gpus:
        parts.append(markdown_table(GPU_COLUMNS, _gpu_rows(report), _GPU_LEFT))
        parts += [*(f"- {note}" for note in _notes(report)), ""]
    else:
        parts.append("No GPU in a recorded run.\n")
    parts += [f"## Alerts ({len(report.alerts)})", ""]
    parts += [f"- {_alert_line(event)}" for event in report.alerts] or ["None."]
    if report.warnings:
        parts += ["", "## Warnings", "", *(f"- {warning}" for warning in report.warnings)]
    return "\n".join(parts).rstrip("\n") + "\n"
