"""RL plans (PPO, GRPO): the policy, a value model or head, frozen reference and reward models, and
the generation engine.

Sources:

* TRL's ``PPOTrainer`` and ``GRPOTrainer`` (a separate value model, a reference model, a reward
  model or reward functions) and ``AutoModelForCausalLMWithValueHead`` (a scalar value head on
  the policy's backbone: :func:`hwdash.core.estimator.savers.value_head_params`).
* PEFT: with adapters the reference is the policy with its adapters disabled (no second copy).
* vLLM's ``gpu_memory_utilization``: a colocated engine reserves that share of the GPU for its
  weights and KV cache.
* The KV cache and ZeRO-3 sharding of the frozen copies: :mod:`hwdash.core.estimator.inference`
  and :mod:`hwdash.core.estimator.states`.
"""

from __future__ import annotations

from hwdash.core.estimator import zero_buffers
from hwdash.core.estimator.architecture import Architecture
from hwdash.core.estimator.inference import (
    LEGACY_CACHE_LABEL,
    kv_cache_bytes,
    legacy_cache_copy_bytes,
)
from hwdash.core.estimator.phases import PHASE_MODEL_LOAD, _Accumulator
from hwdash.core.estimator.savers import Savers, value_head_params
from hwdash.core.estimator.states import (
    ADAPTER_LAYOUT,
    LAYOUTS,
    Layout,
    model_state_bytes,
)
from hwdash.core.estimator.training import _train_one_model
from hwdash.core.plan import LORA_STYLE_METHODS, Generation, Method, Plan, Precision, ValueHead
from hwdash.core.specs import Accelerator


def _add_rl(
    plan: Plan,
    arch: Architecture,
    layout: Layout,
    dp: int,
    acc: _Accumulator,
    accelerator: Accelerator | None,
    savers: Savers,
) -> int:
    """Add every model of an RL plan and its generation engine; return the trainable parameters
    (the policy's, plus PPO's value model or head)."""
    train_method = plan.rl_method
    lora_style = train_method in LORA_STYLE_METHODS
    trainable = _train_one_model(
        plan, arch, train_method, layout, dp, acc, "policy", with_logits=True, savers=savers
    )
    if plan.method is Method.PPO:
        trainable += _add_value_model(plan, arch, layout, dp, acc, savers)
    if plan.rl_reference:
        if lora_style:
            acc.note("reference = policy with adapters disabled (PEFT)", 0)
        else:
            _frozen_copy(plan, arch, layout, dp, acc, "reference model weights")
    if _rl_counts_reward_model(plan):
        _frozen_copy(plan, arch, layout, dp, acc, "reward model weights")
    _generation_engine(plan, arch, accelerator, acc)
    return trainable


def _add_value_model(
    plan: Plan, arch: Architecture, layout: Layout, dp: int, acc: _Accumulator, savers: Savers
) -> int:
    """PPO's value model, a second backbone or a head on the policy's; return its trainable
    parameters."""
    if savers.value_head is ValueHead.SHARED:
        # TRL's AutoModelForCausalLMWithValueHead: a scalar head on the policy's own backbone,
        # trained with it (savers.value_head_params); no second backbone, no second activations
        head = value_head_params(arch.hidden)
        head_layout = LAYOUTS[Precision.MIXED] if plan.zero > 0 else ADAPTER_LAYOUT
        head_states = model_state_bytes(head, head, head_layout, plan.optimizer, 0, 1)
        acc.weights += head_states.total
        acc.note("value head (shared backbone)", head_states.total)
        return head
    # The value model: the same backbone with a scalar head, trained the same way; no logits.
    return _train_one_model(
        plan, arch, plan.rl_method, layout, dp, acc, "value model", with_logits=False, savers=savers
    )


def _frozen_copy(
    plan: Plan, arch: Architecture, layout: Layout, dp: int, acc: _Accumulator, label: str
) -> None:
    """A frozen model (reference, reward) in the layout's weight dtype, sharded under ZeRO-3."""
    full = float(arch.total_params * layout.weight_bytes)
    gpu, host = zero_buffers.add_zero3_weights(plan, arch, full, dp, acc, label)
    acc.weights += gpu
    acc.host += host
    acc.note(label, gpu)
    acc.add_phase_bytes(PHASE_MODEL_LOAD, "weights", gpu, f"{label} as loaded")


def _generation_engine(
    plan: Plan,
    arch: Architecture,
    accelerator: Accelerator | None,
    acc: _Accumulator,
) -> None:
    """RL rollouts: a colocated vLLM engine's reservation, or the policy's own KV cache."""
    kv = kv_cache_bytes(arch, plan.batch, plan.seq, 2)
    if plan.vllm_memory_utilization == 0:
        generated = kv
        if plan.method is Method.GRPO:
            # TRL's GRPOTrainer generates once per optimizer step, for the whole generation batch:
            # per_device_train_batch_size x steps_per_generation (default gradient_accumulation_
            # steps; trl/trainer/grpo_config.py, grpo_trainer.py get_train_dataloader), as
            # --export trainer writes it. vLLM pages its KV cache: its minimum stays one batch.
            generated = kv_cache_bytes(arch, plan.batch * plan.grad_accum, plan.seq, 2)
        acc.kv_cache += generated
        acc.note("generation KV cache (policy generates)", generated)
        if plan.generation is Generation.LEGACY:
            # the policy's generate, as inference's (a vLLM engine pages its own cache)
            copy = legacy_cache_copy_bytes(arch, generated)
            acc.kv_cache += copy
            acc.note(LEGACY_CACHE_LABEL, copy)
        return
    # vLLM holds its own copy of the weights in 16 bits plus a KV cache; at the least one batch.
    engine_minimum = arch.total_params * 2 + kv
    if accelerator is None:
        acc.kv_cache += engine_minimum
        acc.note("vLLM engine (weights + KV cache minimum)", engine_minimum)
        acc.warnings.append(
            "no GPU given: the vLLM engine is counted at its minimum (bf16 weights + KV cache for "
            "batch x seq), not its gpu_memory_utilization share"
        )
        return
    share = plan.vllm_memory_utilization * accelerator.usable_bytes
    acc.kv_cache += share
    acc.note(f"vLLM engine ({plan.vllm_memory_utilization:.0%} of the GPU)", share)
    if share < engine_minimum:
        acc.warnings.append(
            f"vLLM's {plan.vllm_memory_utilization:.0%} share ({share / 2**30:.1f} GiB) is smaller than "
            f"its weights plus one batch of KV cache ({engine_minimum / 2**30:.1f} GiB): raise "
            "--vllm-util or generate with the policy (--vllm-util 0)"
        )


def _rl_counts_reward_model(plan: Plan) -> bool:
    """PPO: the flag as given (default on). GRPO: only when asked for explicitly.

    GRPO in TRL usually scores with reward functions; ``Plan.rl_reward_model`` defaults to True for
    PPO's sake, so for GRPO we count a reward model only when the user set the field.
    """
    if plan.method is Method.PPO:
        return plan.rl_reward_model
    return plan.rl_reward_model and "rl_reward_model" in plan.model_fields_set
