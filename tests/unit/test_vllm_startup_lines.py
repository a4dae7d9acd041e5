"""vLLM's own start-up log lines (tests/data/vllm_startup_lines.toml) reproduced within 5%.

Each logged number of each row is one case: the KV pool, the blocks, the tokens and the maximum
concurrency, from :func:`hwdash.core.estimator.serving.serving_memory` on the row's model, GPU and
settings. A number the row lists in ``xfail_fields`` is an expected failure, with the row's reason.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
import tomllib

from hwdash.core.catalog import load_catalog
from hwdash.core.estimator.architecture import architecture
from hwdash.core.estimator.serving import (
    ServingSettings,
    blocks_from_pool,
    kv_bytes_per_token,
    packaged_engines,
    serving_memory,
)
from hwdash.core.models.config import resolve_model

TABLE = Path(__file__).resolve().parents[1] / "data" / "vllm_startup_lines.toml"
ROWS: list[dict[str, Any]] = tomllib.loads(TABLE.read_text(encoding="utf-8"))["row"]
LOGGED = ("kv_cache_gib", "gpu_blocks", "kv_tokens", "max_concurrency")
TOLERANCE = 0.05
GIB = 2**30


def _cases() -> list[Any]:
    cases = []
    for row in ROWS:
        for field in LOGGED:
            if field not in row or (row.get("pool_given") and field == "kv_cache_gib"):
                continue
            marks = []
            if field in row.get("xfail_fields", ()):
                marks.append(pytest.mark.xfail(reason=row["xfail"], strict=True))
            cases.append(pytest.param(row, field, id=f"{row['id']}-{field}", marks=marks))
    return cases


def _estimate(row: dict[str, Any]) -> dict[str, float]:
    catalog = load_catalog(include_user=False)
    arch = architecture(resolve_model(row["model"], catalog))
    settings = ServingSettings(
        engine=row["engine"],
        max_model_len=row["max_model_len"],
        gpu_memory_utilization=row.get("gpu_memory_utilization"),
        tp=row["tp"],
        quant_bits=row.get("quant_bits"),
    )
    if row.get("pool_given"):
        block = packaged_engines()[row["engine"]].block_tokens
        per_token = kv_bytes_per_token(arch, 2, row["tp"])
        blocks = blocks_from_pool(round(row["kv_cache_gib"] * GIB), per_token, block)
        tokens = blocks * block
        return {
            "gpu_blocks": blocks,
            "kv_tokens": tokens,
            "max_concurrency": tokens / row["max_model_len"],
        }
    memory = serving_memory(arch, catalog.accelerators[row["accelerator"]], settings)
    return {
        "kv_cache_gib": memory.kv_cache_bytes / GIB,
        "gpu_blocks": memory.kv_blocks,
        "kv_tokens": memory.kv_tokens,
        "max_concurrency": memory.max_concurrency,
    }


@pytest.mark.parametrize(("row", "field"), _cases())
def test_logged_number_within_five_percent(row: dict[str, Any], field: str) -> None:
    logged = row[field]
    estimated = _estimate(row)[field]
    if logged == 0:
        assert estimated == 0, f"{row['id']}: vLLM logged 0 {field}, hwdash {estimated}"
        return
    error = abs(estimated - logged) / logged
    assert error <= TOLERANCE, f"{row['id']}: {field} logged {logged}, hwdash {estimated:.4g}"


def test_table_has_six_setups_with_sources_and_a_mechanical_split() -> None:
    assert len(ROWS) >= 6
    assert len({(r["model"], r["accelerator"], r["max_model_len"]) for r in ROWS}) >= 6
    for row in ROWS:
        assert row["source"].startswith("https://github.com/")
        digest = int(hashlib.sha256(row["id"].encode()).hexdigest(), 16)
        assert row["split"] == ("held_out" if digest % 2 else "tuned"), row["id"]
        assert row["engine"] in packaged_engines()
        assert set(row.get("xfail_fields", ())) <= set(LOGGED)
        assert ("xfail" in row) == bool(row.get("xfail_fields"))
