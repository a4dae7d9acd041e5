"""Trace one training (or inference) step of a plan on fake tensors: ``hwdash plan --trace``.

PyTorch's ``FakeTensorMode`` runs a real Hugging Face model with real shapes, dtypes and devices but
allocates no storage, so a 70B step costs seconds and no GPU. ``MemTracker``
(``torch.distributed._tools.mem_tracker``) follows every storage's life and files it under
parameters, buffers, gradients, optimizer states, activations (forward) or temporaries (backward);
we read the peak of each phase and the breakdown at that instant. The method is the one of
``docs/accuracy.md`` (and its harness in ``bench/``), rewritten here so the product does not import
``bench``.

torch, transformers and peft are optional: they are imported inside functions only, so importing
this module costs nothing, and a missing package becomes a :class:`TraceUnavailable` (one line, exit
status 2). The Plan -> model-config mapping (:func:`build_hf_config_dict`, :func:`trace_settings`) is
pure and runs without them.

:func:`trace_plan` is blocking and safe to call from a worker thread; traces run one at a time (a
lock), because the CPU path patches one MemTracker function for the whole process. A caller such as
the TUI's trace action runs, in its worker::

    trace = trace_plan(plan, model)                      # seconds; TraceUnavailable says why not
    estimate = comparable_estimate(plan, model)          # the estimate the trace stands for
    rows = comparison_rows(trace, estimate.per_gpu.as_dict())  # (label, estimated, traced)

and shows ``str(error)`` of a :class:`TraceUnavailable` as a one-line message.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hwdash.core.estimator.savers import SAVER_FIELDS, describe_savers, resolve_savers
from hwdash.core.plan import Attention, Framework, Method, Offload, Optimizer, Plan, Precision
from hwdash.core.results import MemoryEstimate
from hwdash.core.specs import ModelSpec
from hwdash.errors import UsageError

#: The CUDA caching allocator rounds every block up to 512 bytes (``kMinBlockSize`` in
#: c10/cuda/CUDACachingAllocator.cpp). MemTracker applies it to ``cuda`` tensors itself; on the CPU
#: path we apply it too, so a CPU trace counts what CUDA's ``max_memory_allocated`` would.
CUDA_MIN_BLOCK_BYTES = 512

#: Components of a traced peak, in display order.
TRACE_COMPONENTS = (
    "parameters",
    "buffers",
    "gradients",
    "optimizer",
    "activations",
    "temporaries",
    "other",
)

#: MemTracker's reference types (``_MemRefType`` values in torch 2.13) -> our component names.
_TRACKER_CATEGORIES = {
    "Parameter": "parameters",
    "Buffer": "buffers",
    "Gradient": "gradients",
    "Optstate": "optimizer",
    "Activation": "activations",
    "Temp": "temporaries",
    "Other": "other",
}

#: ``Plan.optimizer_impl`` -> the ``foreach`` argument of torch's optimizers (fused is separate).
_FOREACH_BY_IMPL = {"fused": False, "foreach": True, "for-loop": False}

#: Learning rates do not change memory; any positive value does.
_LEARNING_RATE = 1e-4

#: A stack is traced at two small depths and extrapolated when it is deeper than this many layer
#: periods (every component of a uniform stack grows by the same bytes per layer; checked to the
#: byte at full depth on five models in docs/accuracy.md, "Depth by extrapolation").
_EXTRAPOLATE_ABOVE_PERIODS = 4

#: Catalog ids and Hugging Face ids -> transformers ``model_type``, by lowercase prefix, first match
#: wins, for a spec that does not carry its config's ``model_type`` (one written field by field in a
#: user's catalog): the family is read from the model's name (``qwen2.5-7b`` is a Qwen2
#: architecture). Unknown names fall back on the architecture (MoE -> mixtral, two-matrix MLP -> phi,
#: else llama).
_FAMILY_PREFIXES: tuple[tuple[str, str], ...] = (
    ("qwen2.5", "qwen2"),
    ("qwen/qwen2.5", "qwen2"),
    ("qwen2-", "qwen2"),
    ("qwen3", "qwen3"),
    ("qwen/qwen3", "qwen3"),
    ("mixtral", "mixtral"),
    ("mistralai/mixtral", "mixtral"),
    ("mistral", "mistral"),
    ("mistralai/mistral", "mistral"),
    ("gemma-3", "gemma3_text"),
    ("google/gemma-3", "gemma3_text"),
    ("gemma-2", "gemma2"),
    ("google/gemma-2", "gemma2"),
    ("gemma", "gemma"),
    ("google/gemma", "gemma"),
    ("phi-3", "phi3"),
    ("microsoft/phi-3", "phi3"),
    ("phi-", "phi"),
    ("microsoft/phi-", "phi"),
)

#: Families whose config takes ``head_dim`` (the others derive it from hidden_size / heads).
_HEAD_DIM_FAMILIES = {"llama", "mistral", "mixtral", "qwen3", "gemma", "gemma2", "gemma3_text"}

#: Families whose config takes ``attention_bias`` (Qwen2 always has q/k/v biases; Phi always has).
_BIAS_FAMILIES = {"llama", "qwen3", "gemma", "gemma2", "gemma3_text"}

#: config.json keys that must not reach a config built for a fake trace: quantization (bitsandbytes
#: or GPTQ loaders), remote code, stored dtypes (the plan decides the dtype), weight locations.
_DROPPED_CONFIG_KEYS = (
    "quantization_config",
    "auto_map",
    "torch_dtype",
    "dtype",
    "_name_or_path",
    "architectures",
    "transformers_version",
)

_TRACE_LOCK = threading.Lock()


class TraceUnavailable(UsageError):
    """The plan cannot be traced here (a package is missing, or the setting is not traceable)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, flag="--trace")


# --------------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TracePhase:
    """The peak of one phase of the traced step."""

    step: int
    """1 for the first training step (Adam creates its states in it), 2 for a later one, 0 for
    inference."""
    phase: str
    """``forward`` (incl. the loss), ``backward``, ``optimizer`` (step and zero_grad), ``prefill``
    or ``decode``."""
    total: int
    """Peak bytes of all live storages during the phase."""
    components: dict[str, int]
    """Bytes by component (:data:`TRACE_COMPONENTS`) at the peak instant."""
    end_total: int = 0
    """Bytes alive when the phase ended (after forward: what backward will consume)."""
    end_components: dict[str, int] = field(default_factory=dict)
    """Bytes by component when the phase ended."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (the peak only; the end-of-phase bytes are for the calibration harness)."""
        return {
            "step": self.step,
            "phase": self.phase,
            "total": self.total,
            "components": dict(self.components),
        }


