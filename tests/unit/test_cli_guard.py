# ruff: noqa: SIM905 - flag lists read best as one string each
"""``--check`` holds with whatever else is asked, an export says when its flavor does not fit, and
``--export -o FILE`` never overwrites without ``--force`` (issue 22), through the real CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from monitor_cli import run_plan

from hwdash.core.plans.store import PlanStore

pytestmark = pytest.mark.usefixtures("quiet_machine")


TOO_BIG = "--model qwen2.5-7b --method full --examples 2000 --flavor t4-small".split()
"""77 GiB per GPU on a 15 GiB T4."""
FITS = "--model qwen2.5-0.5b --examples 2000 --flavor a10g-large".split()


@pytest.mark.parametrize("kind", ["deepspeed", "trainer", "accelerate", "hf-jobs"])
def test_check_refuses_an_export_the_plan_does_not_fit(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, kind: str
) -> None:
    target = tmp_path / "out.txt"
    status, out, err = run_plan(capsys, *TOO_BIG, "--check", "--export", kind, "-o", str(target))
    assert status == 1
    assert not target.exists()
    assert out.startswith("does not fit t4-small:")
    assert "not written" in err and "--check" in err
    # to stdout: nothing of the export is printed either
    status, out, err = run_plan(capsys, *TOO_BIG, "--check", "--export", kind)
    assert status == 1
    assert "hf jobs" not in out and "{" not in out and "=" not in out
    assert "not written" in err


def test_an_export_for_a_flavor_that_does_not_fit_says_so(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    target = tmp_path / "job.sh"
    status, _out, err = run_plan(capsys, *TOO_BIG, "--export", "hf-jobs", "-o", str(target))
    assert status == 0
    assert "hf jobs uv run --flavor t4-small" in target.read_text(encoding="utf-8")
    assert "warning" in err and "does not fit t4-small" in err
    status, out, err = run_plan(capsys, *FITS, "--export", "hf-jobs")
    assert status == 0 and "hf jobs uv run --flavor a10g-large" in out
    assert "warning" not in err


def test_check_passes_and_the_export_is_written(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    target = tmp_path / "job.sh"
    status, out, _err = run_plan(capsys, *FITS, "--check", "--export", "hf-jobs", "-o", str(target))
    assert status == 0
    assert out.startswith("fits a10g-large:")
    assert target.read_text(encoding="utf-8").rstrip().endswith("train.py")
    # to stdout, stdout is the export alone (the check's line goes to stderr)
    status, out, err = run_plan(capsys, *FITS, "--check", "--export", "hf-jobs")
    assert status == 0
    assert out.startswith("# estimated") and "fits a10g-large:" in err


def test_check_keeps_its_exit_code_with_json(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _err = run_plan(capsys, *TOO_BIG, "--check", "--json")
    assert status == 1
    document = json.loads(out)
    assert document["check"]["flavor"] == "t4-small"
    assert document["check"]["status"] == 1
    assert document["check"]["message"].startswith("does not fit t4-small:")
    assert document["flavors"][0]["fit"] == "no"
    status, out, _err = run_plan(capsys, *FITS, "--check", "--json")
    assert status == 0 and json.loads(out)["check"]["status"] == 0


def test_check_keeps_its_exit_code_with_save(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    status, out, _err = run_plan(capsys, *TOO_BIG, "--check", "--save", "big run")
    assert status == 1
    assert out.startswith("does not fit t4-small:")
    store = PlanStore(tmp_path / "data" / "hwdash" / "plans.json")
    saved = store.get("big run")
    assert saved is not None and saved.plan.model == "qwen2.5-7b"
    status, out, _err = run_plan(capsys, *TOO_BIG, "--check", "--save", "big json", "--json")
    assert status == 1 and json.loads(out)["saved_as"] == "big json"
    assert store.get("big json") is not None


def test_export_refuses_to_overwrite_a_file_without_force(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    target = tmp_path / "ds_config.json"
    target.write_text("mine\n", encoding="utf-8")
    status, _out, err = run_plan(capsys, *FITS, "--export", "deepspeed", "-o", str(target))
    assert status == 2
    assert target.read_text(encoding="utf-8") == "mine\n"
    assert "already exists" in err and "--force" in err
    assert len(err.strip().splitlines()) == 1
    status, _out, err = run_plan(
        capsys, *FITS, "--export", "deepspeed", "-o", str(target), "--force"
    )
    assert status == 0
    assert json.loads(target.read_text(encoding="utf-8"))["train_micro_batch_size_per_gpu"] == 1


def test_force_without_a_file_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    status, _out, err = run_plan(capsys, *FITS, "--export", "deepspeed", "--force")
    assert status == 2 and "--force" in err and "-o" in err
