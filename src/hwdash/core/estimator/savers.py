"""The memory savers of the training stacks (issue 13): the loss path, torch.compile, activation
offloading, the optimizer step fused into backward, paged 8-bit optimizers, 16-bit QLoRA extras and
adapters, PPO's shared value head, and the ``--framework`` defaults that switch them on.

The estimator (:mod:`hwdash.core.estimator`) calls the functions here at the places where it counts
the loss, the activations, the gradients and the optimizer states; each formula names its source.
Framework defaults are data (``catalog/frameworks.toml``); :func:`resolve_savers` applies them to the
settings a plan leaves at None.
"""

from __future__ import annotations

import functools
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from hwdash.core.data_files import packaged_catalog_dir, read_catalog_toml
from hwdash.core.memo import IdentityMemo
from hwdash.core.plan import Loss, Method, Optimizer, Plan, StoreDtype, ValueHead
from hwdash.core.specs import Framework, _entry_label, _validation_error

#: torchtune's ``CEWithChunkedOutputLoss(num_output_chunks=8)``: the output projection and the loss
#: run on 8 chunks of the sequence (torchtune/modules/loss/ce_chunked_output_loss.py, and
#: ``model.set_num_output_chunks(self._loss_fn.num_output_chunks)`` in the recipes).
TORCHTUNE_OUTPUT_CHUNKS = 8

#: Bytes per logit at the loss's peak for transformers' path (``ForCausalLMLoss`` upcasts the logits
#: to fp32; log-softmax keeps its fp32 output; at the start of backward the saved output, the fp32
#: gradient out of NLL and the one log-softmax produces coexist). Traced on every training row of
#: bench/data/calibration.csv; the same constant as the estimator's ``LOSS_FP32_BYTES_PER_LOGIT``.
STANDARD_BYTES_PER_LOGIT = 12

#: Older transformers (before the loss refactor of v4.46, Oct 2024) returned fp32 logits from the
#: model (``logits = logits.float()`` in ``LlamaForCausalLM.forward``, v4.45) and the loss shifted them
#: with ``logits[..., :-1, :].contiguous()``: one more fp32 copy of the logits, 4 bytes per logit.
LEGACY_EXTRA_BYTES_PER_LOGIT = 4

#: Compiled (Inductor) cross-entropy fuses the fp32 upcast, log-softmax and NLL into one kernel that
#: keeps its fp32 input and a log-sum-exp per row; at the start of backward the saved fp32 logits
#: and their fp32 gradient coexist: 8 bytes per logit. From how AOTAutograd's min-cut partitioner
#: treats a pointwise/reduction chain (it saves the cheapest inputs and recomputes the rest;
#: torch/_functorch/partitioners.py ``min_cut_rematerialization_partition``); not traced.
COMPILED_STANDARD_BYTES_PER_LOGIT = 8


@dataclass(frozen=True)
class Savers:
    """The saver settings in force for one plan (plan fields, else framework defaults, else HF)."""

    framework: str
    loss: Loss
    compile: bool
    activation_offload: bool
    optimizer_in_backward: bool
    sync_each_batch: bool
    """FSDP gradients reduce-scattered after every micro-batch (no ``no_sync``)."""
    ddp_bucket_view: bool
    """DDP's gradients are views into its buckets, or no DDP reduces them: no second copy."""
    qlora_frozen_bytes: int
    """Bytes per unquantized parameter of a QLoRA / 8-bit LoRA base (4: PEFT's fp32 upcast)."""
    adapter_dtype: StoreDtype
    value_head: ValueHead
    fsdp1_adapters_share_units: bool = False
    """FSDP1 adapters in their block's unit: the block's whole flat parameter takes a gradient."""
    fsdp_root_keeps_head: bool = False
    """FSDP's root unit holds the output layer (``--fsdp-wrap transformer``): its gradient waits for
    the root's reduce-scatter at the end of backward (set by the FSDP path, not a framework)."""


