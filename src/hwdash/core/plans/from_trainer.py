"""``--from`` Hugging Face ``TrainingArguments`` / TRL config keys (as JSON or YAML, or the keyword
arguments of the ``--export trainer`` snippet), and the Trainer's ``optim`` names, which axolotl
and LLaMA-Factory take too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from hwdash.core.plan import FsdpMode, Optimizer, OptimizerImpl, Precision
from hwdash.core.plans.from_accelerate import (
    FSDP_STRATEGIES,
    STATE_DICTS,
    no_shard,
    read_wrap_policy,
    reshard_strategy,
)
from hwdash.core.plans.from_deepspeed import deepspeed_path
from hwdash.core.plans.from_reader import ConfigReader, ImportedPlan, copy_declared_keys

#: The Trainer's ``optim`` names (``OptimizerNames``, transformers/training_args.py) whose memory
#: hwdash counts, as the plan's optimizer. The Trainer builds them in ``get_optimizer_cls_and_kwargs``
#: (transformers/trainer_optimizer.py): ``adamw_torch`` is ``torch.optim.AdamW`` with torch's
#: default (foreach on CUDA), ``adamw_torch_fused`` the same with ``fused=True``; ``adamw_hf`` was
#: transformers' own AdamW (removed in 5.x), a per-tensor loop kept here as foreach as before;
#: ``adamw_bnb_8bit``, ``adamw_8bit``, ``paged_adamw_8bit`` and ``paged_adamw_32bit`` are
#: bitsandbytes' ``AdamW`` with ``optim_bits`` 8 or 32 ("8bit" in the name) and ``is_paged``
#: ("paged" in the name); ``adafactor`` is transformers' Adafactor; ``sgd`` is ``torch.optim.SGD``.
OPTIMIZERS = {
    "adamw_torch_fused": (Optimizer.ADAMW, OptimizerImpl.FUSED),
    "adamw_torch": (Optimizer.ADAMW, OptimizerImpl.FOREACH),
    "adamw_hf": (Optimizer.ADAMW, OptimizerImpl.FOREACH),
    "adamw_bnb_8bit": (Optimizer.ADAMW_8BIT, None),
    "adamw_8bit": (Optimizer.ADAMW_8BIT, None),
    "paged_adamw_8bit": (Optimizer.ADAMW_8BIT_PAGED, None),
    "paged_adamw_32bit": (Optimizer.ADAMW_32BIT_PAGED, None),
    "adafactor": (Optimizer.ADAFACTOR, None),
    "sgd": (Optimizer.SGD, None),
}

#: What the Trainer's other ``optim`` names are, by a part of the name, for the refusal: their
#: states differ from every optimizer hwdash counts (transformers/trainer_optimizer.py).
UNMODELLED_OPTIMIZERS = (
    ("ademamix", "AdEMAMix keeps three states per parameter"),
    ("lion", "Lion keeps one state per parameter"),
    ("rmsprop", "RMSprop keeps one state per parameter"),
    ("adagrad", "Adagrad keeps one state per parameter"),
    ("galore", "GaLore keeps states of low-rank projected gradients"),
    ("apollo", "APOLLO keeps states of low-rank projected gradients"),
    ("lomo", "LOMO and AdaLomo update the weights inside the backward pass"),
    ("schedule_free", "a schedule-free optimizer (facebookresearch/schedule_free)"),
    ("grokadamw", "GrokAdamW"),
    ("stable_adamw", "StableAdamW (torch-optimi)"),
    ("anyprecision", "AnyPrecisionAdamW (torchdistx)"),
    ("adamw_torch_4bit", "torchao's 4-bit AdamW"),
    ("adamw_torch_8bit", "torchao's 8-bit AdamW"),
    ("xla", "AdamW on XLA devices (TPUs)"),
    ("npu", "AdamW on Ascend NPUs"),
)


def read_optimizer(reader: ConfigReader, key: str, out: ImportedPlan) -> None:
    """The Trainer's ``optim`` name under ``key`` as the plan's optimizer; a name hwdash does not
    count is refused (:attr:`ImportedPlan.refused`), saying what it keeps."""
    name = reader.text(key)
    if name is None:
        return
    if name not in OPTIMIZERS:
        what = next((what for part, what in UNMODELLED_OPTIMIZERS if part in name), None)
        known = f" ({what})" if what else ""
        choices = ", ".join(o.value for o in Optimizer)
        out.refused["optimizer"] = (
            f"{reader.path}: '{key}' is {name!r}{known}: hwdash does not model this optimizer's "
            f"memory yet; give --optimizer ({choices}) to plan one it counts"
        )
        return
    optimizer, impl = OPTIMIZERS[name]
    out.updates["optimizer"] = optimizer
    if impl is not None:
        out.updates["optimizer_impl"] = impl


def _precision_from(
    bf16: bool | None, fp16: bool | None, dtype: str | None, fsdp: bool = False
) -> Precision | None:
    """The plan's precision from the Trainer's ``bf16`` / ``fp16`` and the dtype the model is
    loaded in; None when the file says neither."""
    if bf16 or fp16:
        # Weights loaded in 16 bits train in 16 bits; loaded in fp32 they are autocast (amp), or
        # under FSDP sharded in fp32 and gathered in 16 bits (FSDP's mixed-precision policy).
        if dtype in ("bfloat16", "float16", "bf16", "fp16"):
            return Precision.BF16
        return Precision.MIXED if fsdp else Precision.AMP
    if bf16 is False and fp16 is False:
        return Precision.FP32
    return None


def read_trainer_mapping(reader: ConfigReader, out: ImportedPlan) -> None:
    """``TrainingArguments`` / TRL config keys: batch, accumulation, length, checkpointing, the
    savers the Trainer has a key for, FSDP, precision and the DeepSpeed config."""
    copy_declared_keys(reader, out, "trainer")  # batch, accumulation, length, epochs, ckpt
    reader.get("max_grad_norm")
    reader.get("output_dir")
    # GRPOConfig: completions of each prompt; the batch already counts completions (TRL's
    # per_device_train_batch_size), so it changes no memory
    reader.get("num_generations")
    read_optimizer(reader, "optim", out)
    if reader.flag("torch_compile"):
        out.updates["compile"] = True
    # use_liger_kernel (a declared key: --liger) brings Liger's fused loss with its kernels
    if reader.flag("activation_offloading"):
        out.updates["activation_offload"] = True
    _trainer_fsdp(reader, out)
    _accelerator_config(reader, out)
    init = reader.mapping("model_init_kwargs")
    dtype = init.get("torch_dtype") or init.get("dtype")
    precision = _precision_from(
        reader.flag("bf16"), reader.flag("fp16"), dtype, fsdp="fsdp" in out.updates
    )
    if precision is not None:
        out.updates["precision"] = precision
    deepspeed_path(reader, "deepspeed", out)


#: The Trainer's sharding words (``FSDPOption``, transformers/trainer_utils.py), first match wins.
_FSDP_WORDS = (
    ("hybrid_shard", FsdpMode.HYBRID),
    ("full_shard", FsdpMode.FULL),
    ("shard_grad_op", FsdpMode.SHARD_GRAD_OP),
)


def _trainer_fsdp(reader: ConfigReader, out: ImportedPlan) -> None:
    """The Trainer's ``fsdp`` option with its ``fsdp_config`` (:func:`read_fsdp_options`)."""
    read_fsdp_options(reader, out, reader.get("fsdp"), reader.get("fsdp_config"))


