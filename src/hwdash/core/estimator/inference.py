"""Inference: the weights as loaded, the KV cache and the prefill's transients.

Sources:

* GQA: Ainslie et al. 2023, arXiv:2305.13245 (only the ``kv_heads`` key/value heads are cached);
  Hugging Face's KV-cache docs, and its ``EncoderDecoderCache`` for an encoder-decoder's self- and
  cross-attention caches.
* transformers' ``generate`` (``logits_to_keep=1``: logits for the last position only).
* Quantized checkpoints and ``--quant``: :func:`~hwdash.core.estimator.states.checkpoint_weight_bytes`
  and :mod:`hwdash.core.estimator.quantization`.
* ``--generation legacy`` (:func:`legacy_cache_copy_bytes`): transformers' own comment in
  ``generation/utils.py`` (``_prepare_cache_for_generation``) on using a ``DynamicCache`` by
  default, "This will avoid back and forth from legacy format that keeps copying the cache thus
  using much more memory"; see the function for the versions.
"""

from __future__ import annotations

from hwdash.core.estimator import block_activations
from hwdash.core.estimator.architecture import Architecture
from hwdash.core.estimator.phases import _BACKWARD_ONLY, PHASE_MODEL_LOAD, _Accumulator
from hwdash.core.estimator.states import Layout, checkpoint_weight_bytes
from hwdash.core.plan import Attention, Generation, Plan, Quant

#: The detail line of the second cache copy ``--generation legacy`` counts.
LEGACY_CACHE_LABEL = (
    "legacy tuple cache: the previous step's keys and values, kept while torch.cat builds the next "
    "(--generation legacy)"
)


def eager_prefill_score_bytes(element_bytes: int) -> int:
    """Bytes per score element (b x heads x s x s) alive at once in an eager no-grad prefill.

    transformers' eager attention calls ``softmax(scores, dim=-1, dtype=torch.float32)``. ATen's
    ``softmax`` with a ``dtype`` (``aten/src/ATen/native/SoftMax.cpp``) runs the fused
    half-to-float kernel only for CUDA fp16 inputs; for bf16 (and every CPU input) it converts the
    scores to fp32 first and runs the softmax on that copy. So while the softmax runs, the 16-bit
    scores, their fp32 copy and the fp32 probabilities are alive together: ``e + 4 + 4`` bytes
    (fp32 scores need no copy: ``4 + 4``). Then ``.to(dtype)`` makes the 16-bit probabilities
    while the fp32 ones and the scores still exist (``4 + 2e``, never more). Traced (issue 14,
    ``bench/probe_gaps.py``): llama-3.2-1b and gemma-2-2b at b1/s1024 eager in bf16 hold one bf16
    ``add`` and two fp32 (``_to_copy``, ``_softmax``) score-sized tensors at the prefill peak.
    """
    copy = 4 if element_bytes != 4 else 0
    return max(element_bytes + 4 + copy, 4 + 2 * element_bytes)


def inference_activation_bytes(
    arch: Architecture, batch: int, seq: int, element_bytes: int, attention: Attention
) -> int:
    """Prefill transients: one layer at a time (no grad, nothing saved), plus last-token logits.

    Without autograd only the layer being computed holds intermediates: the fp32 norm upcast, Q/K/V,
    the scores for eager attention, and the MLP's gate, up and activated tensors together. Logits:
    transformers' ``generate`` computes them for the last position only (``logits_to_keep=1``), in
    16 bits plus an fp32 copy for sampling; a plain forward over the whole prompt would hold
    ``b * s * vocab`` logits instead.
    """
    tokens = batch * seq
    e = element_bytes
    norm = 4 * tokens * arch.hidden + e * tokens * arch.hidden
    qkv = e * tokens * (arch.q_dim + 2 * arch.kv_dim)
    if arch.mla:
        # latent attention expands its cached latent for every token (expand_kv in
        # modeling_deepseek_v2.py): kv_b_proj's output (nope + v per head) and the key it copies
        # into (nope + rope per head), beside the query
        nope = arch.head_dim - arch.qk_rope_head_dim
        qkv = e * tokens * (2 * arch.q_dim + arch.heads * (nope + arch.v_head_dim))
    scores = 0
    if attention is Attention.EAGER:
        scores = eager_prefill_score_bytes(e) * batch * arch.heads * seq * seq
        # eager attention reads K and V expanded to every query head (repeat_kv) and adds a
        # b x 1 x s x s additive causal mask in the activations' dtype
        qkv += 2 * e * tokens * (arch.q_dim - arch.kv_dim) + e * batch * seq * seq
    mlp = (3 if arch.gated_mlp else 2) * e * tokens * arch.intermediate
    if arch.experts > 1:
        mlp *= arch.routed_copies
    layer = max(norm + qkv + scores, norm + mlp)
    # an encoder-decoder keeps the encoder output for every decoder step
    encoder = block_activations.encoder_output_bytes(arch, batch, seq, e)
    return layer + batch * arch.vocab * (e + 4) + encoder


