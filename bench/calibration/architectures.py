"""Turn a catalog :class:`~hwdash.core.catalog.ModelSpec` into a Hugging Face config, at any depth.

The dimensions come from ``catalog/models.toml``; this module only picks the transformers model class
that matches the family (the catalog id's prefix) and fills in the fields the catalog does not carry
with the family's published defaults (activation, norm epsilon: they do not change memory).
"""

from __future__ import annotations

from typing import Any

from hwdash.core.specs import ModelSpec

#: Catalog id prefix -> transformers ``model_type``. Checked in order; the first match wins.
FAMILY_BY_PREFIX: tuple[tuple[str, str], ...] = (
    ("qwen2.5-", "qwen2"),
    ("qwen3-30b-a3b", "qwen3_moe"),
    ("qwen3-", "qwen3"),
    ("olmo-2-", "olmo2"),
    ("granite-", "granite"),
    ("stablelm-2-", "stablelm"),
    ("mixtral-", "mixtral"),
    ("mistral-", "mistral"),
    ("gemma-2-", "gemma2"),
    ("gemma-3-", "gemma3_text"),
    ("phi-", "phi"),
)

#: Families whose layers are not all alike: depth pairs for extrapolation must be whole periods.
#: Gemma 2 alternates sliding and global attention (period 2); Gemma 3 uses 5 sliding : 1 global.
LAYER_PERIOD: dict[str, int] = {"gemma2": 2, "gemma3_text": 6}

#: Families whose experts are fused 3-D weights run through ``torch._grouped_mm`` in the trace.
GROUPED_MM_FAMILIES = ("mixtral", "qwen3_moe")

#: Granite's scalar multipliers, from the config.json of ibm-granite/granite-3.1-2b-base (as copied by
#: https://huggingface.co/neuralmagic/granite-3.1-2b-base-FP8-dynamic/blob/main/config.json). Their
#: values do not change memory, but ``modeling_granite.py`` multiplies by them unconditionally, so the
#: trace runs those ops whatever they are; the published values are used.
GRANITE_MULTIPLIERS = {
    "embedding_multiplier": 12.0,
    "attention_multiplier": 0.015625,
    "residual_multiplier": 0.22,
    "logits_scaling": 8.0,
}

#: StableLM 2's rotary fraction (``partial_rotary_factor`` 0.25 in stabilityai/stablelm-2-1_6b's
#: config.json; the model card: rotary on the first 25% of each head's dimensions).
STABLELM_PARTIAL_ROTARY = 0.25


def family_of(spec: ModelSpec) -> str:
    """The transformers ``model_type`` used for a catalog model (``llama`` unless the id says more)."""
    for prefix, family in FAMILY_BY_PREFIX:
        if spec.id.startswith(prefix):
            return family
    if spec.experts > 1:
        return "mixtral"
    if spec.mlp == "standard":
        return "phi"
    return "llama"


def layer_period(spec: ModelSpec) -> int:
    """How many layers repeat as a unit (1 for uniform stacks)."""
    return LAYER_PERIOD.get(family_of(spec), 1)


def config_fields(spec: ModelSpec, layers: int) -> dict[str, Any]:
    """The transformers config fields (``model_type`` included) with the catalog's dimensions and
    ``layers`` blocks: what :func:`hwdash.tracing.trace_plan` builds the traced model from
    (``hf_config``)."""
    family = family_of(spec)
    fields: dict[str, Any] = {
        "model_type": family,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": layers,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads,
        "vocab_size": spec.vocab_size,
        "tie_word_embeddings": spec.tied_embeddings,
        "max_position_embeddings": spec.max_context,
    }
    if family in (
        "llama",
        "mistral",
        "mixtral",
        "qwen3",
        "qwen3_moe",
        "gemma2",
        "gemma3_text",
        "granite",
    ):
        fields["head_dim"] = spec.head_dim
    if family in ("llama", "qwen3", "qwen3_moe", "olmo2", "granite"):
        fields["attention_bias"] = spec.attention_bias
    if family == "mixtral":
        fields["num_local_experts"] = spec.experts
        fields["num_experts_per_tok"] = spec.experts_per_token
    if family == "qwen3_moe":
        # every layer sparse (decoder_sparse_step 1, no mlp_only_layers), each expert
        # moe_intermediate_size wide: the catalog's intermediate_size is the expert width
        fields["num_experts"] = spec.experts
        fields["num_experts_per_tok"] = spec.experts_per_token
        fields["moe_intermediate_size"] = spec.intermediate_size
        fields["decoder_sparse_step"] = 1
        fields["mlp_only_layers"] = []
    if family == "granite":
        fields.update(GRANITE_MULTIPLIERS)
        # the published config trains with attention_dropout 0.1; hwdash counts no dropout masks
        # in attention (as for GPT-2 and T5: hwdash.core.models.families.DROPOUT_NOTE), so neither does
        # the trace
        fields["attention_dropout"] = 0.0
    if family == "stablelm":
        fields["use_qkv_bias"] = spec.attention_bias
        fields["partial_rotary_factor"] = STABLELM_PARTIAL_ROTARY
        fields["qk_layernorm"] = False
        fields["use_parallel_residual"] = False
    if family == "phi":
        fields.pop("num_key_value_heads")
        fields["partial_rotary_factor"] = 0.4
    if family in ("gemma2", "gemma3_text"):
        # Keep the published layer pattern (sliding/global) but the window must not exceed the context.
        fields["sliding_window"] = min(4096, spec.max_context) if family == "gemma2" else 512
    return fields


def build_config(spec: ModelSpec, layers: int, attention: str) -> Any:
    """A transformers config with the catalog's dimensions and ``layers`` blocks.

    ``attention`` is ``sdpa`` or ``eager`` (``flash`` needs flash-attn and CUDA: not traceable here).
    """
    from transformers import AutoConfig

    fields = config_fields(spec, layers)
    family = fields.pop("model_type")
    config = AutoConfig.for_model(family, **fields)
    config._attn_implementation = attention
    if family in GROUPED_MM_FAMILIES:
        # The eager expert loop iterates over data-dependent expert ids, which fake tensors cannot
        # do; grouped_mm has static shapes (tokens x top-k) and is transformers' CUDA path
        # (hwdash.tracing sets the same for every config with experts).
        config._experts_implementation = "grouped_mm"
    return config
