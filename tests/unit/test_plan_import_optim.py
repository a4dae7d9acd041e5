"""`hwdash plan --from`: every optimizer name the Hugging Face Trainer takes (``optim``) is either
planned as the optimizer hwdash counts for it or refused by name (issue 24)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hwdash.cli import main
from hwdash.core.catalog import load_catalog
from hwdash.core.estimator import architecture, estimate_memory
from hwdash.core.plan import Plan

pytestmark = pytest.mark.usefixtures("quiet_machine")

#: ``OptimizerNames`` in transformers/training_args.py (transformers 5.24), plus ``adamw_hf``
#: (transformers' own AdamW, removed in 5.x but still in older scripts' files) ->
#: the plan's (optimizer, optimizer_impl), or None where hwdash refuses the name.
TRAINER_OPTIMS: dict[str, tuple[str, str | None] | None] = {
    "adamw_torch": ("adamw", "foreach"),
    "adamw_torch_fused": ("adamw", "fused"),
    "adamw_hf": ("adamw", "foreach"),
    "adamw_torch_xla": None,
    "adamw_torch_npu_fused": None,
    "adafactor": ("adafactor", None),
    "adamw_anyprecision": None,
    "adamw_torch_4bit": None,
    "adamw_torch_8bit": None,
    "ademamix": None,
    "sgd": ("sgd", None),
    "adagrad": None,
    "adamw_bnb_8bit": ("adamw-8bit", None),
    "adamw_8bit": ("adamw-8bit", None),
    "ademamix_8bit": None,
    "lion_8bit": None,
    "lion_32bit": None,
    "paged_adamw_32bit": ("adamw-32bit-paged", None),
    "paged_adamw_8bit": ("adamw-8bit-paged", None),
    "paged_ademamix_32bit": None,
    "paged_ademamix_8bit": None,
    "paged_lion_32bit": None,
    "paged_lion_8bit": None,
    "rmsprop": None,
    "rmsprop_bnb": None,
    "rmsprop_bnb_8bit": None,
    "rmsprop_bnb_32bit": None,
    "galore_adamw": None,
    "galore_adamw_8bit": None,
    "galore_adafactor": None,
    "galore_adamw_layerwise": None,
    "galore_adamw_8bit_layerwise": None,
    "galore_adafactor_layerwise": None,
    "lomo": None,
    "adalomo": None,
    "grokadamw": None,
    "schedule_free_radam": None,
    "schedule_free_adamw": None,
    "schedule_free_sgd": None,
    "apollo_adamw": None,
    "apollo_adamw_layerwise": None,
    "stable_adamw": None,
}


def from_trainer_args(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, optim: str, *flags: str
) -> tuple[int, dict[str, Any] | None, str]:
    path = tmp_path / "args.json"
    path.write_text(json.dumps({"per_device_train_batch_size": 1, "optim": optim}))
    status = main(["plan", "--model", "qwen2.5-0.5b", "--from", str(path), *flags, "--json"])
    captured = capsys.readouterr()
    return status, json.loads(captured.out)["plan"] if status == 0 else None, captured.err


@pytest.mark.parametrize(("optim", "expected"), TRAINER_OPTIMS.items())
def test_every_trainer_optim_is_planned_or_refused_by_name(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    optim: str,
    expected: tuple[str, str | None] | None,
) -> None:
    status, plan, err = from_trainer_args(capsys, tmp_path, optim)
    if expected is None:
        assert status == 2
        assert f"'{optim}'" in err and "does not model" in err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1
        return
    assert status == 0, err
    assert plan is not None and plan["optimizer"] == expected[0]
    if expected[1] is not None:
        assert plan["optimizer_impl"] == expected[1]


def test_a_name_no_trainer_has_is_refused_by_name(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    status, _, err = from_trainer_args(capsys, tmp_path, "adamw_torhc")
    assert status == 2 and "'adamw_torhc'" in err and "Traceback" not in err


def test_a_typed_optimizer_wins_over_a_refused_name(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    status, plan, err = from_trainer_args(capsys, tmp_path, "lion_8bit", "--optimizer", "sgd")
    assert status == 0, err
    assert plan is not None and plan["optimizer"] == "sgd"


def test_an_axolotl_optimizer_it_does_not_model_is_refused_naming_its_key(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "axolotl.yaml"
    path.write_text("base_model: qwen2.5-0.5b\nadapter: lora\noptimizer: lion_8bit\n")
    status = main(["plan", "--from", str(path), "--json"])
    err = capsys.readouterr().err
    assert status == 2
    assert "'lion_8bit'" in err and "optimizer" in err and "Traceback" not in err


def test_paged_32bit_adamw_round_trips_through_the_trainer_export(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    args = ["--model", "qwen2.5-0.5b", "--method", "qlora", "--optimizer", "adamw-32bit-paged"]
    path = tmp_path / "train_args.py"
    assert main(["plan", *args, "--export", "trainer", "-o", str(path)]) == 0
    assert "optim='paged_adamw_32bit'" in path.read_text()
    capsys.readouterr()
    assert main(["plan", *args, "--json"]) == 0
    original = json.loads(capsys.readouterr().out)
    assert main(["plan", "--from", str(path), "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["plan"]["optimizer"] == "adamw-32bit-paged"
    assert again["memory"] == original["memory"]


def test_paged_32bit_states_are_counted_like_the_8bit_ones_at_4x_the_bytes() -> None:
    # bitsandbytes' PagedAdamW32bit keeps both Adam states in fp32 whatever the parameters' dtype
    # (bitsandbytes/optim/optimizer.py Optimizer2State.init_state: optim_bits 32 -> float32)
    spec = load_catalog().models["llama-3.2-1b"]
    params = architecture(spec).total_params
    plan = Plan(model="llama-3.2-1b", method="full", seq=256)
    eight = estimate_memory(plan.with_changes({"optimizer": "adamw-8bit-paged"}), spec)
    thirty_two = estimate_memory(plan.with_changes({"optimizer": "adamw-32bit-paged"}), spec)
    assert eight.managed_bytes == 2 * params
    assert thirty_two.managed_bytes == 4 * eight.managed_bytes == 8 * params
    # NVML's view: on the GPU either way, no step temporaries (one kernel per parameter)
    assert thirty_two.per_gpu.optimizer == 8 * params
    for part in ("weights", "gradients", "activations"):
        assert getattr(thirty_two.per_gpu, part) == getattr(eight.per_gpu, part)
    labels = [label for label, _ in thirty_two.details]
    assert "model optimizer states (paged: CUDA managed memory)" in labels