def read_fsdp_options(
    reader: ConfigReader, out: ImportedPlan, value: object, config: object, version: object = None
) -> None:
    """The Trainer's ``fsdp`` words (a string or a list of them: ``full_shard``, ``hybrid_shard``,
    ``shard_grad_op``, ``offload``, ``auto_wrap``...; True is full shard) and its ``fsdp_config``,
    whose keys may carry accelerate's ``fsdp_`` prefix, which the Trainer drops
    (transformers/training_args.py). ``version``: the FSDP version where the config holds it
    outside the block (axolotl's top-level ``fsdp_version``); absent, the block's, else 2."""
    if value in (None, "", False, []):
        return
    if value is True:
        words = ["full_shard"]
    elif isinstance(value, str):
        words = value.split()
    elif isinstance(value, list) and all(isinstance(word, str) for word in value):
        words = list(value)
    else:
        raise reader.bad("fsdp", "FSDP options such as 'full_shard auto_wrap'", value)
    if config is not None and not isinstance(config, Mapping):
        raise reader.bad("fsdp_config", "a table of FSDP settings", config)
    keys = {str(key).removeprefix("fsdp_"): str(key) for key in config or {}}
    block = {name: (config or {})[key] for name, key in keys.items()}
    mode = next((mode for word, mode in _FSDP_WORDS if word in words), None)
    if mode is None and "no_shard" in words:
        no_shard(out)
        return
    if mode is None:
        out.notes.append(
            f"fsdp {' '.join(words)!r} is not modelled (full, hybrid or shard_grad_op): ignored"
        )
        return
    out.updates["fsdp"] = mode
    out.updates["fsdp_offload"] = "offload" in words or block.get("offload_params") is True
    version_key = f"fsdp_config.{keys.get('version', 'version')}"
    if version is None:
        version = block.get("version", 2)
    else:
        version_key = "fsdp_version"  # given outside the block (axolotl's top-level key)
    if isinstance(version, str) and version.strip() in ("1", "2"):
        version = int(version)
    if isinstance(version, bool) or version not in (1, 2):
        raise reader.bad(version_key, "1 or 2", version)
    out.updates["fsdp_version"] = version
    if "auto_wrap_policy" in block:  # absent: TRANSFORMER_BASED_WRAP
        policy_key = f"fsdp_config.{keys['auto_wrap_policy']}"
        read_wrap_policy(reader, policy_key, block["auto_wrap_policy"], out)
    if "reshard_after_forward" in block and mode is not FsdpMode.HYBRID:
        _read_reshard(reader, f"fsdp_config.{keys['reshard_after_forward']}", block, out)
    if isinstance(block.get("state_dict_type"), str):
        state_dict = STATE_DICTS.get(block["state_dict_type"].upper())
        if state_dict is not None:
            out.updates["fsdp_state_dict"] = state_dict


