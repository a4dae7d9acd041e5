"""Turn what the user typed after ``--model`` into a :class:`ModelSpec`.

Three forms, tried in order:

1. a catalog id, display name or Hugging Face id (``qwen2.5-7b``, ``Qwen/Qwen2.5-7B``);
2. a path to a Hugging Face ``config.json`` or to a folder holding one, read with :mod:`json` only
   (no transformers, no network);
3. a bare parameter count (``7B``, ``500M``), which gets a synthetic dense Llama-style architecture.

Anything else is a :class:`UsageError` naming ``--model`` and suggesting close catalog matches.
"""

from __future__ import annotations

import difflib
import functools
import json
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pydantic import ValidationError

from hwdash.core.estimator.architecture import architecture
from hwdash.core.models import family_llama4, family_vision, hf_cache, windows
from hwdash.core.models.families import FAMILY_READERS, family_model
from hwdash.core.models.fields import (
    ACTIVATIONS,
    FLAG,
    _checkpoint_bits,
    _get_bool,
    _get_int,
    _shown,
)
from hwdash.core.specs import ModelSpec, VisionSpec
from hwdash.core.units import parse_count
from hwdash.errors import UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib


#: ``model_type`` values whose config we understand, and the MLP kind each uses.
#: Sources: the ``configuration_*.py`` / ``modeling_*.py`` files of transformers for each type.
SUPPORTED_MODEL_TYPES: dict[str, str] = {
    "llama": "gated",
    "mistral": "gated",
    "mixtral": "gated",
    "qwen2": "gated",
    "qwen3": "gated",
    "qwen2_moe": "gated",
    "qwen3_moe": "gated",
    "gemma": "gated",
    "gemma2": "gated",
    "gemma3": "gated",
    "gemma3_text": "gated",
    "phi": "standard",
    "phi3": "gated",
    # Qwen2.5-VL's language model (modeling_qwen2_5_vl.py Qwen2_5_VLTextModel): Qwen2's layout
    "qwen2_5_vl": "gated",
    "qwen2_5_vl_text": "gated",
}

#: transformers' per-type default for ``tie_word_embeddings`` when a config leaves it out
#: (``PretrainedConfig`` defaults to True; Llama, Mistral, Mixtral, Qwen2/3 and Phi override it to
#: False in their config classes, Gemma keeps True).
_TIED_BY_DEFAULT = {"gemma", "gemma2", "gemma3", "gemma3_text"}

#: Families whose q/k/v biases are not a config key: ``modeling_qwen2.py`` builds ``q_proj``,
#: ``k_proj`` and ``v_proj`` with ``bias=True`` and ``modeling_phi.py`` every projection with
#: ``bias=True``, whatever ``attention_bias`` says.
_BIAS_ALWAYS = {"qwen2", "phi", "qwen2_5_vl_text"}

#: Defaults of ``attention_bias`` (or the family's own key) when a config leaves it out:
#: ``Qwen2MoeConfig.qkv_bias`` is True (``modeling_qwen2_moe.py`` reads ``config.qkv_bias``).
_BIAS_KEY = {"qwen2_moe": ("qkv_bias", True)}

#: The config key each family's MLP activation is read from (``ACT2FN[config.<key>]`` in its
#: modeling file) and the config class's default: ``modeling_gemma2.py`` and ``modeling_gemma3.py``
#: read ``hidden_activation``; the others ``hidden_act`` (``modeling_llama.py``, ``modeling_qwen3.py``,
#: ``modeling_gemma.py``, ``modeling_phi.py``...).
_ACTIVATION_KEY: dict[str, tuple[str, str]] = {
    "gemma": ("hidden_act", "gelu_pytorch_tanh"),  # configuration_gemma.py GemmaConfig
    "gemma2": ("hidden_activation", "gelu_pytorch_tanh"),  # configuration_gemma2.py
    "gemma3_text": ("hidden_activation", "gelu_pytorch_tanh"),  # configuration_gemma3.py
    "phi": ("hidden_act", "gelu_new"),  # configuration_phi.py PhiConfig
}

#: ``GemmaConfig.__post_init__`` (configuration_gemma.py) turns the legacy ``hidden_act: "gelu"`` of
#: the released Gemma 1 configs into ``gelu_pytorch_tanh``, the tanh approximation they were trained with.
_LEGACY_GELU = {"gemma"}

