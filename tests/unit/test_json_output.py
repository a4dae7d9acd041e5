"""JSON output never holds NaN or Infinity (not JSON): bounded inputs keep numbers finite, and a
number that slips through anyway is refused with exit 2 and nothing half-written, never a traceback."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from hwdash.cli import main
from hwdash.core import strict_json
from hwdash.core.plans.store import PlanStore

BAD = Path(__file__).resolve().parent.parent / "data" / "catalog_bad"


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.delenv("HWDASH_CATALOG", raising=False)
    monkeypatch.setenv("HWDASH_FAKE_NVML", "no-driver")


# -- the helper ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("document", "where"),
    [
        ({"flavors": [{"cost": 1.0}, {"cost": math.inf}]}, "flavors[1].cost"),
        ([1, (2, {"hours": -math.inf})], "[1][1].hours"),
        (math.nan, "the document"),
    ],
)
def test_dumps_refuses_a_non_finite_number_and_says_where(document: Any, where: str) -> None:
    with pytest.raises(strict_json.NonFiniteNumberError) as caught:
        strict_json.dumps(document)
    assert caught.value.where == where
    assert where in str(caught.value)
    assert isinstance(caught.value, ValueError)  # what callers of json.dumps already catch


def test_dumps_writes_finite_documents_as_json_does() -> None:
    document = {"b": [1, 2.5, None, "x"], "a": {"ü": True}}
    assert strict_json.dumps(document, indent=2, sort_keys=True) == json.dumps(
        document, indent=2, sort_keys=True
    )


def test_finite_or_none_turns_bad_numbers_into_null() -> None:
    cleaned = strict_json.finite_or_none({"a": (1.5, math.nan), "b": {"c": -math.inf}, "d": "nan"})
    assert cleaned == {"a": [1.5, None], "b": {"c": None}, "d": "nan"}
    assert "NaN" not in json.dumps(cleaned)


# -- every JSON output of the CLI, with a non-finite number injected -----------------------------


def _poison(document: dict[str, Any]) -> dict[str, Any]:
    return {**document, "poisoned": [0.0, math.nan]}


@pytest.mark.parametrize(
    ("argv", "target", "attribute"),
    [
        (
            ["plan", "--model", "qwen2.5-0.5b", "--json"],
            "hwdash.core.results.PlanReport",
            "to_json",
        ),
        (["catalog", "list", "--json"], "hwdash.commands.catalog", "catalog_as_json"),
        (["compare", "--json"], "hwdash.commands.compare", "compare_json"),
    ],
)
def test_a_nan_in_any_json_output_is_exit_2_with_nothing_on_stdout(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    target: str,
    attribute: str,
) -> None:
    import importlib

    module_name, _, class_name = target.rpartition(".")
    owner: Any
    if class_name[:1].isupper():
        owner = getattr(importlib.import_module(module_name), class_name)
    else:
        owner = importlib.import_module(target)
    original = getattr(owner, attribute)

    def poisoned(*args: Any, **kwargs: Any) -> Any:
        document = original(*args, **kwargs)
        return _poison(document) if isinstance(document, dict) else [document, math.nan]

    monkeypatch.setattr(owner, attribute, poisoned)
    status = main(argv)
    captured = capsys.readouterr()
    assert status == 2
    assert captured.out == ""
    assert "not a JSON number" in captured.err
    assert "Traceback" not in captured.err


# -- the inputs that produced infinities ---------------------------------------------------------


def test_an_overlay_accelerator_with_a_vanishing_rate_is_refused_not_infinite_hours(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status = main(
        [
            "plan",
            "--model",
            "7B",
            "--examples",
            "1000",
            "--catalog",
            str(BAD / "vanishing_rate.toml"),
        ]
    )
    captured = capsys.readouterr()
    assert status == 2
    assert "crawling-gpu" in captured.err and "bf16_tflops" in captured.err


def test_a_vanishing_mfu_is_refused_not_infinite_hours(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["plan", "--model", "7B", "--mfu", "1e-300", "--tokens", "1000T", "--json"])
    captured = capsys.readouterr()
    assert status == 2
    assert "--mfu" in captured.err
    assert "Infinity" not in captured.out


def test_a_plans_file_holding_nan_is_refused_at_read_not_crashing_the_next_write(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Python's json reads NaN and Infinity; a hand-edited plans file may hold them.
    assert main(["plan", "--model", "qwen2.5-0.5b", "--save", "first", "--json"]) == 0
    capsys.readouterr()
    store = PlanStore()
    document = json.loads(store.path.read_text())
    document["plans"][0]["summary"]["hours"] = math.nan
    store.path.write_text(json.dumps(document))
    status = main(["plan", "--model", "qwen2.5-0.5b", "--save", "second"])
    captured = capsys.readouterr()
    assert status == 2
    assert "plans.0.summary.hours" in captured.err
    assert "Traceback" not in captured.err
    # Moved aside as the module promises for a bad entry (kept whole in the backup); the next
    # save starts a fresh, strict file.
    backups = list(store.path.parent.glob("plans.json.bak-*"))
    assert len(backups) == 1 and "NaN" in backups[0].read_text()
    assert main(["plan", "--model", "qwen2.5-0.5b", "--save", "second"]) == 0
    assert "NaN" not in store.path.read_text()
