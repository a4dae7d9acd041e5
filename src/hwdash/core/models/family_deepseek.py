"""DeepSeek-V2 and V3 from their ``config.json`` (``model_type`` ``deepseek_v2``, ``deepseek_v3``).

Read as transformers 5 builds them (``configuration_deepseek_v2.py`` / ``modeling_deepseek_v2.py``,
``configuration_deepseek_v3.py`` / ``modeling_deepseek_v3.py``; the paper: DeepSeek-AI 2024,
arXiv:2405.04434, sections 2.1 and 2.2):

* multi-head latent attention: ``kv_lora_rank`` (the key/value latent), ``q_lora_rank`` (the query
  latent; null in V2-Lite: one plain ``q_proj``), ``qk_nope_head_dim`` + ``qk_rope_head_dim`` per
  query/key head, ``v_head_dim`` per value head; ``attention_bias`` on q_a, kv_a and o;
* DeepSeekMoE: ``n_routed_experts`` experts of ``moe_intermediate_size``, ``num_experts_per_tok`` of
  them per token, and ``n_shared_experts`` shared experts, built as one MLP of
  ``n_shared_experts x moe_intermediate_size`` (``DeepseekV2Moe.shared_experts``); the first
  ``first_k_dense_replace`` blocks have one dense MLP of ``intermediate_size`` instead;
* the router: an fp32 weight of experts x hidden over an fp32 copy of its input
  (``DeepseekV2TopkRouter``; ``gate.weight`` in ``_keep_in_fp32_modules_strict``); V3's
  ``noaux_tc`` routing scores with a sigmoid and adds ``e_score_correction_bias`` (a buffer of one
  fp32 per expert, not a parameter).

transformers builds no multi-token-prediction block (V3's ``num_nextn_predict_layers``), and reads
no ``moe_layer_freq``: a config whose ``moe_layer_freq`` is not 1 is refused, since the original
remote code and transformers would build different models from it.
"""

from __future__ import annotations

from typing import Any

from hwdash.core.models import fields as cfg_fields
from hwdash.errors import UsageError

#: ``DeepseekV2Config`` / ``DeepseekV3Config`` defaults for the keys a config may leave out.
_DEFAULTS = {
    "deepseek_v2": {"first_k_dense_replace": 0, "n_shared_experts": 2, "q_lora_rank": 1536},
    "deepseek_v3": {"first_k_dense_replace": 3, "n_shared_experts": 1, "q_lora_rank": 1536},
}


def _count(fields: dict[str, Any], key: str, default: int | None, source: str) -> int:
    """A whole number that may be 0 (first_k_dense_replace, n_shared_experts)."""
    value = fields.get(key, default)
    if value is None:
        value = 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 100_000:
        raise UsageError(
            f"{source}: '{key}' must be a whole number from 0 to 100,000, got {value!r}",
            flag=cfg_fields.FLAG,
        )
    return value


def _check_moe_layer_freq(fields: dict[str, Any], source: str) -> None:
    """Refuse a ``moe_layer_freq`` other than 1 (MoE blocks every other layer are not counted)."""
    freq = fields.get("moe_layer_freq", 1)
    if freq != 1 or isinstance(freq, bool):
        raise UsageError(
            f"{source}: 'moe_layer_freq' {freq!r} is not counted (only 1: transformers builds "
            "every block from first_k_dense_replace on as a MoE block)",
            flag=cfg_fields.FLAG,
        )


def _deepseek(model_type: str, fields: dict[str, Any], source: str) -> dict[str, Any]:
    """The ModelSpec fields of a DeepSeek V2 or V3 config (``model_type``)."""
    defaults = _DEFAULTS[model_type]

    def whole(key: str, default: int | None = None) -> int:
        return cfg_fields._int(fields, (key,), source, default=default)

    def count(key: str) -> int:
        return _count(fields, key, defaults[key], source)

    _check_moe_layer_freq(fields, source)
    layers = whole("num_hidden_layers")
    heads = whole("num_attention_heads")
    rope = whole("qk_rope_head_dim")
    head_dim = whole("qk_nope_head_dim") + rope
    experts = whole("n_routed_experts")
    per_token = whole("num_experts_per_tok")
    if per_token > experts:
        raise UsageError(
            f"{source}: 'num_experts_per_tok' ({per_token}) is more than the {experts} experts",
            flag=cfg_fields.FLAG,
        )
    moe_width = whole("moe_intermediate_size")
    q_rank = fields.get("q_lora_rank", defaults["q_lora_rank"])
    dense = min(count("first_k_dense_replace"), layers)
    if experts > 1 and dense == layers:
        experts, per_token, dense = 1, 1, 0  # every block dense: no MoE at all
    return {
        "layers": layers,
        "hidden_size": whole("hidden_size"),
        "heads": heads,
        # num_key_value_heads is the heads count in every released config; MLA has no KV heads
        "kv_heads": heads,
        "head_dim": head_dim,
        "intermediate_size": moe_width if experts > 1 else whole("intermediate_size"),
        "vocab_size": whole("vocab_size"),
        "max_context": whole("max_position_embeddings", 4096),
        "tied_embeddings": cfg_fields._bool(fields, "tie_word_embeddings", source, False),
        "attention_bias": cfg_fields._bool(fields, "attention_bias", source, False),
        "mlp": "gated",
        "mlp_bias": False,
        "mlp_activation": cfg_fields._activation(fields, ("hidden_act",), "silu"),
        "experts": experts,
        "experts_per_token": per_token if experts > 1 else 1,
        "shared_expert_intermediate_size": count("n_shared_experts") * moe_width
        if experts > 1
        else 0,
        "dense_mlp_layers": dense,
        "dense_intermediate_size": whole("intermediate_size") if dense else 0,
        "router_fp32": True,
        "router_sigmoid": model_type == "deepseek_v3",
        "kv_lora_rank": whole("kv_lora_rank"),
        "q_lora_rank": 0 if q_rank is None else whole("q_lora_rank"),
        "qk_rope_head_dim": rope,
        "v_head_dim": whole("v_head_dim"),
    }


def deepseek_v2(fields: dict[str, Any], source: str) -> dict[str, Any]:
    """``deepseek_v2``: DeepSeek-V2, V2-Lite, V2.5, Coder-V2."""
    return _deepseek("deepseek_v2", fields, source)


def deepseek_v3(fields: dict[str, Any], source: str) -> dict[str, Any]:
    """``deepseek_v3``: DeepSeek-V3, R1 and their fine-tunes."""
    return _deepseek("deepseek_v3", fields, source)