@dataclass(frozen=True)
class TraceResult:
    """What a fake-tensor trace of one plan measured."""

    peak_bytes: int
    """Peak bytes of live tensor storages on the device, over the whole traced step(s)."""
    components: dict[str, int]
    """Bytes by component (:data:`TRACE_COMPONENTS`) at the peak instant."""
    peak_step: int
    """Step of the peak (see :attr:`TracePhase.step`)."""
    peak_phase: str
    """Phase of the peak (see :attr:`TracePhase.phase`)."""
    phases: tuple[TracePhase, ...]
    """Every phase's own peak, in the order they ran."""
    device: str
    """Device type the fake tensors lived on (``cuda`` or ``cpu``)."""
    layers: int
    """Decoder layers of the model the result stands for."""
    traced_layers: tuple[int, ...]
    """Depths actually traced: the full depth, or two small depths extrapolated to ``layers``."""
    total_params: int
    """Parameters of the traced model (adapters included)."""
    trainable_params: int
    """Parameters that receive gradients."""
    seconds: float
    """Wall time of the trace."""
    notes: tuple[str, ...] = ()
    """How the trace differs from the plan or from a real run."""
    versions: dict[str, str] = field(default_factory=dict)
    """torch, transformers and peft versions used."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (the ``trace`` object of ``hwdash plan --trace --json``)."""
        return {
            "peak_bytes": self.peak_bytes,
            "components": dict(self.components),
            "peak_step": self.peak_step,
            "peak_phase": self.peak_phase,
            "phases": [phase.as_dict() for phase in self.phases],
            "device": self.device,
            "layers": self.layers,
            "traced_layers": list(self.traced_layers),
            "total_params": self.total_params,
            "trainable_params": self.trainable_params,
            "seconds": round(self.seconds, 3),
            "notes": list(self.notes),
            "versions": dict(self.versions),
        }


# --------------------------------------------------------------------------------------------------
# Pure mapping: Plan and ModelSpec -> what to build and run
# --------------------------------------------------------------------------------------------------


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
    # sync_each_batch only changes what FSDP keeps between micro-batches: a trace runs one process
    same = replace(wanted, framework=traced.framework, sync_each_batch=traced.sync_each_batch)
    if same == traced:
        return None  # another framework's name, the same savers
    return (
        f"traced the Hugging Face stack ({describe_savers(traced)}), not the plan's savers "
        f"({describe_savers(wanted)}); compared with the estimate for the Hugging Face stack"
    )


