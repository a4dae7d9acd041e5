"""An encoder-only model's plan (:mod:`hwdash.core.estimator.encoder`): training with its head and
loss, or inference as one forward pass.

The model states (weights, gradients, optimizer states, the step's temporaries) are counted as
for any model (:mod:`hwdash.core.estimator.training`); the activations, the head and the loss are
the encoder's own. LoRA on an encoder adapts the blocks' linears by their module names and, with
``all-linear``, the head's dense layer; PEFT's ``task_type="SEQ_CLS"`` also trains the classifier
in full (``modules_to_save``, PEFT's ``peft_model.py``), next to its frozen original.
"""

from __future__ import annotations

from hwdash.core.estimator import encoder
from hwdash.core.estimator.architecture import ALL_LINEAR, Architecture
from hwdash.core.estimator.phases import (
    _BACKWARD_END_ONLY,
    _BACKWARD_ONLY,
    _STEP_ONLY,
    _Accumulator,
)
from hwdash.core.estimator.savers import Savers
from hwdash.core.estimator.states import Layout, checkpoint_weight_bytes, model_state_bytes
from hwdash.core.estimator.training import (
    _add_adapted_weights,
    _add_full_weights,
    _add_gradients,
    _add_optimizer_states,
    _Trained,
)
from hwdash.core.plan import Method, Plan, Quant
from hwdash.core.specs import ModelSpec


def lora_head_params(plan: Plan, model: ModelSpec) -> int:
    """Adapters on the head's dense layer (``all-linear``) plus the classifier PEFT trains in full."""
    enc = encoder.encoder_layout(model)
    rank = plan.lora_r
    extra = enc.head_trained_copy
    if ALL_LINEAR in plan.lora_targets:
        for _, fan_in, fan_out in enc.head_linears:
            extra += rank * (fan_in + fan_out) + (fan_out if plan.method is Method.DORA else 0)
    return extra


def _adapter_activation_bytes(
    plan: Plan, model: ModelSpec, arch: Architecture, trained: _Trained, element_bytes: int
) -> int:
    """What the adapters keep per block beyond the frozen block: each adapted module's own
    dropped-out, 16-bit input (PEFT drops out each module's input separately), its dropout mask
    (one byte on CUDA), lora_A's output (read by lora_B); minus the inputs the frozen base linears
    no longer keep for their weight gradients."""
    t = plan.batch * plan.seq
    e = element_bytes
    kept = 0
    for linear in trained.targets:
        kept += e * t * linear.in_features + e * t * plan.lora_r
        if plan.lora_dropout > 0:
            kept += encoder.CUDA_MASK_BYTES * t * linear.in_features
        if plan.method is Method.DORA:
            # DoRA keeps the base and the LoRA outputs for the magnitude scaling (PEFT's
            # DoraLinearLayer; as activations._adapter_extras counts for decoders)
            kept += 2 * e * t * linear.out_features
    return kept - _frozen_inputs(model, t, e)


def _frozen_inputs(model: ModelSpec, tokens: int, e: int) -> int:
    """The linear inputs the full-training count keeps only for the weight gradients."""
    h, inter = model.hidden_size, model.intermediate_size
    if model.encoder_family == "modernbert":
        return e * tokens * (h + h + h + inter)
    return e * tokens * (h + h + h + inter)


def train_encoder(
    plan: Plan,
    model: ModelSpec,
    arch: Architecture,
    layout: Layout,
    dp: int,
    acc: _Accumulator,
    savers: Savers,
) -> int:
    """Add an encoder's training step; return its trainable parameters."""
    label = "model"
    method = plan.method
    if method is Method.FULL:
        trained = _add_full_weights(plan, arch, layout, dp, acc, label)
    else:
        trained = _add_adapted_weights(plan, arch, method, layout, dp, acc, label, savers)
        extra = lora_head_params(plan, model)
        if extra:
            total = trained.trainable + extra
            states = model_state_bytes(
                total, total, trained.state_layout, plan.optimizer, plan.zero, dp
            )
            acc.weights += states.weights - trained.states.weights
            acc.note(f"{label} head adapters and trained classifier", extra)
            trained = _Trained(total, states, trained.state_layout, trained.targets)
    gradients, step_temporaries = _add_optimizer_states(
        plan, arch, method, trained, dp, acc, label, savers
    )
    _add_gradients(plan, arch, method, trained, gradients, dp, acc, label, savers)
    acc.step_temporaries += step_temporaries
    acc.note(f"{label} optimizer step temporaries", step_temporaries, _STEP_ONLY)
    lora = method is not Method.FULL
    weight_bytes = 4 if lora else layout.weight_bytes  # LoRA trains under autocast (PEFT, Trainer)
    blocks, one, head = encoder.training_activation_bytes(
        plan, model, layout.activation_bytes, weight_bytes
    )
    if lora:
        adapters = _adapter_activation_bytes(plan, model, arch, trained, layout.activation_bytes)
        blocks += (1 if plan.grad_ckpt else model.layers) * adapters
        one += adapters
    elif layout.weight_bytes == 4 and layout.activation_bytes == 2:
        # autocast's 16-bit copy of every weight matrix, kept for the input gradients: the blocks'
        # linears and the head's (the tied decoder is the word embedding)
        copies = 2 * arch.layers * arch.linear_params_per_layer
        if model.encoder_head == "mlm":
            copies += 2 * (model.vocab_size + model.hidden_size) * model.hidden_size
        blocks += copies
    acc.last_layer_activations += one
    acc.note(f"{label} first layer's backward", one, _BACKWARD_END_ONLY)
    acc.activations += blocks + head
    acc.note(f"{label} activations", blocks, _BACKWARD_ONLY)
    acc.note(f"{label} {model.encoder_head} head and loss", head, _BACKWARD_ONLY)
    return trained.trainable


def encoder_inference(
    plan: Plan, model: ModelSpec, arch: Architecture, layout: Layout, dp: int, acc: _Accumulator
) -> None:
    """Inference: the weights and one forward pass's transients (no KV cache, no generation)."""
    weights = checkpoint_weight_bytes(arch, layout.weight_bytes) / dp
    if plan.quant is not Quant.NONE:
        from hwdash.core.estimator.quantization import quantized_inference

        weights = quantized_inference(plan, arch, layout.weight_bytes, dp, acc, weights)
    activations = encoder.inference_activation_bytes(
        model, plan.batch, plan.seq, layout.activation_bytes, plan.attention
    )
    acc.weights += weights
    acc.activations += activations
    acc.note("weights", weights)
    acc.note("forward activations (one block) and the head's output", activations, _BACKWARD_ONLY)