def _read_reshard(
    reader: ConfigReader, key: str, block: Mapping[str, object], out: ImportedPlan
) -> None:
    """``reshard_after_forward``, which wins over the ``fsdp`` words (the Trainer fills it from
    them only where it is absent): FSDP2's true or false, FSDP1's ``full_shard`` or
    ``shard_grad_op`` (accelerate's reader, :func:`reshard_strategy`); false or
    ``shard_grad_op`` keeps the units gathered."""
    value = block["reshard_after_forward"]
    mode = FSDP_STRATEGIES.get(reshard_strategy(reader, key, value, fsdp2=False).upper())
    if mode not in (FsdpMode.FULL, FsdpMode.SHARD_GRAD_OP):
        raise reader.bad(key, "true or false", value)
    out.updates["fsdp"] = mode


def _accelerator_config(reader: ConfigReader, out: ImportedPlan) -> None:
    """The Trainer's ``accelerator_config``: a table, or the path of a JSON file holding one
    (transformers/trainer_pt_utils.py ``AcceleratorConfig.from_json_file``); its
    ``gradient_accumulation_kwargs.sync_each_batch`` is accelerate's (issue 22)."""
    value = reader.get("accelerator_config")
    if value is None:
        return
    key = "accelerator_config"
    if isinstance(value, str):
        path = (reader.path.parent / value).resolve()
        try:
            value = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError):
            out.notes.append(f"accelerator_config {value!r} not readable next to the file: ignored")
            return
        key = f"accelerator_config ({path.name})"
    if not isinstance(value, Mapping):
        raise reader.bad(key, "a table of settings or a JSON file's path", value)
    kwargs = value.get("gradient_accumulation_kwargs") or {}
    if not isinstance(kwargs, Mapping):
        raise reader.bad(f"{key}.gradient_accumulation_kwargs", "a table of settings", kwargs)
    sync = kwargs.get("sync_each_batch")
    if sync is None:
        return
    if not isinstance(sync, bool):
        raise reader.bad(
            f"{key}.gradient_accumulation_kwargs.sync_each_batch", "true or false", sync
        )
    out.updates["sync_each_batch"] = sync
