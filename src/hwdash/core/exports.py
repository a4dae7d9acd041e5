"""A plan as the configs of the tools that run it: DeepSpeed JSON, a Hugging Face Trainer snippet,
an accelerate YAML, and the ``hf jobs`` command line.

Pure: each function takes a plan (and what it needs of the estimate) and returns a value or text;
the CLI writes it. What each field means in the target tool:

* DeepSpeed config (deepspeed.ai/docs/config-json): ``train_batch_size`` must equal
  ``train_micro_batch_size_per_gpu * gradient_accumulation_steps * data-parallel GPUs``;
  ``zero_optimization.offload_optimizer`` / ``offload_param`` with ``device: cpu`` and
  ``pin_memory``; ``bf16`` / ``fp16`` blocks with ``enabled``.
* ``TrainingArguments`` (transformers) and TRL's ``SFTConfig`` / ``GRPOConfig`` / ``PPOConfig``:
  ``per_device_train_batch_size``, ``gradient_accumulation_steps``, ``gradient_checkpointing``,
  ``bf16`` / ``fp16``, ``optim`` (``adamw_torch_fused``, ``adamw_torch``, ``adamw_bnb_8bit``,
  ``adafactor``, ``sgd``), ``deepspeed``, ``num_train_epochs``; PEFT's ``LoraConfig`` (``r``,
  ``lora_alpha``, ``target_modules``, ``lora_dropout``, ``use_dora``); transformers'
  ``BitsAndBytesConfig`` (``load_in_4bit`` with NF4, ``load_in_8bit``).
* accelerate config (``accelerate config`` writes it): ``distributed_type``, ``num_processes``,
  ``mixed_precision`` and a ``deepspeed_config`` block.
* ``hf jobs uv run --flavor FLAVOR --timeout T SCRIPT`` (huggingface_hub's jobs CLI).
"""

from __future__ import annotations

import math
from typing import Any

from hwdash.core.catalog import Catalog
from hwdash.core.plan import Method, Offload, Optimizer, OptimizerImpl, Plan, Precision
from hwdash.core.results import PlanReport

EXPORT_FORMATS = ("deepspeed", "trainer", "accelerate", "hf-jobs")

GRADIENT_CLIPPING = 1.0
"""``max_grad_norm`` / ``gradient_clipping``: the Trainer's default."""

TIMEOUT_MARGIN = 0.25
"""The ``hf jobs`` timeout is the estimated time plus this share (the estimate is FLOPs-based and
jobs also download the model and data), rounded up to the minute."""

FILE_SUFFIXES = {"deepspeed": "json", "trainer": "py", "accelerate": "yaml", "hf-jobs": "sh"}
"""The file name ending each format is written with (the dashboard names files by it)."""

DEEPSPEED_CONFIG_NAME = "ds_config.json"
"""The file name the Trainer and accelerate exports point at for the DeepSpeed block."""


def half_precision(plan: Plan, bf16_hardware: bool = True) -> str | None:
    """``bf16``, ``fp16`` or None (fp32): the 16-bit dtype the run computes in."""
    if plan.precision is Precision.FP32:
        return None
    return "bf16" if bf16_hardware else "fp16"


def trained_method(plan: Plan) -> Method:
    """The method the weights are trained with (the policy's, for RL)."""
    return plan.rl_method if plan.is_rl else plan.method


# -- DeepSpeed ----------------------------------------------------------------------------------


def deepspeed_config(plan: Plan, gpus: int, *, bf16_hardware: bool = True) -> dict[str, Any]:
    """The DeepSpeed JSON config of a plan run on ``gpus`` data-parallel GPUs."""
    if not plan.is_training:
        raise ValueError("DeepSpeed configs are for training plans; inference has none")
    zero: dict[str, Any] = {
        "stage": plan.zero,
        "overlap_comm": True,
        "contiguous_gradients": True,
    }
    if plan.offload in (Offload.OPTIMIZER, Offload.PARAMS):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if plan.offload is Offload.PARAMS:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    half = half_precision(plan, bf16_hardware)
    return {
        "train_batch_size": plan.batch * plan.grad_accum * gpus,
        "train_micro_batch_size_per_gpu": plan.batch,
        "gradient_accumulation_steps": plan.grad_accum,
        "gradient_clipping": GRADIENT_CLIPPING,
        "zero_optimization": zero,
        "bf16": {"enabled": half == "bf16"},
        "fp16": {"enabled": half == "fp16"},
    }


# -- Hugging Face Trainer / TRL -------------------------------------------------------------------

OPTIM_NAMES = {
    (Optimizer.ADAMW, OptimizerImpl.FUSED): "adamw_torch_fused",
    (Optimizer.ADAMW, OptimizerImpl.FOREACH): "adamw_torch",
    (Optimizer.ADAMW, OptimizerImpl.FOR_LOOP): "adamw_torch",
    (Optimizer.ADAMW_8BIT, None): "adamw_bnb_8bit",
    (Optimizer.ADAFACTOR, None): "adafactor",
    (Optimizer.SGD, None): "sgd",
}