def trace_settings(plan: Plan) -> TraceSettings:
    """Map a plan onto a traceable step, or raise :class:`TraceUnavailable` saying why not."""
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
    notes: list[str] = []
    method = plan.method.value
    bitsandbytes = (Optimizer.ADAMW_8BIT, Optimizer.ADAMW_8BIT_PAGED, Optimizer.ADAMW_32BIT_PAGED)
    if plan.method is not Method.INFERENCE and plan.optimizer in bitsandbytes:
        raise TraceUnavailable(
            f"{plan.optimizer.value} is bitsandbytes' optimizer, whose kernels need a real CUDA "
            "GPU: fake tensors cannot run it; trace --optimizer adamw instead"
        )
    if plan.gpus > 1 or plan.zero or plan.offload is not Offload.NONE:
        notes.append(
            "traced one GPU's view without ZeRO, offload or data-parallel sharding "
            f"(the plan has {plan.gpus} GPU{'s' if plan.gpus != 1 else ''}, ZeRO {plan.zero}, "
            f"offload {plan.offload.value}); compared with the estimate for 1 GPU, ZeRO 0"
        )
    savers_note = _savers_note(plan)
    if savers_note:
        notes.append(savers_note)
    attention = plan.attention.value
    if plan.attention is Attention.FLASH:
        attention = Attention.SDPA.value
        notes.append(
            "flash attention traced as sdpa (flash-attn needs a real GPU; both keep O(s) per layer)"
        )
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
    if plan.method is Method.DORA:
        notes.append(
            "DoRA: PEFT leaves reference cycles that hold activations until Python's garbage "
            "collector runs, so the peak depends on its timing (a repeated trace in one process "
            "can differ by a few percent)"
        )
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
    return TraceSettings(
        method=method,
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


def hf_model_type(model: ModelSpec) -> str:
    """The transformers ``model_type`` that builds ``model``: its config's (every catalog model and
    every config.json carries one), else read from its ids, else from its shape."""
    if model.model_type:
        return model.model_type
    for name in (model.id.lower(), model.hf_id.lower()):
        if not name:
            continue
        for prefix, family in _FAMILY_PREFIXES:
            if name.startswith(prefix):
                return family
    if model.experts > 1:
        return "mixtral"
    if model.mlp == "standard":
        return "phi"
    return "llama"


def build_hf_config_dict(model: ModelSpec, *, layers: int | None = None) -> dict[str, Any]:
    """The fields of a transformers config with ``model``'s dimensions (``model_type`` included).

    Fields the catalog does not carry (activation, norm epsilon, RoPE base and fraction) keep the
    family's transformers defaults: they change memory by a few KiB at most (Phi-2's rotary fraction,
    0.4 against the default 0.5, changes the peak by 32-128 KiB: bench/trace_parity.py). ``layers``
    overrides the depth.

    A model read from a config (a catalog model's ``[model.config]``, a config.json) is built from
    that config itself, less the keys that would load weights or quantize (as the plan's own
    config.json is: :func:`local_config_dict`).
    """
    family = hf_model_type(model)
    if model.hf_config is not None:
        own = {k: v for k, v in model.hf_config.items() if k not in _DROPPED_CONFIG_KEYS}
        own["model_type"] = family
        if layers is not None or "num_hidden_layers" in own:
            # the spec's depth wins over its config's (a copy made deeper to test extrapolation)
            own["num_hidden_layers"] = model.layers if layers is None else layers
        return own
    if model.kv_lora_rank or model.shared_expert_intermediate_size or model.dense_mlp_layers:
        raise TraceUnavailable(
            f"{model.name} (latent attention or shared experts) is traced from its config.json "
            "only: give --model the path to it"
        )
    fields: dict[str, Any] = {
        "model_type": family,
        "hidden_size": model.hidden_size,
        "intermediate_size": model.intermediate_size,
        "num_hidden_layers": model.layers if layers is None else layers,
        "num_attention_heads": model.heads,
        "num_key_value_heads": model.kv_heads,
        "vocab_size": model.vocab_size,
        "tie_word_embeddings": model.tied_embeddings,
        "max_position_embeddings": model.max_context,
    }
    if family in _HEAD_DIM_FAMILIES:
        fields["head_dim"] = model.head_dim
    if family in _BIAS_FAMILIES:
        fields["attention_bias"] = model.attention_bias
    if family == "mixtral":
        fields["num_local_experts"] = model.experts
        fields["num_experts_per_tok"] = model.experts_per_token
    return fields


def local_config_dict(plan: Plan) -> dict[str, Any] | None:
    """The user's own ``config.json`` when ``plan.model`` is a path to one (or to its folder).

    Keys that would load weights, quantize or run remote code are dropped; a multimodal config's
    ``text_config`` is used on its own (the planner counts the language model only). None when the
    plan names a catalog model or a parameter count.
    """
    path = Path(plan.model).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None  # resolve_model already reported an unreadable file
    if not isinstance(raw, dict):
        return None
    text = raw.get("text_config")
    if isinstance(text, dict) and text.get("model_type"):
        raw = dict(text)
    if not raw.get("model_type"):
        return None
    return {key: value for key, value in raw.items() if key not in _DROPPED_CONFIG_KEYS}


def layer_period(layer_types: list[str] | None) -> int:
    """The shortest run of layer kinds that repeats through the stack (1 for uniform stacks)."""
    if not layer_types:
        return 1
    count = len(layer_types)
    for period in range(1, count + 1):
        if all(layer_types[i] == layer_types[i % period] for i in range(count)):
            return period
    return count


def trace_depths(layers: int, period: int) -> tuple[int, ...]:
    """The depths to trace: the full depth when it is short, else two small ones to extrapolate from.

    The small depths are 2 and 4 layers for a uniform stack, one and two periods otherwise (Gemma 3's
    five sliding layers and one global: 6 and 12), so both hold whole repeats of the pattern.
    """
    if layers <= _EXTRAPOLATE_ABOVE_PERIODS * period:
        return (layers,)
    low = period if period > 1 else 2
    return (low, 2 * low)


def extrapolate_phases(
    low: tuple[int, list[TracePhase]], high: tuple[int, list[TracePhase]], layers: int
) -> list[TracePhase]:
    """Every phase's peak and components on the line through two depths, at ``layers``."""
    low_layers, low_phases = low
    high_layers, high_phases = high
    if [(p.step, p.phase) for p in low_phases] != [(p.step, p.phase) for p in high_phases]:
        raise ValueError("the two depths did not run the same phases")

    def line(a: int, b: int) -> int:
        # Per-layer bytes are whole numbers: integer arithmetic keeps the result exact.
        return a + (b - a) * (layers - low_layers) // (high_layers - low_layers)

    return [
        TracePhase(
            step=a.step,
            phase=a.phase,
            total=line(a.total, b.total),
            components={
                name: line(a.components[name], b.components[name]) for name in a.components
            },
            end_total=line(a.end_total, b.end_total),
            end_components={
                name: line(a.end_components[name], b.end_components[name])
                for name in a.end_components
            },
        )
        for a, b in zip(low_phases, high_phases, strict=True)
    ]


def traced_plan(plan: Plan, model: ModelSpec) -> Plan:
    """The plan a trace really runs: one GPU without ZeRO or offload, the Hugging Face stack's
    savers (``--framework hf``, no saver set), and, for LoRA on an MoE, no dropout (PEFT adapts
    fused 3-D expert weights with ``lora.ParamWrapper``, which refuses dropout)."""
    update: dict[str, Any] = {"gpus": 1, "zero": 0, "offload": Offload.NONE}
    if model.experts > 1 and plan.method in (Method.LORA, Method.DORA) and plan.lora_dropout > 0:
        update["lora_dropout"] = 0.0
    return _on_hugging_face_stack(plan).model_copy(update=update)


def comparable_estimate(plan: Plan, model: ModelSpec) -> MemoryEstimate:
    """The estimate a trace stands for: the estimate of :func:`traced_plan` on one GPU."""
    from hwdash.core.estimator import estimate_memory

    return estimate_memory(traced_plan(plan, model), model, gpus=1)


def trace_document(trace: TraceResult, estimate: MemoryEstimate) -> dict[str, Any]:
    """The trace, the estimate it is compared with and the errors, JSON-ready.

    This is the ``trace`` object of ``hwdash plan --trace --json``. Errors are (estimate - traced)
    / traced; ``error`` leaves out the estimate's ``overhead`` (CUDA context, allocator slack),
    which a trace of tensor storages cannot see, and ``error_with_overhead`` keeps it.
    """
    breakdown = estimate.per_gpu.as_dict()
    without_overhead = breakdown["total"] - breakdown["overhead"]
    document = trace.as_dict()
    document["estimate"] = {
        "components": breakdown,
        "total": breakdown["total"],
        "without_overhead": without_overhead,
        "peak_phase": estimate.peak_phase,
    }
    document["error"] = relative_error(without_overhead, trace.peak_bytes)
    document["error_with_overhead"] = relative_error(breakdown["total"], trace.peak_bytes)
    return document


def relative_error(estimate: int, measured: int) -> float | None:
    """(estimate - measured) / measured; positive means the estimate is too high."""
    if measured <= 0:
        return None
    return (estimate - measured) / measured


def comparison_rows(
    trace: TraceResult, estimate: dict[str, int]
) -> list[tuple[str, int | None, int | None]]:
    """Rows ``(label, estimated bytes, traced bytes)`` that set the two breakdowns side by side.

    ``estimate`` is :meth:`MemoryBreakdown.as_dict`. The trace has no KV-cache category (the cache
    is made in forward, so it counts as activations) and cannot see the estimate's overhead (the
    CUDA context and allocator slack are not tensors); the estimate has no temporaries of its own
    (its activations include the largest transient). So activations, temporaries and the KV cache
    are compared as one row, with their parts below it.
    """
    parts = trace.components
    return [
        (
            "weights / parameters+buffers",
            estimate["weights"],
            parts["parameters"] + parts["buffers"],
        ),
        ("gradients", estimate["gradients"], parts["gradients"]),
        ("optimizer (+ master copy)", estimate["optimizer"], parts["optimizer"] + parts["other"]),
        (
            "activations, temporaries, KV cache",
            estimate["activations"] + estimate["kv_cache"],
            parts["activations"] + parts["temporaries"],
        ),
        ("  activations (traced: + KV cache)", estimate["activations"], parts["activations"]),
        ("  backward temporaries", None, parts["temporaries"]),
        ("  KV cache", estimate["kv_cache"], None),
        ("overhead (context, allocator)", estimate["overhead"], None),
    ]


# --------------------------------------------------------------------------------------------------
# The trace itself (torch, transformers, peft imported here only)
# --------------------------------------------------------------------------------------------------


def check_trace_dependencies(plan: Plan) -> dict[str, str]:
    """Import what a trace of ``plan`` needs; raise :class:`TraceUnavailable` naming what is missing.

    Returns the versions found.
    """
    wanted = ["torch", "transformers"]
    if plan.method in (Method.LORA, Method.DORA):
        wanted.append("peft")
    versions: dict[str, str] = {}
    missing: list[str] = []
    for name in wanted:
        try:
            module = __import__(name)
        except ImportError:
            missing.append(name)
        else:
            versions[name] = str(getattr(module, "__version__", "?"))
    if missing:
        raise TraceUnavailable(
            f"needs {' and '.join(missing)}, not installed for this Python "
            f"(pip install {' '.join(missing)}); the estimate itself does not need them"
        )
    return versions


@dataclass(frozen=True)
class TraceHooks:
    """What a caller may run inside the trace besides the step itself (the calibration harness's
    extras: it records which attention ops run and inventories the live storages at the peak).

    Neither changes what is allocated; both default to nothing.
    """

    around_run: Callable[[Any], contextlib.AbstractContextManager[Any]] | None = None
    """Given the fake model, a context entered inside the fake-tensor mode around the whole run."""
    on_phase: Callable[[int, str], None] | None = None
    """Called as each phase starts, with its step and name (``forward``, ``backward``,
    ``optimizer``, ``prefill``, ``decode``)."""

    def phase(self, step: int, name: str) -> None:
        """Tell the caller a phase starts."""
        if self.on_phase is not None:
            self.on_phase(step, name)


_NO_HOOKS = TraceHooks()


def trace_plan(
    plan: Plan,
    model: ModelSpec,
    *,
    device: str | None = None,
    full_depth: bool = False,
    sdpa_math: bool | None = None,
    hf_config: dict[str, Any] | None = None,
    hooks: TraceHooks | None = None,
    cuda_dropout: bool = True,
) -> TraceResult:
    """Run ``plan``'s step for ``model`` on fake tensors and return its traced peak memory.

    ``device`` is ``cuda`` or ``cpu``; None takes ``cuda`` when torch has a usable CUDA device, else
    ``cpu`` (fake tensors allocate nothing either way). Training runs two steps (forward, backward,
    optimizer step, zero_grad), because Adam creates its states in the first; the result is the
    maximum over both. Deep stacks are traced at two small depths and extrapolated unless
    ``full_depth``. ``sdpa_math`` forces (True) or forbids (False) SDPA's math kernel; None forces
    it where CUDA would take it and a CPU trace would not (fp32 on a grouped-query model).
    ``hf_config`` (transformers config fields, ``model_type`` included) builds the model instead of
    the catalog's dimensions or the plan's own config.json; ``hooks`` run the caller's extras inside
    the trace (:class:`TraceHooks`). The calibration harness uses both. ``cuda_dropout`` (on a CPU
    trace) runs every dropout through CUDA's fused kernel, whose mask is bool, as a GPU would
    (:func:`_cuda_fused_dropout`); False keeps CPU's own dropout (the calibration CSV's rows, which
    ``bench/estimator_errors.py`` converts).

    Raises :class:`TraceUnavailable` when a package is missing, the setting cannot be traced, or
    the trace itself fails.
    """
    settings = trace_settings(traced_plan(plan, model))
    if settings.lora_dropout != plan.lora_dropout and plan.method in (Method.LORA, Method.DORA):
        settings = replace(
            settings,
            notes=(
                *settings.notes,
                f"LoRA dropout {plan.lora_dropout:g} traced as 0: PEFT refuses dropout on fused "
                "expert weights (lora.ParamWrapper); compared with the estimate at dropout 0",
            ),
        )
    versions = check_trace_dependencies(plan)
    started = time.perf_counter()
    with _TRACE_LOCK:
        try:
            requested = _RequestedOptions(
                device, full_depth, sdpa_math, hf_config, hooks or _NO_HOOKS, cuda_dropout
            )
            return _trace(plan, model, settings, versions, requested, started)
        except TraceUnavailable:
            raise
        except Exception as exc:  # a library failing under fake tensors: one line, not a traceback
            first_line = (str(exc).strip().splitlines() or [""])[0][:300]
            raise TraceUnavailable(
                f"the fake-tensor trace failed ({type(exc).__name__}: {first_line})"
            ) from exc


def _pick_device(requested: str | None) -> str:
    import torch

    has_cuda = bool(torch.cuda.is_available())
    if requested is None:
        return "cuda" if has_cuda else "cpu"
    if requested not in ("cuda", "cpu"):
        raise TraceUnavailable(f"device must be cuda or cpu, not {requested!r}")
    if requested == "cuda" and not has_cuda:
        raise TraceUnavailable("device cuda asked for, but this torch has no usable CUDA device")
    return requested


@dataclass(frozen=True)
class _RequestedOptions:
    """The keyword arguments of :func:`trace_plan` that are not plan fields."""

    device: str | None
    full_depth: bool
    sdpa_math: bool | None
    hf_config: dict[str, Any] | None = None
    hooks: TraceHooks = _NO_HOOKS
    cuda_dropout: bool = True


@dataclass(frozen=True)
class _RunOptions:
    """What one depth's trace runs with, once the device and the SDPA kernel are decided."""

    device: str
    sdpa_math: bool
    hooks: TraceHooks = _NO_HOOKS
    cuda_dropout: bool = False
    head: str = "causal"
    """What to build: ``causal`` (AutoModelForCausalLM), or an encoder's ``mlm``
    (AutoModelForMaskedLM) or ``classification`` (AutoModelForSequenceClassification)."""


def _trace(
    plan: Plan,
    model: ModelSpec,
    settings: TraceSettings,
    versions: dict[str, str],
    requested: _RequestedOptions,
    started: float,
) -> TraceResult:
    import warnings

    device = _pick_device(requested.device)
    notes = list(settings.notes)
    local = local_config_dict(plan)
    if requested.hf_config is not None:
        notes.append("model built from the caller's transformers config")
        base_fields = dict(requested.hf_config)
    elif local is not None:
        notes.append("model built from the plan's own config.json")
        base_fields = local
    else:
        base_fields = build_hf_config_dict(model)
        what = "the model's config" if model.hf_config is not None else "the catalog's dimensions"
        notes.append(f"model built from {what} as a {base_fields['model_type']}")
    layers = int(base_fields.get("num_hidden_layers") or model.layers)
    if model.encoder_only and model.encoder_head == "classification":
        base_fields["num_labels"] = model.num_labels
        # one class index per sequence, as the Trainer passes them (DeBERTa's loss otherwise
        # picks the labelled rows with a data-dependent nonzero(), which fake tensors cannot run)
        base_fields["problem_type"] = "single_label_classification"
    # Room for the traced sequence: RoPE models have no position table, but some configs check.
    base_fields["max_position_embeddings"] = max(
        int(base_fields.get("max_position_embeddings") or 0), settings.seq
    )
    with warnings.catch_warnings(), _quiet_transformers():
        warnings.simplefilter("ignore")
        full_config = _build_config(base_fields, settings, layers)
        if settings.attention == "sdpa" and not _supports_sdpa(full_config, model):
            # transformers refuses SDPA for some architectures (Gemma 2's soft-capped attention)
            # and runs them with eager attention, which is what a real run gets.
            settings = replace(settings, attention="eager")
            full_config._attn_implementation = "eager"
            notes.append(
                f"{base_fields['model_type']} has no SDPA attention in transformers: traced with "
                "eager (what transformers runs for it)"
            )
        layer_types = getattr(full_config, "layer_types", None)
        period = layer_period(list(layer_types) if layer_types else None)
        depths = (layers,) if requested.full_depth else trace_depths(layers, period)
        dense = base_fields.get("first_k_dense_replace")
        if len(depths) == 2 and isinstance(dense, int) and dense >= depths[0]:
            # DeepSeek's leading dense blocks: both depths hold all of them, so the line through
            # the two is exact (modeling_deepseek_v3.py: first_k_dense_replace)
            depths = (dense + 2, dense + 4) if dense + 4 < layers else (layers,)
        if settings.attention == "sdpa" and device == "cpu" and base_fields.get("kv_lora_rank"):
            notes.append(
                "latent attention's value heads are narrower than its query/key heads: CPU runs "
                "SDPA's math kernel (scores kept), CUDA the memory-efficient one (no scores, as "
                "estimated); compare with --attn eager"
            )
        sdpa_math = requested.sdpa_math
        if sdpa_math is None:
            sdpa_math = device == "cpu" and _cpu_needs_math_sdpa(settings, full_config)
            if sdpa_math:
                notes.append(
                    "fp32 SDPA on a grouped-query model: forced the math kernel, which CUDA runs "
                    "there (a CPU trace would take a flash-style kernel)"
                )
        elif settings.attention == "sdpa":
            notes.append(f"SDPA math kernel {'forced' if sdpa_math else 'not forced'} (asked)")
        cuda_dropout = device == "cpu" and requested.cuda_dropout
        if cuda_dropout and settings.lora_dropout > 0 and settings.method in ("lora", "dora"):
            notes.append(
                "LoRA dropout run through CUDA's fused kernel (a bool mask, as on a GPU; CPU's own "
                "dropout keeps a mask in the input's dtype)"
            )
        if cuda_dropout and settings.attention == "sdpa" and model.attention_dropout > 0:
            notes.append(
                "SDPA's attention dropout traced as CUDA's flash and memory-efficient kernels run "
                "it (the mask drawn inside the kernel, nothing s^2 kept): dropout_p 0 in the trace, "
                "where CPU's math kernel would keep the s^2 probabilities and masks"
            )
        head = model.encoder_head if model.encoder_only else "causal"
        options = _RunOptions(
            device=device,
            sdpa_math=sdpa_math and settings.attention == "sdpa",
            hooks=requested.hooks,
            cuda_dropout=cuda_dropout,
            head=head,
        )
        if head != "causal":
            notes.append(_encoder_trace_note(model, settings, device))
        traces = []
        for depth in depths:
            fields = dict(base_fields, num_hidden_layers=depth)
            if layer_types:
                fields["layer_types"] = list(layer_types)[:depth]
            config = _build_config(fields, settings, depth)
            traces.append(_trace_at_depth(config, settings, options, depth))
    if len(traces) == 1:
        phases = traces[0].phases
        total_params, trainable = traces[0].total_params, traces[0].trainable_params
    else:
        low, high = traces
        phases = extrapolate_phases((low.depth, low.phases), (high.depth, high.phases), layers)
        total_params = _line_int(low.total_params, high.total_params, low.depth, high.depth, layers)
        trainable = _line_int(
            low.trainable_params, high.trainable_params, low.depth, high.depth, layers
        )
        notes.append(
            f"traced at {low.depth} and {high.depth} layers and extrapolated linearly to {layers} "
            "(exact for a stack of identical layers)"
        )
    if device == "cpu":
        notes.append(
            "CPU fake tensors: every storage rounded to 512 bytes as CUDA's allocator does; CPU "
            "autocast and kernel choices can differ slightly from CUDA's"
        )
    peak = max(phases, key=lambda p: p.total)
    return TraceResult(
        peak_bytes=peak.total,
        components=dict(peak.components),
        peak_step=peak.step,
        peak_phase=peak.phase,
        phases=tuple(phases),
        device=device,
        layers=layers,
        traced_layers=tuple(depths),
        total_params=total_params,
        trainable_params=trainable,
        seconds=time.perf_counter() - started,
        notes=tuple(notes),
        versions=versions,
    )


def _line_int(a: int, b: int, low: int, high: int, layers: int) -> int:
    return a + (b - a) * (layers - low) // (high - low)


def _build_config(fields: dict[str, Any], settings: TraceSettings, layers: int) -> Any:
    from transformers import AutoConfig

    rest = {key: value for key, value in fields.items() if key != "model_type"}
    rest["num_hidden_layers"] = layers
    try:
        config = AutoConfig.for_model(str(fields["model_type"]), **rest)
    except (ValueError, KeyError) as exc:
        first_line = (str(exc).strip().splitlines() or [""])[0][:200]
        raise TraceUnavailable(
            f"transformers cannot build a {fields['model_type']!r} model: {first_line}"
        ) from None
    config._attn_implementation = settings.attention
    pad = getattr(config, "pad_token_id", None)
    if isinstance(pad, int) and not 0 <= pad < int(config.vocab_size):
        # A family default outside a smaller vocabulary; the padding row changes no memory.
        config.pad_token_id = None
    experts = getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None)
    if int(experts or 1) > 1:
        # The eager expert loop iterates over data-dependent expert ids, which fake tensors cannot
        # do; grouped_mm has static shapes (transformers' CUDA path for MoE layers).
        config._experts_implementation = "grouped_mm"
    return config