@functools.cache
def packaged_frameworks() -> dict[str, Framework]:
    """The built-in ``frameworks.toml``, read once (a data file, like the rest of the catalog).

    The estimator falls back to it when a caller passes no framework entry; commands that load a
    user catalog pass ``catalog.frameworks[plan.framework.value]`` so overrides apply.
    """
    path = packaged_catalog_dir() / "frameworks.toml"
    frameworks: dict[str, Framework] = {}
    for index, raw in enumerate(read_catalog_toml(path).get("framework", [])):
        try:
            entry = Framework.model_validate(raw)
        except ValidationError as exc:
            raise _validation_error(path, _entry_label("framework", index, raw), exc) from None
        frameworks[entry.id] = entry
    return frameworks


#: The Plan fields the savers read (None: the framework's default), in the order of the flags.
SAVER_FIELDS = (
    "loss",
    "compile",
    "activation_offload",
    "optimizer_in_backward",
    "sync_each_batch",
    "ddp_bucket_view",
    "qlora_frozen_dtype",
    "adapter_dtype",
    "value_head",
)

#: Stated defaults already read, by Framework entry and method: every estimate resolves its savers,
#: and the make-it-fit search makes thousands.
_STATED: IdentityMemo[dict[str, Any]] = IdentityMemo()


def framework_settings(framework: Framework | None, method: Method) -> dict[str, Any]:
    """The framework's stated defaults for ``method``: the general ones, then ``full``'s (a new
    dict the caller may change)."""
    if framework is None:
        return {}

    def read() -> dict[str, Any]:
        settings = framework.given()
        if method is Method.FULL:
            settings.update(framework.full.given())
        return settings

    return dict(_STATED.get(framework, read, method))


def resolve_savers(plan: Plan, framework: Framework | None = None) -> Savers:
    """The savers for ``plan``: its own fields where set, else ``framework``'s defaults (the
    packaged entry for ``plan.framework`` when None), else the Hugging Face behaviour."""
    if framework is None:
        framework = packaged_frameworks().get(plan.framework.value)
    trained = plan.rl_method if plan.is_rl else plan.method
    defaults = framework_settings(framework, trained)

    def pick(name: str, fallback: Any) -> Any:
        value = getattr(plan, name)
        if value is not None:
            return value
        return defaults.get(name, fallback)

    frozen = StoreDtype(pick("qlora_frozen_dtype", StoreDtype.FP32))
    in_backward = bool(pick("optimizer_in_backward", False))
    if in_backward and plan.optimizer_in_backward is None and plan.grad_accum > 1:
        in_backward = False  # a framework default the plan cannot use (torchtune refuses it)
    loss = Loss(pick("loss", Loss.STANDARD))
    if plan.liger and plan.loss is None and not plan.megatron:
        loss = Loss.FUSED_LINEAR  # Liger's kernels bring its fused linear cross-entropy
    return Savers(
        framework=plan.framework.value,
        loss=loss,
        compile=bool(pick("compile", False)),
        activation_offload=bool(pick("activation_offload", False)),
        optimizer_in_backward=in_backward,
        sync_each_batch=bool(pick("sync_each_batch", False)),
        ddp_bucket_view=bool(pick("ddp_bucket_view", False)),
        fsdp1_adapters_share_units=bool(defaults.get("fsdp1_adapters_share_units", False)),
        qlora_frozen_bytes=2 if frozen is StoreDtype.BF16 else 4,
        adapter_dtype=StoreDtype(pick("adapter_dtype", StoreDtype.FP32)),
        value_head=ValueHead(pick("value_head", ValueHead.SEPARATE)),
    )


#: The plan fields a framework's defaults set where the user chose no value, in the order of the
#: flags. The savers (:data:`SAVER_FIELDS`) are not among them: a plan keeps those at None and
#: :func:`resolve_savers` reads the framework's defaults at every estimate.
FRAMEWORK_PLAN_FIELDS = ("precision", "grad_ckpt", "optimizer", "optimizer_impl")