def optim_name(plan: Plan) -> str:
    """The Trainer's ``optim`` value for the plan's optimizer."""
    impl = plan.optimizer_impl if plan.optimizer is Optimizer.ADAMW else None
    return OPTIM_NAMES[(plan.optimizer, impl)]


def _config_class(plan: Plan) -> str:
    if plan.method is Method.GRPO:
        return "GRPOConfig"
    if plan.method is Method.PPO:
        return "PPOConfig"
    return "SFTConfig" if trained_method(plan) is not Method.FULL else "TrainingArguments"


def _py(value: Any) -> str:
    """A Python literal (``repr`` of str, int, float, bool, list)."""
    if isinstance(value, tuple):
        value = list(value)
    return repr(value)


def trainer_snippet(plan: Plan, model_id: str, *, bf16_hardware: bool = True) -> str:
    """A Python snippet building the Trainer (or TRL) arguments, PEFT and bitsandbytes configs.

    Every value is a literal, so ``hwdash plan --from`` can read the snippet back.
    """
    if not plan.is_training:
        raise ValueError("Trainer arguments are for training plans; inference has none")
    method = trained_method(plan)
    half = half_precision(plan, bf16_hardware)
    # How the weights are loaded: fp32 for amp/fp32 (the Trainer autocasts), 16-bit otherwise.
    dtype = "float32" if plan.precision in (Precision.FP32, Precision.AMP) else "bfloat16"
    if dtype == "bfloat16" and not bf16_hardware:
        dtype = "float16"
    config_class = _config_class(plan)
    lines = [
        f"# hwdash plan: {model_id}, {plan.method.value}"
        + (f" (policy {method.value})" if plan.is_rl else "")
        + f", precision {plan.precision.value}",
        "import torch",
    ]
    imports = []
    if config_class == "TrainingArguments":
        imports.append("from transformers import TrainingArguments")
    else:
        imports.append(f"from trl import {config_class}")
    if method in (Method.LORA, Method.DORA, Method.QLORA, Method.LORA_8BIT):
        imports.append("from peft import LoraConfig")
    if method in (Method.QLORA, Method.LORA_8BIT):
        imports.append("from transformers import BitsAndBytesConfig")
    lines += imports
    lines += [
        "",
        f"MODEL = {_py(model_id)}",
        f"MODEL_DTYPE = {_py(dtype)}  # AutoModelForCausalLM.from_pretrained(MODEL, torch_dtype=...)",
        f"MAX_LENGTH = {plan.seq}  # tokens per example",
        "",
    ]
    arguments: list[tuple[str, Any]] = [
        ("output_dir", "out"),
        ("per_device_train_batch_size", plan.batch),
        ("gradient_accumulation_steps", plan.grad_accum),
        ("gradient_checkpointing", plan.grad_ckpt),
        ("bf16", half == "bf16" and plan.precision is not Precision.FP32),
        ("fp16", half == "fp16"),
        ("optim", optim_name(plan)),
        ("max_grad_norm", GRADIENT_CLIPPING),
        ("num_train_epochs", plan.epochs),
    ]
    if config_class == "SFTConfig":
        arguments.append(("max_length", plan.seq))
    if plan.zero:
        arguments.append(("deepspeed", DEEPSPEED_CONFIG_NAME))
    lines.append("args = " + config_class + "(")
    lines += [f"    {name}={_py(value)}," for name, value in arguments]
    lines.append(")")
    if method in (Method.LORA, Method.DORA, Method.QLORA, Method.LORA_8BIT):
        targets: Any = (
            "all-linear" if "all-linear" in plan.lora_targets else list(plan.lora_targets)
        )
        lines += [
            "peft_config = LoraConfig(",
            f"    r={plan.lora_r},",
            f"    lora_alpha={2 * plan.lora_r},",
            f"    target_modules={_py(targets)},",
            f"    lora_dropout={_py(plan.lora_dropout)},",
            f"    use_dora={method is Method.DORA},",
            '    task_type="CAUSAL_LM",',
            ")",
        ]
    if method is Method.QLORA:
        lines += [
            "quantization_config = BitsAndBytesConfig(",
            "    load_in_4bit=True,",
            '    bnb_4bit_quant_type="nf4",',
            "    bnb_4bit_use_double_quant=True,",
            f"    bnb_4bit_compute_dtype=torch.{'bfloat16' if bf16_hardware else 'float16'},",
            ")",
        ]
    if method is Method.LORA_8BIT:
        lines += ["quantization_config = BitsAndBytesConfig(load_in_8bit=True)"]
    return "\n".join(lines) + "\n"


# -- accelerate ---------------------------------------------------------------------------------