def _supports_sdpa(config: Any, model: ModelSpec | None = None) -> bool:
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING,
        MODEL_FOR_MASKED_LM_MAPPING,
    )

    mapping = (
        MODEL_FOR_MASKED_LM_MAPPING
        if model is not None and model.encoder_only
        else MODEL_FOR_CAUSAL_LM_MAPPING
    )
    model_class = mapping.get(type(config), None)
    return bool(getattr(model_class, "_supports_sdpa", True))


#: Of every sequence, the share of positions a masked-LM trainer masks and scores (BERT's 15%:
#: Devlin et al. 2019, arXiv:1810.04805, section 3.1; ``DataCollatorForLanguageModeling``'s
#: ``mlm_probability``); the others carry label -100.
MLM_MASKED_EVERY = 7


def _encoder_trace_note(model: ModelSpec, settings: TraceSettings, device: str) -> str:
    """How an encoder's step is traced (its head, labels and, on CPU, SDPA's dropout path)."""
    if model.encoder_head == "mlm":
        text = (
            "encoder built as AutoModelForMaskedLM; labels: the input ids on every "
            f"{MLM_MASKED_EVERY}th position, -100 elsewhere (the logits cover every position)"
        )
    else:
        text = (
            "encoder built as AutoModelForSequenceClassification "
            f"({model.num_labels} labels); one label per sequence"
        )
    if settings.method == "inference":
        text += "; inference: one forward pass, no generation"
    return text


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """Silence transformers' advice (``use_cache`` vs checkpointing) for the trace, then restore."""
    from transformers.utils import logging as transformers_logging

    previous = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()
    try:
        yield
    finally:
        transformers_logging.set_verbosity(previous)


