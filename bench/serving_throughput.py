"""Score the batch-job time model (:mod:`hwdash.core.planning.serving_time`) on the public vLLM
throughput rows of ``tests/data/vllm_throughput.toml``: each row's estimated output tokens/s
against the reported one, held-out rows first, then their median |error| and median signed
error, then the tuned rows.

    PYTHONPATH=src .venv/bin/python bench/serving_throughput.py
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

import tomllib

from hwdash.core.catalog import load_catalog
from hwdash.core.estimator.architecture import architecture
from hwdash.core.estimator.serving import ServingSettings, serving_memory
from hwdash.core.models.config import resolve_model
from hwdash.core.planning.serving_time import BatchJob, BatchTime, batch_time

TABLE = Path(__file__).resolve().parents[1] / "tests" / "data" / "vllm_throughput.toml"


def rows() -> list[dict[str, Any]]:
    """The table's rows."""
    return list(tomllib.loads(TABLE.read_text(encoding="utf-8"))["row"])


def estimate(row: dict[str, Any]) -> BatchTime:
    """The model's batch time for one row (the packaged catalog, no user catalog)."""
    catalog = load_catalog(include_user=False)
    arch = architecture(resolve_model(row["model"], catalog))
    accelerator = catalog.accelerators[row["accelerator"]]
    length = row["prompt_tokens"] + row["output_tokens"]
    settings = ServingSettings(
        engine=row["engine"],
        max_model_len=row.get("max_model_len", length),
        max_num_seqs=row["max_num_seqs"],
        tp=row["tp"],
    )
    memory = serving_memory(arch, accelerator, settings)
    job = BatchJob(row["requests"], row["prompt_tokens"], row["output_tokens"])
    timing = batch_time(arch, accelerator, memory, job)
    if timing is None:
        raise ValueError(f"{row['id']}: no batch time (no rates or no room)")
    return timing


def error(row: dict[str, Any]) -> float:
    """Signed relative error of the estimated output tokens/s."""
    reported = row["output_tokens_per_second"]
    return estimate(row).output_tokens_per_second / reported - 1


def main() -> int:
    table = rows()
    for split in ("held_out", "tuned"):
        chosen = [row for row in table if row["split"] == split]
        print(f"{split} ({len(chosen)} rows):")
        errors = []
        for row in chosen:
            timing = estimate(row)
            err = timing.output_tokens_per_second / row["output_tokens_per_second"] - 1
            errors.append(err)
            print(
                f"  {row['id']:48s} reported {row['output_tokens_per_second']:9.1f}  "
                f"estimated {timing.output_tokens_per_second:9.1f}  {err:+7.1%}  "
                f"({timing.bound}-bound, {timing.running} at once)"
            )
        if errors:
            print(
                f"  median |error| {statistics.median(abs(e) for e in errors):.1%}, "
                f"median signed {statistics.median(errors):+.1%}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