def accelerate_config(plan: Plan, gpus: int, *, bf16_hardware: bool = True) -> dict[str, Any]:
    """The accelerate config (what ``accelerate config`` writes to default_config.yaml)."""
    half = half_precision(plan, bf16_hardware)
    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "DEEPSPEED" if plan.zero else ("MULTI_GPU" if gpus > 1 else "NO"),
        "num_machines": 1,
        "machine_rank": 0,
        "num_processes": gpus,
        "mixed_precision": half or "no",
        "use_cpu": False,
    }
    if plan.zero:
        config["deepspeed_config"] = {
            "zero_stage": plan.zero,
            "gradient_accumulation_steps": plan.grad_accum,
            "gradient_clipping": GRADIENT_CLIPPING,
            "offload_optimizer_device": "cpu" if plan.offload is not Offload.NONE else "none",
            "offload_param_device": "cpu" if plan.offload is Offload.PARAMS else "none",
            "zero3_init_flag": plan.zero == 3,
        }
    return config


# -- hf jobs ------------------------------------------------------------------------------------


def job_timeout_minutes(hours: float) -> int:
    """The estimated hours plus :data:`TIMEOUT_MARGIN`, in whole minutes (at least 10); from two
    hours on, rounded up to whole hours."""
    minutes = max(10, math.ceil(hours * 60 * (1 + TIMEOUT_MARGIN)))
    return math.ceil(minutes / 60) * 60 if minutes >= 120 else minutes


def timeout_text(minutes: int) -> str:
    """``90m``, or ``3h`` when it is whole hours (the ``--timeout`` forms the jobs CLI takes)."""
    return f"{minutes // 60}h" if minutes % 60 == 0 else f"{minutes}m"


def hf_jobs_command(
    flavor_id: str, hours: float, price_per_hour: float | None, script: str = "train.py"
) -> str:
    """The ``hf jobs uv run`` line with the timeout from the estimate, and what it may cost."""
    minutes = job_timeout_minutes(hours)
    lines = [
        f"# estimated {hours:.2f} h; timeout = estimate + {TIMEOUT_MARGIN:.0%} margin",
    ]
    if price_per_hour is not None:
        expected = hours * price_per_hour
        ceiling = minutes / 60 * price_per_hour
        lines.append(
            f"# cost: about ${expected:.2f} (at most ${ceiling:.2f} if it runs to the timeout)"
        )
    lines.append(f"hf jobs uv run --flavor {flavor_id} --timeout {timeout_text(minutes)} {script}")
    return "\n".join(lines) + "\n"


# -- one entry point for the CLI and the dashboard ------------------------------------------------


def export_text(kind: str, report: PlanReport, catalog: Catalog) -> tuple[str, list[str]]:
    """The plan of ``report`` as ``kind`` (one of :data:`EXPORT_FORMATS`), and notes for the user.

    The hardware is the plan's first ``--flavor``, else the recommended flavor: its bf16 support
    and (for a named flavor) its GPU count. Raises ``ValueError`` with the reason when the plan
    cannot be written in that format.
    """
    import yaml

    from hwdash.core import strict_json

    plan = report.plan
    flavor_id = plan.flavors[0] if plan.flavors else report.recommended
    flavor = catalog.flavors.get(flavor_id) if flavor_id else None
    accelerator = catalog.accelerator_for(flavor) if flavor is not None else None
    bf16 = accelerator.bf16 if accelerator is not None else True
    gpus = plan.gpus
    if plan.flavors and flavor is not None and flavor.gpu_count:
        gpus = flavor.gpu_count
    notes: list[str] = []
    if kind == "deepspeed":
        if plan.precision in (Precision.BF16, Precision.AMP):
            notes.append(
                "DeepSpeed's bf16/fp16 keeps an fp32 master copy: the memory is that of "
                "--precision mixed"
            )
        config = deepspeed_config(plan, gpus, bf16_hardware=bf16)
        return strict_json.dumps(config, indent=2) + "\n", notes
    if kind == "trainer":
        model_id = report.model.hf_id or report.model.id  # what from_pretrained takes
        if plan.zero:
            notes.append(
                f"the snippet points at {DEEPSPEED_CONFIG_NAME}: write it with --export deepspeed"
            )
        return trainer_snippet(plan, model_id, bf16_hardware=bf16), notes
    if kind == "accelerate":
        config = accelerate_config(plan, gpus, bf16_hardware=bf16)
        return yaml.safe_dump(config, sort_keys=False), notes
    if kind == "hf-jobs":
        fit = next((f for f in report.flavors if f.flavor.id == flavor_id), None)
        if fit is None or flavor is None or flavor.provider != "hf-jobs":
            raise ValueError(
                "hf-jobs needs a Hugging Face Jobs flavor: give --flavor ID, or a plan that one "
                "of them fits"
            )
        if fit.hours is None:
            raise ValueError(
                "hf-jobs needs the run's length for its timeout: add --examples or --tokens"
            )
        return hf_jobs_command(flavor.id, fit.hours, flavor.price_per_hour), notes
    raise ValueError(f"unknown export format {kind!r} (choose from {', '.join(EXPORT_FORMATS)})")