def with_framework_defaults(
    plan: Plan, framework: Framework | None, chosen: Collection[str] = ()
) -> Plan:
    """``plan`` with ``framework``'s defaults (the catalog's entry for ``plan.framework``, from
    :meth:`Catalog.framework_for`) in every field of :data:`FRAMEWORK_PLAN_FIELDS` that is not in
    ``chosen``, the Plan fields the user set (typed flags, a ``--from`` file's settings, the form's
    edited rows): explicit choices always win.

    A field that is not chosen takes the framework's default for the plan's method (the policy's,
    for RL; ``full`` overrides for full fine-tuning), else the Plan's own default, whatever the
    plan held: so a form that showed torchtune's bf16 goes back to the Hugging Face default when
    the framework changes. The one function behind ``hwdash plan``, ``--from`` and the planner form.
    Raises ``pydantic.ValidationError`` when a default cannot combine with the plan (checkpointing
    with Megatron's selective recomputation)."""
    settings = framework_settings(framework, plan.rl_method if plan.is_rl else plan.method)
    defaults = Plan.model_fields
    updates = {
        name: settings.get(name, defaults[name].default)
        for name in FRAMEWORK_PLAN_FIELDS
        if name not in chosen
    }
    if all(getattr(plan, name) == value for name, value in updates.items()):
        return plan  # nothing to change (the enums compare equal to their values)
    return plan.with_changes(updates)


def applied_framework_defaults(
    plan: Plan, framework: Framework | None, chosen: Collection[str] = ()
) -> dict[str, Any]:
    """What ``framework`` (the catalog's entry for ``plan.framework``; None: the packaged one) set
    in ``plan`` that the user did not choose, field -> value (enums as their values), in the order
    of the flags: its :data:`FRAMEWORK_PLAN_FIELDS` outside ``chosen`` (the fields the user set, as
    for :func:`with_framework_defaults`) and its :data:`SAVER_FIELDS` the plan leaves at None. A
    default :func:`resolve_savers` cannot use (the optimizer in backward with accumulation) is
    left out: the framework did not apply it. For ``hwdash plan``'s text and ``--json``."""
    if framework is None:
        framework = packaged_frameworks().get(plan.framework.value)
    settings = framework_settings(framework, plan.rl_method if plan.is_rl else plan.method)
    applied: dict[str, Any] = {}
    for name in FRAMEWORK_PLAN_FIELDS:
        if name in settings and name not in chosen:
            value = getattr(plan, name)
            applied[name] = getattr(value, "value", value)
    in_force = resolve_savers(plan, framework)
    for name in SAVER_FIELDS:
        if name in settings and getattr(plan, name) is None:
            if name == "optimizer_in_backward" and not in_force.optimizer_in_backward:
                continue
            applied[name] = settings[name]
    return applied


#: Applied defaults the savers' own words (:func:`describe_savers`) already say, on the same line.
SAID_BY_SAVERS = frozenset(
    {
        "loss",
        "compile",
        "activation_offload",
        "optimizer_in_backward",
        "adapter_dtype",
        "qlora_frozen_dtype",
        "value_head",
    }
)


def describe_framework_defaults(applied: dict[str, Any]) -> str:
    """``applied`` (:func:`applied_framework_defaults`) as words for the line after the savers
    (``precision bf16, grad_ckpt on``): what the savers' words already say is left out, and so is
    a switch the framework leaves off (the JSON's ``framework_defaults`` keeps every one)."""
    words = []
    for name, value in applied.items():
        if name in SAID_BY_SAVERS or (value is False and name != "grad_ckpt"):
            continue
        shown = ("on" if value else "off") if isinstance(value, bool) else str(value)
        words.append(f"{name} {shown}")
    return ", ".join(words)