def _cpu_needs_math_sdpa(settings: TraceSettings, config: Any) -> bool:
    """fp32 SDPA on a GQA model: CUDA takes the math kernel, CPU a flash-style one.

    On CUDA, flash attention takes fp16/bf16 only, and fp32 grouped-query inputs (transformers
    passes ``enable_gqa``) fall to the O(s^2) math path; on CPU, SDPA's flash kernel takes fp32 too
    (docs/accuracy.md, finding 4). Forcing the math kernel makes a CPU trace keep what CUDA keeps.
    """
    heads = int(getattr(config, "num_attention_heads", 0) or 0)
    kv_heads = int(getattr(config, "num_key_value_heads", heads) or heads)
    return (
        settings.attention == "sdpa"
        and settings.weight_dtype == "float32"
        and not settings.autocast
        and settings.method != "inference"
        and kv_heads < heads
    )


@dataclass
class _DepthTrace:
    depth: int
    phases: list[TracePhase]
    total_params: int
    trainable_params: int


@contextlib.contextmanager
def _frozen_survivors() -> Iterator[None]:
    """Collect what earlier work left, then freeze the survivors for the length of a trace.

    PEFT's DoRA forward leaves reference cycles that hold activation-sized tensors until Python's
    cyclic collector runs, so a DoRA peak depends on when collections happen. We collect at every
    phase boundary (``close_phase``) and start from a clean, frozen heap, as the calibration harness
    does. That makes a trace repeatable from a fresh process, not exact: on Llama-3.2-1B (DoRA,
    bf16, batch 2 x 1024, dropout 0.05, no autocast) the first trace in a process peaked at 23.67
    GB, later ones at 24.03 GB (+1.5%), and 29.02 GB (+23%) with the collector held off until each
    phase ends. Against the harness's autocast traces (bench/data/calibration-lora-autocast.csv)
    four DoRA rows match to the byte and the two without checkpointing, whose peak is in the first
    forward, come out 2.5% and 11.9% lower (bench/trace_parity.py): the collector's timing is part
    of DoRA's real peak too.
    Full and LoRA traces do not depend on the collector.
    """
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@contextlib.contextmanager
def _cuda_block_rounding() -> Iterator[None]:
    """Make MemTracker round every storage to 512 bytes, as it already does for cuda tensors."""
    from torch.distributed._tools import mem_tracker

    info_class = mem_tracker._WeakRefInfo
    original = info_class._calculate_mem_consumed

    def rounded(self: Any) -> int:
        raw_bytes = int(self.size) * int(self.element_size)
        return math.ceil(raw_bytes / CUDA_MIN_BLOCK_BYTES) * CUDA_MIN_BLOCK_BYTES

    info_class._calculate_mem_consumed = rounded
    try:
        yield
    finally:
        info_class._calculate_mem_consumed = original


