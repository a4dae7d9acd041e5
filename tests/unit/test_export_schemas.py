"""`hwdash plan --export` read by the libraries that run it: transformers' ``TrainingArguments`` and
``BitsAndBytesConfig``, TRL's ``SFTConfig``, PEFT's ``LoraConfig``, DeepSpeed's ``DeepSpeedConfig``
and accelerate's config file loader.

These need the ``validate`` extra (CPU torch, transformers, peft, trl, accelerate, deepspeed) and
skip without it; ``.ci/run`` installs it and runs them with ``HWDASH_REQUIRE_VALIDATE=1``, where a
skip is a failure (tests/conftest.py). Each writes the file with the CLI, as a user gets it.
"""

from __future__ import annotations

import ast
import inspect
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from hwdash.cli import main

pytestmark = [pytest.mark.validate, pytest.mark.usefixtures("quiet_machine")]

MODEL = ["--model", "qwen2.5-7b"]


def export(
    capsys: pytest.CaptureFixture[str], kind: str, args: str, path: Path, *extra: str
) -> str:
    status = main(["plan", *MODEL, *args.split(), *extra, "--export", kind, "-o", str(path)])
    err = capsys.readouterr().err
    assert status == 0, err
    return path.read_text()


def snippet_calls(text: str) -> dict[str, dict[str, Any]]:
    """Each ``Name(key=value, ...)`` call of the Trainer snippet: its keyword arguments as values
    (literals, ``torch.<dtype>`` for BitsAndBytesConfig's compute dtype, and a call written as an
    argument, such as ``parallelism_config=ParallelismConfig(...)``, built by :func:`build`)."""
    import torch

    calls: dict[str, dict[str, Any]] = {}

    def value_of(value: ast.expr) -> Any:
        if isinstance(value, ast.Attribute) and getattr(value.value, "id", "") == "torch":
            return getattr(torch, value.attr)
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
            return build(value.func.id, {str(k.arg): value_of(k.value) for k in value.keywords})
        return ast.literal_eval(value)

    for node in ast.walk(ast.parse(text)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        calls[node.func.id] = {str(k.arg): value_of(k.value) for k in node.keywords}
    return calls


def config_class(name: str) -> Any:
    """The class a snippet's call names, from the module the snippet imports it from."""
    module = {
        "TrainingArguments": "transformers",
        "BitsAndBytesConfig": "transformers",
        "SFTConfig": "trl",
        "LoraConfig": "peft",
        "GRPOConfig": "trl",
        "ParallelismConfig": "accelerate",
    }[name]
    return getattr(pytest.importorskip(module), name)


def build(name: str, kwargs: dict[str, Any]) -> Any:
    """``name(**kwargs)`` after checking that every keyword is one of its parameters (some of these
    classes swallow unknown keywords in ``**kwargs`` and only log them)."""
    cls = config_class(name)
    parameters = inspect.signature(cls).parameters
    named = {p for p, v in parameters.items() if v.kind is not inspect.Parameter.VAR_KEYWORD}
    unknown = sorted(set(kwargs) - named)
    assert not unknown, f"{name} has no parameter {unknown}"
    return cls(**kwargs)


# -- the Trainer snippet: TrainingArguments / SFTConfig, LoraConfig, BitsAndBytesConfig -----------

TRAINER_PLANS = [
    "--method full --grad-ckpt",
    "--method full --optimizer-impl fused --compile --loss fused-linear",
    "--method full --optimizer sgd --precision fp32",
    "--method full --optimizer adafactor --fsdp full --fsdp-offload --gpus 8",
    "--method full --fsdp shard-grad-op --fsdp-version 1 --gpus 8",
    "--method full --precision mixed --zero 2 --offload optimizer --gpus 2",
    "--method lora --lora-targets q_proj,v_proj --activation-offload",
    "--method dora --optimizer adamw-8bit --lora-dropout 0",
    "--method qlora --optimizer adamw-8bit-paged --grad-ckpt",
    "--method lora-8bit --grad-accum 4",
]


@pytest.mark.parametrize("args", TRAINER_PLANS)
def test_the_libraries_accept_the_trainer_snippet(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: str
) -> None:
    pytest.importorskip("torch")
    monkeypatch.chdir(tmp_path)  # the snippet's output_dir and ds_config.json are relative
    text = export(capsys, "trainer", args, tmp_path / "train.py")
    if "--zero" in args:  # the snippet points at the DeepSpeed file: the Trainer loads it
        export(capsys, "deepspeed", args, tmp_path / "ds_config.json")
    calls = snippet_calls(text)
    arguments_class = "TrainingArguments" if "--method full" in args else "SFTConfig"
    assert arguments_class in calls
    arguments = calls.pop(arguments_class)
    # This machine has no GPU: the Trainer refuses bf16/fp16 unless told to run on the CPU.
    built = build(arguments_class, {**arguments, "use_cpu": True})
    for name in ("per_device_train_batch_size", "gradient_accumulation_steps", "optim", "bf16"):
        assert getattr(built, name) == arguments[name], name
    if "--method full" not in args:
        lora = build("LoraConfig", calls.pop("LoraConfig"))
        assert lora.use_dora is ("--method dora" in args)
    if "--method qlora" in args or "--method lora-8bit" in args:
        quantization = build("BitsAndBytesConfig", calls.pop("BitsAndBytesConfig"))
        assert quantization.load_in_4bit is ("qlora" in args)
    assert not calls, f"a call this test does not check: {sorted(calls)}"


@pytest.mark.parametrize(
    ("args", "replicas", "shard"),
    [
        ("--method full --fsdp hybrid --gpus 16 --gpus-per-node 8", 2, 8),
        ("--method lora --fsdp hybrid --fsdp-offload --gpus 8", 1, 8),
    ],
)
def test_transformers_accepts_the_hybrid_fsdp_snippet(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    args: str,
    replicas: int,
    shard: int,
) -> None:
    """FSDP2 (transformers 5's default) has no ``hybrid_shard``: the snippet asks for a
    replicate x shard device mesh through accelerate's ``ParallelismConfig`` instead."""
    pytest.importorskip("torch")
    monkeypatch.chdir(tmp_path)
    calls = snippet_calls(export(capsys, "trainer", args, tmp_path / "train.py"))
    arguments_class = "TrainingArguments" if "--method full" in args else "SFTConfig"
    arguments = calls[arguments_class]
    built = build(arguments_class, {**arguments, "use_cpu": True})
    mesh = built.parallelism_config
    assert (mesh.dp_replicate_size, mesh.dp_shard_size) == (replicas, shard)
    assert built.fsdp_config.get("version", 2) == 2
    assert built.fsdp_config.get("cpu_offload", False) is ("--fsdp-offload" in args)


@pytest.mark.parametrize(
    ("args", "generations"),
    [
        ("--batch 1 --grad-accum 2", 2),
        ("--batch 4 --grad-accum 4", 8),
        ("--batch 3 --grad-accum 1", 3),
        ("--batch 12 --grad-accum 1", 6),
        ("--batch 11 --grad-accum 1", 11),
    ],
)
def test_trl_accepts_the_grpo_snippet(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    args: str,
    generations: int,
) -> None:
    pytest.importorskip("torch")
    monkeypatch.chdir(tmp_path)
    text = export(capsys, "trainer", f"--method grpo --rl-method lora {args}", tmp_path / "t.py")
    # One process here, as the plan's one GPU: TRL checks the generation batch against it.
    built = build("GRPOConfig", {**snippet_calls(text)["GRPOConfig"], "use_cpu": True})
    assert built.num_generations == generations
    assert built.generation_batch_size % built.num_generations == 0


def test_a_grpo_plan_of_one_completion_a_step_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """TRL's GRPOConfig needs two completions of each prompt in a generation batch: a plan of
    batch 1, one accumulation step and one GPU cannot be written for it."""
    path = tmp_path / "train.py"
    args = ["plan", *MODEL, "--method", "grpo", "--export", "trainer", "-o", str(path)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "--batch" in err and "--grad-accum" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and not path.exists()


def test_the_ppo_snippet_says_which_trl_has_its_config(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """TRL moved PPOConfig/PPOTrainer to trl.experimental.ppo (huggingface/trl#4482; the import
    from ``trl`` is gone from 0.29) and later removed them (huggingface/trl#7020): the snippet
    states the TRL it needs, and the CLI warns."""
    trl = pytest.importorskip("trl")
    path = tmp_path / "train.py"
    assert main(["plan", *MODEL, "--method", "ppo", "--export", "trainer", "-o", str(path)]) == 0
    err = capsys.readouterr().err
    text = path.read_text()
    header = text.split("\nargs = ")[0]
    assert "from trl import PPOConfig" in header
    assert "pip install 'trl<0.29'" in header
    assert "warning" in err and "trl<0.29" in err
    # the pin is right about the TRL installed here: its top level has PPOConfig below 0.29 only
    from packaging.version import Version

    assert hasattr(trl, "PPOConfig") is (Version(trl.__version__) < Version("0.29"))


# -- DeepSpeed ----------------------------------------------------------------------------------


def read_back(config: Any, key: str) -> Any:
    """Where DeepSpeed's parsed config keeps the top-level ``key`` of the JSON file."""
    blocks = {
        "zero_optimization": config.zero_config,
        "bf16": config.bfloat16_config,
        "fp16": config.float16_config,
    }
    return blocks[key] if key in blocks else getattr(config, key)


def assert_read_back(parsed: Any, written: dict[str, Any], where: str) -> None:
    for key, value in written.items():
        held = getattr(parsed, key)
        if isinstance(value, dict):
            assert_read_back(held, value, f"{where}.{key}")
        else:
            assert held == value, f"{where}.{key}: wrote {value!r}, DeepSpeed holds {held!r}"


@pytest.mark.parametrize(
    "args",
    [
        "--method full --precision mixed --zero 2 --offload optimizer",
        "--method full --precision mixed --zero 3 --offload params --batch 4 --grad-accum 8",
        "--method full --precision mixed --zero 1",
        "--method lora --zero 2",
    ],
)
def test_deepspeed_reads_every_key_of_its_config(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, args: str
) -> None:
    pytest.importorskip("deepspeed")
    from deepspeed.runtime.config import DeepSpeedConfig

    path = tmp_path / "ds_config.json"
    written = json.loads(export(capsys, "deepspeed", args, path))
    # One process here (world size 1): train_batch_size is checked against micro x accumulation.
    parsed = DeepSpeedConfig(str(path))
    for key, value in written.items():
        held = read_back(parsed, key)
        if isinstance(value, dict):
            assert_read_back(held, value, key)
        else:
            assert held == value, f"{key}: wrote {value!r}, DeepSpeed holds {held!r}"


# -- accelerate ---------------------------------------------------------------------------------

FSDP_CHOICES = {
    "fsdp_sharding_strategy": "FSDP_SHARDING_STRATEGY",
    "fsdp_auto_wrap_policy": "FSDP_AUTO_WRAP_POLICY",
    "fsdp_backward_prefetch": "FSDP_BACKWARD_PREFETCH",
    "fsdp_state_dict_type": "FSDP_STATE_DICT_TYPE",
}
"""accelerate.utils.constants' list of the values each FSDP key takes."""


@pytest.mark.parametrize(
    "args",
    [
        "--method full --gpus 4",
        "--method full --precision mixed --zero 3 --offload params --gpus 8",
        "--method full --fsdp full --fsdp-offload --gpus 8",
        "--method lora --fsdp hybrid --gpus 16 --gpus-per-node 8",
        "--method full --fsdp shard-grad-op --gpus 8",
    ],
)
def test_accelerate_loads_its_config(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, args: str
) -> None:
    pytest.importorskip("accelerate")
    from accelerate.commands.config.config_args import ClusterConfig
    from accelerate.commands.launch import launch_command_parser
    from accelerate.utils import constants

    path = tmp_path / "default_config.yaml"
    written = yaml.safe_load(export(capsys, "accelerate", args, path))
    # accelerate's own loader: unknown top-level keys and distributed types are errors.
    loaded = ClusterConfig.from_yaml_file(str(path))
    assert loaded.num_processes == written["num_processes"]
    # `accelerate launch` copies each key of these blocks onto its argument of the same name
    # (commands/launch.py), silently: a key that is no argument is lost.
    launch_options = {action.dest for action in launch_command_parser()._actions}
    for block in ("deepspeed_config", "fsdp_config"):
        unknown = sorted(set(getattr(loaded, block) or {}) - launch_options)
        assert not unknown, f"accelerate launch has no option {unknown} ({block})"
    for key, constant in FSDP_CHOICES.items():
        if loaded.fsdp_config and key in loaded.fsdp_config:
            assert loaded.fsdp_config[key] in getattr(constants, constant), key
    # accelerate hands the offload devices to DeepSpeed: its enum of them.
    offload = pytest.importorskip("deepspeed.runtime.zero.offload_config")
    devices = {device.value for device in offload.OffloadDeviceEnum}
    for key in ("offload_optimizer_device", "offload_param_device"):
        if loaded.deepspeed_config:
            assert loaded.deepspeed_config[key] in devices, key
