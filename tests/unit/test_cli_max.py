# ruff: noqa: SIM905 - flag lists read best as one string each
"""``hwdash plan --max FIELD`` end to end: the text (a column and a line), the JSON ``max`` object,
the exit status (``--check``'s convention) and the refusals of bad input."""

from __future__ import annotations

import json

import pytest
from monitor_cli import run_plan

pytestmark = pytest.mark.usefixtures("quiet_machine")

INFERENCE = "--model qwen2.5-7b --method inference --seq 2048 --flavor l4x1".split()
TOO_BIG = "--model qwen2.5-72b --method full --flavor t4-small".split()


def test_the_text_has_a_max_column_and_a_line(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _err = run_plan(capsys, *INFERENCE, "--max", "concurrency")
    assert status == 0
    header = next(line for line in out.splitlines() if "flavor" in line and "fit" in line)
    assert "max concurrency" in header
    document = json.loads(run_plan(capsys, *INFERENCE, "--max", "concurrency", "--json")[1])
    value = document["max"]["value"]
    row = next(line for line in out.splitlines() if line.startswith("│ l4x1"))
    assert f" {value} " in row
    assert f"most sequences of 2048 tokens at once that fit l4x1: {value} (" in out
    assert f"{value + 1} does not fit" in out


def test_the_json_max_object(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _err = run_plan(capsys, *INFERENCE, "--max", "seq", "--json")
    assert status == 0
    found = json.loads(out)["max"]
    assert found["field"] == "seq" and found["target"] == "l4x1"
    assert isinstance(found["value"], int) and 2048 < found["value"] < 32768
    assert found["headroom_bytes"] > 0 and found["bounded_by"] is None
    # the answer re-planned with --check fits; one token more does not
    at = [*INFERENCE[:-4], "--flavor", "l4x1", "--seq", str(found["value"]), "--check"]
    assert run_plan(capsys, *at)[0] == 0
    at[-2] = str(found["value"] + 1)
    assert run_plan(capsys, *at)[0] == 1


def test_nothing_fits_is_null_and_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _err = run_plan(capsys, *TOO_BIG, "--max", "batch", "--json")
    assert status == 1
    assert json.loads(out)["max"] == {
        "field": "batch",
        "value": None,
        "headroom_bytes": None,
        "target": "t4-small",
        "bounded_by": None,
    }
    status, out, _err = run_plan(capsys, *TOO_BIG, "--max", "batch")
    assert status == 1
    assert "largest --batch that fits t4-small: none (even 1 does not fit: needs" in out


def test_with_check_both_lines_and_the_worse_status(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _err = run_plan(capsys, *INFERENCE, "--batch", "64", "--check", "--max", "batch")
    assert status == 1  # batch 64 does not fit; the largest that does is found all the same
    first, second = out.splitlines()
    assert first.startswith("does not fit l4x1")
    assert second.startswith("largest --batch that fits l4x1: ")


def test_local_is_a_target(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HWDASH_FAKE_NVML", "h100x8")
    args = "--model qwen2.5-7b --method full --zero 3 --grad-ckpt --max gpus --json".split()
    status, out, _err = run_plan(capsys, *args, "--flavor", "local")
    assert status == 0
    found = json.loads(out)["max"]
    assert found["target"] == "local" and 1 < found["value"] <= 8
    status, out, _err = run_plan(capsys, *args, "--flavor", "local-free")
    assert status == 0 and json.loads(out)["max"]["target"] == "local-free"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ("--model qwen2.5-7b --max seq", "--max: give exactly one --flavor ID"),
        (
            "--model qwen2.5-7b --flavor l4x1 --flavor t4-small --max seq",
            "--max: give exactly one --flavor ID",
        ),
        ("--model qwen2.5-7b --flavor l4x1 --max seq --max batch", "--max: one field at a time"),
        ("--model qwen2.5-7b --flavor l4x1 --max tokens", "--max: unknown field 'tokens'"),
        (
            "--model qwen2.5-7b --method lora --flavor l4x1 --max concurrency",
            "error: --max concurrency counts the sequences",
        ),
    ],
)
def test_bad_max_exits_2_naming_the_flag(
    capsys: pytest.CaptureFixture[str], args: str, message: str
) -> None:
    status, out, err = run_plan(capsys, *args.split())
    assert status == 2
    assert message in err and "Traceback" not in err
    assert out == ""


def test_calibrated_searches_with_the_measured_peak_factor(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Runs of this model here peaked 30% over their plans: --calibrated scales every need the
    # search reads, as it scales the flavor table's, so the answer is a smaller batch whose
    # calibrated verdict is "fits" and one more is not.
    from hwdash.commands import plan_measured
    from hwdash.runs.calibration import Calibration

    measured = Calibration("qwen2.5-7b", "inference", 3, 1.3, 3, None, 0)
    monkeypatch.setattr(plan_measured, "measured_for", lambda plan, model: measured)
    on_a100 = "--model qwen2.5-7b --method inference --seq 512 --flavor a100-large".split()
    wide = [*on_a100, "--max", "batch", "--json"]
    plain = json.loads(run_plan(capsys, *wide)[1])["max"]["value"]
    status, out, _err = run_plan(capsys, *wide, "--calibrated")
    assert status == 0
    calibrated = json.loads(out)["max"]["value"]
    assert 1 <= calibrated < plain
    for batch, verdicts in ((calibrated, {"fits"}), (calibrated + 1, {"tight", "no"})):
        at = [*on_a100, "--batch", str(batch), "--calibrated", "--json"]
        flavors = json.loads(run_plan(capsys, *at)[1])["flavors"]
        assert flavors[0]["fit"] in verdicts