@contextlib.contextmanager
def _cuda_fused_dropout(keep_sdpa_dropout: bool = False) -> Iterator[None]:
    """Run ``torch.nn.functional.dropout`` (what ``nn.Dropout`` calls) as CUDA runs it.

    torch's ``dropout`` (``aten/src/ATen/native/Dropout.cpp``) takes the fused ``native_dropout``
    only where ``is_fused_kernel_acceptable`` holds (CUDA, XPU, lazy and private-use devices);
    elsewhere, CPU included, a composite ``input * noise`` whose multiply keeps the noise, a mask in
    the input's dtype (4 bytes per element inside PEFT's fp32 adapters). ``native_dropout`` keeps a
    bool mask and nothing else (``NativeDropoutBackward0`` saves ``result1``, the mask). Calling
    it on CPU fake tensors keeps what a GPU keeps; p = 0, eval mode and in-place dropout go to
    torch's own function, which returns the input (or takes the composite path) as before.
    """
    import torch

    functional = torch.nn.functional
    original = functional.dropout

    def fused(input: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
        if training and not inplace and 0 < p < 1 and input.numel() > 0:
            return torch.ops.aten.native_dropout(input, p, True)[0]
        return original(input, p, training, inplace)

    original_sdpa = functional.scaled_dot_product_attention

    def in_kernel(*args: Any, **kwargs: Any) -> Any:
        # (query, key, value, attn_mask=None, dropout_p=0.0, ...): CPU's flash kernel refuses
        # dropout (sdp_utils_cpp.cpp) and falls to the math kernel, which keeps the s^2
        # probabilities and a mask; CUDA's flash and memory-efficient kernels take dropout_p and
        # regenerate the mask in backward from the RNG state (their saved tensors are the output
        # and log-sum-exp, with or without dropout). At p 0 the CPU trace takes the same kind of
        # kernel. A math kernel forced for the trace (sdpa_math) is left alone.
        if len(args) > 4 and args[4]:
            args = (*args[:4], 0.0, *args[5:])
        elif kwargs.get("dropout_p"):
            kwargs["dropout_p"] = 0.0
        return original_sdpa(*args, **kwargs)

    functional.dropout = fused
    if not keep_sdpa_dropout:
        functional.scaled_dot_product_attention = in_kernel
    try:
        yield
    finally:
        functional.dropout = original
        functional.scaled_dot_product_attention = original_sdpa


def _make_tracker() -> Any:
    """A MemTracker that accepts frozen parameters and keeps per-phase peaks itself.

    torch 2.13's MemTracker installs a gradient hook on every parameter of every module it enters,
    which fails on frozen parameters (LoRA bases, inference): those are recorded as hooked with no
    hook. After every op it also refreshes the peak of every module seen, which makes a trace
    quadratic in the module count; we only need the device peak per phase, so the subclass keeps
    just that (``phase`` names the running phase).
    """
    from torch.distributed._tools.mem_tracker import MemTracker

    class _NoHandle:
        def remove(self) -> None:
            return None

    class PhasePeakTracker(MemTracker):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.phase_label: tuple[int, str] = (0, "")
            self.phase_peak = 0
            self.phase_snapshot: dict[str, int] = {}

        def _track_module_params_and_buffers(  # type: ignore[no-untyped-def]
            self, module: Any, install_grad_hooks: bool = True
        ):
            for param in module.parameters():
                if not param.requires_grad and param not in self._param_to_grad_hook_handles:
                    self._param_to_grad_hook_handles[param] = (_NoHandle(), _NoHandle())
            return super()._track_module_params_and_buffers(module, install_grad_hooks)

        def _update_peak_stats(self, peak_state: Any) -> None:
            self.record_current()

        def record_current(self) -> None:
            total, snapshot = self.current()
            if total > self.phase_peak or not self.phase_snapshot:
                self.phase_peak = total
                self.phase_snapshot = snapshot

        def current(self) -> tuple[int, dict[str, int]]:
            total = 0
            snapshot = dict.fromkeys(TRACE_COMPONENTS, 0)
            for device_snapshot in self._curr_mem_snap.values():
                for key, value in device_snapshot.items():
                    name = str(getattr(key, "value", key))
                    if name == "Total":
                        total += int(value)
                    elif name in _TRACKER_CATEGORIES:
                        snapshot[_TRACKER_CATEGORIES[name]] += int(value)
            return total, snapshot

        def close_phase(self, step: int, phase: str, collect: bool) -> TracePhase:
            if collect:
                gc.collect()
            self.record_current()
            end_total, end_components = self.current()
            closed = TracePhase(
                step=step,
                phase=phase,
                total=self.phase_peak,
                components=self.phase_snapshot,
                end_total=end_total,
                end_components=end_components,
            )
            self.phase_peak = 0
            self.phase_snapshot = {}
            self.record_current()
            return closed

    return PhasePeakTracker()


def _trace_at_depth(
    config: Any, settings: TraceSettings, options: _RunOptions, depth: int
) -> _DepthTrace:
    from torch._subclasses.fake_tensor import FakeTensorMode

    collecting = _frozen_survivors() if settings.method == "dora" else contextlib.nullcontext()
    rounding = _cuda_block_rounding() if options.device == "cpu" else contextlib.nullcontext()
    dropout = (
        _cuda_fused_dropout(keep_sdpa_dropout=options.sdpa_math)
        if options.cuda_dropout
        else contextlib.nullcontext()
    )
    with collecting:
        # Built on meta outside the fake mode, then swapped for fake tensors (see _build_model).
        model = _build_model(config, settings, options.head)
        with rounding, dropout, FakeTensorMode():
            _materialize_fake(model, options.device)
            unique = {id(p): p for p in model.parameters()}
            total_params = sum(int(p.numel()) for p in unique.values())
            trainable = sum(int(p.numel()) for p in unique.values() if p.requires_grad)
            tracker = _make_tracker()
            around = options.hooks.around_run
            with around(model) if around is not None else contextlib.nullcontext():
                if settings.method == "inference" and options.head != "causal":
                    phases = _run_encoder_inference(model, settings, tracker, options)
                elif settings.method == "inference":
                    phases = _run_inference(model, settings, tracker, options)
                else:
                    phases = _run_training(model, settings, tracker, options)
    return _DepthTrace(depth, phases, total_params, trainable)


def _build_model(config: Any, settings: TraceSettings, head: str = "causal") -> Any:
    """The model (and adapters) on the meta device; fake tensors replace its storage next.

    Built on meta rather than under the fake mode because ``Module.to`` and PEFT's adapter moves
    cannot swap fake parameters in (torch 2.13).
    """
    import torch
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForMaskedLM,
        AutoModelForSequenceClassification,
    )

    auto = {
        "mlm": AutoModelForMaskedLM,
        "classification": AutoModelForSequenceClassification,
    }.get(head, AutoModelForCausalLM)
    dtype = getattr(torch, settings.weight_dtype)
    with torch.device("meta"):
        model = auto.from_config(config, attn_implementation=settings.attention, dtype=dtype)
    if settings.method == "inference":
        model.eval()
        model.requires_grad_(False)
        return model
    model.train()
    if settings.grad_ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if settings.method in ("lora", "dora"):
        from peft import LoraConfig, get_peft_model

        targets: str | list[str] = (
            "all-linear"
            if settings.lora_targets == ("all-linear",)
            else list(settings.lora_targets)
        )
        adapter = LoraConfig(
            r=settings.lora_r,
            lora_alpha=2 * settings.lora_r,
            lora_dropout=settings.lora_dropout,
            target_modules=targets,
            modules_to_save=list(settings.lora_modules_to_save) or None,
            use_dora=settings.method == "dora",
            # an encoder classifier as trainers set it up (PEFT then trains the classification
            # head in full, modules_to_save); a masked LM takes no task type
            task_type={"mlm": None, "classification": "SEQ_CLS"}.get(head, "CAUSAL_LM"),
        )
        # PEFT keeps the adapter weights in fp32 under a bf16 base (autocast_adapter_dtype), as a
        # real run does.
        model = get_peft_model(model, adapter)
    return model