#: Config-class defaults for dimension keys a published config.json may leave out. Gemma 3's
#: multimodal checkpoints (google/gemma-3-4b-pt) write only a few keys in ``text_config`` and rely on
#: ``Gemma3TextConfig`` (configuration_gemma3.py) for the rest; ``GemmaConfig`` and ``Gemma2Config``
#: default ``head_dim`` to 256 and ``Qwen3Config`` to 128 (not hidden_size / heads).
_DIMENSION_DEFAULTS: dict[str, dict[str, int]] = {
    "gemma": {"head_dim": 256},
    "gemma2": {"head_dim": 256},
    "gemma3_text": {
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "vocab_size": 262_208,
        "max_position_embeddings": 131_072,
    },
    "qwen3": {"head_dim": 128},
}

#: Soft caps, by config key, with the config class's default when the key is absent (an explicit
#: null means no cap): ``Gemma2Config`` caps attention scores at 50 and logits at 30
#: (``modeling_gemma2.py``: ``softcap`` in ``eager_attention_forward``, ``final_logit_softcapping``
#: in ``Gemma2ForCausalLM.forward``); ``Gemma3TextConfig`` defaults both to None (Gemma 3 uses
#: q/k norms instead of the attention cap).
_SOFTCAP_DEFAULTS: dict[str, tuple[float | None, float | None]] = {
    "gemma2": (50.0, 30.0),
    "gemma3_text": (None, None),
}

#: What each family's modeling file fixes, whatever its config says (ModelSpec field -> value).
#: The types not listed keep ModelSpec's defaults, the Llama layout: two RMSNorms per block that
#: normalise in fp32, cast back, then scale by the weight (``LlamaRMSNorm`` in modeling_llama.py, and
#: its copies in modeling_mistral.py, modeling_mixtral.py, modeling_qwen2.py,
#: modeling_qwen2_moe.py, modeling_phi3.py), no q/k norms, no soft caps. Phi-3's fused ``qkv_proj``
#: and ``gate_up_proj`` (modeling_phi3.py) hold and produce what separate q/k/v and gate/up
#: projections do, so the layout counts them as those.
_FAMILY_FACTS: dict[str, dict[str, Any]] = {
    # modeling_qwen3.py Qwen3Attention: q_norm and k_norm, Qwen3RMSNorm over head_dim, before RoPE
    "qwen3": {"qk_norm": True},
    # modeling_qwen3_moe.py Qwen3MoeAttention: the same q_norm and k_norm
    "qwen3_moe": {"qk_norm": True},
    # modeling_gemma.py GemmaRMSNorm: normalise in fp32, scale by (1 + weight.float()), cast back
    "gemma": {"norm_type": "rmsnorm_offset"},
    # modeling_gemma2.py Gemma2DecoderLayer: input_layernorm, post_attention_layernorm,
    # pre_feedforward_layernorm and post_feedforward_layernorm; Gemma2RMSNorm scales by (1 + weight)
    "gemma2": {"norm_type": "rmsnorm_offset", "norms_per_layer": 4},
    # modeling_gemma3.py: the same four Gemma3RMSNorms per Gemma3DecoderLayer, and Gemma3Attention's
    # q_norm and k_norm (Gemma3RMSNorm over head_dim, so with the (1 + weight) fp32 scale too)
    "gemma3_text": {"norm_type": "rmsnorm_offset", "norms_per_layer": 4, "qk_norm": True},
    # (norm_weights_per_layer stays at 2 for Gemma 2/3 and Phi, as the catalog's trace-tuned entries
    # had it, though their blocks hold four and one norms' weights: a few hundred thousand parameters;
    # a change of the counted parameters, left to a decision of its own.)
    # modeling_phi.py PhiDecoderLayer: one input_layernorm (torch's nn.LayerNorm with weight and
    # bias, which keeps its input and per-row mean and rstd for backward) read by both attention and
    # the MLP, and `attn_outputs + feed_forward_hidden_states + residual` (a parallel block); PhiMLP
    # fc1/fc2 and PhiAttention's dense have biases (mlp "standard" implies them)
    "phi": {
        "norms_per_layer": 1,
        "norm_type": "layernorm",
        "norm_saves_input": True,
        "parallel_block": True,
    },
}

#: Types whose facts are another's: Gemma 3's text model has the outer type ``gemma3`` in a
#: config without ``text_config``.
_SAME_AS = {"gemma3": "gemma3_text", "qwen2_5_vl": "qwen2_5_vl_text"}

