# ruff: noqa: SIM905 - flag lists read best as one string each
"""`hwdash plan --export` and `--from`: configs that the tools accept, read back to the same plan."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from monitor_cli import run_plan

from hwdash.core.plan import FsdpMode, Loss, Method, Offload, Optimizer, Plan, Precision
from hwdash.core.plans import exports
from hwdash.errors import UsageError

pytestmark = pytest.mark.usefixtures("quiet_machine")


CONFIGS = Path(__file__).resolve().parent.parent / "data" / "configs"


def plan_of(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    status, out, err = run_plan(capsys, *args, "--json")
    assert status == 0, err
    return json.loads(out)  # type: ignore[no-any-return]


# -- pure checks of each format -------------------------------------------------------------------


@pytest.mark.parametrize("gpus", [1, 2, 8])
@pytest.mark.parametrize("offload", list(Offload))
def test_deepspeed_batch_arithmetic_and_blocks(gpus: int, offload: Offload) -> None:
    plan = Plan(
        model="qwen2.5-7b",
        method=Method.FULL,
        precision=Precision.MIXED,
        batch=3,
        grad_accum=5,
        zero=3,
        offload=offload,
    )
    config = exports.deepspeed_config(plan, gpus)
    assert config["train_batch_size"] == 3 * 5 * gpus
    assert config["train_micro_batch_size_per_gpu"] == 3
    assert config["gradient_accumulation_steps"] == 5
    zero = config["zero_optimization"]
    assert zero["stage"] == 3 and zero["overlap_comm"] and zero["contiguous_gradients"]
    assert ("offload_optimizer" in zero) == (offload is not Offload.NONE)
    assert ("offload_param" in zero) == (offload is Offload.PARAMS)
    for block in ("offload_optimizer", "offload_param"):
        if block in zero:
            assert zero[block] == {"device": "cpu", "pin_memory": True}
    assert config["bf16"] == {"enabled": True} and config["fp16"] == {"enabled": False}
    assert exports.deepspeed_config(plan, 1, bf16_hardware=False)["fp16"] == {"enabled": True}


def test_trainer_snippet_is_python_with_the_plans_arguments() -> None:
    plan = Plan(model="qwen2.5-7b", method=Method.QLORA, batch=2, grad_accum=8, grad_ckpt=True)
    text = exports.trainer_snippet(plan, "Qwen/Qwen2.5-7B")
    compile(text, "snippet.py", "exec")  # valid Python
    assert "per_device_train_batch_size=2," in text
    assert "gradient_accumulation_steps=8," in text
    assert "gradient_checkpointing=True," in text
    assert "optim='adamw_torch'," in text
    assert "load_in_4bit=True," in text and "LoraConfig(" in text


@pytest.mark.parametrize(
    ("method", "config_class"),
    [
        (Method.FULL, "TrainingArguments"),
        (Method.LORA, "SFTConfig"),
        (Method.GRPO, "GRPOConfig"),
        (Method.PPO, "PPOConfig"),
    ],
)
def test_trainer_snippet_picks_the_config_class(method: Method, config_class: str) -> None:
    # batch 2: GRPO needs two completions of a prompt in a generation batch (grpo_generations)
    text = exports.trainer_snippet(Plan(model="qwen2.5-7b", method=method, batch=2), "m")
    assert f"args = {config_class}(" in text


def test_accelerate_config_types() -> None:
    plan = Plan(model="qwen2.5-7b", method=Method.FULL, precision=Precision.MIXED, zero=2)
    config = yaml.safe_load(yaml.safe_dump(exports.accelerate_config(plan, 4)))
    assert config["distributed_type"] == "DEEPSPEED"
    assert config["num_processes"] == 4 and config["mixed_precision"] == "bf16"
    assert config["deepspeed_config"]["zero_stage"] == 2
    assert (
        exports.accelerate_config(plan.model_copy(update={"zero": 0}), 1)["distributed_type"]
        == "NO"
    )


def test_hf_jobs_timeout_has_the_margin_and_the_cost(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run_plan(
        capsys,
        "--model",
        "qwen2.5-0.5b",
        "--examples",
        "2000",
        "--flavor",
        "a10g-large",
        "--export",
        "hf-jobs",
    )
    assert status == 0
    command = out.strip().splitlines()[-1]
    assert command.startswith("hf jobs uv run --flavor a10g-large --timeout ")
    document = plan_of(
        capsys, "--model", "qwen2.5-0.5b", "--examples", "2000", "--flavor", "a10g-large"
    )
    hours = document["flavors"][0]["hours"]
    timeout = command.split("--timeout ")[1].split()[0]
    minutes = int(timeout[:-1]) * (60 if timeout.endswith("h") else 1)
    assert hours * 60 * 1.25 <= minutes < hours * 60 * 1.25 + 60
    assert "cost: about $" in out


def test_hf_jobs_without_a_run_length_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run_plan(
        capsys, "--model", "qwen2.5-0.5b", "--flavor", "a10g-large", "--export", "hf-jobs"
    )
    assert status == 2 and "--examples" in err


# -- round trips: export, then --from gives the same estimate ---------------------------------------

ROUND_TRIP_PLANS = [
    "--model qwen2.5-7b --method full --precision mixed --zero 3 --offload optimizer --batch 2 --grad-accum 4 --gpus 4 --flavor a10g-largex4".split(),
    "--model qwen2.5-7b --method full --precision fp32 --zero 2 --batch 1 --gpus 4 --flavor a100x4".split(),
    "--model qwen2.5-3b --method full --precision mixed --zero 1 --batch 4 --grad-accum 2 --gpus 4 --flavor l4x4".split(),
]


@pytest.mark.parametrize("args", ROUND_TRIP_PLANS)
def test_deepspeed_round_trip(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str]
) -> None:
    path = tmp_path / "ds.json"
    assert run_plan(capsys, *args, "--export", "deepspeed", "-o", str(path))[0] == 0
    original = plan_of(capsys, *args)
    model_and_method = args[:4]
    flavor = args[args.index("--flavor") :][:2]
    again = plan_of(capsys, *model_and_method, *flavor, "--from", str(path))
    assert again["memory"] == original["memory"]
    assert again["flavors"] == original["flavors"]


TRAINER_PLANS = [
    "--model qwen2.5-7b --method qlora --batch 2 --grad-accum 8 --grad-ckpt --lora-r 64 --seq 4096".split(),
    # issue 13: the savers the Trainer/TRL have a field for, and FSDP
    # (--liger: the Trainer's use_liger_kernel, its one switch for the fused loss, brings Liger's
    # norms and SwiGLU too; a --loss fused-linear plan without --liger reads back with them)
    "--model qwen2.5-3b --method lora --grad-ckpt --compile --liger --activation-offload --optimizer adamw-8bit-paged".split(),
    "--model qwen2.5-3b --method full --compile --optimizer adamw-8bit-paged".split(),
    "--model qwen2.5-3b --method full --fsdp full --gpus 4".split(),
    "--model qwen2.5-3b --method full --precision mixed --fsdp hybrid --fsdp-offload --gpus 8 --grad-ckpt".split(),
    "--model qwen2.5-3b --method lora --fsdp hybrid --gpus 16 --gpus-per-node 4".split(),
    # issue 22: accelerate's sync_each_batch through the Trainer's accelerator_config
    "--model qwen2.5-3b --method full --fsdp full --gpus 4 --grad-accum 4 --sync-each-batch".split(),
    "--model qwen2.5-7b --method dora --lora-targets q_proj,v_proj --optimizer adamw-8bit --epochs 3".split(),
    "--model qwen2.5-3b --method full --precision amp --optimizer-impl fused".split(),
    "--model qwen2.5-3b --method lora-8bit --batch 8".split(),
    "--model qwen2.5-0.5b --method grpo --rl-method lora --batch 4".split(),
]


@pytest.mark.parametrize("args", TRAINER_PLANS)
def test_trainer_round_trip(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str]
) -> None:
    path = tmp_path / "train_args.py"
    assert run_plan(capsys, *args, "--export", "trainer", "-o", str(path))[0] == 0
    original = plan_of(capsys, *args)
    # the model comes from the snippet too; the GPU count is the launcher's, not the snippet's
    gpus = args[args.index("--gpus") :][:2] if "--gpus" in args else []
    again = plan_of(capsys, "--from", str(path), *gpus)
    assert again["memory"] == original["memory"]
    assert again["plan"]["model_id"] == original["plan"]["model_id"]


def test_trainer_with_zero_round_trips_with_its_deepspeed_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    args = [
        "--model",
        "qwen2.5-7b",
        "--method",
        "lora",
        "--precision",
        "mixed",
        "--zero",
        "3",
        "--offload",
        "params",
    ]
    run_plan(capsys, *args, "--export", "deepspeed", "-o", str(tmp_path / "ds_config.json"))
    run_plan(capsys, *args, "--export", "trainer", "-o", str(tmp_path / "train.py"))
    assert (
        plan_of(capsys, "--from", str(tmp_path / "train.py"))["memory"]
        == plan_of(capsys, *args)["memory"]
    )


ACCELERATE_PLANS = [
    "--model qwen2.5-7b --method full --precision mixed --zero 3 --offload params --gpus 8 --grad-accum 2".split(),
    "--model qwen2.5-7b --method lora --precision amp --gpus 2".split(),
    "--model qwen2.5-7b --method full --fsdp full --gpus 4".split(),
    "--model qwen2.5-7b --method full --fsdp full --fsdp-offload --gpus 8".split(),
    "--model qwen2.5-7b --method lora --fsdp hybrid --gpus-per-node 4 --gpus 8".split(),
]


@pytest.mark.parametrize("args", ACCELERATE_PLANS)
def test_accelerate_round_trip(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str]
) -> None:
    path = tmp_path / "default_config.yaml"
    assert run_plan(capsys, *args, "--export", "accelerate", "-o", str(path))[0] == 0
    original = plan_of(capsys, *args)
    again = plan_of(capsys, *args[:4], "--from", str(path))
    assert again["memory"] == original["memory"]


def test_trainer_snippet_carries_the_savers_it_has_fields_for() -> None:
    plan = Plan(
        model="qwen2.5-3b",
        method=Method.LORA,
        compile=True,
        loss=Loss.FUSED_LINEAR,
        activation_offload=True,
        optimizer=Optimizer.ADAMW_8BIT_PAGED,
        fsdp=FsdpMode.HYBRID,
        fsdp_offload=True,
    )
    text = exports.trainer_snippet(plan, "Qwen/Qwen2.5-3B")
    compile(text, "snippet.py", "exec")
    for argument in (
        "torch_compile=True,",
        "use_liger_kernel=True,",
        "activation_offloading=True,",
        "optim='paged_adamw_8bit',",
        # FSDP2 has no hybrid_shard: full sharding over accelerate's replicate x shard mesh
        "fsdp='full_shard offload auto_wrap',",
        "parallelism_config=ParallelismConfig(dp_replicate_size=1, dp_shard_size=1),",
        "from accelerate import ParallelismConfig",
    ):
        assert argument in text
    plain = exports.trainer_snippet(Plan(model="qwen2.5-3b", method=Method.LORA), "m")
    for name in ("torch_compile", "use_liger_kernel", "activation_offloading", "fsdp="):
        assert name not in plain
    # TrainingArguments (full fine-tuning) has no activation_offloading: not written, and said
    full = plan.with_changes({"method": Method.FULL})
    assert "activation_offloading" not in exports.trainer_snippet(full, "m")
    assert "--activation-offload" in exports.uncarried_settings(full, "trainer")
    assert "--activation-offload" not in exports.uncarried_settings(plan, "trainer")


def test_a_grpo_snippet_reads_back_with_nothing_ignored(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    args = "--model qwen2.5-0.5b --method grpo --batch 2 --grad-accum 3".split()
    path = tmp_path / "train.py"
    assert run_plan(capsys, *args, "--export", "trainer", "-o", str(path))[0] == 0
    assert "num_generations=6," in path.read_text()  # the generation batch 2 x 1 x 3
    status, _, err = run_plan(capsys, "--from", str(path), "--json")
    assert status == 0 and "ignored" not in err


def test_a_hybrid_trainer_snippet_reads_back_as_hybrid(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    args = "--model qwen2.5-7b --method full --fsdp hybrid --gpus 16 --gpus-per-node 8".split()
    path = tmp_path / "train.py"
    assert run_plan(capsys, *args, "--export", "trainer", "-o", str(path))[0] == 0
    text = path.read_text()
    assert "ParallelismConfig(dp_replicate_size=2, dp_shard_size=8)" in text
    assert "hybrid_shard" not in text  # transformers 5 (FSDP2) refuses it
    plan = plan_of(capsys, "--from", str(path), "--gpus", "16")["plan"]
    assert (plan["fsdp"], plan["gpus_per_node"]) == ("hybrid", 8)
    # one node (no --gpus-per-node): a mesh of one replica, which is full sharding
    single = "--model qwen2.5-7b --method full --fsdp hybrid --gpus 4".split()
    assert run_plan(capsys, *single, "--export", "trainer", "-o", str(path), "--force")[0] == 0
    assert "ParallelismConfig(dp_replicate_size=1, dp_shard_size=4)" in path.read_text()
    assert plan_of(capsys, "--from", str(path), "--gpus", "4")["plan"]["fsdp"] == "full"


def test_a_hybrid_plan_of_part_of_a_node_is_refused_by_the_trainer_export(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # accelerate's ParallelismConfig must cover every process (replicate x shard = processes,
    # accelerate/parallelism_config.py _validate_accelerator): 12 GPUs are not whole nodes of 8
    args = "--model qwen2.5-7b --method full --fsdp hybrid --gpus 12 --gpus-per-node 8".split()
    status, out, err = run_plan(capsys, *args, "--export", "trainer")
    assert status == 2 and not out
    assert "--gpus" in err and "--gpus-per-node" in err and "Traceback" not in err


def test_sync_each_batch_is_written_where_the_trainer_has_a_field_for_it() -> None:
    plan = Plan(
        model="qwen2.5-3b",
        method=Method.FULL,
        fsdp=FsdpMode.FULL,
        gpus=4,
        grad_accum=4,
        sync_each_batch=True,
    )
    # transformers' TrainingArguments.accelerator_config takes GradientAccumulationPlugin's kwargs
    # under gradient_accumulation_kwargs (transformers/trainer_pt_utils.py AcceleratorConfig)
    text = exports.trainer_snippet(plan, "Qwen/Qwen2.5-3B")
    compile(text, "snippet.py", "exec")
    assert "accelerator_config={'gradient_accumulation_kwargs': {'sync_each_batch': True}}," in text
    for unset in (plan.with_changes({"sync_each_batch": None}), Plan(model="qwen2.5-3b")):
        assert "accelerator_config" not in exports.trainer_snippet(unset, "m")
    # accelerate's config file has no such key: said, and the Trainer export carries it
    assert "--sync-each-batch" in exports.uncarried_settings(plan, "accelerate")
    assert "--sync-each-batch" not in exports.uncarried_settings(plan, "trainer")
    one_batch = plan.with_changes({"grad_accum": 1})
    assert "--sync-each-batch" not in exports.uncarried_settings(one_batch, "accelerate")


def test_sync_each_batch_is_read_from_trainer_configs(tmp_path: Path) -> None:
    from hwdash.core.plans.imports import read_plan_file

    kwargs = {"gradient_accumulation_kwargs": {"sync_each_batch": True}}
    inline = tmp_path / "args.yaml"
    inline.write_text(
        yaml.safe_dump(
            {"per_device_train_batch_size": 1, "fsdp": "full_shard", "accelerator_config": kwargs}
        )
    )
    assert read_plan_file(inline).updates["sync_each_batch"] is True
    # a path: the Trainer reads the JSON file it names (AcceleratorConfig.from_json_file)
    (tmp_path / "accelerator.json").write_text(
        json.dumps({"gradient_accumulation_kwargs": {"sync_each_batch": False}})
    )
    by_path = tmp_path / "by_path.json"
    by_path.write_text(
        json.dumps({"gradient_accumulation_steps": 4, "accelerator_config": "accelerator.json"})
    )
    assert read_plan_file(by_path).updates["sync_each_batch"] is False
    missing = tmp_path / "missing.json"
    missing.write_text(
        json.dumps({"gradient_accumulation_steps": 4, "accelerator_config": "no.json"})
    )
    imported = read_plan_file(missing)
    assert "sync_each_batch" not in imported.updates
    assert any("no.json" in note for note in imported.notes)
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text(
        yaml.safe_dump(
            {
                "per_device_train_batch_size": 1,
                "accelerator_config": {"gradient_accumulation_kwargs": {"sync_each_batch": "yes"}},
            }
        )
    )
    with pytest.raises(UsageError, match="sync_each_batch"):
        read_plan_file(wrong)


def test_accelerate_fsdp_block() -> None:
    plan = Plan(
        model="qwen2.5-7b",
        method=Method.FULL,
        fsdp=FsdpMode.HYBRID,
        gpus_per_node=8,
        gpus=16,
        fsdp_offload=True,
    )
    config = yaml.safe_load(yaml.safe_dump(exports.accelerate_config(plan, 16)))
    assert config["distributed_type"] == "FSDP"
    assert config["num_processes"] == 16 and config["num_machines"] == 2
    assert config["mixed_precision"] == "bf16"
    block = config["fsdp_config"]
    assert block["fsdp_sharding_strategy"] == "HYBRID_SHARD"
    assert block["fsdp_offload_params"] is True
    full = exports.accelerate_config(plan.with_changes({"fsdp": FsdpMode.FULL}), 16)
    assert full["fsdp_config"]["fsdp_sharding_strategy"] == "FULL_SHARD"
    assert "fsdp_config" not in exports.accelerate_config(Plan(model="qwen2.5-7b"), 2)


def test_what_no_format_carries_is_said(capsys: pytest.CaptureFixture[str]) -> None:
    args = "--model qwen2.5-3b --method full --framework torchtune --fsdp full --gpus 2".split()
    status, _, err = run_plan(capsys, *args, "--export", "accelerate")
    assert status == 0
    # torchtune's chunked loss and optimizer-in-backward have no accelerate field
    assert "--loss chunked" in err and "--optimizer-in-backward" in err
    assert "--fsdp" not in err.split("no field for")[1].split(":")[0]
    status, _, err = run_plan(
        capsys, *"--model qwen2.5-7b --method full --tp 2 --gpus 2".split(), "--export", "deepspeed"
    )
    assert status == 0 and "--tp 2 --pp 1" in err


def test_fsdp_files_of_other_spellings(tmp_path: Path) -> None:
    from hwdash.core.plans.imports import read_plan_file

    fsdp2 = tmp_path / "fsdp2.yaml"
    fsdp2.write_text(
        "distributed_type: FSDP\nnum_processes: 4\nmixed_precision: bf16\n"
        "fsdp_config:\n  fsdp_version: 2\n  fsdp_reshard_after_forward: true\n"
        "  fsdp_offload_params: false\n"
    )
    found = read_plan_file(fsdp2)
    assert found.updates["fsdp"] is FsdpMode.FULL and found.updates["fsdp_offload"] is False
    assert found.updates["precision"] is Precision.BF16 and found.notes
    numbered = tmp_path / "old.yaml"
    numbered.write_text(
        "distributed_type: FSDP\nnum_processes: 8\nnum_machines: 2\n"
        "fsdp_config:\n  fsdp_sharding_strategy: 4\n  fsdp_offload_params: true\n"
    )
    found = read_plan_file(numbered)
    assert found.updates["fsdp"] is FsdpMode.HYBRID and found.updates["gpus_per_node"] == 4
    grad_op = tmp_path / "grad_op.yaml"
    grad_op.write_text(
        "distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: SHARD_GRAD_OP\n"
    )
    assert read_plan_file(grad_op).updates["fsdp"] is FsdpMode.SHARD_GRAD_OP
    hybrid_zero2 = tmp_path / "hybrid_zero2.yaml"
    hybrid_zero2.write_text(
        "distributed_type: FSDP\nfsdp_config:\n  fsdp_sharding_strategy: _HYBRID_SHARD_ZERO2\n"
    )
    assert any("not modelled" in note for note in read_plan_file(hybrid_zero2).notes)
    broken = tmp_path / "broken.yaml"
    broken.write_text("distributed_type: FSDP\nfsdp_config:\n  fsdp_offload_params: maybe\n")
    with pytest.raises(UsageError, match="fsdp_offload_params"):
        read_plan_file(broken)
    trainer = tmp_path / "args.json"
    trainer.write_text(
        json.dumps({"per_device_train_batch_size": 2, "fsdp": ["full_shard", "offload"]})
    )
    found = read_plan_file(trainer)
    assert found.updates["fsdp"] is FsdpMode.FULL and found.updates["fsdp_offload"] is True
    trainer.write_text(json.dumps({"per_device_train_batch_size": 2, "fsdp": 3}))
    with pytest.raises(UsageError, match="'fsdp'"):
        read_plan_file(trainer)


# -- other tools' files ---------------------------------------------------------------------------


def test_an_axolotl_qlora_yaml_gives_the_plan_it_describes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    document = plan_of(capsys, "--from", str(CONFIGS / "axolotl-qlora.yaml"))
    plan = document["plan"]
    assert plan["model_id"] == "qwen2.5-7b"
    assert (plan["method"], plan["lora_r"], plan["seq"], plan["batch"], plan["grad_accum"]) == (
        "qlora",
        32,
        4096,
        2,
        4,
    )
    assert (plan["grad_ckpt"], plan["attention"], plan["optimizer"], plan["epochs"]) == (
        True,
        "flash",
        "adamw-8bit-paged",  # axolotl's optimizer: paged_adamw_8bit
        3.0,
    )
    err = capsys.readouterr().err
    assert "ignored" not in err or "learning_rate" in err


def test_a_llama_factory_yaml_gives_the_plan_it_describes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out, err = run_plan(
        capsys, "--from", str(CONFIGS / "llama-factory-lora.yaml"), "--json"
    )
    assert status == 0
    plan = json.loads(out)["plan"]
    assert plan["model_id"] == "llama-3-8b"
    assert (plan["method"], plan["lora_r"], plan["lora_targets"], plan["seq"]) == (
        "lora",
        8,
        ["q_proj", "v_proj"],
        1024,
    )
    assert (plan["batch"], plan["grad_accum"], plan["epochs"], plan["precision"]) == (
        1,
        8,
        3.0,
        "bf16",
    )
    assert "ignored" in err and "learning_rate" in err and "dataset" in err  # one line, listed


def test_flags_on_the_command_line_win_over_the_file(capsys: pytest.CaptureFixture[str]) -> None:
    plan = plan_of(
        capsys, "--from", str(CONFIGS / "axolotl-qlora.yaml"), "--batch", "1", "--seq=512"
    )["plan"]
    assert (plan["batch"], plan["seq"], plan["method"]) == (1, 512, "qlora")


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("broken.yaml", "a: [1, 2\nb: 3\n", "not valid YAML (line"),
        ("broken.json", '{"train_micro_batch_size_per_gpu": 2,\n  oops}', "not valid JSON (line 2"),
        ("what.yaml", "colour: blue\n", "cannot tell what this file configures"),
        (
            "bad.json",
            '{"train_micro_batch_size_per_gpu": "two"}',
            "'train_micro_batch_size_per_gpu' must be a whole number",
        ),
        ("list.yaml", "- 1\n- 2\n", "holds no table"),
    ],
)
def test_a_broken_file_is_exit_2_naming_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str, text: str, message: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    status, _, err = run_plan(capsys, "--model", "qwen2.5-7b", "--from", str(path))
    assert status == 2
    assert str(path) in err and message in err
    assert "Traceback" not in err


def test_output_without_export_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run_plan(capsys, "--model", "qwen2.5-7b", "-o", "x.json")
    assert status == 2 and "--export" in err
