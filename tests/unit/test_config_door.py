"""The held-out rows through the config.json door (issue 24): data well-formed, configs readable.

``bench/data/config_door.csv`` holds traced peaks of published config.json files of families hwdash
was not tuned on (``tests/data/model_configs/heldout/``), made by ``bench/config_door.py``. These
checks need no torch and pin no estimate (the estimator changes; the report recomputes ``est_now``):
they check that every config has a row per plan, that the rows are well-formed, that ``est_before``
stays frozen when the report runs, and that hwdash reads every config or refuses it with a
UsageError, never a traceback.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from hwdash.core.models.config import model_from_config_file
from hwdash.core.specs import ModelSpec
from hwdash.errors import UsageError

REPO = Path(__file__).resolve().parents[2]
HELDOUT = REPO / "tests" / "data" / "model_configs" / "heldout"


def _load_bench() -> ModuleType:
    path = REPO / "bench" / "config_door.py"
    spec = importlib.util.spec_from_file_location("config_door", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["config_door"] = module
    spec.loader.exec_module(module)
    return module


door = _load_bench()
ROWS = door.read_rows(door.DATA_CSV)
CONFIGS = sorted(HELDOUT.glob("*/config.json"))
PLAN_NAMES = [case.name for case in door.PLANS]


def _is_bytes(text: str) -> bool:
    return text.isdigit() and int(text) > 0


def test_at_least_twelve_heldout_configs_each_a_json_object() -> None:
    assert len(CONFIGS) >= 12
    for config in CONFIGS:
        raw = json.loads(config.read_text(encoding="utf-8"))
        assert isinstance(raw, dict) and raw.get("model_type"), config


def test_sources_name_every_heldout_config() -> None:
    sources = (HELDOUT / "SOURCES.md").read_text(encoding="utf-8")
    for config in CONFIGS:
        assert f"`{config.parent.name}`" in sources, config.parent.name


def test_csv_has_its_columns_and_one_row_per_config_and_plan() -> None:
    with door.DATA_CSV.open(encoding="utf-8") as handle:
        header = handle.readline().strip().split(",")
    assert tuple(header) == door.CSV_COLUMNS
    keys = [(row["model"], row["plan"]) for row in ROWS]
    assert len(keys) == len(set(keys)), "duplicate (model, plan) rows"
    expected = {(config.parent.name, plan) for config in CONFIGS for plan in PLAN_NAMES}
    assert set(keys) == expected


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r['model']}-{r['plan']}")
def test_row_is_well_formed(row: dict[str, str]) -> None:
    assert (REPO / row["config"]).is_file()
    assert row["config"].endswith(f"/{row['model']}/config.json")
    status = row["trace_status"]
    assert status == "ok" or status.startswith("failed: "), status
    if status == "ok":
        peak = row["traced_peak_bytes"]
        assert _is_bytes(peak)
        parts = [int(row[f"traced_{name}"]) for name in door.COMPONENTS]
        assert all(part >= 0 for part in parts)
        # extrapolated components are each rounded down: a few bytes from the extrapolated total
        assert abs(sum(parts) - int(peak)) <= len(parts)
        # the plain CPU trace keeps dropout masks at least as large as CUDA's bool ones
        assert int(row["door_trace_peak_bytes"]) >= int(peak)
        assert row["trace_driver"] in (door.DRIVER_DOOR, door.DRIVER_PLACEHOLDER)
        assert row["traced_peak_phase"] in ("forward", "backward", "optimizer", "prefill", "decode")
    for column in ("est_before", "est_now"):
        value = row[column]
        assert _is_bytes(value) or value.startswith("refused: "), (column, value)
        error = row[column.replace("est_", "err_")]
        if status == "ok" and _is_bytes(value):
            float(error)
        else:
            assert error == ""


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.parent.name)
def test_config_reads_or_is_refused_with_a_usage_error(config: Path) -> None:
    try:
        model = model_from_config_file(config)
    except UsageError as exc:
        assert str(config) in str(exc) or "--model" in str(exc)
    else:
        assert isinstance(model, ModelSpec)


def test_report_recomputes_now_and_keeps_before_frozen(tmp_path: Path) -> None:
    rows = [dict(row) for row in ROWS]
    for row in rows:
        row["est_now"] = row["err_now"] = ""
    rescored = door.score(rows, freeze_before=True)
    for old, new in zip(ROWS, rescored, strict=True):
        assert new["est_before"] == old["est_before"]
        assert new["err_before"] == old["err_before"]
        assert new["est_now"] != ""
    # a row whose est_before is empty is filled only when asked
    blank = dict(ROWS[0], est_before="", err_before="")
    assert door.score([blank], freeze_before=False)[0]["est_before"] == ""
    assert door.score([blank], freeze_before=True)[0]["est_before"] != ""


def test_accuracy_page_reports_the_config_door_first() -> None:
    text = (REPO / "docs" / "accuracy.md").read_text(encoding="utf-8")
    begin, end = text.find(door.BEGIN_MARK), text.find(door.END_MARK)
    assert 0 <= begin < end
    assert begin < text.find("## Method")
    section = text[begin:end]
    assert "Through the config.json door (held-out, issue 24)" in section
    assert "median |err|" in section
    assert "before" in section and "now" in section
