"""``hwdash plan`` with ``--framework`` and the saver flags (issue 13)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hwdash.cli import main
from hwdash.core.estimator.savers import packaged_frameworks, with_framework_defaults
from hwdash.core.plan import Framework, Method, Optimizer, Plan, Precision

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


def test_a_from_files_settings_win_over_the_framework_defaults(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # A DeepSpeed config that says bf16 (fp32 master weights: precision mixed) and AdamW: the
    # file's settings are the user's, so torchtune's bf16 and paged 8-bit AdamW do not replace them.
    config = tmp_path / "ds_config.json"
    config.write_text(
        json.dumps({"bf16": {"enabled": True}, "train_micro_batch_size_per_gpu": 2}),
        encoding="utf-8",
    )
    plan = _json(capsys, "--method", "full", "--framework", "torchtune", "--from", str(config))
    assert plan["plan"]["precision"] == "mixed"  # from the file
    assert plan["plan"]["batch"] == 2
    assert plan["plan"]["optimizer"] == "adamw-8bit-paged"  # the file says nothing: torchtune's
    assert plan["plan"]["grad_ckpt"] is True


def test_framework_defaults_resolve_in_one_function() -> None:
    frameworks = packaged_frameworks()
    unsloth = frameworks["unsloth"]
    plan = Plan(model="llama-3.2-1b", method=Method.QLORA, framework=Framework.UNSLOTH)
    resolved = with_framework_defaults(plan, unsloth)
    assert resolved.grad_ckpt is True and resolved.optimizer is Optimizer.ADAMW_8BIT
    # a chosen field keeps what the plan holds
    kept = with_framework_defaults(plan, unsloth, {"grad_ckpt", "optimizer"})
    assert kept.grad_ckpt is False and kept.optimizer is Optimizer.ADAMW
    # an unchosen field goes back to the Plan's default when the framework states none
    torchtune_plan = resolved.model_copy(update={"framework": Framework.TORCHTUNE})
    hf = with_framework_defaults(
        torchtune_plan.model_copy(update={"framework": Framework.HF}), frameworks["hf"]
    )
    assert hf.optimizer is Optimizer.ADAMW and hf.grad_ckpt is False
    assert hf.precision is Precision.BF16
    # full fine-tuning reads the framework's `full` overrides (the policy's method, for RL)
    full = with_framework_defaults(
        Plan(model="7B", method=Method.FULL, framework=Framework.TORCHTUNE), frameworks["torchtune"]
    )
    assert full.optimizer is Optimizer.ADAMW_8BIT_PAGED
    ppo = with_framework_defaults(
        Plan(model="7B", method=Method.PPO, rl_method=Method.FULL), frameworks["torchtune"]
    )
    assert ppo.optimizer is Optimizer.ADAMW_8BIT_PAGED
    # no framework entry: the Plan's defaults
    assert with_framework_defaults(resolved, None).optimizer is Optimizer.ADAMW
