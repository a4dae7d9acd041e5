"""What to trace: a plan mapped onto one traceable step (pure, decided without torch).

The trace runs the Hugging Face stack on one GPU's view; :func:`trace_settings` says how a plan's
precision, attention, optimizer and batch become that step, with a note for each way the traced
step differs from the plan, and refuses what fake tensors cannot run.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from hwdash.core.estimator.savers import SAVER_FIELDS, describe_savers, resolve_savers
from hwdash.core.plan import Attention, Framework, Method, Offload, Optimizer, Plan, Precision
from hwdash.core.specs import ModelSpec
from hwdash.tracing.results import TraceUnavailable


@dataclass(frozen=True)
class TraceSettings:
    """How a plan is run under the tracer (pure: decided without torch)."""

    method: str
    """``inference``, ``full``, ``lora`` or ``dora``."""
    weight_dtype: str
    """dtype the model is built in: ``float32`` or ``bfloat16``."""
    autocast: bool
    """Run forward under bf16 autocast (``amp``; bf16 LoRA/DoRA, as the Trainer runs them)."""
    master_copy: bool
    """Keep an fp32 master copy and fp32 optimizer states (``mixed``, emulated)."""
    attention: str
    """``attn_implementation``: ``sdpa`` or ``eager``."""
    optimizer: str
    """``adamw``, ``sgd`` or ``adafactor`` (unused for inference)."""
    grad_ckpt: bool
    """Non-reentrant activation checkpointing."""
    lora_r: int
    """Adapter rank."""
    lora_targets: tuple[str, ...]
    """Adapted module names, or ``("all-linear",)``."""
    lora_dropout: float
    """LoRA/DoRA dropout probability."""
    optimizer_impl: str
    """AdamW's implementation: ``fused``, ``foreach`` or ``for-loop``."""
    batch: int
    """Sequences per step."""
    seq: int
    """Tokens per sequence (inference: prompt plus one decoded token)."""
    micro_batches: int
    """Forward/backward passes per optimizer step: 2 stands for any gradient accumulation (from
    the second micro-batch on, the gradients of the earlier ones are alive; more add nothing)."""
    notes: tuple[str, ...]
    """How the traced setting differs from the plan."""
    lora_modules_to_save: tuple[str, ...] = ()
    """PEFT's ``modules_to_save``: modules trained in full next to the adapters."""


def _on_hugging_face_stack(plan: Plan) -> Plan:
    """``plan`` with the savers the trace runs whatever the plan says: the Hugging Face stack's
    (the model's own loss, PEFT's fp32 adapters, no compile, no offload, the optimizer stepped
    after backward): ``--framework hf`` and no saver set."""
    return plan.model_copy(update={"framework": Framework.HF, **dict.fromkeys(SAVER_FIELDS)})


def _savers_note(plan: Plan) -> str | None:
    """What the trace leaves out of the plan's memory savers (None when it runs them all: the
    Hugging Face stack's own)."""
    wanted, traced = resolve_savers(plan), resolve_savers(_on_hugging_face_stack(plan))
    # sync_each_batch (what FSDP keeps between micro-batches) and ddp_bucket_view (DDP's bucket
    # copy) change only multi-process runs: a trace runs one process
    same = replace(
        wanted,
        framework=traced.framework,
        sync_each_batch=traced.sync_each_batch,
        ddp_bucket_view=traced.ddp_bucket_view,
    )
    if same == traced:
        return None  # another framework's name, the same savers
    return (
        f"traced the Hugging Face stack ({describe_savers(traced)}), not the plan's savers "
        f"({describe_savers(wanted)}); compared with the estimate for the Hugging Face stack"
    )


def trace_settings(plan: Plan) -> TraceSettings:
    """Map a plan onto a traceable step, or raise :class:`TraceUnavailable` saying why not."""
    _refuse_untraceable(plan)
    notes: list[str] = []
    _note_one_gpu_view(plan, notes)
    attention = plan.attention.value
    if plan.attention is Attention.FLASH:
        attention = Attention.SDPA.value
        notes.append(
            "flash attention traced as sdpa (flash-attn needs a real GPU; both keep O(s) per layer)"
        )
    weight_dtype, autocast, master_copy = _traced_precision(plan, notes)
    if plan.method is Method.DORA:
        notes.append(
            "DoRA: PEFT leaves reference cycles that hold activations until Python's garbage "
            "collector runs, so the peak depends on its timing (a repeated trace in one process "
            "can differ by a few percent)"
        )
    seq, micro_batches = _traced_batch(plan, notes)
    return TraceSettings(
        method=plan.method.value,
        weight_dtype=weight_dtype,
        autocast=autocast,
        master_copy=master_copy,
        attention=attention,
        optimizer=plan.optimizer.value,
        grad_ckpt=plan.grad_ckpt and plan.method is not Method.INFERENCE,
        lora_r=plan.lora_r,
        lora_targets=tuple(plan.lora_targets),
        lora_dropout=plan.lora_dropout,
        optimizer_impl=plan.optimizer_impl.value,
        batch=plan.batch,
        seq=seq,
        micro_batches=micro_batches,
        notes=tuple(notes),
        lora_modules_to_save=tuple(plan.lora_modules_to_save),
    )


