"""``--from`` an axolotl YAML config, where its fields map onto a plan."""

from __future__ import annotations

from collections.abc import Mapping

from hwdash.core.plan import Attention, Loss, Method, Precision
from hwdash.core.plans.from_deepspeed import deepspeed_path
from hwdash.core.plans.from_reader import (
    ConfigReader,
    ImportedPlan,
    copy_declared_keys,
    module_names,
)
from hwdash.core.plans.from_trainer import read_fsdp_options, read_optimizer


def read_axolotl(reader: ConfigReader, out: ImportedPlan) -> None:
    """An axolotl config: the model, the adapter (LoRA, QLoRA, DoRA) and its modules, the batch,
    attention, precision, optimizer, DeepSpeed config and FSDP."""
    model = reader.text("base_model")
    if model:
        out.updates["model"] = model
    adapter = reader.text("adapter")
    in_4bit = reader.flag("load_in_4bit")
    in_8bit = reader.flag("load_in_8bit")
    if adapter in ("lora", "qlora"):
        method = Method.LORA
        if adapter == "qlora" or in_4bit:
            method = Method.QLORA
        elif in_8bit:
            method = Method.LORA_8BIT
        if reader.flag("peft_use_dora"):
            method = Method.DORA
        out.updates["method"] = method
    elif adapter is None:
        out.updates["method"] = Method.FULL
    copy_declared_keys(reader, out, "axolotl")  # rank, dropout, batch, length, ...
    if reader.flag("lora_target_linear"):
        out.updates["lora_targets"] = ("all-linear",)
    modules = reader.get("lora_target_modules")
    if isinstance(modules, list) and modules and all(isinstance(m, str) for m in modules):
        out.updates["lora_targets"] = module_names(reader.path, "lora_target_modules", modules)
    saved = reader.get("lora_modules_to_save")
    if isinstance(saved, list) and saved and all(isinstance(m, str) for m in saved):
        # axolotl hands it to PEFT's LoraConfig(modules_to_save=...)
        out.updates["lora_modules_to_save"] = module_names(
            reader.path, "lora_modules_to_save", saved
        )
    ckpt = reader.get("gradient_checkpointing")
    if ckpt is not None:
        out.updates["grad_ckpt"] = bool(ckpt)  # axolotl also takes "unsloth" here
    if reader.flag("flash_attention"):
        out.updates["attention"] = Attention.FLASH
    elif reader.flag("sdp_attention"):
        out.updates["attention"] = Attention.SDPA
    _axolotl_precision(reader, out, in_8bit=bool(in_8bit))
    _axolotl_liger(reader, out)
    read_optimizer(reader, "optimizer", out)
    deepspeed_path(reader, "deepspeed", out)
    _axolotl_fsdp(reader, out)


def _axolotl_fsdp(reader: ConfigReader, out: ImportedPlan) -> None:
    """axolotl's FSDP: on with ``fsdp`` (the Trainer's words) or an ``fsdp_config`` block alone
    (axolotl/utils/trainer.py ``prepare_optim_env``: ``cfg.fsdp or cfg.fsdp_config``), whose keys
    come with or without accelerate's ``fsdp_`` prefix (``offload_params``,
    ``reshard_after_forward``, ``auto_wrap_policy``, ``state_dict_type``:
    axolotl/utils/schemas/fsdp.py), and the top-level ``fsdp_version`` of newer configs (absent
    everywhere: FSDP1). Both reach the Trainer's ``fsdp`` and ``fsdp_config``
    (:func:`read_fsdp_options`)."""
    words, config = reader.get("fsdp"), reader.get("fsdp_config")
    if not words and not config:
        return
    version = reader.get("fsdp_version")
    block = config if isinstance(config, Mapping) else {}
    if version is None and not any(str(key).removeprefix("fsdp_") == "version" for key in block):
        # axolotl sets FSDP_VERSION only for 2 (setup_fsdp_envs); accelerate's default is 1
        version = 1
    read_fsdp_options(reader, out, words or True, config, version)


def _axolotl_liger(reader: ConfigReader, out: ImportedPlan) -> None:
    """axolotl's LigerPlugin keys (axolotl/integrations/liger/args.py): ``liger_rms_norm`` and
    ``liger_glu_activation`` are ``--liger``'s kernels (hwdash counts the two together),
    ``liger_fused_linear_cross_entropy`` its fused loss."""
    norm, glu = reader.flag("liger_rms_norm"), reader.flag("liger_glu_activation")
    fused_loss = reader.flag("liger_fused_linear_cross_entropy")
    reader.get("liger_rope")  # RoPE applied in place keeps nothing either way
    if norm and glu:
        out.updates["liger"] = True
        out.updates["loss"] = Loss.FUSED_LINEAR if fused_loss else Loss.STANDARD
    elif norm or glu:
        one = "liger_rms_norm" if norm else "liger_glu_activation"
        out.notes.append(
            f"{one} alone is planned without Liger's kernels (--liger counts the fused norms and "
            "the fused gated activation together): a little more memory than it needs"
        )
    if fused_loss and not (norm and glu):
        out.updates["loss"] = Loss.FUSED_LINEAR


_MISSING = object()


def _axolotl_bf16(reader: ConfigReader) -> bool | None:
    """axolotl's ``bf16``: true, false, null or "auto" (its schema: ``Literal["auto"] | bool |
    None``, default "auto"; pydantic also takes the words true and false). None means auto."""
    reader.used.add("bf16")  # read raw: the reader's get() turns "auto" into None
    written = reader.data.get("bf16", _MISSING)
    if written is _MISSING or written == "auto":
        return None
    if written is None or isinstance(written, bool):
        return bool(written)
    if isinstance(written, str) and written.lower() in ("true", "false"):
        return written.lower() == "true"
    raise reader.bad("bf16", "true, false or auto", written)


def _axolotl_precision(reader: ConfigReader, out: ImportedPlan, *, in_8bit: bool) -> None:
    """The dtype axolotl loads and trains the model in, as its ``resolve_dtype`` picks it
    (src/axolotl/utils/config/__init__.py): ``bf16: auto`` (the default) is bf16 where the GPU has
    it, else fp16; then bf16/bfloat16 load in bfloat16, fp16/float16/load_in_8bit in float16, and
    anything else in float32, trained without autocast."""
    bf16 = _axolotl_bf16(reader)
    fp16 = reader.flag("fp16")
    if bf16 is None:  # auto
        bf16 = not fp16
        if bf16 and "bf16" in reader.data:
            out.notes.append(
                "bf16: auto planned as bf16 (axolotl picks bf16 where the GPU supports it, "
                "fp16 elsewhere: the same bytes)"
            )
    sixteen_bits = bf16 or reader.flag("bfloat16") or fp16 or reader.flag("float16") or in_8bit
    # 16 bits: axolotl loads the base weights in the training dtype; bf16 and fp16 weigh the same
    out.updates["precision"] = Precision.BF16 if sixteen_bits else Precision.FP32
