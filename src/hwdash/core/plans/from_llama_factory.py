"""``--from`` a LLaMA-Factory YAML config, where its fields map onto a plan."""

from __future__ import annotations

from hwdash.core.plan import Attention, Method, Precision
from hwdash.core.plans.from_deepspeed import deepspeed_path
from hwdash.core.plans.from_reader import (
    ConfigReader,
    ImportedPlan,
    copy_declared_keys,
    module_names,
)
from hwdash.core.plans.from_trainer import read_optimizer


def read_llama_factory(reader: ConfigReader, out: ImportedPlan) -> None:
    """A LLaMA-Factory config: the model, the stage and fine-tuning type as the method, LoRA's
    modules, the batch, attention, precision, checkpointing, optimizer and DeepSpeed config."""
    model = reader.text("model_name_or_path")
    if model:
        out.updates["model"] = model
    method = _llama_factory_method(reader, out)
    copy_declared_keys(reader, out, "llama-factory")  # rank, dropout, batch, length, ...
    _llama_factory_modules(reader, out)
    _llama_factory_attention(reader, out)
    _llama_factory_precision(reader, out, method)
    _llama_factory_checkpointing(reader, out)
    read_optimizer(reader, "optim", out)
    deepspeed_path(reader, "deepspeed", out)


def _llama_factory_method(reader: ConfigReader, out: ImportedPlan) -> Method:
    """The plan's method from ``stage``, ``finetuning_type``, ``use_dora`` and
    ``quantization_bit`` (PPO's policy trains with the rest); returns the method the weights are
    trained with."""
    stage = reader.text("stage") or "sft"
    finetuning = reader.text("finetuning_type") or "lora"
    bits = reader.integer("quantization_bit")
    method = Method.FULL if finetuning in ("full", "freeze") else Method.LORA
    if finetuning == "freeze":
        out.notes.append("finetuning_type freeze is planned as full fine-tuning (an upper bound)")
    if method is Method.LORA:
        if reader.flag("use_dora"):
            method = Method.DORA
        if bits == 4:
            method = Method.QLORA
        elif bits == 8:
            method = Method.LORA_8BIT
        elif bits:
            out.notes.append(
                f"quantization_bit {bits} is not counted (hwdash counts 4 and 8 bits): planned "
                "as LoRA on an unquantized model (more memory than it needs)"
            )
    if stage == "ppo":
        out.updates["method"] = Method.PPO
        out.updates["rl_method"] = method
    else:
        if stage not in ("sft", "pt"):
            out.notes.append(f"stage {stage!r} is planned as supervised fine-tuning")
        out.updates["method"] = method
    return method


def _llama_factory_modules(reader: ConfigReader, out: ImportedPlan) -> None:
    """LoRA's target modules (``lora_target``, ``all`` for every linear layer) and the modules
    trained in full beside the adapters (``additional_target``)."""
    target = reader.text("lora_target")
    if target:
        out.updates["lora_targets"] = (
            ("all-linear",) if target == "all" else module_names(reader.path, "lora_target", target)
        )
    additional = reader.text("additional_target")
    if additional:
        # LLaMA-Factory's FinetuningArguments.additional_target: comma-separated names of modules
        # "apart from LoRA layers to be set as trainable and saved", passed to PEFT's
        # modules_to_save
        out.updates["lora_modules_to_save"] = module_names(
            reader.path, "additional_target", additional
        )


def _llama_factory_attention(reader: ConfigReader, out: ImportedPlan) -> None:
    """LLaMA-Factory's ``flash_attn``: ``fa2``, ``sdpa`` or ``disabled`` (eager); ``auto`` leaves the
    plan's attention as it is."""
    attention = reader.text("flash_attn")
    if attention == "fa2":
        out.updates["attention"] = Attention.FLASH
    elif attention == "sdpa":
        out.updates["attention"] = Attention.SDPA
    elif attention == "disabled":
        out.updates["attention"] = Attention.EAGER


def _llama_factory_checkpointing(reader: ConfigReader, out: ImportedPlan) -> None:
    """Gradient checkpointing: on unless ``gradient_checkpointing: false`` or
    ``disable_gradient_checkpointing`` says otherwise."""
    if reader.flag("gradient_checkpointing") is False:
        out.updates["grad_ckpt"] = False
    elif "disable_gradient_checkpointing" in reader.data:
        out.updates["grad_ckpt"] = not bool(reader.get("disable_gradient_checkpointing"))
    else:
        out.updates["grad_ckpt"] = True  # LLaMA-Factory checkpoints unless told not to


def _llama_factory_precision(reader: ConfigReader, out: ImportedPlan, method: Method) -> None:
    """What LLaMA-Factory trains in. Its bf16 and fp16 are TrainingArguments' (default off). It
    loads the model in the compute dtype (bf16/fp16 when set, else the checkpoint's 16 bits where
    the GPU has them: ``infer_optim_dtype``) and then upcasts the trainable parameters to fp32
    unless ``pure_bf16`` (src/llamafactory/model/adapter.py, ``init_adapter``). So full and freeze
    tuning hold fp32 weights, autocast only with bf16/fp16; LoRA's frozen base stays 16 bits."""
    bf16 = reader.flag("bf16")
    fp16 = reader.flag("fp16")
    if reader.flag("pure_bf16"):
        out.updates["precision"] = Precision.BF16
    elif method is not Method.FULL:
        out.updates["precision"] = Precision.BF16
        if not (bf16 or fp16) and method in (Method.LORA, Method.DORA):
            out.notes.append(
                "bf16 and fp16 off: LLaMA-Factory still loads the frozen base in the checkpoint's "
                "16 bits (infer_optim_dtype), planned as bf16; the adapters train in fp32"
            )
    elif bf16 or fp16:
        out.updates["precision"] = Precision.AMP
    else:
        out.updates["precision"] = Precision.FP32
        if bf16 is None and fp16 is None:
            out.notes.append("no bf16 or fp16: LLaMA-Factory trains in fp32 (their default is off)")