def _refuse_untraceable(plan: Plan) -> None:
    """Raise :class:`TraceUnavailable` for what fake tensors cannot run: a multi-model RL step,
    bitsandbytes' quantized bases and optimizers."""
    if plan.method in (Method.PPO, Method.GRPO):
        raise TraceUnavailable(
            f"{plan.method.value} is not one training step (generation, reference and reward "
            "models, policy updates): it cannot be traced; trace its policy with --method "
            f"{plan.rl_method.value}"
        )
    if plan.method in (Method.QLORA, Method.LORA_8BIT):
        raise TraceUnavailable(
            f"{plan.method.value} quantizes the base model with bitsandbytes, whose kernels need a "
            "real CUDA GPU: fake tensors cannot run them; trace --method lora for the adapter part"
        )
    if plan.images:
        raise TraceUnavailable(
            "--images: the tracer builds a vision-language model's language model alone, so "
            "images are not traced (bench/vlm_tower_trace.py checks the vision tower's "
            "activations); trace without --images"
        )
    bitsandbytes = (Optimizer.ADAMW_8BIT, Optimizer.ADAMW_8BIT_PAGED, Optimizer.ADAMW_32BIT_PAGED)
    if plan.method is not Method.INFERENCE and plan.optimizer in bitsandbytes:
        raise TraceUnavailable(
            f"{plan.optimizer.value} is bitsandbytes' optimizer, whose kernels need a real CUDA "
            "GPU: fake tensors cannot run it; trace --optimizer adamw instead"
        )


def _note_one_gpu_view(plan: Plan, notes: list[str]) -> None:
    """Note the sharding and the savers the trace leaves out: it runs one GPU's view on the
    Hugging Face stack."""
    if plan.gpus > 1 or plan.zero or plan.offload is not Offload.NONE:
        notes.append(
            "traced one GPU's view without ZeRO, offload or data-parallel sharding "
            f"(the plan has {plan.gpus} GPU{'s' if plan.gpus != 1 else ''}, ZeRO {plan.zero}, "
            f"offload {plan.offload.value}); compared with the estimate for 1 GPU, ZeRO 0"
        )
    savers_note = _savers_note(plan)
    if savers_note:
        notes.append(savers_note)


def _traced_precision(plan: Plan, notes: list[str]) -> tuple[str, bool, bool]:
    """(weight dtype, bf16 autocast, fp32 master copy) the plan's precision is traced with."""
    weight_dtype = "bfloat16"
    autocast = False
    master_copy = False
    if plan.precision is Precision.FP32:
        weight_dtype = "float32"
    elif plan.precision is Precision.AMP:
        weight_dtype = "float32"
        autocast = plan.method is not Method.INFERENCE
        if not autocast:
            notes.append("amp inference traced as fp32 weights without autocast")
    elif plan.precision is Precision.BF16 and plan.method in (Method.LORA, Method.DORA):
        # The Hugging Face Trainer (bf16=True) wraps the forward in bf16 autocast; PEFT's adapters
        # are fp32, so autocast decides the dtype of the inputs they keep. The estimator models
        # the Trainer (bench/trace_lora_autocast.py).
        autocast = True
        notes.append("bf16 LoRA traced under bf16 autocast, as the Trainer runs it (bf16=True)")
    elif plan.precision is Precision.MIXED and plan.method is not Method.INFERENCE:
        master_copy = True
        notes.append(
            "mixed is DeepSpeed's layout; traced as a plain PyTorch emulation: bf16 model and "
            "gradients, an fp32 master copy with fp32 gradients and fp32 optimizer states"
        )
    return weight_dtype, autocast, master_copy


def _traced_batch(plan: Plan, notes: list[str]) -> tuple[int, int]:
    """(tokens per sequence, micro-batches per step) of the traced step, with their notes."""
    seq = plan.seq
    if plan.method is Method.INFERENCE:
        if seq < 2:
            raise TraceUnavailable("inference needs --seq of at least 2 (a prompt and one token)")
        notes.append(
            f"inference traced as a prefill of {seq - 1} tokens with the KV cache and one decoded "
            "token (generate() keeps only the last position's logits)"
        )
    elif plan.optimizer is Optimizer.ADAMW:
        notes.append(
            f"AdamW {plan.optimizer_impl.value}, two steps: Adam creates its states in the first"
        )
    micro_batches = 1
    if plan.method is not Method.INFERENCE and plan.grad_accum > 1:
        micro_batches = 2
        notes.append(
            f"gradient accumulation ({plan.grad_accum} micro-batches) traced as 2 per step: from "
            "the second on, the accumulated gradients are alive, and later ones add nothing"
        )
    return seq, micro_batches


def traced_plan(plan: Plan, model: ModelSpec) -> Plan:
    """The plan a trace really runs: one GPU without ZeRO or offload, the Hugging Face stack's
    savers (``--framework hf``, no saver set), and, for LoRA on an MoE, no dropout (PEFT adapts
    fused 3-D expert weights with ``lora.ParamWrapper``, which refuses dropout)."""
    update: dict[str, Any] = {"gpus": 1, "zero": 0, "offload": Offload.NONE}
    if model.experts > 1 and plan.method in (Method.LORA, Method.DORA) and plan.lora_dropout > 0:
        update["lora_dropout"] = 0.0
    return _on_hugging_face_stack(plan).model_copy(update=update)