def _materialize_fake(model: Any, device: str) -> None:
    """Swap every meta parameter and buffer for a fake tensor on ``device`` (tied ones stay tied)."""
    import torch

    swapped: dict[int, Any] = {}
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is None:
                continue
            if id(param) not in swapped:
                storage = torch.empty(param.shape, dtype=param.dtype, device=device)
                swapped[id(param)] = torch.nn.Parameter(storage, requires_grad=param.requires_grad)
            module._parameters[name] = swapped[id(param)]
        for name, buffer in list(module._buffers.items()):
            if buffer is None:
                continue
            if id(buffer) not in swapped:
                swapped[id(buffer)] = torch.empty(buffer.shape, dtype=buffer.dtype, device=device)
            module._buffers[name] = swapped[id(buffer)]


def _make_optimizer(settings: TraceSettings, params: list[Any]) -> Any:
    import torch

    if settings.optimizer == "adamw":
        if settings.optimizer_impl == "fused":
            return torch.optim.AdamW(params, lr=_LEARNING_RATE, weight_decay=0.0, fused=True)
        return torch.optim.AdamW(
            params,
            lr=_LEARNING_RATE,
            weight_decay=0.0,
            foreach=_FOREACH_BY_IMPL[settings.optimizer_impl],
        )
    if settings.optimizer == "sgd":
        # The Hugging Face Trainer's "sgd" is torch.optim.SGD without momentum: no state. The plan's
        # optimizer_impl is AdamW's; SGD runs as torch does by default on CUDA (foreach).
        return torch.optim.SGD(params, lr=_LEARNING_RATE, foreach=True)
    if settings.optimizer == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(
            params, lr=_LEARNING_RATE, scale_parameter=False, relative_step=False, warmup_init=False
        )
    raise TraceUnavailable(f"optimizer {settings.optimizer} cannot be traced")


