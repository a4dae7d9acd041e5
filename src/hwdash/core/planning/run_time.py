"""The time model: how long a plan runs on some GPUs, and which catalog factors slow it down.

:func:`estimate_run_time` is the one place hours and throughput come from: the flavor table
(:func:`hwdash.core.planning.fit.evaluate_flavor`), make-it-fit's options (:mod:`hwdash.core.planning.fit_options`),
the saved plans' summaries and the ``hf jobs`` export's timeout all read its result, so they agree.

Two parts:

* Throughput from FLOPs. Training FLOPs per token: ``6 N`` for full training (Kaplan et al. 2020,
  arXiv:2001.08361 section 2.1; Hoffmann et al. 2022 "Chinchilla", arXiv:2203.15556): 2N forward,
  4N backward (gradients with respect to activations and to weights). LoRA-style methods skip the
  frozen weights' gradients: 2N forward + 2N backward = 4N (adapter weight gradients are
  negligible). Gradient checkpointing recomputes the forward: +2N. N counts parameters a token
  multiplies through (MoE: routed experts only, embedding lookups excluded; every expert where
  transformers runs all of them on every token, Llama 4's ``Llama4TextMoe``, modeling_llama4.py,
  except in a vLLM engine's generation, which runs the top-k). Attention-score FLOPs
  are left out, as in 6N. Time = FLOPs / (dense 16-bit tensor rate x GPUs x MFU); MFU from the
  catalog (per accelerator) or ``--mfu``. On a GPU without bf16 the fp16 rate is used. Inference
  decode is bound by memory bandwidth: each generated token reads every weight once plus the
  sequence's KV cache (a per-sequence rate; a batch of b shares the weight reads).
* The catalog's ``[[slowdown]]`` factors (``catalog/slowdowns.toml``, each with its source) for
  what FLOPs leave out: 4-bit and 8-bit dequantisation (``qlora``, ``lora-8bit``,
  ``int8-inference``), CPU offload (``offload-optimizer``, ``offload-params``, also for FSDP's CPU
  offload; ``megatron-offload-optimizer`` for Megatron's) and activation offloading. Every factor the plan brings in multiplies its time; the
  result names them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass

from hwdash.core.catalog import parse_catalog_file
from hwdash.core.data_files import packaged_catalog_dir
from hwdash.core.estimator import LAYOUTS, architecture, kv_cache_bytes
from hwdash.core.estimator.savers import resolve_savers
from hwdash.core.estimator.selective_ac import recompute_flops_per_token
from hwdash.core.plan import Method, Offload, Plan, Quant
from hwdash.core.specs import Accelerator, Framework, ModelSpec, Slowdown
from hwdash.core.units import GB


@functools.cache
def packaged_slowdowns() -> dict[str, Slowdown]:
    """The built-in ``slowdowns.toml``, read once: the factors a caller that passes none gets."""
    entries = parse_catalog_file(packaged_catalog_dir() / "slowdowns.toml")["slowdown"]
    return {entry.id: entry for entry in entries if isinstance(entry, Slowdown)}


def slowdown_ids(plan: Plan, framework: Framework | None = None) -> set[str]:
    """The catalog slowdown ids that apply to the plan (its method, quantization, offload and
    activation offloading, the last as ``framework`` resolves it; None: the packaged entry)."""
    ids = set()
    method = plan.rl_method if plan.is_rl else plan.method
    if method in (Method.QLORA, Method.LORA_8BIT):
        ids.add(method.value)
    if plan.method is Method.INFERENCE and plan.quant is Quant.INT8:
        ids.add("int8-inference")
    if plan.megatron_offload:
        # Megatron's own optimizer CPU offload (its catalog entry, not ZeRO-Offload's)
        ids.add("megatron-offload-optimizer")
    elif plan.offload is Offload.OPTIMIZER:
        ids.add("offload-optimizer")
    if plan.offload is Offload.PARAMS or plan.fsdp_offload:
        # ZeRO's parameter offload also offloads the optimizer (one factor for both, as its
        # catalog entry is measured against ZeRO-3 without any offload).
        ids.add("offload-params")
    if plan.is_training and resolve_savers(plan, framework).activation_offload:
        ids.add("activation-offload")
    return ids


@dataclass(frozen=True)
class RunTime:
    """How fast and how long a plan runs, the catalog's slowdowns included."""

    tokens_per_second: float | None
    """Training tokens/s, or for inference decode tokens/s per sequence; None when the hardware's
    rate (or bandwidth) is unknown."""
    hours: float | None
    """Wall-clock hours for the run's tokens; None without a data size or a rate."""
    slowdowns: tuple[Slowdown, ...] = ()
    """The catalog factors applied (by id), each with its source."""

    @property
    def factor(self) -> float:
        """The product of the applied factors (1.0: none)."""
        return math.prod(entry.factor for entry in self.slowdowns)


