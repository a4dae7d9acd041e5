"""One ledger record per run: the probe's raw facts, completed from the run's plan and the catalog.

The probe calls :func:`record_run` when its run ends (``hwdash.probe.stop()`` or the process's exit);
a monitor calls it for a run whose process died leaving its probe file behind (:func:`raw_from_reading`,
``exit: "killed"``). The derived members follow the rules of :mod:`hwdash.runs.metrics`, over the
whole run instead of the last minute: mean tokens/s (tokens after the first step over the time from
the first step to the last), MFU from it, cost = price x duration x the run's share of the machine.
The price: ``HWDASH_PRICE`` (the machine's price per hour, as ``--price``), else the plan's flavor's.
"""

from __future__ import annotations

import getpass
import os
import socket
from collections.abc import Mapping
from typing import Any

from hwdash.runs import ledger
from hwdash.telemetry.probes import ProbeReading

PRICE_ENV = "HWDASH_PRICE"


def _user() -> str | None:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return None


def raw_from_reading(reading: ProbeReading, *, exit: str) -> dict[str, Any] | None:
    """The raw record of a run from its probe's last file (a run that could not write its own)."""
    run = reading.run
    if run is None:
        return None
    devices = reading.devices
    tokens_per_s = None
    if (
        run.tokens
        and run.first_step_at
        and run.last_step_at
        and run.last_step_at > run.first_step_at
    ):
        tokens_per_s = run.tokens_per_s  # the last minute's rate: the best the file says
    return {
        "host": socket.gethostname(),
        "user": _user(),
        "pid": reading.pid,
        "command": run.command,
        "started": run.started_at,
        "ended": reading.written_at,
        "duration_s": max(0.0, reading.written_at - run.started_at),
        "exit": exit,
        "gpus": [
            {
                "uuid": None if d.uuid is None else f"GPU-{d.uuid.removeprefix('GPU-')}",
                "name": None,
                "index": None,
            }
            for d in devices
        ],
        "plan": run.plan,
        "steps": run.step,
        "tokens": run.tokens,
        "tokens_estimated": run.tokens_estimated,
        "samples": run.samples,
        "tokens_per_s": tokens_per_s,
        "energy_kwh": None if run.energy_j is None else run.energy_j / 3.6e6,
        "measured_peak_bytes": max((d.max_reserved_bytes for d in devices), default=None),
        "measured_peak_allocated_bytes": max(
            (d.max_allocated_bytes for d in devices), default=None
        ),
        "world_size": run.world_size,
        "oom_snapshot": (
            str(reading.oom.snapshots[-1].path)
            if reading.oom is not None and reading.oom.snapshots
            else None
        ),
    }


def _price(environ: Mapping[str, str]) -> float | None:
    text = environ.get(PRICE_ENV, "").strip()
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0 <= value < 1e6 else None


def complete(raw: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The raw record with the plan's and the catalog's members filled in (None where unknown)."""
    from hwdash.core.catalog import load_catalog
    from hwdash.runs.plans import plan_facts

    env = os.environ if environ is None else environ
    record: dict[str, Any] = {key: None for key in ledger.RECORD_KEYS}
    record.update(raw)
    record["version"] = ledger.VERSION
    catalog = load_catalog()
    facts = None
    if record.get("plan"):
        try:
            facts = plan_facts(str(record["plan"]), catalog=catalog)
        except Exception as exc:  # a record without its plan beats no record
            record["plan_error"] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    names = [gpu.get("name") for gpu in record.get("gpus") or [] if isinstance(gpu, dict)]
    accelerator = next(
        (a for a in (catalog.match_nvml_name(n) for n in names if n) if a is not None), None
    )
    peak = None if accelerator is None else accelerator.matmul_tflops()[0]
    world = record.get("world_size") or max(1, len(names))
    record["peak_tflops"] = peak
    if facts is not None:
        record["model"] = record.get("model") or facts.model
        record["method"] = record.get("method") or facts.method
        record["flops_per_token"] = facts.model_flops_per_token
        record["planned_peak_bytes"] = facts.planned_peak_bytes
        measured = record.get("measured_peak_bytes")
        if measured is not None and facts.planned_peak_bytes:
            record["peak_error"] = measured / facts.planned_peak_bytes - 1
        rate = record.get("tokens_per_s")
        if rate and peak:
            record["mfu"] = rate * facts.model_flops_per_token / (peak * 1e12 * world)
    price, machine_gpus = _price(env), None
    if price is None and facts is not None and facts.price_per_hour is not None:
        price, machine_gpus = facts.price_per_hour, facts.flavor_gpus
    record["price_per_hour"] = price
    duration = record.get("duration_s")
    if price is not None and duration is not None:
        share = 1.0 if not machine_gpus else min(1.0, world / machine_gpus)
        record["cost_usd"] = price * share * float(duration) / 3600
    if not record.get("id"):
        record["id"] = ledger.make_id(
            str(record.get("host")), int(record["pid"]), record["started"]
        )
    return record


def record_run(raw: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Complete the raw record (:func:`complete`) and append it to the runs ledger."""
    record = complete(raw, environ)
    ledger.append(record)
    return record
