"""Which transformers config a trace builds: from the catalog's dimensions, the model's own config
or the plan's config.json (the dict is pure; :func:`_build_config` imports transformers)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hwdash.core.plan import Plan
from hwdash.core.specs import ModelSpec
from hwdash.tracing.results import TraceUnavailable
from hwdash.tracing.settings import TraceSettings

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


#: Types transformers has no causal-LM class for, traced as the decoder they share: Qwen2.5-VL's
#: language model is Qwen2's (``hf_config_of`` in hwdash.core.models.config says why).
_TRACED_AS = {"qwen2_5_vl": "qwen2", "qwen2_5_vl_text": "qwen2", "llama4": "llama4_text"}


def hf_model_type(model: ModelSpec) -> str:
    """The transformers ``model_type`` that builds ``model``: its config's (every catalog model and
    every config.json carries one), else read from its ids, else from its shape."""
    if model.model_type:
        return _TRACED_AS.get(model.model_type, model.model_type)
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
    from hwdash.core.models.config import hf_config_of

    raw = hf_config_of(raw)
    if not raw.get("model_type"):
        return None
    return {key: value for key, value in raw.items() if key not in _DROPPED_CONFIG_KEYS}


#: MoE families whose experts have a forward of their own, with static shapes, and no
#: ``@use_experts_implementation`` (transformers refuses ``_experts_implementation`` for them):
#: Llama 4's ``Llama4TextExperts`` multiplies every expert with ``torch.bmm`` (modeling_llama4.py).
_OWN_EXPERTS_FORWARD = {"llama4_text"}


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
    if int(experts or 1) > 1 and fields["model_type"] not in _OWN_EXPERTS_FORWARD:
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