#: Families whose modules transformers names otherwise than Llama's (``ModelSpec.module_names``,
#: ``catalog/shapes/module_names.toml``): Phi's ``dense``, ``fc1``, ``fc2``; Phi-3's fused
#: ``qkv_proj`` and ``gate_up_proj``; Mixtral's older ``w1``/``w2``/``w3``.
_MODULE_NAMES = {"phi": "phi", "phi3": "phi3", "mixtral": "mixtral"}

#: Synthetic models (bare parameter counts). Llama-1/2 shapes: 7B is 32 layers x 4096 wide, 13B 40 x
#: 5120, 70B 80 x 8192 (Touvron et al. 2023, arXiv:2302.13971 Table 2 and arXiv:2307.09288), so
#: layers ~ hidden / 128; head_dim 128 (64 below 1024 wide); SwiGLU MLP of ~8/3 hidden; vocabulary
#: 32000; untied embeddings; GQA with 8 KV heads from 30B up, as Llama-2-70B.
SYNTHETIC_VOCAB = 32_000
SYNTHETIC_CONTEXT = 4096
SYNTHETIC_GQA_FROM = 30_000_000_000
SYNTHETIC_MIN_PARAMS = 1_000_000
#: 100T: fifty times the largest dense model trained so far (~2T), and below where the shape
#: would need more than ModelSpec's 10,000 layers (width stops at 65536, so layers grow with the
#: count: 1000T asked for 209,041).
SYNTHETIC_MAX_PARAMS = 100 * 10**12


class ModelLookup(Protocol):
    """What the door needs of a catalog (:class:`hwdash.core.catalog.Catalog` is one): its models
    and their lookup. A protocol, so that the readers do not import the catalog that imports them."""

    @property
    def models(self) -> Mapping[str, ModelSpec]: ...

    def find_model(self, name: str) -> ModelSpec | None: ...


def resolve_model(ref: str, catalog: ModelLookup) -> ModelSpec:
    """The model ``ref`` names: catalog entry, ``config.json`` (or its folder), or parameter count."""
    text = ref.strip()
    if not text:
        raise UsageError(
            "give a catalog model id, a config.json path or a parameter count", flag=FLAG
        )
    found = catalog.find_model(text)
    if found is not None:
        return found
    path = Path(text).expanduser()
    try:
        is_dir, is_file = path.is_dir(), path.is_file()
    except OSError:  # a name too long for a path (ENAMETOOLONG) is not a path
        is_dir = is_file = False
    if is_dir:
        config = path / "config.json"
        if not config.is_file():
            raise UsageError(f"folder '{text}' has no config.json", flag=FLAG)
        return model_from_config_file(config)
    if is_file:
        return model_from_config_file(path)
    try:
        count = parse_count(text)
    except ValueError:
        count = None
    if count is not None:
        return synthetic_model(count)
    if text.endswith(".json"):
        raise UsageError(f"no such file: '{text}'", flag=FLAG)
    if hf_cache.REPO_ID.match(text):
        cached = hf_cache.cached_config(text)
        if cached is not None:
            return model_from_config_file(cached, name=text)
        raise UsageError(
            f"'{text}' is not in hwdash's catalog nor in the Hugging Face cache "
            f"({hf_cache.cache_dir()}; set HF_HUB_CACHE or HF_HOME, or download it with "
            "`hf download`): hwdash never fetches models",
            flag=FLAG,
        )
    raise UsageError(_unknown_model_message(text, catalog), flag=FLAG)


def cached_models(catalog: ModelLookup) -> list[ModelSpec]:
    """Models in the local Hugging Face cache that the catalog does not already know (by
    Hugging Face id), read from their cached config.json; unreadable ones are skipped."""
    known = {model.hf_id.lower() for model in catalog.models.values() if model.hf_id}
    found = []
    for repo_id in hf_cache.cached_model_ids():
        if repo_id.lower() in known:
            continue
        path = hf_cache.cached_config(repo_id)
        if path is None:
            continue
        try:
            found.append(model_from_config_file(path, name=repo_id))
        except UsageError:
            continue
    return found