def _train_flops_factor(method: Method, grad_ckpt: bool) -> int:
    """Multiple of N FLOPs per token: 6 for full, 4 for LoRA-style, +2 with recomputation."""
    factor = 6 if method is Method.FULL else 4
    return factor + (2 if grad_ckpt else 0)


def flops_per_token(plan: Plan, model: ModelSpec, *, model_flops: bool = False) -> float:
    """FLOPs to train on (or, for RL, roll out and train on) one token.

    As transformers runs the step (every expert on every token where the MoE block does so), or
    with ``model_flops`` the model's own FLOPs (the top-k experts), the numerator of MFU as PaLM
    defines it (Chowdhery et al. 2022, arXiv:2204.02311, appendix B: what the implementation adds,
    like recomputation, is not counted).

    RL: the policy's generation (a forward, 2N; generation is bandwidth-bound in practice, so the
    time from FLOPs is a lower bound), the frozen reference and reward forwards (2N each), and the
    training of the policy and, for PPO, the value model.
    """
    arch = architecture(model)
    if plan.method is Method.INFERENCE:
        return 2.0 * arch.matmul_params_per_token
    # what transformers runs: every expert on every token where the MoE block does so (Llama 4's
    # Llama4TextMoe, modeling_llama4.py), the top-k otherwise
    n = arch.matmul_params_per_token if model_flops else arch.trained_matmul_params_per_token
    # torchtitan's selective checkpointing recomputes part of the forward (0 without it)
    again = recompute_flops_per_token(plan.selective_ac, arch, n)
    if not plan.is_rl:
        return float(_train_flops_factor(plan.method, plan.grad_ckpt) * n) + again
    train = _train_flops_factor(plan.rl_method, plan.grad_ckpt)
    factor = train  # policy training
    if plan.method is Method.PPO:
        factor += train  # value model
    if plan.rl_reference:
        factor += 2  # a frozen copy, or the policy with its adapters disabled: a forward either way
    if plan.method is Method.PPO and plan.rl_reward_model:
        factor += 2
    # generation: vLLM's engine runs the top-k experts; the policy's own generate what training runs
    generated = arch.matmul_params_per_token if plan.vllm_memory_utilization > 0 else n
    trained_models = 2 if plan.method is Method.PPO else 1  # the policy, and PPO's value model
    return float(factor * n + 2 * generated) + trained_models * again


def _unslowed_tokens_per_second(
    plan: Plan, model: ModelSpec, accelerator: Accelerator, gpus: int
) -> float | None:
    """Tokens/s from FLOPs (training) or bandwidth (inference decode, per sequence)."""
    if plan.method is Method.INFERENCE:
        if accelerator.memory_bandwidth_gbps is None:
            return None
        bandwidth = accelerator.memory_bandwidth_gbps * GB * gpus  # tensor parallel: ideal scaling
        arch = architecture(model)
        layout = LAYOUTS[plan.precision]
        weight_bytes = arch.total_params * layout.weight_bytes
        kv_one = kv_cache_bytes(arch, 1, plan.seq, layout.activation_bytes)
        # A batch reads the weights once per step and each sequence's own KV cache.
        step_seconds = (weight_bytes + plan.batch * kv_one) / bandwidth
        return 1.0 / step_seconds
    tflops, _dtype = accelerator.matmul_tflops()
    if tflops is None:
        return None
    mfu = plan.mfu if plan.mfu is not None else accelerator.default_mfu
    return tflops * 1e12 * gpus * mfu / flops_per_token(plan, model)


def estimate_run_time(
    plan: Plan,
    model: ModelSpec,
    accelerator: Accelerator,
    gpus: int,
    tokens: int | None,
    *,
    slowdowns: Mapping[str, Slowdown] | None = None,
    framework: Framework | None = None,
) -> RunTime:
    """The plan's speed and hours on ``gpus`` of ``accelerator`` for ``tokens`` tokens, times the
    ``slowdowns`` factors it brings in (None: the packaged catalog's; a catalog without an entry
    for an id applies none). ``framework``: the catalog's entry for ``plan.framework`` (None: the
    packaged one), which says whether activations are offloaded."""
    if slowdowns is None:
        slowdowns = packaged_slowdowns()
    applied = tuple(
        slowdowns[key] for key in sorted(slowdown_ids(plan, framework)) if key in slowdowns
    )
    rate = _unslowed_tokens_per_second(plan, model, accelerator, gpus)
    if rate is None:
        return RunTime(None, None, applied)
    factor = math.prod(entry.factor for entry in applied)
    tokens_per_second = rate / factor
    if plan.method is Method.INFERENCE:
        # the per-sequence rate; a batch decodes plan.batch sequences at once
        hours = None if tokens is None else tokens / (tokens_per_second * plan.batch) / 3600
    else:
        hours = None if tokens is None else tokens / tokens_per_second / 3600
    return RunTime(tokens_per_second, hours, applied)
