"""Images in a serving plan (``--method inference --engine vllm --images N --image-tokens T``).

A vision-language model's server spends memory on images in three places, each read from vLLM's
V1 code (file names of github.com/vllm-project/vllm):

* the weights: the vision tower and projector load with the model (already in
  :attr:`~hwdash.core.estimator.layout.Architecture.total_params`, so in the serving plan's
  weights line; nothing is added here);
* the profile run (``profile_run`` in ``vllm/v1/worker/gpu_model_runner.py``): before the
  language model's dummy forward, the runner encodes a dummy batch of the largest multimodal item,
  as many items as the encoder budget holds, and keeps their outputs in the encoder cache while
  the dummy forward and the sampler run; the KV pool is what is left after that peak. The budget
  (``compute_mm_encoder_budget`` in ``vllm/v1/core/encoder_cache_manager.py``): the encoder's
  compute budget and the encoder cache are ``max(max_num_batched_tokens, tokens of the largest
  item)`` each unless set, and the budget is the smaller of the two. The items
  (``MultiModalBudget._get_max_items`` in ``vllm/multimodal/encoder_budget.py``): ``budget //
  item tokens`` for the encoder, ``max_num_seqs x items per prompt`` for the decoder, the smaller
  of the two and at least one; items per prompt are ``limit_mm_per_prompt`` (here ``--images``,
  which ``--export vllm`` writes as ``--limit-mm-per-prompt``), at most ``max_model_len // item
  tokens`` and at least one;
* the KV cache: an image's tokens are positions of the request (its placeholders are replaced by
  the item's embeddings), so a request's length, ``max_model_len``, counts them: by default
  ``--seq`` text tokens plus ``N x T`` image tokens.

The largest item is ``--image-tokens`` tokens (the config's default where the family has one):
vLLM profiles the largest image its processor accepts, so give the largest image the server will
take (for Qwen2.5-VL, the ``max_pixels`` of ``--mm-processor-kwargs``, over 28 x 28 pixels per
token). The encoder's working set per image token is the inference one of
:mod:`hwdash.core.models.family_vision` (one block's forward without grad), split over ``tp`` as the
language model's forward is (vLLM's vision towers use its tensor-parallel linears, e.g.
``Qwen2_5_VisionMLP`` in ``vllm/model_executor/models/qwen2_5_vl.py``). The encoder's outputs
(item tokens x the language model's hidden size) stay whole on every rank.

Only vLLM V1's profile run (``profile = "batched-tokens"`` in ``catalog/engines.toml``) is modelled;
V0 (``vllm-v0``) and SGLang (no profile run) get the image tokens in the request length only.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from hwdash.core.estimator.images import image_tokens_per_example
from hwdash.core.estimator.serving import ServingMemory
from hwdash.core.plan import Plan
from hwdash.core.specs import ModelSpec, VisionSpec
from hwdash.errors import UsageError

#: The engine profile whose multimodal dummy encoder run is modelled (vLLM V1's).
ENCODER_PROFILED = "batched-tokens"


@dataclass(frozen=True)
class ServingImages:
    """The images of each request of a serving plan, and the tower that encodes them."""

    images: int
    """Images per request (vLLM's ``limit_mm_per_prompt``)."""
    tokens_per_image: int
    """Language-model tokens of the largest image (the item the profile run encodes)."""
    vision: VisionSpec
    hidden: int
    """The language model's hidden size: the width of each encoder output token."""


@dataclass(frozen=True)
class EncoderProfile:
    """The profile run's multimodal part on one GPU."""

    budget_tokens: int
    """vLLM's "Encoder cache will be initialized with a budget of N tokens"."""
    items: int
    """"... and profiled with N image items of the maximum feature size"."""
    working_bytes: int
    """The vision tower's forward over the items: one block's working set, split over TP."""
    cache_bytes: int
    """The items' encoder outputs, kept in the encoder cache through the dummy forward."""

    def peak_bytes(self, forward_bytes: int) -> int:
        """The profile's activation peak: the encoder outputs plus the larger of the encoder's
        working set (while they are made) and the language model's forward and sampler."""
        return self.cache_bytes + max(self.working_bytes, forward_bytes)


def encoder_profile(
    images: ServingImages,
    *,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    max_model_len: int,
    element_bytes: int,
    tp: int,
) -> EncoderProfile:
    """The dummy encoder run of vLLM V1's profile for ``images`` (module docstring)."""
    item = images.tokens_per_image
    budget = max(max_num_batched_tokens, item)
    per_prompt = max(1, min(images.images, max_model_len // item))
    items = max(1, min(budget // item, max_num_seqs * per_prompt))
    tokens = items * item
    working = images.vision.working_elements_per_image_token * tokens * element_bytes
    return EncoderProfile(
        budget_tokens=budget,
        items=items,
        working_bytes=math.ceil(working / tp),
        cache_bytes=tokens * images.hidden * element_bytes,
    )


@dataclass(frozen=True)
class ImageServingMemory(ServingMemory):
    """A serving plan's memory with images: the pool after the encoder's profile."""

    images: ServingImages | None = None
    encoder: EncoderProfile | None = None
    """None where the engine has no multimodal profile run (vLLM V0, SGLang)."""

    def to_json(self) -> dict[str, int | float]:
        """The ``serving`` object plus the encoder's figures (budget, items, bytes)."""
        document = super().to_json()
        if self.images is not None:
            document["images_per_request"] = self.images.images
            document["image_tokens"] = self.images.tokens_per_image
        if self.encoder is not None:
            document["encoder_budget_tokens"] = self.encoder.budget_tokens
            document["encoder_items"] = self.encoder.items
            document["encoder_activation_bytes"] = self.encoder.working_bytes
            document["encoder_cache_bytes"] = self.encoder.cache_bytes
        return document


def with_images(
    memory: ServingMemory, images: ServingImages | None, element_bytes: int = 2
) -> ServingMemory:
    """``memory`` (:func:`~hwdash.core.estimator.serving.serving_memory`, at ``element_bytes`` per
    activation) with the encoder's profile taken from the KV pool; ``memory`` itself for a
    text-only plan."""
    if images is None:
        return memory
    fields = {field.name: getattr(memory, field.name) for field in dataclasses.fields(memory)}
    fields["images"] = images
    engine, settings = memory.engine, memory.settings
    if engine.profile != ENCODER_PROFILED or memory.profile_tokens == 0:
        return ImageServingMemory(**fields)
    encoder = encoder_profile(
        images,
        max_num_batched_tokens=settings.max_num_batched_tokens or engine.max_num_batched_tokens,
        max_num_seqs=settings.max_num_seqs or engine.max_num_seqs,
        max_model_len=settings.max_model_len,
        element_bytes=element_bytes,
        tp=settings.tp,
    )
    activations = encoder.peak_bytes(memory.activation_bytes)
    pool = max(0, memory.budget_bytes - memory.weight_bytes - activations - memory.non_torch_bytes)
    fields.update(
        activation_bytes=activations,
        kv_cache_bytes=pool,
        kv_blocks=pool // (memory.block_tokens * memory.kv_bytes_per_token),
        encoder=encoder,
    )
    return ImageServingMemory(**fields)


def request_images(plan: Plan, model: ModelSpec) -> ServingImages | None:
    """The images of each request of ``plan`` (None without ``--images``); a UsageError naming the
    flag where the model has no vision tower or the tokens per image are unknown."""
    if not image_tokens_per_example(plan, model) or model.vision is None:
        return None
    return ServingImages(
        images=plan.images,
        tokens_per_image=plan.image_tokens or model.vision.image_tokens,
        vision=model.vision,
        hidden=model.hidden_size,
    )


def request_tokens(plan: Plan, images: ServingImages | None, max_model_len: int | None) -> int:
    """A request's length, ``max_model_len``: the flag's, else ``--seq`` text tokens plus the
    images' tokens; a UsageError naming ``--max-model-len`` where it cannot hold the images and
    one text token."""
    image_tokens = images.images * images.tokens_per_image if images else 0
    if max_model_len is None:
        return plan.seq + image_tokens
    if images is not None and max_model_len <= image_tokens:
        raise UsageError(
            f"{max_model_len:,} tokens cannot hold a request's {images.images} image(s) of "
            f"{images.tokens_per_image:,} tokens (its image tokens count in its length): give "
            f"at least {image_tokens + 1:,}, or leave it out for --seq plus the images' tokens",
            flag="--max-model-len",
        )
    return max_model_len