def kv_cache_bytes(
    arch: Architecture, batch: int, seq: int, element_bytes: int, prompt: int | None = None
) -> int:
    """Key and value cache at its peak: ``2 * layers * kv_heads * head_dim * seq * batch * bytes``.

    GQA-aware: only the ``kv_heads`` key/value heads are cached (Ainslie et al. 2023,
    arXiv:2305.13245); see also Hugging Face's KV-cache docs. Multi-head latent attention
    (DeepSeek-V2/V3): transformers caches the latent, ``kv_lora_rank + qk_rope_head_dim`` per
    token per layer (:attr:`~hwdash.core.estimator.Architecture.kv_cache_width`).

    Sliding-window and chunked layers (Gemma 2/3, Mistral, Llama 4): ``generate``'s
    ``DynamicCache`` gives them a ``DynamicSlidingWindowLayer`` (transformers 5.24
    ``cache_utils.py``, ``DYNAMIC_LAYER_TYPE_MAPPING``; a chunked layer's window is its
    ``attention_chunk_size``, ``get_layer_types_and_kwargs``), whose ``update`` concatenates the
    new keys to the kept ones and keeps the last ``window - 1`` as a slice, a view of the
    concatenated tensor. After the prefill that view holds the whole ``prompt``'s storage in every
    layer; from the first decoding step each sliding layer holds a ``window``-token tensor
    (:meth:`~hwdash.core.estimator.Architecture.kv_layer_tokens`). The peak is the larger of the
    two. ``prompt`` defaults to ``seq``: the plan's prefill covers the whole sequence
    (:func:`inference_activation_bytes`), and then the windows save nothing at the peak.
    (Checked on transformers 5.24 with a 6-layer Gemma 3 of window 8: after a 32-token prefill every
    layer's key storage is 32 tokens; after one decoding step the sliding ones' is 8.)
    """
    per_token = arch.kv_cache_width * batch * element_bytes
    decoding = arch.kv_layer_tokens(seq) * per_token
    prefill = arch.kv_cache_layers * min(seq, seq if prompt is None else prompt) * per_token
    return max(prefill, decoding)


def kv_cache_after_prefill_bytes(
    arch: Architecture, batch: int, seq: int, element_bytes: int
) -> int:
    """The cache once decoding has begun: every full layer's ``seq`` tokens, each sliding or
    chunked layer's window (:func:`kv_cache_bytes`); the whole cache without windows."""
    return arch.kv_layer_tokens(seq) * arch.kv_cache_width * batch * element_bytes


def legacy_cache_copy_bytes(arch: Architecture, cache_bytes: float) -> float:
    """The second copy of the cache older transformers' ``generate`` holds (``--generation legacy``).

    Before the ``Cache`` classes, each attention layer returned its cache as a new tuple,
    ``torch.cat([past_key, key], dim=-2)`` (and the values alike), while ``generate`` still held the
    previous step's tuple in ``model_kwargs["past_key_values"]`` until the forward returned: at
    the end of a decoding step every layer's old and new keys and values are alive, two copies.
    transformers 4.36 brought ``DynamicCache`` (PR #26681), but models converted the tuple they were
    given with ``from_legacy_cache`` and ``generate`` kept passing tuples, so the old tuple stayed
    referenced; in May 2024 (PR #30716, after 4.41) ``generate`` still defaulted to the legacy format,
    and ``_prepare_cache_for_generation`` keeps one ``DynamicCache`` from 4.42 on, whose
    ``update`` replaces each layer's tensor in place (one layer's old copy at a time).

    An encoder-decoder's cross-attention cache is computed once and handed back unchanged
    (no ``torch.cat``): only its self-attention half is copied.
    """
    if arch.cross_attention_layers:
        return cache_bytes * arch.cross_attention_layers / arch.kv_cache_layers
    return cache_bytes