def _attention_kernel(options: _RunOptions) -> Any:
    if options.sdpa_math:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        return sdpa_kernel([SDPBackend.MATH])
    return contextlib.nullcontext()


def _run_training(
    model: Any, settings: TraceSettings, tracker: Any, options: _RunOptions
) -> list[TracePhase]:
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    masters: list[Any] = []
    if settings.master_copy:
        # DeepSpeed-style bf16 emulated: the optimizer steps fp32 masters with fp32 gradients, and
        # the bf16 weights are copied back from them.
        masters = [p.detach().float() for p in params]
        optimizer = _make_optimizer(settings, masters)

        def gradients_to_masters(opt: Any, args: Any, kwargs: Any) -> None:
            for param, master in zip(params, masters, strict=True):
                master.grad = None if param.grad is None else param.grad.float()
                param.grad = None

        def weights_from_masters(opt: Any, args: Any, kwargs: Any) -> None:
            with torch.no_grad():
                for param, master in zip(params, masters, strict=True):
                    param.copy_(master)

        optimizer.register_step_pre_hook(gradients_to_masters)
        optimizer.register_step_post_hook(weights_from_masters)
    else:
        optimizer = _make_optimizer(settings, params)
    tracker.track_external(model, optimizer, *masters)
    vocab = int(model.config.vocab_size)
    ids = torch.randint(0, vocab, (settings.batch, settings.seq), device=options.device)
    labels = _labels(ids, options)
    autocast = (
        torch.autocast(options.device, dtype=torch.bfloat16)
        if settings.autocast
        else contextlib.nullcontext()
    )
    collect = settings.method == "dora"  # PEFT's DoRA leaves cycles holding activations
    phases: list[TracePhase] = []
    with tracker, _attention_kernel(options):
        tracker.close_phase(0, "setup", collect)
        for step in (1, 2):
            for micro in range(1, settings.micro_batches + 1):
                suffix = f" {micro}" if settings.micro_batches > 1 else ""
                # MemTracker refuses a module that runs twice unless its per-module stats are
                # cleared first.
                tracker.reset_mod_stats()
                options.hooks.phase(step, "forward" + suffix)
                with autocast:
                    loss = model(input_ids=ids, labels=labels).loss
                phases.append(tracker.close_phase(step, "forward" + suffix, collect))
                options.hooks.phase(step, "backward" + suffix)
                loss.backward()
                del loss
                phases.append(tracker.close_phase(step, "backward" + suffix, collect))
            options.hooks.phase(step, "optimizer")
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            phases.append(tracker.close_phase(step, "optimizer", collect))
    return phases


def _labels(ids: Any, options: _RunOptions) -> Any:
    """The labels a trainer passes: the ids themselves (causal LM; the model shifts them), the ids
    on the masked positions and -100 elsewhere (masked LM), one class per sequence (classification)."""
    import torch

    if options.head == "classification":
        return torch.zeros(ids.shape[0], dtype=torch.long, device=ids.device)
    if options.head == "mlm":
        labels = torch.full_like(ids, -100)
        labels[:, ::MLM_MASKED_EVERY] = ids[:, ::MLM_MASKED_EVERY]
        return labels
    return ids


def _run_encoder_inference(
    model: Any, settings: TraceSettings, tracker: Any, options: _RunOptions
) -> list[TracePhase]:
    """An encoder's inference: one forward pass over the batch (no generation, no cache)."""
    import torch

    tracker.track_external(model)
    vocab = int(model.config.vocab_size)
    ids = torch.randint(0, vocab, (settings.batch, settings.seq), device=options.device)
    phases: list[TracePhase] = []
    with torch.no_grad(), tracker, _attention_kernel(options):
        tracker.close_phase(0, "setup", False)
        options.hooks.phase(0, "forward")
        output = model(input_ids=ids)
        del output
        phases.append(tracker.close_phase(0, "forward", False))
    return phases


def _run_inference(
    model: Any, settings: TraceSettings, tracker: Any, options: _RunOptions
) -> list[TracePhase]:
    import torch

    tracker.track_external(model)
    vocab = int(model.config.vocab_size)
    ids = torch.randint(0, vocab, (settings.batch, settings.seq), device=options.device)
    phases: list[TracePhase] = []
    with torch.no_grad(), tracker, _attention_kernel(options):
        tracker.close_phase(0, "setup", False)
        options.hooks.phase(0, "prefill")
        output = model(input_ids=ids[:, :-1], use_cache=True, logits_to_keep=1)
        cache = output.past_key_values
        del output
        phases.append(tracker.close_phase(0, "prefill", False))
        options.hooks.phase(0, "decode")
        tracker.reset_mod_stats()
        output = model(
            input_ids=ids[:, -1:], past_key_values=cache, use_cache=True, logits_to_keep=1
        )
        del output, cache
        phases.append(tracker.close_phase(0, "decode", False))
    return phases
