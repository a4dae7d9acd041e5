"""Realistic runs ledger records for the tests of tests/runs (imported as a plain module)."""

from __future__ import annotations

from typing import Any

from hwdash.runs import ledger

H100 = "NVIDIA H100 80GB HBM3"


def make_record(
    pid: int,
    started: float,
    *,
    seconds: float = 3600.0,
    host: str = "box",
    gpus: tuple[int, ...] = (0,),
    **fields: Any,
) -> dict[str, Any]:
    """A version-1 record as the recorder writes it (every key of the design), ``fields`` on top."""
    record: dict[str, Any] = {
        "version": 1,
        "id": ledger.make_id(host, pid, started),
        "host": host,
        "user": "ada",
        "pid": pid,
        "command": f"python train.py --seed {pid}",
        "started": started,
        "ended": started + seconds,
        "duration_s": seconds,
        "exit": "normal",
        "gpus": [{"uuid": f"GPU-{index:04d}-aaaa", "name": H100, "index": index} for index in gpus],
        "plan": "my-plan",
        "model": "llama-3.1-8b",
        "method": "lora",
        "steps": 1000,
        "tokens": 4096000,
        "tokens_estimated": False,
        "samples": 8000,
        "tokens_per_s": 1137.8,
        "mfu": 0.38,
        "flops_per_token": 4.8e10,
        "peak_tflops": 989.0,
        "energy_kwh": 0.6,
        "price_per_hour": 4.5,
        "cost_usd": 4.5,
        "measured_peak_bytes": 61_000_000_000,
        "measured_peak_allocated_bytes": 58_000_000_000,
        "planned_peak_bytes": 60_000_000_000,
        "peak_error": 61 / 60 - 1,
    }
    record.update(fields)
    return record