def _window_label(arch: Architecture, decoding: float) -> str:
    """The KV cache's detail line for a model with sliding or chunked layers: what the cache
    holds once decoding has begun, and why the peak is still the whole prompt in every layer."""
    kinds = ", ".join(
        f"{kind} window {span:,} on {count} of {arch.kv_cache_layers} layers"
        for kind, span, count in arch.attention_groups
        if span
    )
    return (
        f"KV cache ({kinds}: {decoding / 2**30:.2f} GiB once decoding begins; the prefill "
        "holds the whole prompt in all, cache_utils.py DynamicSlidingWindowLayer)"
    )


def latent_kv_bytes_per_token(arch: Architecture, element_bytes: int) -> int:
    """Bytes per token of MLA's compressed cache over all layers: ``layers x (kv_lora_rank +
    qk_rope_head_dim) x bytes`` (DeepSeek-V2 paper, arXiv:2405.04434, Table 1), what a serving
    engine that keeps the latent holds. For a model without MLA, its ordinary key/value cache."""
    return arch.kv_cache_layers * arch.latent_kv_width * element_bytes


def decompressed_kv_bytes_per_token(arch: Architecture, element_bytes: int) -> int:
    """Bytes per token of the per-head keys and values MLA expands its latent into, over all
    layers (what a cache of expanded heads would hold); the ordinary cache without MLA."""
    return arch.kv_cache_layers * arch.decompressed_kv_width * element_bytes


def _add_inference(
    plan: Plan, arch: Architecture, layout: Layout, dp: int, acc: _Accumulator
) -> None:
    """Add an inference plan's weights (quantized as the checkpoint or ``--quant`` says), KV cache
    and prefill activations to ``acc``; weights and cache split over ``dp`` GPUs."""
    element_bytes = layout.activation_bytes
    weights = checkpoint_weight_bytes(arch, layout.weight_bytes) / dp
    if plan.quant is not Quant.NONE:
        # imported here: hwdash.core.estimator.quantization imports this package
        from hwdash.core.estimator.quantization import quantized_inference

        weights = quantized_inference(plan, arch, layout.weight_bytes, dp, acc, weights)
    kv = kv_cache_bytes(arch, plan.batch, plan.seq, element_bytes) / dp
    activations = inference_activation_bytes(
        arch, plan.batch, plan.seq, element_bytes, plan.attention
    )
    if plan.quant is Quant.NONE:
        acc.add_phase_bytes(PHASE_MODEL_LOAD, "weights", weights, "weights as loaded")
    acc.weights += weights
    acc.kv_cache += kv
    acc.activations += activations
    acc.note("weights", weights)
    if arch.mla:
        # what generate holds: transformers caches the latent, not per-head keys and values
        acc.note(
            f"KV cache (latent attention: the {arch.kv_lora_rank}-wide latent and the "
            f"{arch.qk_rope_head_dim}-wide rotary key per token per layer, as transformers caches "
            f"them; per-head keys and values would take {arch.decompressed_kv_width} per token "
            "per layer)",
            kv,
        )
    elif arch.layer_attention:
        decoding = kv_cache_after_prefill_bytes(arch, plan.batch, plan.seq, element_bytes) / dp
        acc.note(_window_label(arch, decoding), kv)
    else:
        acc.note("KV cache", kv)
    if plan.generation is Generation.LEGACY:
        copy = legacy_cache_copy_bytes(arch, kv)
        acc.kv_cache += copy
        acc.note(LEGACY_CACHE_LABEL, copy)
    acc.note("prefill activations (one layer) + last-token logits", activations, _BACKWARD_ONLY)
    if dp > 1:
        acc.warnings.append(
            f"inference on {dp} GPUs assumes the weights and KV cache are split evenly "
            "(tensor parallel, as vLLM does)"
        )