def _unknown_model_message(text: str, catalog: ModelLookup) -> str:
    names: dict[str, str] = {}
    for model in catalog.models.values():
        for alias in (model.id, model.name, model.hf_id):
            if alias:
                names[alias.lower()] = model.id
    close = difflib.get_close_matches(text.lower(), list(names), n=5, cutoff=0.5)
    ids = list(dict.fromkeys(names[name] for name in close))
    hint = f"; did you mean {', '.join(ids)}?" if ids else ""
    return (
        f"unknown model '{text}' (not a catalog id, not a config.json path, not a count like 7B)"
        f"{hint or '.'} See `hwdash catalog list --kind models`."
    )


# --------------------------------------------------------------------------------------------------
# config.json
# --------------------------------------------------------------------------------------------------


def model_from_config_file(path: Path, *, name: str | None = None) -> ModelSpec:
    """Read a Hugging Face ``config.json`` with :mod:`json` and build a :class:`ModelSpec`
    (named ``name``, else after its folder)."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read '{path}': {exc}", flag=FLAG) from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"'{path}' is not valid JSON: {exc}", flag=FLAG) from None
    except RecursionError:
        raise UsageError(f"'{path}' is nested too deeply to be a config.json", flag=FLAG) from None
    except ValueError as exc:  # an integer literal over Python's digit limit
        raise UsageError(f"'{path}' is not usable JSON: {exc}", flag=FLAG) from None
    if not isinstance(raw, dict):
        raise UsageError(f"'{path}' is not a config.json object", flag=FLAG)
    folder = path.parent.name if path.name == "config.json" else path.stem
    return model_from_config(raw, name=name or folder or "model", source=str(path))


def _experts(fields: dict[str, Any], source: str) -> int:
    """The MoE expert count: Mixtral's ``num_local_experts``, else Qwen MoE's ``num_experts``; 1
    (dense) when neither is set, or when one says 0 as some dense configs do. Any other
    non-integer (``false``, ``"8"``) is refused rather than read as dense."""
    for key in ("num_local_experts", "num_experts"):
        value = fields.get(key)
        if value is None or (value == 0 and type(value) is int):
            continue
        return _get_int(fields, key, source)
    return 1


def model_from_config(config: dict[str, Any], *, name: str, source: str) -> ModelSpec:
    """Build a :class:`ModelSpec` from a parsed ``config.json``.

    Multimodal configs (Gemma 3) keep the language model under ``text_config``; its fields win. The
    vision tower is not counted (a text-only plan does not load it with ``AutoModelForCausalLM``).
    Missing ``head_dim`` is ``hidden_size / num_attention_heads``; missing ``num_key_value_heads``
    means no GQA.
    """
    fields, model_type = _merged_fields(config, source)
    if model_type in FAMILY_READERS:
        return family_model(model_type, fields, name=name, source=source)
    if model_type not in SUPPORTED_MODEL_TYPES:
        supported = ", ".join(sorted({*SUPPORTED_MODEL_TYPES, *FAMILY_READERS}, key=str.lower))
        raise UsageError(
            f"{source}: model_type {_shown(model_type or '?')} is not supported "
            f"(supported: {supported})",
            flag=FLAG,
        )
    family = _SAME_AS.get(model_type, model_type)
    # config-class defaults for the keys this family's published configs may leave out
    for key, value in _DIMENSION_DEFAULTS.get(family, {}).items():
        if fields.get(key) is None:
            fields[key] = value
    dimensions = _dimensions(config, fields, model_type, family, source)
    family_fields = _family_fields(family, fields, source)
    try:
        return ModelSpec(
            id=name.lower(),
            name=name,
            **dimensions,
            source=f"config.json: {source}",
            model_type=model_type,
            hf_config=hf_config_of(config),
            **family_fields,
            module_names=_MODULE_NAMES.get(model_type, ""),
            **_shared_expert(fields, source, dimensions["experts"]),
            vision=_vision(config, dimensions["hidden_size"], source),
            **windows.window_layout(family, fields, dimensions["layers"], source),
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        raise UsageError(f"{source}: {field}: {first['msg']}", flag=FLAG) from None


def _vision(config: dict[str, Any], text_hidden: int, source: str) -> VisionSpec | None:
    """A vision-language config's vision tower and projector (:mod:`family_vision`); None for a
    text model. A ``gemma3`` config is multimodal only with a ``vision_config`` (without one it
    is Gemma 3's text model)."""
    outer = config.get("model_type")
    if outer not in family_vision.VISION_FAMILIES:
        return None
    if outer == "gemma3" and "vision_config" not in config:
        return None
    return family_vision.read_vision(config, outer, text_hidden, source)


def _merged_fields(config: dict[str, Any], source: str) -> tuple[dict[str, Any], str]:
    """(the config's fields with ``text_config``'s over them, the model type to read them as):
    the text model's type, or the outer one where only that is supported."""
    outer_type = config.get("model_type", "")
    if not isinstance(outer_type, str):  # refused below, naming the field
        outer_type = ""
    text = config.get("text_config")
    fields = dict(config)
    if isinstance(text, dict):
        fields.update(text)
    model_type = fields.get("model_type") or outer_type
    if not isinstance(model_type, str):
        raise UsageError(
            f"{source}: 'model_type' must be a string, got {_shown(model_type)}", flag=FLAG
        )
    if model_type not in SUPPORTED_MODEL_TYPES and outer_type in SUPPORTED_MODEL_TYPES:
        model_type = outer_type
    return fields, model_type


def _dimensions(
    config: dict[str, Any], fields: dict[str, Any], model_type: str, family: str, source: str
) -> dict[str, Any]:
    """The ModelSpec fields every Llama-layout family reads the same way: sizes, experts, tied
    embeddings, biases, the checkpoint's quantization and its Hub id (a UsageError naming the
    first bad key, in this order)."""
    layers = _get_int(fields, "num_hidden_layers", source)
    hidden = _get_int(fields, "hidden_size", source)
    heads = _get_int(fields, "num_attention_heads", source)
    kv_heads = _get_int(fields, "num_key_value_heads", source, default=heads)
    head_dim = _get_int(fields, "head_dim", source, default=hidden // heads)
    experts = _experts(fields, source)
    intermediate_key = "intermediate_size"
    if experts > 1 and fields.get("moe_intermediate_size") is not None:
        # Qwen MoE: each expert is moe_intermediate_size wide; the shared expert is read below.
        intermediate_key = "moe_intermediate_size"
    intermediate = _get_int(fields, intermediate_key, source)
    vocab = _get_int(fields, "vocab_size", source)
    max_context = _get_int(fields, "max_position_embeddings", source, default=SYNTHETIC_CONTEXT)
    tied_default = _get_bool(config, "tie_word_embeddings", source, model_type in _TIED_BY_DEFAULT)
    tied = _get_bool(fields, "tie_word_embeddings", source, tied_default)
    bias_key, bias_default = _BIAS_KEY.get(family, ("attention_bias", False))
    bias = family in _BIAS_ALWAYS or _get_bool(fields, bias_key, source, bias_default)
    experts_per_token = _experts_per_token(fields, experts, source)
    checkpoint_bits = _checkpoint_bits(fields.get("quantization_config"), source)
    name_or_path = fields.get("_name_or_path")
    return {
        "hf_id": name_or_path[:200] if isinstance(name_or_path, str) else "",
        "layers": layers,
        "hidden_size": hidden,
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "intermediate_size": intermediate,
        "vocab_size": vocab,
        "tied_embeddings": tied,
        "mlp": "gated" if SUPPORTED_MODEL_TYPES[model_type] == "gated" else "standard",
        "attention_bias": bias,
        "experts": experts,
        "experts_per_token": experts_per_token,
        "max_context": max_context,
        "checkpoint_bits": checkpoint_bits,
    }


def _experts_per_token(fields: dict[str, Any], experts: int, source: str) -> int:
    """Experts each token is routed to (1 for a dense model); never more than the experts."""
    if experts <= 1:
        return 1
    experts_per_token = _get_int(fields, "num_experts_per_tok", source, default=1)
    if experts_per_token > experts:
        raise UsageError(
            f"{source}: 'num_experts_per_tok' ({experts_per_token}) is more than the "
            f"{experts} experts",
            flag=FLAG,
        )
    return experts_per_token


def _shared_expert(fields: dict[str, Any], source: str, experts: int) -> dict[str, Any]:
    """Qwen MoE's shared expert (``Qwen2MoeSparseMoeBlock`` in ``modeling_qwen2_moe.py``): a gated
    MLP of ``shared_expert_intermediate_size`` every token goes through, scaled by the sigmoid of
    ``shared_expert_gate``, a linear of hidden -> 1. Absent (Mixtral, Qwen3 MoE): nothing."""
    if experts <= 1 or fields.get("shared_expert_intermediate_size") in (None, 0):
        return {}
    return {
        "shared_expert_intermediate_size": _get_int(
            fields, "shared_expert_intermediate_size", source
        ),
        "shared_expert_gate": True,
        # PEFT 0.21 has no fused-expert mapping for qwen2_moe (transformers_weight_conversion.py):
        # LoRA names reach the shared expert, never the routed experts
        "peft_fused_experts": False,
    }


def hf_config_of(config: dict[str, Any]) -> dict[str, Any]:
    """The config a transformers model is built from: a multimodal config's ``text_config`` when it
    names its own ``model_type`` (the planner counts the language model only), else the config."""
    text = config.get("text_config")
    if config.get("model_type") in ("llama4", "llama4_text"):
        # Llama4ForCausalLM from the text fields (family_llama4 says why they are adjusted)
        return family_llama4.transformers_text_config(config)
    if config.get("model_type") == "qwen2_5_vl":
        # transformers has no causal-LM class for Qwen2.5-VL's configs; its language model is
        # Qwen2's decoder (modeling_qwen2_5_vl.py Qwen2_5_VLDecoderLayer: the same projections,
        # q/k/v biases, norms and MLP, with 3-D multimodal rotary positions that store nothing
        # per layer), so the tracer builds it as qwen2 from the text fields
        fields = {k: v for k, v in config.items() if k not in ("vision_config", "text_config")}
        fields.update(text if isinstance(text, dict) else {})
        fields.pop("layer_types", None)
        return {**fields, "model_type": "qwen2"}
    if isinstance(text, dict) and text.get("model_type"):
        return dict(text)
    return dict(config)


def _family_fields(family: str, fields: dict[str, Any], source: str) -> dict[str, Any]:
    """The ModelSpec fields a Llama-layout family derives from its modeling file and config keys
    (:data:`_FAMILY_FACTS`, the activation, soft caps and Phi's ``qk_layernorm``)."""

    out: dict[str, Any] = dict(_FAMILY_FACTS.get(family, {}))
    key, default = _ACTIVATION_KEY.get(family, ("hidden_act", "silu"))
    value = fields.get(key)
    if family in _LEGACY_GELU and value == "gelu":
        value = "gelu_pytorch_tanh"
    # an activation hwdash has no entry for is counted as the family's own (as hwdash.core.models.families)
    out["mlp_activation"] = (
        ACTIVATIONS.get(value, ACTIVATIONS[default])
        if isinstance(value, str)
        else ACTIVATIONS[default]
    )
    if family in _SOFTCAP_DEFAULTS:
        attn_default, final_default = _SOFTCAP_DEFAULTS[family]
        out["attn_logit_softcap"] = _softcap(fields, "attn_logit_softcapping", attn_default, source)
        out["final_logit_softcap"] = _softcap(
            fields, "final_logit_softcapping", final_default, source
        )
    if family == "phi" and _get_bool(fields, "qk_layernorm", source, False):
        # modeling_phi.py PhiAttention: q_layernorm and k_layernorm over head_dim when qk_layernorm
        out["qk_norm"] = True
    return out


def _softcap(fields: dict[str, Any], key: str, default: float | None, source: str) -> float | None:
    """A soft cap: the key's number, None for an explicit null, ``default`` when it is absent."""
    if key not in fields:
        return default
    value = fields[key]
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1_000_000:
        raise UsageError(
            f"{source}: '{key}' must be a positive number or null, got {_shown(value)}", flag=FLAG
        )
    return float(value)


# --------------------------------------------------------------------------------------------------
# Bare parameter counts
# --------------------------------------------------------------------------------------------------


def _synthetic_spec(
    params_label: str, gqa: bool, layers: int, hidden: int, intermediate: int, vocab: int
) -> ModelSpec:
    head_dim = 128 if hidden >= 1024 else 64
    heads = max(1, hidden // head_dim)
    kv_heads = 8 if gqa and heads % 8 == 0 else heads
    return ModelSpec(
        id=f"synthetic-{params_label.lower()}",
        name=f"synthetic {params_label}",
        layers=layers,
        hidden_size=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=intermediate,
        vocab_size=vocab,
        tied_embeddings=False,
        mlp="gated",
        max_context=SYNTHETIC_CONTEXT,
        source="synthetic Llama-style shape for a bare parameter count (hwdash.core.models)",
        notes="layers ~ hidden/128, SwiGLU MLP, 32000 vocabulary, as Llama-1/2",
    )


def _label(count: int) -> str:
    for div, suffix in ((10**12, "T"), (10**9, "B"), (10**6, "M")):
        if count >= div:
            return f"{count / div:g}{suffix}"
    return str(count)


def synthetic_model(count: int) -> ModelSpec:
    """A dense Llama-style model with about ``count`` parameters (within ~1%).

    Within the sizes of released models (:func:`reference_shapes`, half the smallest to twice the
    largest) the shape follows the released model nearest in size (:func:`_shaped_like`): its layer
    count, so a synthetic 7B has Llama-7B's 32 layers and splits over 2 or 4 pipeline stages as it
    does. Outside them, :func:`_free_synthetic` sizes a Llama aspect ratio.
    """
    if count < SYNTHETIC_MIN_PARAMS:
        raise UsageError(
            f"{count} parameters is too small to size (give at least 1M, or a catalog model)",
            flag=FLAG,
        )
    if count > SYNTHETIC_MAX_PARAMS:
        raise UsageError(
            f"{_label(count)} parameters is too large to size (at most 100T)", flag=FLAG
        )
    reference = _nearest_reference(count)
    if reference is not None:
        return _shaped_like(count, reference)
    return _free_synthetic(count)


@dataclass(frozen=True)
class ReferenceShape:
    """A released dense Llama-style model's shape (``catalog/shapes/reference_models.toml``)."""

    id: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tied: bool
    source: str

    @property
    def params(self) -> int:
        """Its parameter count, from the shape (Llama layout: q, k, v, o, gate, up, down, two
        RMSNorms per block, a final norm, the embedding and an untied head)."""
        head_dim = self.hidden // self.heads
        kv = self.kv_heads * head_dim
        block = 2 * self.hidden * self.hidden + 2 * self.hidden * kv
        block += 3 * self.hidden * self.intermediate + 2 * self.hidden
        embeddings = (1 if self.tied else 2) * self.vocab * self.hidden
        return self.layers * block + embeddings + self.hidden


@functools.cache
def reference_shapes() -> tuple[tuple[ReferenceShape, ...], float]:
    """The released shapes a bare parameter count borrows from, and the width tolerance
    (``catalog/shapes/reference_models.toml``; every entry cites its paper and config.json)."""
    from hwdash.core.data_files import packaged_catalog_dir

    data = tomllib.loads(
        (packaged_catalog_dir() / "shapes" / "reference_models.toml").read_text(encoding="utf-8")
    )
    shapes = tuple(ReferenceShape(**entry) for entry in data["shape"])
    return shapes, float(data["width_tolerance"])


def _nearest_reference(count: int) -> ReferenceShape | None:
    """The released shape nearest to ``count`` in ratio; None outside half the smallest to twice
    the largest (there a released shape says nothing about the layer count)."""
    shapes, _ = reference_shapes()
    sizes = [shape.params for shape in shapes]
    if not min(sizes) / 2 <= count <= 2 * max(sizes):
        return None
    return min(shapes, key=lambda shape: abs(math.log(count / shape.params)))


def _shaped_like(count: int, reference: ReferenceShape) -> ModelSpec:
    """``count`` parameters with ``reference``'s layer count, head size, KV grouping and MLP ratio.

    The width is solved for the count (blocks of ``(2 + 2/g + 3 m) h^2`` parameters with ``g``
    query heads per KV head and an MLP ``m = intermediate / hidden`` wide, plus a 32000-word
    untied embedding and head). Where it lands within the file's tolerance of the reference's
    width, the reference's width and heads are kept; otherwise it is rounded to whole heads (with
    GQA, to a head count the reference's KV heads divide). The MLP width then absorbs the rest, in steps of 64.
    """
    _, tolerance = reference_shapes()
    label = _label(count)
    layers, vocab = reference.layers, SYNTHETIC_VOCAB
    head_dim = reference.hidden // reference.heads
    mha = reference.kv_heads == reference.heads
    ratio = reference.intermediate / reference.hidden
    a = layers * (2 + 2 * reference.kv_heads / reference.heads + 3 * ratio)
    b = 2 * layers + 2 * vocab + 1
    solved = (-b + math.sqrt(b * b + 4 * a * count)) / (2 * a)
    if abs(solved / reference.hidden - 1) <= tolerance:
        widths = [reference.hidden]
    else:
        # whole heads; with GQA the reference's KV heads, each serving a whole group of heads
        step = head_dim * (1 if mha else reference.kv_heads)
        widths = sorted(
            {max(step, math.floor(solved / step) * step), math.ceil(solved / step) * step}
        )

    def build(hidden: int) -> ModelSpec:
        heads = hidden // head_dim
        probe = _reference_spec(label, reference, layers, hidden, heads, 64, vocab)
        arch = architecture(probe)
        # each unit of MLP width adds 3 * hidden per layer (gate, up, down)
        without_mlp = arch.total_params - layers * 3 * hidden * 64
        intermediate = _round64((count - without_mlp) / (layers * 3 * hidden))
        return _reference_spec(label, reference, layers, hidden, heads, intermediate, vocab)

    # of the candidate widths, the one whose MLP ratio stays closest to the reference's
    candidates = [build(hidden) for hidden in widths]
    return min(candidates, key=lambda m: abs(math.log(m.intermediate_size / m.hidden_size / ratio)))


def _reference_spec(
    label: str,
    reference: ReferenceShape,
    layers: int,
    hidden: int,
    heads: int,
    intermediate: int,
    vocab: int,
) -> ModelSpec:
    mha = reference.kv_heads == reference.heads
    return ModelSpec(
        id=f"synthetic-{label.lower()}",
        name=f"synthetic {label}",
        layers=layers,
        hidden_size=hidden,
        heads=heads,
        kv_heads=heads if mha else reference.kv_heads,
        head_dim=hidden // heads,
        intermediate_size=intermediate,
        vocab_size=vocab,
        tied_embeddings=False,
        mlp="gated",
        max_context=SYNTHETIC_CONTEXT,
        source=(
            f"synthetic Llama-style shape for a bare parameter count, after {reference.id} "
            f"({reference.source}; catalog/shapes/reference_models.toml)"
        ),
        notes=(
            f"{reference.id}'s {layers} layers, head size and KV heads; width and SwiGLU MLP "
            "sized to the count; 32000 vocabulary, untied"
        ),
    )


def _free_synthetic(count: int) -> ModelSpec:
    """A Llama-style model sized from the aspect ratio alone, for counts outside the released
    shapes (:func:`reference_shapes`).

    Width from the Llama aspect ratio: with ``layers = hidden / 128`` and blocks of ~12 hidden^2
    parameters (4 h^2 attention + 3 * h * 8h/3 SwiGLU), the blocks hold ~``12 h^3 / 128``; we solve
    for ``hidden`` with the embeddings included and round it to the head size. Then the layer count
    is fitted to the budget, and the MLP width absorbs what remains (in steps of 64). Below ~100M the
    32000-word vocabulary would dominate, so it is shrunk to keep embeddings at most a quarter of the
    budget.
    """
    label = _label(count)
    gqa = count >= SYNTHETIC_GQA_FROM

    def blocks_for(hidden: float, vocab_size: int) -> float:
        return 12 * hidden**3 / 128 + 2 * vocab_size * hidden - count

    # First guess without embeddings (blocks take ~3/4 of the budget) to size the vocabulary.
    first_guess = (0.75 * count * 128 / 12) ** (1 / 3)
    vocab = min(SYNTHETIC_VOCAB, max(256, int(count // (8 * first_guess))))
    low, high = 64.0, 65536.0
    for _ in range(60):
        mid = (low + high) / 2
        if blocks_for(mid, vocab) > 0:
            high = mid
        else:
            low = mid
    # Round to the head size; with GQA keep the head count a multiple of the 8 KV heads.
    step = 1024 if gqa else (128 if low >= 1024 else 64)
    hidden = max(64, round(low / step) * step)
    probe = _synthetic_spec(label, gqa, 1, hidden, _round64(8 * hidden / 3), vocab)
    arch = architecture(probe)
    fixed = arch.embedding_params + arch.lm_head_params + arch.final_norm_params
    per_layer = arch.block_params
    layers = max(1, round((count - fixed) / per_layer))
    # Adjust the MLP width so the total lands on the budget: each 1 of intermediate adds 3*h per layer.
    mlp_part = 3 * hidden * _round64(8 * hidden / 3)
    attention_part = per_layer - mlp_part
    wanted_mlp = (count - fixed) / layers - attention_part
    intermediate = max(64, _round64(wanted_mlp / (3 * hidden)))
    return _synthetic_spec(label, gqa, layers, hidden, intermediate, vocab)


def _round64(value: float) -> int:
    return max(64, math.floor(value / 64 + 0.5) * 64)
