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
  ``lora_alpha``, ``target_modules``, ``lora_dropout``, ``use_dora``, ``modules_to_save``); transformers'
  ``BitsAndBytesConfig`` (``load_in_4bit`` with NF4, ``load_in_8bit``).
  Issue 13's savers where the Trainer has a field: ``torch_compile``, ``use_liger_kernel`` (Liger's
  kernels, whose fused linear cross-entropy is ``--loss fused-linear``; transformers
  ``TrainingArguments`` docs), TRL ``SFTConfig``'s ``activation_offloading``, ``optim``
  ``paged_adamw_8bit`` (bitsandbytes' ``PagedAdamW8bit``; ``paged_adamw_32bit``, ``PagedAdamW32bit``) and ``fsdp`` (``"full_shard"``,
  ``"offload"``, ``"auto_wrap"``; the Trainer's FSDP options). Hybrid sharding: transformers 5
  runs FSDP2, which has no ``"hybrid_shard"`` (``TrainingArguments._apply_legacy_fsdp_to_config``
  refuses it unless ``fsdp_config`` says version 1); FSDP2 shards over a replicate x shard device
  mesh, which the Trainer takes as ``parallelism_config=ParallelismConfig(dp_replicate_size=nodes,
  dp_shard_size=gpus_per_node)`` (accelerate/parallelism_config.py: replicate > 1 and shard > 1 is
  HSDP). TRL's ``GRPOConfig`` needs ``num_generations`` (default 8, at least 2) to divide its
  generation batch (trl/trainer/grpo_config.py ``__post_init__``): :func:`grpo_generations`.
  TRL's ``PPOConfig`` is importable from ``trl`` below 0.29 only (huggingface/trl#4482 moved it to
  ``trl.experimental.ppo``; huggingface/trl#7020 removed it): :data:`PPO_TRL_REQUIREMENT`. Issue 22's
  ``sync_each_batch``: ``accelerator_config={"gradient_accumulation_kwargs": {...}}``, which the
  Trainer hands to accelerate's ``GradientAccumulationPlugin`` (transformers/trainer_pt_utils.py
  ``AcceleratorConfig.gradient_accumulation_kwargs``).
