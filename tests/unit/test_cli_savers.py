"""``hwdash plan`` with ``--framework`` and the saver flags (issue 13)."""

from __future__ import annotations

import json

import pytest

from hwdash.cli import main

pytestmark = pytest.mark.usefixtures("isolated_home")


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:  # type: ignore[type-arg]
    status = main(["plan", "--model", "llama-3.2-1b", *argv, "--json"])
    out = capsys.readouterr().out
    assert status == 0, out
    document: dict = json.loads(out)  # type: ignore[type-arg]
    return document


def test_framework_fills_untyped_flags_and_typed_ones_win(
    capsys: pytest.CaptureFixture[str],
) -> None:
    plan = _json(capsys, "--method", "full", "--framework", "torchtune")["plan"]
    assert plan["framework"] == "torchtune"
    assert plan["grad_ckpt"] is True
    assert plan["optimizer"] == "adamw-8bit-paged"
    assert plan["optimizer_impl"] == "fused"
    typed = _json(capsys, "--method", "full", "--framework", "torchtune", "--optimizer", "adamw")
    assert typed["plan"]["optimizer"] == "adamw"


def test_savers_lower_the_estimate_and_show_in_json(capsys: pytest.CaptureFixture[str]) -> None:
    plain = _json(capsys, "--method", "full", "--seq", "4096")
    saved = _json(
        capsys,
        "--method",
        "full",
        "--seq",
        "4096",
        "--loss",
        "chunked",
        "--compile",
        "--optimizer",
        "adamw-8bit-paged",
    )
    assert saved["plan"]["loss"] == "chunked" and saved["plan"]["compile"] is True
    assert saved["memory"]["total"] < plain["memory"]["total"]
    assert saved["managed_memory"] > 0 and plain["managed_memory"] == 0


def test_text_output_names_the_framework(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(
        ["plan", "--model", "llama-3.2-1b", "--framework", "unsloth", "--method", "qlora"]
    )
    out = capsys.readouterr().out
    assert status == 0
    assert "framework unsloth: loss fused-linear, activation offload" in out


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--loss", "chunky"], "--loss"),
        (["--framework", "keras"], "--framework"),
        (["--value-head", "both"], "--value-head"),
        (["--optimizer-in-backward", "--grad-accum", "4"], "--optimizer-in-backward"),
    ],
)
def test_bad_values_exit_2_naming_the_flag(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        status = main(["plan", "--model", "llama-3.2-1b", *argv])
    except SystemExit as exc:  # argparse's refusals
        status = exc.code
    assert status == 2
    err = capsys.readouterr().err
    assert flag in err
    assert "Traceback" not in err


def test_flags_that_do_not_apply_are_warned_about(capsys: pytest.CaptureFixture[str]) -> None:
    document = _json(capsys, "--method", "lora", "--value-head", "shared", "--no-compile")
    warnings = " ".join(document["warnings"])
    assert "--value-head does nothing here" in warnings
    assert "--no-compile" not in warnings
    inference = _json(capsys, "--method", "inference", "--compile")
    assert any(w.startswith("--compile does nothing here") for w in inference["warnings"])
