"""The rules other tools and the seeds use, scored on the same grid as hwdash's estimator.

Each function returns the peak bytes the rule predicts for one traced case, or None where the rule
says nothing about that setting.
"""

from __future__ import annotations

from typing import Any

#: Bytes per element of a weight in each plan precision, for the rules that scale "the model size".
_WEIGHT_BYTES = {"fp32": 4, "amp": 4, "bf16": 2, "mixed": 2}


def accelerate_rule(record: dict[str, Any]) -> int | None:
    """``accelerate estimate-memory``: training with Adam, batch size 1, no activations.

    accelerate 1.15 ``commands/estimate.py`` (``estimate_training_usage``), where ``size`` is the fp32
    model size (4 bytes/param): for float32 the peak is the step, 4 x size (weights, gradients and two
    Adam states: 16 bytes/param); for float16/bfloat16 the peak is max(size, 1.5 x size, 2 x size) =
    2 x size = 8 bytes/param (the "optimizer" stage). Docs:
    https://huggingface.co/docs/accelerate/usage_guides/model_size_estimator ("roughly 4x the reported
    results ... 1x model, 1x gradients, 2x optimizer"). Inference: the model size in the dtype.
    Full fine-tuning only: the rule knows nothing of adapters.
    """
    params = int(record["total_params"])
    plan = record["plan"]
    if plan["method"] == "inference":
        return params * _WEIGHT_BYTES[plan["precision"]]
    if plan["method"] != "full" or plan["optimizer"] != "adamw":
        return None
    fp32_size = 4 * params
    if plan["precision"] == "fp32":
        return 4 * fp32_size
    return 2 * fp32_size


def deepspeed_rule(record: dict[str, Any]) -> int | None:
    """DeepSpeed's model-state estimate on one GPU without offload (ZeRO-2 form).

    ``deepspeed.runtime.zero.stage_1_and_2.estimate_zero2_model_states_mem_needs``: GPU bytes =
    4 x params + 16 x params / GPUs, i.e. 20 bytes/param on one GPU (bf16 weights and gradients,
    fp32 master, fp32 Adam m and v, plus an fp32 gradient copy). Activations are not counted.
    https://deepspeed.readthedocs.io/en/latest/memory.html. Full fine-tuning with Adam only.
    """
    plan = record["plan"]
    if plan["method"] != "full" or plan["optimizer"] != "adamw":
        return None
    params = int(record["total_params"])
    return 4 * params + 16 * params


#: Seed 000 ("hardware selection guide", memory section): full fine-tune GB = params in B x 20,
#: LoRA GB = params in B x 4. "GB" read as 10^9 bytes.
SEED_GB_PER_BILLION = {"full": 20, "lora": 4, "dora": 4}


def seed_rule(record: dict[str, Any]) -> int | None:
    """The seeds' rules of thumb (seed 000): x20 for full fine-tuning, x4 for LoRA."""
    factor = SEED_GB_PER_BILLION.get(record["plan"]["method"])
    if factor is None:
        return None
    base_params = int(record["total_params"]) - (
        int(record["trainable_params"]) if record["plan"]["method"] in ("lora", "dora") else 0
    )
    return int(base_params / 1e9 * factor * 1e9)


ANCHORS = {
    "accelerate": accelerate_rule,
    "deepspeed": deepspeed_rule,
    "seed": seed_rule,
}
