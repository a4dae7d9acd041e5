"""`hwdash plan --from FILE`: files that name each other, the precision axolotl and LLaMA-Factory
train in, and LLaMA-Factory's quantization bits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hwdash.cli import main
from hwdash.core.plan import Method, Precision
from hwdash.core.plans.imports import read_plan_file
from hwdash.errors import UsageError

pytestmark = pytest.mark.usefixtures("quiet_machine")


def plan_command(capsys: pytest.CaptureFixture[str], path: Path) -> tuple[int, str, str]:
    status = main(["plan", "--model", "qwen2.5-7b", "--from", str(path), "--json"])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def planned(capsys: pytest.CaptureFixture[str], path: Path) -> tuple[dict[str, Any], str]:
    status, out, err = plan_command(capsys, path)
    assert status == 0, err
    return json.loads(out)["plan"], err


def write_yaml(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


# -- files that name each other -------------------------------------------------------------------


def test_a_trainer_file_whose_deepspeed_entry_names_itself_is_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    looped = tmp_path / "args.json"
    looped.write_text(json.dumps({"per_device_train_batch_size": 2, "deepspeed": "args.json"}))
    status, _, err = plan_command(capsys, looped)
    assert status == 2
    assert "args.json" in err and "names the file itself" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_two_files_that_name_each_other_are_exit_2_showing_the_loop(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "first.yaml").write_text("base_model: qwen2.5-7b\ndeepspeed: second.json\n")
    (tmp_path / "second.json").write_text(
        json.dumps({"gradient_accumulation_steps": 2, "deepspeed": "first.yaml"})
    )
    status, _, err = plan_command(capsys, tmp_path / "first.yaml")
    assert status == 2
    assert "first.yaml -> " in err and "second.json -> " in err
    assert "Traceback" not in err


def test_a_trainer_snippet_that_names_itself_is_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    snippet = tmp_path / "train.py"
    snippet.write_text(
        'args = TrainingArguments(per_device_train_batch_size=1, deepspeed="train.py")\n'
    )
    status, _, err = plan_command(capsys, snippet)
    assert status == 2 and "names the file itself" in err


def test_a_deepspeed_file_named_twice_along_one_chain_is_still_read(tmp_path: Path) -> None:
    """Only a loop is refused: a trainer file naming a DeepSpeed file is the usual case."""
    (tmp_path / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": 3}}))
    trainer = tmp_path / "args.json"
    trainer.write_text(json.dumps({"per_device_train_batch_size": 1, "deepspeed": "./ds.json"}))
    assert read_plan_file(trainer).updates["zero"] == 3


# -- axolotl's precision --------------------------------------------------------------------------

AXOLOTL = ["base_model: qwen2.5-7b", "adapter: lora", "micro_batch_size: 1"]


@pytest.mark.parametrize(
    ("lines", "precision"),
    [
        # axolotl's resolve_dtype (src/axolotl/utils/config/__init__.py): no bf16, no fp16 (nor
        # bfloat16/float16/load_in_8bit) loads the model in torch.float32 and trains without amp
        (["bf16: false", "fp16: false"], Precision.FP32),
        (["bf16: false"], Precision.FP32),
        # bf16: auto is bf16 on a GPU with bf16 and fp16 on one without: the same bytes
        (["bf16: auto"], Precision.BF16),
        (["bf16: auto", "fp16: true"], Precision.BF16),
        ([], Precision.BF16),  # axolotl's schema default for bf16 is "auto"
        (["bf16: true"], Precision.BF16),
        (["bf16: false", "bfloat16: true"], Precision.BF16),
        (["bf16: false", "fp16: false", "load_in_8bit: true"], Precision.BF16),
    ],
)
def test_axolotl_precision_follows_axolotls_dtype_rules(
    tmp_path: Path, lines: list[str], precision: Precision
) -> None:
    found = read_plan_file(write_yaml(tmp_path / "axolotl.yaml", AXOLOTL + lines))
    assert found.updates["precision"] is precision


def test_axolotl_without_bf16_or_fp16_plans_fp32_through_the_cli(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = write_yaml(tmp_path / "axolotl.yaml", [*AXOLOTL, "bf16: false", "fp16: false"])
    plan, _ = planned(capsys, path)
    assert plan["precision"] == "fp32"


def test_axolotl_bf16_auto_is_planned_as_bf16_and_says_so(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = write_yaml(tmp_path / "axolotl.yaml", [*AXOLOTL, "bf16: auto"])
    plan, err = planned(capsys, path)
    assert plan["precision"] == "bf16"
    assert "bf16: auto" in err


def test_axolotl_bf16_of_another_kind_is_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = write_yaml(tmp_path / "axolotl.yaml", [*AXOLOTL, "bf16: sometimes"])
    status, _, err = plan_command(capsys, path)
    assert status == 2 and "'bf16' must be true, false or auto" in err


# -- LLaMA-Factory's precision and quantization ---------------------------------------------------

LLAMA_FACTORY = ["model_name_or_path: qwen2.5-7b", "stage: sft"]


@pytest.mark.parametrize(
    ("lines", "precision"),
    [
        # full and freeze: LLaMA-Factory upcasts the trainable parameters to fp32
        # (src/llamafactory/model/adapter.py, init_adapter) and autocasts only with bf16/fp16
        (["finetuning_type: full", "bf16: false", "fp16: false"], Precision.FP32),
        (["finetuning_type: full"], Precision.FP32),  # TrainingArguments: bf16/fp16 default false
        (["finetuning_type: freeze", "fp16: false"], Precision.FP32),
        (["finetuning_type: full", "bf16: true"], Precision.AMP),
        (["finetuning_type: full", "fp16: true"], Precision.AMP),
        (["finetuning_type: full", "bf16: true", "pure_bf16: true"], Precision.BF16),
        # LoRA: the frozen base stays in the dtype it is loaded in, 16 bits either way
        (["finetuning_type: lora", "bf16: true"], Precision.BF16),
        (["finetuning_type: lora", "bf16: false", "fp16: false"], Precision.BF16),
    ],
)
def test_llama_factory_precision_follows_what_it_trains_in(
    tmp_path: Path, lines: list[str], precision: Precision
) -> None:
    found = read_plan_file(write_yaml(tmp_path / "lf.yaml", LLAMA_FACTORY + lines))
    assert found.updates["precision"] is precision


def test_llama_factory_full_without_mixed_precision_plans_fp32_through_the_cli(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = write_yaml(
        tmp_path / "lf.yaml",
        [*LLAMA_FACTORY, "finetuning_type: full", "bf16: false", "fp16: false"],
    )
    plan, _ = planned(capsys, path)
    assert (plan["method"], plan["precision"]) == ("full", "fp32")


@pytest.mark.parametrize(
    ("bits", "method"),
    [(None, "lora"), (4, "qlora"), (8, "lora-8bit")],
)
def test_llama_factory_quantization_bit_picks_the_method(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, bits: int | None, method: str
) -> None:
    lines = [*LLAMA_FACTORY, "finetuning_type: lora"]
    if bits is not None:
        lines.append(f"quantization_bit: {bits}")
    plan, _ = planned(capsys, write_yaml(tmp_path / "lf.yaml", lines))
    assert plan["method"] == method


def test_llama_factory_quantization_bits_hwdash_does_not_count_are_said(tmp_path: Path) -> None:
    path = write_yaml(
        tmp_path / "lf.yaml", [*LLAMA_FACTORY, "finetuning_type: lora", "quantization_bit: 2"]
    )
    found = read_plan_file(path)
    assert found.updates["method"] is Method.LORA
    assert any("quantization_bit 2" in note for note in found.notes)


def test_a_python_file_with_a_null_byte_is_a_usage_error_without_a_line_none(
    tmp_path: Path,
) -> None:
    path = tmp_path / "train.py"
    path.write_bytes(b"x = 1\x00\n")
    with pytest.raises(UsageError) as caught:
        read_plan_file(path)
    assert "not valid Python" in str(caught.value) and "None" not in str(caught.value)


# -- crashes the fuzz found (tests/unit/test_fuzz_plan_import.py) -----------------------------------


@pytest.mark.parametrize("argument", ["{[1]: 2}", "{1, [2]}"])
def test_a_snippet_argument_python_cannot_hash_is_skipped(tmp_path: Path, argument: str) -> None:
    """ast.literal_eval raises TypeError (not ValueError) for a dict key or set member that is a
    list: the argument is skipped like any other non-literal."""
    path = tmp_path / "train.py"
    path.write_text(
        f"args = TrainingArguments(per_device_train_batch_size={argument}, gradient_accumulation_steps=3)\n"
    )
    found = read_plan_file(path)
    assert found.updates["grad_accum"] == 3 and "batch" not in found.updates


def test_llama_factory_freeze_tuning_is_planned_as_full_as_its_note_says(tmp_path: Path) -> None:
    path = write_yaml(tmp_path / "lf.yaml", [*LLAMA_FACTORY, "finetuning_type: freeze"])
    found = read_plan_file(path)
    assert found.updates["method"] is Method.FULL
    assert any("freeze" in note for note in found.notes)


@pytest.mark.parametrize(
    ("name", "text", "key"),
    [
        (
            "lf.yaml",
            "model_name_or_path: qwen2.5-7b\nstage: sft\nlora_target: ' , '\n",
            "lora_target",
        ),
        (
            "train.py",
            "args = SFTConfig(per_device_train_batch_size=1)\nlora = LoraConfig(target_modules=[])\n",
            "target_modules",
        ),
        (
            "train.py",
            "args = SFTConfig(per_device_train_batch_size=1)\nlora = LoraConfig(target_modules=',')\n",
            "target_modules",
        ),
    ],
)
def test_lora_targets_that_name_no_module_are_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str, text: str, key: str
) -> None:
    """An empty target list reached the fit search, whose min() of nothing raised ValueError."""
    path = tmp_path / name
    path.write_text(text)
    status, _, err = plan_command(capsys, path)
    assert status == 2 and f"'{key}'" in err and "Traceback" not in err


def test_a_setting_the_file_gave_is_blamed_on_the_file_not_on_a_flag_never_typed(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "axolotl.yaml"
    path.write_text(
        "base_model: Qwen/Qwen2.5-7B\nadapter: lora\nlora_target_modules: [foo_proj]\n"
        "sequence_len: 1024\nmicro_batch_size: 1\n"
    )
    status, out, err = plan_command(capsys, path)
    assert status == 2 and out == ""
    assert f"--from: {path}: its lora_targets (what --lora-targets sets)" in err
    assert "no module 'foo_proj'" in err
    # Typed on the command line, the same mistake is the flag's.
    status = main(["plan", "--model", "qwen2.5-7b", "--from", str(path), "--lora-targets", "bar"])
    err = capsys.readouterr().err
    assert status == 2 and "error: --lora-targets: the model has no module 'bar'" in err


@pytest.mark.parametrize("value", ["1" + "0" * 400, "Infinity", "NaN"])
def test_a_number_past_floats_range_is_a_usage_error(tmp_path: Path, value: str) -> None:
    # hypothesis found it: json.loads reads 10**400 as an int that float() refuses (OverflowError)
    path = tmp_path / "llama_factory.json"
    path.write_text(
        '{"model_name_or_path": "qwen2.5-7b", "stage": "sft", "num_train_epochs": ' + value + "}"
    )
    with pytest.raises(UsageError) as caught:
        read_plan_file(path)
    assert "'num_train_epochs' must be a finite number" in str(caught.value)


def test_a_deepspeed_bucket_past_floats_range_is_a_usage_error(tmp_path: Path) -> None:
    path = tmp_path / "ds_config.json"
    big = "1" + "0" * 400
    path.write_text('{"zero_optimization": {"stage": 2, "reduce_bucket_size": ' + big + "}}")
    with pytest.raises(UsageError) as caught:
        read_plan_file(path)
    assert "reduce_bucket_size' must be a whole number of elements" in str(caught.value)


def test_a_snippet_dropout_past_floats_range_is_refused_by_the_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "train.py"
    path.write_text(
        "from peft import LoraConfig\nfrom transformers import TrainingArguments\n"
        f"config = LoraConfig(r=8, lora_dropout=1{'0' * 400})\n"
        'args = TrainingArguments(output_dir="x", per_device_train_batch_size=2)\n'
    )
    assert main(["plan", "--model", "qwen2.5-0.5b", "--from", str(path)]) == 2
    assert "lora_dropout" in capsys.readouterr().err