def describe_savers(savers: Savers) -> str:
    """One line for the plan's output: the loss path and the savers in force."""
    parts = [f"loss {savers.loss.value}"]
    for name, on in (
        ("compile", savers.compile),
        ("activation offload", savers.activation_offload),
        ("optimizer in backward", savers.optimizer_in_backward),
    ):
        if on:
            parts.append(name)
    parts.append(f"adapters {savers.adapter_dtype.value}")
    parts.append(f"QLoRA extras {'bf16' if savers.qlora_frozen_bytes == 2 else 'fp32'}")
    if savers.value_head is ValueHead.SHARED:
        parts.append("shared value head")
    return ", ".join(parts)


# --------------------------------------------------------------------------------------------------
# The loss.
# --------------------------------------------------------------------------------------------------


def loss_bytes_per_logit(
    loss: Loss, compiled: bool, element_bytes: int, chunks: int = TORCHTUNE_OUTPUT_CHUNKS
) -> float:
    """Bytes per logit alive at the loss's peak (start of backward), by loss path.

    * standard: :data:`STANDARD_BYTES_PER_LOGIT` (``max(e + 8, 12)`` for fp32 activations), or
      :data:`COMPILED_STANDARD_BYTES_PER_LOGIT` compiled;
    * legacy: standard plus :data:`LEGACY_EXTRA_BYTES_PER_LOGIT`;
    * chunked (torchtune's ``CEWithChunkedOutputLoss``): each chunk's 16-bit logits are upcast on
      their own, so across the loss the 16-bit logits (e) and every chunk's saved fp32 log-softmax
      output (4) are alive, plus one chunk's fp32 copy and gradient (8 / chunks). Compiled
      (torchtune compiles the per-chunk loss), the upcast, log-softmax and NLL fuse: each chunk
      keeps only its 16-bit input and a log-sum-exp per row, and one fused backward kernel writes
      the chunk's gradient straight in the 16-bit dtype (the cast's backward fused in): e + e / chunks;
    * fused-linear: no logits at all (see :func:`fused_linear_loss_bytes`).
    """
    standard = float(max(element_bytes + 8, STANDARD_BYTES_PER_LOGIT))
    if compiled:
        standard = float(COMPILED_STANDARD_BYTES_PER_LOGIT)
    if loss is Loss.STANDARD:
        return standard
    if loss is Loss.LEGACY:
        return standard + LEGACY_EXTRA_BYTES_PER_LOGIT
    if loss is Loss.CHUNKED:
        one_chunk = 8 / max(1, chunks)
        if compiled:
            return element_bytes + element_bytes / max(1, chunks)
        return element_bytes + 4 + one_chunk
    return 0.0


def fused_linear_loss_bytes(tokens: int, hidden: int, element_bytes: int) -> int:
    """What a fused linear cross-entropy holds: the hidden states' gradient (e t h, computed in the
    forward) and one chunk of logits with its in-place gradient.

    Liger-Kernel's ``fused_linear_cross_entropy_forward`` sizes a chunk so that its logits are about
    as large as the hidden states: ``chunk = next_power_of_2(ceil(BT / ceil(V / H)))`` tokens, so
    ``chunk * V`` is at most about ``2 * BT * H`` elements (src/liger_kernel/ops/
    fused_linear_cross_entropy.py; Hsu et al. 2024, arXiv:2410.10989, section 3.2). Cut
    Cross-Entropy (Wijmans et al. 2024, arXiv:2411.09009) keeps less: this is the larger of the two.
    """
    return element_bytes * tokens * hidden + 2 * element_bytes * tokens * hidden


