"""Images in a vision-language model's plan (``--images N --image-tokens T``).

Each image becomes ``T`` image tokens that take the place of the image placeholders in the
language model's sequence (``Qwen2_5_VLModel.forward`` scatters the merger's output into the
positions of ``image_token_id``, modeling_qwen2_5_vl.py; ``LlavaModel`` and ``Gemma3Model`` do the
same with ``masked_scatter``, modeling_llava.py, modeling_gemma3.py). So the language model runs
``seq + N x T`` tokens per example: its activations, logits and KV cache grow as for a longer
sequence. The vision tower runs each image's patches first; in training it keeps its saved
tensors until backward (counted for every trained method: full fine-tuning trains the tower, and
PEFT's ``all-linear`` adapts its linears too, ``_maybe_include_all_linear_layers`` in
``peft/tuners/tuners_utils.py``); for inference one block's working set is alive at a time. The
per-image-token element counts come from the config (:mod:`hwdash.core.models.family_vision`).
The tower's weights are counted whether or not a plan has images
(:attr:`~hwdash.core.estimator.layout.Architecture.vision_params`).
"""

from __future__ import annotations

from hwdash.core.estimator.phases import PHASE_BACKWARD, PHASE_INFERENCE, _Accumulator
from hwdash.core.plan import Method, Plan
from hwdash.core.specs import ModelSpec
from hwdash.errors import UsageError


def image_tokens_per_example(plan: Plan, model: ModelSpec) -> int:
    """``images x image tokens`` per example (0 for a text-only plan); a UsageError naming the
    flag where the model has no vision tower or the tokens per image are not known."""
    if plan.images == 0:
        if plan.image_tokens is not None:
            raise UsageError(
                "--image-tokens needs --images (images per example)", flag="--image-tokens"
            )
        return 0
    if model.vision is None:
        raise UsageError(
            f"{model.name} has no vision tower: --images needs a vision-language model's "
            "config.json (qwen2_5_vl, gemma3 with vision_config, llava, llava_next, llama4)",
            flag="--images",
        )
    per_image = plan.image_tokens or model.vision.image_tokens
    if not per_image:
        raise UsageError(
            f"{model.name}: the image tokens per image depend on the image's resolution "
            f"({model.vision.family}): give --image-tokens T (e.g. 256 for a 448x448 image at "
            "14 px patches merged 2x2)",
            flag="--image-tokens",
        )
    return plan.images * per_image


def with_image_tokens(plan: Plan, model: ModelSpec) -> tuple[Plan, int]:
    """(the plan with the image tokens added to ``seq``, image tokens per example)."""
    tokens = image_tokens_per_example(plan, model)
    if not tokens:
        return plan, 0
    return plan.model_copy(update={"seq": plan.seq + tokens}), tokens


def add_vision_activations(
    plan: Plan, model: ModelSpec, tokens: int, element_bytes: int, acc: _Accumulator
) -> None:
    """The vision tower's and projector's activations for ``tokens`` image tokens per example
    (module docstring): saved until backward in training, one block's working set in inference."""
    if not tokens or model.vision is None:
        return
    vision = model.vision
    per_batch = plan.batch * tokens * element_bytes
    label = f"vision tower ({plan.images} image{'s' if plan.images > 1 else ''} x {tokens // plan.images} tokens)"
    if plan.method is Method.INFERENCE:
        value = per_batch * vision.working_elements_per_image_token
        acc.activations += value
        acc.note(f"{label}, one block", value, frozenset({PHASE_INFERENCE}))
        return
    value = per_batch * vision.saved_elements_per_image_token
    acc.activations += value
    acc.note(f"{label} activations", value, frozenset({PHASE_BACKWARD}))
