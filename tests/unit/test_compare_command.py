"""``hwdash plan ... --save NAME`` and ``hwdash compare --list/--json`` (no terminal needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hwdash.cli import main
from hwdash.core.catalog import load_catalog
from hwdash.core.planning.fit import evaluate_plan
from hwdash.core.plans.store import PlanStore, PlanSummary


@pytest.fixture
def plans_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("HWDASH_CATALOG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path / "xdg" / "hwdash" / "plans.json"


def test_plan_save_stores_the_plan_and_says_where(
    plans_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["plan", "--model", "qwen2.5-0.5b", "--batch", "4", "--examples", "5000"]
    assert main([*argv, "--save", "small run"]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith(f"saved plan 'small run' to {plans_file}")
    [saved] = PlanStore(plans_file).list()
    assert saved.name == "small run"
    assert saved.plan.model == "qwen2.5-0.5b" and saved.plan.batch == 4
    report = evaluate_plan(saved.plan, load_catalog(include_user=False))
    assert saved.summary == PlanSummary.from_report(report)
    # The same name again gets a suffix; --json says which name was used.
    assert main([*argv, "--save", "small run", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["saved_as"] == "small run (2)"
    assert "saved plan 'small run (2)'" in captured.err
    assert PlanStore(plans_file).names() == ["small run", "small run (2)"]


def test_plan_save_with_an_empty_name_is_a_usage_error(
    plans_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", "--model", "qwen2.5-0.5b", "--save", "  "]) == 2
    assert "a plan needs a name" in capsys.readouterr().err
    assert not plans_file.exists()


def test_compare_json_recomputes_each_plan(
    plans_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    catalog = load_catalog(include_user=False)
    store = PlanStore(plans_file)
    assert main(["plan", "--model", "qwen2.5-0.5b", "--examples", "5000", "--save", "a"]) == 0
    assert main(["plan", "--model", "phi-2", "--method", "full", "--save", "b"]) == 0
    # A plan whose config.json has gone away keeps its cached summary.
    cached = PlanSummary(model_name="gone", memory={"total": 123}, gpus=1)
    store.save(
        "gone",
        store.list()[0].plan.model_copy(update={"model": str(tmp_path / "nope")}),
        summary=cached,
    )
    capsys.readouterr()
    assert main(["compare", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["plans_file"] == str(plans_file)
    entries = {entry["name"]: entry for entry in document["plans"]}
    assert list(entries) == ["a", "b", "gone"]
    for name in ("a", "b"):
        saved = store.get(name)
        assert saved is not None
        expected = PlanSummary.from_report(evaluate_plan(saved.plan, catalog))
        assert entries[name]["recomputed"] is True
        assert entries[name]["problem"] is None
        assert entries[name]["summary"]["per_gpu_total"] == expected.per_gpu_total
        assert entries[name]["summary"]["best_flavor"] == expected.best_flavor
        assert entries[name]["plan"]["model"] == saved.plan.model
    assert entries["gone"]["recomputed"] is False
    assert entries["gone"]["summary"]["per_gpu_total"] == 123
    assert "nope" in entries["gone"]["problem"]


def test_compare_list(plans_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "--list"]) == 0
    assert "no saved plans" in capsys.readouterr().out
    assert main(["plan", "--model", "qwen2.5-0.5b", "--save", "tiny"]) == 0
    assert main(["plan", "--model", "qwen2.5-7b", "--method", "qlora", "--save", "qlora 7b"]) == 0
    capsys.readouterr()
    assert main(["compare", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["name", "model", "method"]
    assert lines[1].startswith("tiny ") and "lora" in lines[1]
    assert lines[2].startswith("qlora 7b ") and "qlora" in lines[2]


def test_compare_without_a_terminal_points_to_list(
    plans_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["compare"]) == 2
    err = capsys.readouterr().err
    assert "needs a terminal" in err and "hwdash compare --list" in err


def test_compare_with_a_broken_plans_file(
    plans_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plans_file.parent.mkdir(parents=True)
    plans_file.write_text("not json")
    for read in (["compare", "--json"], ["compare", "--list"]):
        assert main(read) == 2
        err = capsys.readouterr().err
        assert "not valid JSON" in err and str(plans_file) in err and "left as it is" in err
    # Reading never moves the user's file.
    assert plans_file.read_text() == "not json"
    assert list(plans_file.parent.glob("plans.json.bak-*")) == []


def test_catalog_before_the_subcommand_is_kept(
    plans_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "no-such-catalog"
    assert main(["--catalog", str(missing), "compare", "--list"]) == 2
    assert str(missing) in capsys.readouterr().err
    assert main(["compare", "--catalog", str(missing), "--list"]) == 2
    assert str(missing) in capsys.readouterr().err