def logits_and_loss_bytes(
    savers: Savers,
    batch: int,
    seq: int,
    vocab: int,
    hidden: int,
    element_bytes: int,
    softcap: bool,
    head_gradient_bytes: int = 0,
) -> int:
    """The loss's bytes at the start of backward for ``savers.loss`` (see the two functions above).

    Gemma 2's soft-capped logits keep one more 16-bit tensor (tanh's output) wherever the logits
    are materialised: the estimator's trace on gemma-2-2b. ``head_gradient_bytes`` is the output
    layer's weight gradient when it trains: a chunked or fused loss differentiates the output
    layer chunk by chunk (Liger allocates its ``grad_weight`` in the forward), so that gradient is
    alive next to the other chunks' saved tensors; the standard path only creates it after the
    fp32 tensors are freed.
    """
    tokens = batch * seq
    if savers.loss is Loss.FUSED_LINEAR:
        return fused_linear_loss_bytes(tokens, hidden, element_bytes) + head_gradient_bytes
    per_logit = loss_bytes_per_logit(savers.loss, savers.compile, element_bytes)
    if softcap:
        per_logit += element_bytes
    head = head_gradient_bytes if savers.loss is Loss.CHUNKED else 0
    return round(tokens * vocab * per_logit) + head


# --------------------------------------------------------------------------------------------------
# torch.compile, activation offloading, optimizer in backward, paged optimizers.
# --------------------------------------------------------------------------------------------------


def compiled_norm_saving(
    tokens: int, hidden: int, norms: int, element_bytes: int, weight_bytes: int, frozen: bool
) -> int:
    """Bytes per layer that compiling the RMSNorms saves.

    Eager ``LlamaRMSNorm`` keeps its fp32 upcast input (4 t h), the fp32 reciprocal RMS (4 t) and,
    when its weight trains, the normalised tensor (w t h) (see the estimator's ``_rms_norm_bytes``).
    Compiled, the upcast, the normalisation and the scale fuse into one kernel and AOTAutograd's
    min-cut partitioner saves the cheapest tensors that let backward recompute the rest: the 16-bit
    input and the reciprocal RMS (torch/_functorch/partitioners.py,
    ``min_cut_rematerialization_partition``). So each norm keeps ``e t h`` instead of
    ``(4 + w) t h``. Other fusions (SwiGLU, RoPE) are not counted: a smaller, safer saving. Checked
    against torchtune's "+ Compile" row (README, Llama 3.2 3B: -9.0 GiB measured; this and the
    compiled loss give -9.2 GiB), which is part of the test table, not a separate calibration.
    """
    if element_bytes >= 4:
        return 0
    per_norm = (4 - element_bytes) + (0 if frozen else weight_bytes)
    return norms * per_norm * tokens * hidden


#: Layers whose saved tensors activation offloading keeps on the GPU at once: the one backward is
#: working on and the next one, brought back early on a side stream (torchtune
#: torchtune/training/_activation_offloading.py ``OffloadActivations(use_streams=True)``; Unsloth's
#: offloaded checkpointing copies each checkpoint back just before its layer is recomputed).
OFFLOAD_LAYERS_ON_GPU = 2


def offloaded_activations(layers: int, per_layer_kept: float) -> tuple[float, float]:
    """(GPU, host) bytes of the saved activations with offloading: all but
    :data:`OFFLOAD_LAYERS_ON_GPU` layers' worth live in host RAM."""
    on_gpu = min(layers, OFFLOAD_LAYERS_ON_GPU) * per_layer_kept
    return on_gpu, max(0.0, layers * per_layer_kept - on_gpu)


def is_paged(optimizer: Optimizer) -> bool:
    """Whether the optimizer keeps its states in CUDA managed (paged) memory."""
    return optimizer in (Optimizer.ADAMW_8BIT_PAGED, Optimizer.ADAMW_32BIT_PAGED)


#: The value head TRL puts on the policy for a shared-backbone PPO (``ValueHead``: a dropout and
#: one ``Linear(hidden, 1)``; trl/models/modeling_value_head.py).
def value_head_params(hidden: int) -> int:
    """Parameters of a scalar value head on the backbone: ``hidden`` weights and a bias."""
    return hidden + 1