* accelerate config (``accelerate config`` writes it): ``distributed_type``, ``num_processes``,
  ``num_machines``, ``mixed_precision`` and a ``deepspeed_config`` or ``fsdp_config`` block
  (``fsdp_sharding_strategy`` FULL_SHARD / HYBRID_SHARD / SHARD_GRAD_OP, with
  ``fsdp_reshard_after_forward``, what FSDP2 reads in its place; ``fsdp_offload_params``;
  accelerate's FSDP plugin takes its mixed-precision policy from ``mixed_precision``: docs "Fully
  Sharded Data Parallel", huggingface.co/docs/accelerate/usage_guides/fsdp). It has no key for
  ``sync_each_batch`` (accelerate/commands/config/config_args.py): the training script passes
  ``GradientAccumulationPlugin(sync_each_batch=True)`` to its ``Accelerator``.

No format here carries: the chunked or legacy loss path, the optimizer step in backward, the
QLoRA extras' and the adapters' dtype (PEFT decides them in code), PPO's shared value head, the
``--framework`` name itself, and Megatron's ``--tp``/``--pp`` (its own launcher arguments):
:func:`uncarried_settings` names those a plan uses, and the CLI says so.
* ``hf jobs uv run --flavor FLAVOR --timeout T SCRIPT`` (huggingface_hub's jobs CLI).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hwdash.core.catalog import Catalog
from hwdash.core.estimator.fsdp_versions import state_dict_kind
from hwdash.core.estimator.savers import Savers, resolve_savers
from hwdash.core.estimator.zero_buffers import zero_settings
from hwdash.core.fsdp_modes import SHARDING_STRATEGIES, keeps_ends_in_root
from hwdash.core.plan import (
    FsdpMode,
    FsdpWrap,
    Loss,
    Method,
    Offload,
    Optimizer,
    OptimizerImpl,
    Plan,
    Precision,
    StoreDtype,
    ValueHead,
)
from hwdash.core.plan_fields import BY_NAME, ZERO_KEYS, file_key
from hwdash.core.plan_unused import plain_data_parallel
from hwdash.core.results import PlanReport
from hwdash.core.specs import Flavor, Framework, Slowdown

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


def deepspeed_config(
    plan: Plan, gpus: int, *, bf16_hardware: bool = True, hidden: int | None = None
) -> dict[str, Any]:
    """The DeepSpeed JSON config of a plan run on ``gpus`` data-parallel GPUs. ``overlap_comm``
    and ``contiguous_gradients`` as the estimate counted them (the plan's, else DeepSpeed's
    defaults); the buffer sizes the plan sets, as numbers (an ``auto`` one resolved for a model of
    width ``hidden``, kept ``"auto"`` without it: the Trainer fills in the same)."""
    if not plan.is_training:
        raise ValueError("DeepSpeed configs are for training plans; inference has none")
    settings = zero_settings(plan, hidden or 0)
    zero: dict[str, Any] = {
        "stage": plan.zero,
        ZERO_KEYS["ds_overlap_comm"]: settings.overlap_comm,
        ZERO_KEYS["ds_contiguous_gradients"]: settings.contiguous_gradients,
    }
    resolved = {
        "ds_reduce_bucket": settings.reduce_bucket,
        "ds_prefetch_bucket": settings.prefetch_bucket,
        "ds_persistence_threshold": settings.persistence_threshold,
    }
    for name, key in ZERO_KEYS.items():
        value = getattr(plan, name)
        if value is None or key in zero:
            continue
        zero[key] = resolved[name] if value == "auto" and hidden else value
    if plan.offload in (Offload.OPTIMIZER, Offload.PARAMS):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if plan.offload is Offload.PARAMS:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    half = half_precision(plan, bf16_hardware)
    return {
        "train_batch_size": plan.batch * plan.grad_accum * gpus,
        file_key("batch", "deepspeed"): plan.batch,
        file_key("grad_accum", "deepspeed"): plan.grad_accum,
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
    (Optimizer.ADAMW_8BIT_PAGED, None): "paged_adamw_8bit",
    (Optimizer.ADAMW_32BIT_PAGED, None): "paged_adamw_32bit",
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


def trainer_fsdp(plan: Plan) -> str | None:
    """The Trainer's ``fsdp`` option string (``"full_shard auto_wrap"``...), or None. Hybrid
    sharding is full sharding within a node: :func:`hybrid_mesh` adds the nodes."""
    if plan.fsdp is FsdpMode.NONE:
        return None
    words = ["shard_grad_op" if plan.fsdp is FsdpMode.SHARD_GRAD_OP else "full_shard"]
    if plan.fsdp_offload:
        words.append("offload")
    words.append("auto_wrap")
    return " ".join(words)


def hybrid_mesh(plan: Plan, gpus: int) -> tuple[int, int] | None:
    """``(dp_replicate_size, dp_shard_size)`` of accelerate's ``ParallelismConfig`` for a hybrid
    FSDP plan on ``gpus`` GPUs: sharded within a node of ``gpus_per_node`` (all of them without
    it, as :func:`hwdash.core.estimator.parallelism.fsdp_shard_size` counts), replicated over the nodes.
    None for other plans; ``ValueError`` when ``gpus`` is not whole nodes."""
    if plan.fsdp is not FsdpMode.HYBRID:
        return None
    shard = max(1, min(gpus, plan.gpus_per_node or gpus))
    if gpus % shard:
        # accelerate refuses a mesh that does not cover every process (replicate x shard must
        # equal num_processes: accelerate/parallelism_config.py _validate_accelerator)
        raise ValueError(
            f"--fsdp hybrid over {gpus} GPUs is not whole nodes of --gpus-per-node {shard}: "
            "give --gpus a multiple of --gpus-per-node"
        )
    return gpus // shard, shard


GRPO_MAX_GENERATIONS = 8
"""TRL's default ``num_generations`` (trl/trainer/grpo_config.py): the snippet writes no more."""


def grpo_generations(plan: Plan, processes: int) -> int:
    """The ``num_generations`` (completions of each prompt) the GRPO snippet writes.

    TRL's ``GRPOConfig`` sets the generation batch to ``per_device_train_batch_size x processes x
    steps_per_generation`` (which defaults to ``gradient_accumulation_steps``) and refuses it unless
    ``num_generations`` divides it and is at least 2 (trl/trainer/grpo_config.py
    ``__post_init__``). This is the largest divisor up to TRL's default of 8; a generation batch
    with none (a prime above 8) gets its smallest divisor above 1. Raises ``ValueError`` naming
    the flags when the generation batch is a single completion.
    """
    generation_batch = plan.batch * processes * plan.grad_accum
    if generation_batch < 2:
        raise ValueError(
            "GRPO needs at least 2 completions of each prompt in a generation batch (TRL's "
            f"num_generations), and --batch {plan.batch} x --grad-accum {plan.grad_accum} x "
            f"{processes} GPU is 1: raise --batch or --grad-accum"
        )
    divisors = [n for n in range(2, generation_batch + 1) if generation_batch % n == 0]
    small = [n for n in divisors if n <= GRPO_MAX_GENERATIONS]
    return max(small) if small else min(divisors)


PPO_TRL_REQUIREMENT = "trl<0.29"
"""The TRL whose top level still has ``PPOConfig``/``PPOTrainer``: 0.29 dropped the deprecated
import from ``trl`` (they lived on in ``trl.experimental.ppo``, huggingface/trl#4482, until
huggingface/trl#7020 removed them); checked against the wheels of 0.28.0 and 0.29.0."""


def uncarried_settings(plan: Plan, kind: str, framework: Framework | None = None) -> list[str]:
    """The plan's settings (in flag words) that the ``kind`` export cannot write, so the tool
    would run without them and ``--from`` cannot read them back. ``framework``: the catalog's
    entry for ``plan.framework`` (None: the packaged one)."""
    savers = resolve_savers(plan, framework)
    trained = trained_method(plan)
    missing: list[str] = []
    if plan.is_training:
        if savers.loss in (Loss.CHUNKED, Loss.LEGACY) or (
            savers.loss is Loss.FUSED_LINEAR and kind != "trainer"
        ):
            missing.append(f"--loss {savers.loss.value}")
        if savers.compile and kind != "trainer":
            missing.append("--compile")
        if savers.activation_offload and (kind != "trainer" or _config_class(plan) != "SFTConfig"):
            missing.append("--activation-offload")
        if savers.optimizer_in_backward:
            missing.append("--optimizer-in-backward")
        missing.extend(_uncarried_code_savers(plan, kind))
        if trained in (Method.QLORA, Method.LORA_8BIT) and savers.qlora_frozen_bytes == 2:
            missing.append("--qlora-frozen-dtype bf16")
        if trained in (Method.LORA, Method.DORA, Method.QLORA, Method.LORA_8BIT) and (
            savers.adapter_dtype is StoreDtype.BF16
        ):
            missing.append("--adapter-dtype bf16")
        if plan.method is Method.PPO and savers.value_head is ValueHead.SHARED:
            missing.append("--value-head shared")
        if plan.fsdp is not FsdpMode.NONE and kind == "deepspeed":
            missing.append(f"--fsdp {plan.fsdp.value}")
        if kind == "accelerate" and _writes_sync_each_batch(plan, savers) and plan.grad_accum > 1:
            missing.append("--sync-each-batch")
        if kind == "accelerate" and plan.zero:
            # accelerate's deepspeed_config block has no buffer keys (a deepspeed_config_file
            # written by --export deepspeed does)
            missing.extend(
                f"{BY_NAME[name].flag} {_flag_value(getattr(plan, name))}"
                for name in ZERO_KEYS
                if getattr(plan, name) is not None
            )
        missing.extend(_uncarried_fsdp(plan, kind))
    if plan.megatron:
        words = [f"--tp {plan.tp} --pp {plan.pp}"]
        words += [
            f"--{name} {getattr(plan, name)}" for name in ("cp", "ep") if getattr(plan, name) > 1
        ]
        if plan.megatron_offload:
            words.append(megatron_offload_arguments(plan))
        missing.append(" ".join(words))
    elif plan.sequence_shards > 1 and kind != "accelerate":
        flag = "--cp" if plan.cp > 1 else "--sp-ulysses"
        missing.append(f"{flag} {plan.sequence_shards}")
    if kind in ("deepspeed", "accelerate"):
        # the method lives in the training code (peft, bitsandbytes, the TRL trainer); the
        # Trainer snippet writes it, these configs have no key for it
        method = f"--method {plan.method.value}"
        if plan.is_rl:
            method += f" --rl-method {plan.rl_method.value}"
        missing.insert(0, method)
    return missing


def _uncarried_code_savers(plan: Plan, kind: str) -> list[str]:
    """Savers applied in the training code that no export writes: torchtitan's selective
    checkpointing (no export writes a torchtitan config), DeepSpeed's TiledMLP (ArcticTraining
    and axolotl patch the model's MLP), Liger's kernels outside the Trainer's snippet (the
    training code applies them: ``AutoLigerKernelForCausalLM``) and DDP's gradients as bucket
    views (``DistributedDataParallel(gradient_as_bucket_view=True)``, or accelerate's
    ``DistributedDataParallelKwargs``; neither a config file nor the Trainer's arguments hold it)."""
    missing = []
    if plan.ddp_bucket_view and plain_data_parallel(plan):
        missing.append("--ddp-bucket-view")
    if plan.selective_ac is not None:
        missing.append(f"--selective-ac {plan.selective_ac}")
    if plan.tiled_mlp:
        missing.append("--tiled-mlp")
    if plan.liger and kind != "trainer":
        missing.append("--liger")
    return missing


def megatron_offload_arguments(plan: Plan) -> str:
    """Megatron-LM's own arguments for the plan's optimizer CPU offload (megatron/training/
    arguments.py: ``--optimizer-cpu-offload`` needs ``--use-precision-aware-optimizer``; the
    distributed optimizer is ``--zero 1``), as the words of :func:`uncarried_settings`."""
    fraction = f"{plan.optimizer_offload_fraction:g}"
    return (
        f"--offload optimizer --optimizer-offload-fraction {fraction} (Megatron-LM: "
        "--use-distributed-optimizer --optimizer-cpu-offload --optimizer-offload-fraction "
        f"{fraction} --use-precision-aware-optimizer --overlap-cpu-optimizer-d2h-h2d)"
    )


def _uncarried_fsdp(plan: Plan, kind: str) -> list[str]:
    """The FSDP settings a ``kind`` export cannot write: the rate limiter and the reduce dtype
    (code: ``FullyShardedDataParallelPlugin``), and, outside accelerate's config, a state dict
    other than the version's default."""
    if plan.fsdp is FsdpMode.NONE:
        return []
    missing = []
    if plan.fsdp_limit_all_gathers is False:
        missing.append("--no-fsdp-limit-all-gathers")
    if plan.fsdp_reduce_fp32:
        missing.append("--fsdp-reduce-fp32")
    if plan.fsdp_wrap is FsdpWrap.NONE and kind not in ("accelerate", "trainer"):
        missing.append("--fsdp-wrap none")
    if _wrap_not_written(plan):
        # TRANSFORMER_BASED_WRAP, written for either layout, gives the version's default one
        missing.append(_WRAP_WORDS[plan.fsdp_version == 1])
    default = plan.model_copy(update={"fsdp_state_dict": None})
    if kind != "accelerate" and state_dict_kind(plan) is not state_dict_kind(default):
        missing.append(f"--fsdp-state-dict {state_dict_kind(plan).value}")
    return missing


#: The layout an explicit ``--fsdp-wrap`` asks for where accelerate's ``TRANSFORMER_BASED_WRAP``
#: gives the other one, by FSDP version (True: FSDP1).
_WRAP_WORDS = {
    False: "--fsdp-wrap transformer (FSDP2 keeps the embedding and output layer in the root unit "
    "only with accelerate before 1.14)",
    True: "--fsdp-wrap transformer-ends (accelerate's FSDP1 auto-wrap leaves the embedding and "
    "output layer in the root unit)",
}


def _wrap_not_written(plan: Plan) -> bool:
    """Whether the plan's explicit unit layout differs from the one its FSDP version gets from
    ``TRANSFORMER_BASED_WRAP`` with the current accelerate (fsdp_modes.keeps_ends_in_root)."""
    if plan.fsdp_wrap in (None, FsdpWrap.NONE):
        return False
    asked = keeps_ends_in_root(plan.fsdp_wrap, plan.fsdp_version)
    return asked != keeps_ends_in_root(None, plan.fsdp_version)


def _flag_value(value: Any) -> str:
    """A buffer field's value as its flag takes it (true/false for the switches)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _writes_sync_each_batch(plan: Plan, savers: Savers) -> bool:
    """Whether the exports say ``sync_each_batch``: on, for an FSDP plan (elsewhere it changes
    nothing hwdash counts)."""
    return savers.sync_each_batch and plan.fsdp is not FsdpMode.NONE


def _py(value: Any) -> str:
    """A Python literal (``repr`` of str, int, float, bool, list)."""
    if isinstance(value, tuple):
        value = list(value)
    return repr(value)


def trainer_snippet(
    plan: Plan,
    model_id: str,
    *,
    bf16_hardware: bool = True,
    framework: Framework | None = None,
    gpus: int | None = None,
) -> str:
    """A Python snippet building the Trainer (or TRL) arguments, PEFT and bitsandbytes configs
    (the savers as ``framework``, the catalog's entry for ``plan.framework``, sets them) for a run
    on ``gpus`` data-parallel processes (None: ``plan.gpus``).

    Every value is a literal (or a call of literals), so ``hwdash plan --from`` can read the
    snippet back. Raises ``ValueError`` when TRL cannot run the plan (:func:`grpo_generations`).
    """
    if not plan.is_training:
        raise ValueError("Trainer arguments are for training plans; inference has none")
    processes = plan.gpus if gpus is None else gpus
    generations = grpo_generations(plan, processes) if plan.method is Method.GRPO else None
    mesh = hybrid_mesh(plan, processes)
    config_class = _config_class(plan)
    lines = _snippet_preamble(plan, model_id, config_class, mesh, bf16_hardware)
    arguments = _trainer_arguments(plan, config_class, generations, bf16_hardware, framework)
    if generations is not None:
        lines.append(
            f"# GRPO: {generations} completions of each prompt; they divide the generation batch "
            f"{plan.batch} x {processes} process(es) x {plan.grad_accum} step(s)"
        )
    lines.append("args = " + config_class + "(")
    lines += [f"    {name}={_py(value)}," for name, value in arguments]
    if mesh is not None:
        # FSDP2's hybrid sharding: a device mesh of nodes x GPUs per node (see the module docs)
        lines.append(
            f"    parallelism_config=ParallelismConfig(dp_replicate_size={mesh[0]}, "
            f"dp_shard_size={mesh[1]}),"
        )
    lines.append(")")
    lines += _lora_config_lines(plan)
    lines += _quantization_config_lines(plan, bf16_hardware)
    return "\n".join(lines) + "\n"


_ADAPTER_METHODS = (Method.LORA, Method.DORA, Method.QLORA, Method.LORA_8BIT)
"""The methods that train PEFT LoRA adapters (the snippet writes a ``LoraConfig``)."""


def _load_dtype(plan: Plan, bf16_hardware: bool) -> str:
    """The ``torch_dtype`` the snippet loads the model in."""
    # How the weights are loaded: fp32 for amp/fp32 (the Trainer autocasts), 16-bit otherwise;
    # under FSDP, mixed means fp32 shards with the bf16 mixed-precision policy: loaded in fp32.
    fp32_loaded: tuple[Precision, ...] = (Precision.FP32, Precision.AMP)
    if plan.fsdp is not FsdpMode.NONE:
        fp32_loaded = (Precision.FP32, Precision.AMP, Precision.MIXED)
    dtype = "float32" if plan.precision in fp32_loaded else "bfloat16"
    if dtype == "bfloat16" and not bf16_hardware:
        dtype = "float16"
    return dtype


def _snippet_preamble(
    plan: Plan,
    model_id: str,
    config_class: str,
    mesh: tuple[int, int] | None,
    bf16_hardware: bool,
) -> list[str]:
    """The snippet's lines before the arguments: the plan in a comment (and TRL's version for
    PPO), the imports, and the model, its dtype and the length as constants."""
    method = trained_method(plan)
    lines = [
        f"# hwdash plan: {model_id}, {plan.method.value}"
        + (f" (policy {method.value})" if plan.is_rl else "")
        + f", precision {plan.precision.value}",
        "import torch",
    ]
    if config_class == "PPOConfig":
        lines.insert(
            1,
            f"# needs pip install '{PPO_TRL_REQUIREMENT}': later TRL has no PPOConfig in trl "
            "(huggingface/trl#4482, #7020)",
        )
    if config_class == "TrainingArguments":
        lines.append("from transformers import TrainingArguments")
    else:
        lines.append(f"from trl import {config_class}")
    if mesh is not None:
        lines.append("from accelerate import ParallelismConfig")
    if method in _ADAPTER_METHODS:
        lines.append("from peft import LoraConfig")
    if method in (Method.QLORA, Method.LORA_8BIT):
        lines.append("from transformers import BitsAndBytesConfig")
    dtype = _load_dtype(plan, bf16_hardware)
    return [
        *lines,
        "",
        f"MODEL = {_py(model_id)}",
        f"MODEL_DTYPE = {_py(dtype)}  # AutoModelForCausalLM.from_pretrained(MODEL, torch_dtype=...)",
        f"MAX_LENGTH = {plan.seq}  # tokens per example",
        "",
    ]


def _trainer_arguments(
    plan: Plan,
    config_class: str,
    generations: int | None,
    bf16_hardware: bool,
    framework: Framework | None,
) -> list[tuple[str, Any]]:
    """The keyword arguments of the Trainer's (or TRL's) config call, in the order written."""
    half = half_precision(plan, bf16_hardware)
    arguments: list[tuple[str, Any]] = [
        ("output_dir", "out"),
        (file_key("batch", "trainer"), plan.batch),
        (file_key("grad_accum", "trainer"), plan.grad_accum),
        (file_key("grad_ckpt", "trainer"), plan.grad_ckpt),
        ("bf16", half == "bf16" and plan.precision is not Precision.FP32),
        ("fp16", half == "fp16"),
        ("optim", optim_name(plan)),
        ("max_grad_norm", GRADIENT_CLIPPING),
        (file_key("epochs", "trainer"), plan.epochs),
    ]
    if config_class == "SFTConfig":
        arguments.append((file_key("seq", "trainer"), plan.seq))
    if generations is not None:
        # generation batch = per-device batch x processes x steps_per_generation (TRL's default:
        # gradient_accumulation_steps); the estimator's policy KV cache counts the same batch
        arguments.append(("num_generations", generations))
    savers = resolve_savers(plan, framework)
    if savers.compile:
        arguments.append(("torch_compile", True))
    if plan.liger or savers.loss is Loss.FUSED_LINEAR:
        # Liger's kernels, its fused linear cross-entropy among them: the Trainer's one switch
        # for a fused loss (which brings Liger's norms and SwiGLU too)
        arguments.append((file_key("liger", "trainer"), True))
    if savers.activation_offload and config_class == "SFTConfig":
        arguments.append(("activation_offloading", True))
    fsdp = trainer_fsdp(plan)
    if fsdp is not None:
        arguments.append(("fsdp", fsdp))
        fsdp_config: dict[str, Any] = {}
        if plan.fsdp_version == 1:
            # the Trainer runs FSDP2 unless fsdp_config says version 1 (training_args.py)
            fsdp_config["version"] = 1
        if plan.fsdp_wrap is FsdpWrap.NONE:
            fsdp_config["auto_wrap_policy"] = "NO_WRAP"  # absent: TRANSFORMER_BASED_WRAP
        if fsdp_config:
            arguments.append(("fsdp_config", fsdp_config))
    if _writes_sync_each_batch(plan, savers):
        arguments.append(
            ("accelerator_config", {"gradient_accumulation_kwargs": {"sync_each_batch": True}})
        )
    if plan.zero:
        arguments.append(("deepspeed", DEEPSPEED_CONFIG_NAME))
    return arguments


def _lora_config_lines(plan: Plan) -> list[str]:
    """PEFT's ``LoraConfig(...)`` for an adapter method (alpha twice the rank); none otherwise."""
    method = trained_method(plan)
    if method not in _ADAPTER_METHODS:
        return []
    targets: Any = "all-linear" if "all-linear" in plan.lora_targets else list(plan.lora_targets)
    lines = [
        "peft_config = LoraConfig(",
        f"    {file_key('lora_r', 'peft')}={plan.lora_r},",
        f"    lora_alpha={2 * plan.lora_r},",
        f"    target_modules={_py(targets)},",
        f"    {file_key('lora_dropout', 'peft')}={_py(plan.lora_dropout)},",
        f"    use_dora={method is Method.DORA},",
        '    task_type="CAUSAL_LM",',
    ]
    if plan.lora_modules_to_save:
        # PEFT trains a full copy of each (ModulesToSaveWrapper)
        lines.append(f"    modules_to_save={_py(list(plan.lora_modules_to_save))},")
    lines.append(")")
    return lines


def _quantization_config_lines(plan: Plan, bf16_hardware: bool) -> list[str]:
    """transformers' ``BitsAndBytesConfig(...)`` for QLoRA (NF4, double quantization) or 8-bit
    LoRA; none otherwise."""
    method = trained_method(plan)
    if method is Method.QLORA:
        return [
            "quantization_config = BitsAndBytesConfig(",
            "    load_in_4bit=True,",
            '    bnb_4bit_quant_type="nf4",',
            "    bnb_4bit_use_double_quant=True,",
            f"    bnb_4bit_compute_dtype=torch.{'bfloat16' if bf16_hardware else 'float16'},",
            ")",
        ]
    if method is Method.LORA_8BIT:
        return ["quantization_config = BitsAndBytesConfig(load_in_8bit=True)"]
    return []


# -- accelerate ---------------------------------------------------------------------------------


def accelerate_config(plan: Plan, gpus: int, *, bf16_hardware: bool = True) -> dict[str, Any]:
    """The accelerate config (what ``accelerate config`` writes to default_config.yaml)."""
    half = half_precision(plan, bf16_hardware)
    distributed = "DEEPSPEED" if plan.zero else ("MULTI_GPU" if gpus > 1 else "NO")
    machines = 1
    if plan.fsdp is not FsdpMode.NONE:
        distributed = "FSDP"
        if plan.fsdp is FsdpMode.HYBRID and plan.gpus_per_node:
            # hybrid shard: sharded within a node, replicated over the nodes
            machines = max(1, gpus // plan.gpus_per_node)
    config: dict[str, Any] = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": distributed,
        "num_machines": machines,
        "machine_rank": 0,
        file_key("gpus", "accelerate"): gpus,  # the flavor's GPUs where one is named
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
    if plan.fsdp is not FsdpMode.NONE:
        config["fsdp_config"] = {
            "fsdp_version": plan.fsdp_version,
            "fsdp_sharding_strategy": SHARDING_STRATEGIES[plan.fsdp],
            # what FSDP2 reads in place of the strategy (accelerate/utils/dataclasses.py)
            "fsdp_reshard_after_forward": plan.fsdp is not FsdpMode.SHARD_GRAD_OP,
            "fsdp_offload_params": plan.fsdp_offload,
            # one unit per decoder layer, or the whole model one unit (--fsdp-wrap none)
            "fsdp_auto_wrap_policy": (
                "NO_WRAP" if plan.fsdp_wrap is FsdpWrap.NONE else "TRANSFORMER_BASED_WRAP"
            ),
            "fsdp_backward_prefetch": "BACKWARD_PRE",
            "fsdp_state_dict_type": f"{state_dict_kind(plan).value.upper()}_STATE_DICT",
            "fsdp_use_orig_params": True,  # PEFT's frozen and trained weights in one unit
            "fsdp_cpu_ram_efficient_loading": True,
            "fsdp_sync_module_states": True,
        }
    parallel = _parallelism_config(plan, gpus)
    if parallel:
        config["parallelism_config"] = parallel
    return config


def _parallelism_config(plan: Plan, gpus: int) -> dict[str, Any]:
    """accelerate's ``parallelism_config`` block for context (FSDP2, ``cp_size``) or Ulysses
    sequence parallelism (DeepSpeed, ``sp_size``): the keys ``accelerate config`` writes with its
    ``parallelism_config_`` prefix (accelerate/commands/config/cluster.py); the data-parallel
    shard is what the sequence split leaves (accelerate/parallelism_config.py: the sizes'
    product is the number of processes). Empty for other plans."""
    prefix = "parallelism_config_"
    if plan.cp > 1 and plan.fsdp is not FsdpMode.NONE:
        mesh = hybrid_mesh(plan, gpus) or (1, gpus)
        return {
            f"{prefix}dp_replicate_size": mesh[0],
            f"{prefix}dp_shard_size": mesh[1] // plan.cp,
            f"{prefix}tp_size": 1,
            f"{prefix}cp_size": plan.cp,
            f"{prefix}cp_backend": "torch",
        }
    if plan.sp_ulysses > 1:
        return {
            f"{prefix}dp_replicate_size": 1,
            f"{prefix}dp_shard_size": gpus // plan.sp_ulysses,
            f"{prefix}sp_size": plan.sp_ulysses,
            f"{prefix}sp_backend": "deepspeed",
        }
    return {}


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
    flavor_id: str,
    hours: float,
    price_per_hour: float | None,
    script: str = "train.py",
    slowdowns: Sequence[Slowdown] = (),
) -> str:
    """The ``hf jobs uv run`` line with the timeout from the estimate (``hours``, the flavor
    table's, with the catalog's ``slowdowns`` in: they are named), and what it may cost."""
    minutes = job_timeout_minutes(hours)
    factors = ", ".join(f"{entry.id} x{entry.factor:g}" for entry in slowdowns)
    included = f" ({factors} included)" if factors else ""
    lines = [
        f"# estimated {hours:.2f} h{included}; timeout = estimate + {TIMEOUT_MARGIN:.0%} margin",
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


def export_flavor_id(report: PlanReport) -> str | None:
    """The flavor an export is written for: the plan's first ``--flavor``, else the recommended
    one (None when neither: the export then assumes bf16 hardware and ``--gpus``)."""
    return report.plan.flavors[0] if report.plan.flavors else report.recommended


def export_text(kind: str, report: PlanReport, catalog: Catalog) -> tuple[str, list[str]]:
    """The plan of ``report`` as ``kind`` (one of :data:`EXPORT_FORMATS`), and notes for the user.

    The hardware is the plan's first ``--flavor``, else the recommended flavor: its bf16 support
    and (for a named flavor) its GPU count. Raises ``ValueError`` with the reason when the plan
    cannot be written in that format.
    """
    target = _export_target(report, catalog)
    notes: list[str] = []
    missing = uncarried_settings(report.plan, kind, target.framework) if kind != "hf-jobs" else []
    if missing:
        notes.append(
            f"{kind} has no field for {', '.join(missing)}: set it in the training code "
            "(--from cannot read it back)"
        )
    write = _EXPORT_WRITERS.get(kind)
    if write is None:
        raise ValueError(
            f"unknown export format {kind!r} (choose from {', '.join(EXPORT_FORMATS)})"
        )
    return write(report, target, notes)


@dataclass(frozen=True)
class _ExportTarget:
    """The hardware and framework an export is written for."""

    flavor_id: str | None
    """:func:`export_flavor_id`."""
    flavor: Flavor | None
    """That flavor in the catalog (None: none, or not in the catalog)."""
    bf16: bool
    """Whether its accelerator computes in bf16 (True without one)."""
    gpus: int
    """Data-parallel GPUs: a named ``--flavor``'s GPU count, else ``--gpus``."""
    framework: Framework | None
    """The catalog's entry for ``plan.framework``."""


def _export_target(report: PlanReport, catalog: Catalog) -> _ExportTarget:
    """The flavor, bf16 support, GPU count and framework of the export of ``report``."""
    plan = report.plan
    flavor_id = export_flavor_id(report)
    flavor = catalog.flavors.get(flavor_id) if flavor_id else None
    accelerator = catalog.accelerator_for(flavor) if flavor is not None else None
    bf16 = accelerator.bf16 if accelerator is not None else True
    gpus = plan.gpus
    if plan.flavors and flavor is not None and flavor.gpu_count:
        gpus = flavor.gpu_count
    return _ExportTarget(flavor_id, flavor, bf16, gpus, catalog.framework_for(plan))


def _export_deepspeed(
    report: PlanReport, target: _ExportTarget, notes: list[str]
) -> tuple[str, list[str]]:
    """``--export deepspeed``: the JSON config."""
    from hwdash.core import strict_json

    plan = report.plan
    if plan.precision in (Precision.BF16, Precision.AMP):
        notes.append(
            "DeepSpeed's bf16/fp16 keeps an fp32 master copy: the memory is that of "
            "--precision mixed"
        )
    config = deepspeed_config(
        plan, target.gpus, bf16_hardware=target.bf16, hidden=report.model.hidden_size
    )
    return strict_json.dumps(config, indent=2) + "\n", notes


def _export_trainer(
    report: PlanReport, target: _ExportTarget, notes: list[str]
) -> tuple[str, list[str]]:
    """``--export trainer``: the Python snippet."""
    plan = report.plan
    model_id = report.model.hf_id or report.model.id  # what from_pretrained takes
    if plan.zero:
        notes.append(
            f"the snippet points at {DEEPSPEED_CONFIG_NAME}: write it with --export deepspeed"
        )
    if plan.method is Method.PPO:
        notes.append(
            f"warning: the PPO snippet needs pip install '{PPO_TRL_REQUIREMENT}' (newer TRL has "
            "no PPOConfig in trl)"
        )
    text = trainer_snippet(
        plan, model_id, bf16_hardware=target.bf16, framework=target.framework, gpus=target.gpus
    )
    return text, notes


def _export_accelerate(
    report: PlanReport, target: _ExportTarget, notes: list[str]
) -> tuple[str, list[str]]:
    """``--export accelerate``: the YAML config."""
    import yaml

    plan = report.plan
    if plan.fsdp is not FsdpMode.NONE and plan.precision is not Precision.BF16:
        notes.append(
            "accelerate's FSDP config cannot say the model's dtype: load it in fp32 for "
            f"--precision {plan.precision.value} (--from reads mixed_precision bf16 under FSDP "
            "as --precision bf16)"
        )
    config = accelerate_config(plan, target.gpus, bf16_hardware=target.bf16)
    return yaml.safe_dump(config, sort_keys=False), notes


def _export_hf_jobs(
    report: PlanReport, target: _ExportTarget, notes: list[str]
) -> tuple[str, list[str]]:
    """``--export hf-jobs``: the command line, for a Hugging Face Jobs flavor and a run length."""
    fit = next((f for f in report.flavors if f.flavor.id == target.flavor_id), None)
    flavor = target.flavor
    if fit is None or flavor is None or flavor.provider != "hf-jobs":
        raise ValueError(
            "hf-jobs needs a Hugging Face Jobs flavor: give --flavor ID, or a plan that one "
            "of them fits"
        )
    if fit.hours is None:
        raise ValueError(
            "hf-jobs needs the run's length for its timeout: add --examples or --tokens"
        )
    return (
        hf_jobs_command(flavor.id, fit.hours, flavor.price_per_hour, slowdowns=fit.slowdowns),
        notes,
    )


_EXPORT_WRITERS: dict[
    str, Callable[[PlanReport, _ExportTarget, list[str]], tuple[str, list[str]]]
] = {
    "deepspeed": _export_deepspeed,
    "trainer": _export_trainer,
    "accelerate": _export_accelerate,
    "hf-jobs": _export_hf_jobs,
}
"""The writer of each of :data:`EXPORT_FORMATS`."""
