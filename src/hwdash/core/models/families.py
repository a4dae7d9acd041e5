"""Model families beyond the Llama layout, read from their Hugging Face ``config.json``.

Each reader maps one ``model_type``'s config keys onto :class:`ModelSpec`, whose fields the estimator
turns into an :class:`~hwdash.core.estimator.Architecture`. The key names, their defaults when a
config leaves them out, and the layer layout come from each family's ``configuration_*.py`` and
``modeling_*.py`` in transformers:

* ``gpt_neox`` (Pythia, GPT-NeoX-20B; Black et al. 2022, arXiv:2204.06745, section 2.1): a fused
  ``query_key_value`` with bias (same count as separate q, k, v), ``dense`` with bias, a GELU MLP of
  ``intermediate_size`` with biases, two LayerNorms per block that both read the block input when
  ``use_parallel_residual`` (default true), untied ``embed_out``; rotary on ``rotary_pct`` of each head
  (no parameters, no stored activations).
* ``bloom`` (BigScience 2022, arXiv:2211.05100, section 3.2): ``n_layer``, ``n_head``,
  ``hidden_size`` (``n_embed`` in older configs), an MLP of 4 x hidden fixed in ``BloomMLP``, biases
  everywhere, a LayerNorm after the word embedding, ALiBi instead of positions, tied head; its attention
  adds ALiBi with ``baddbmm`` and has no SDPA path.
* ``gpt_bigcode`` (SantaCoder, StarCoder; Allal et al. 2023, arXiv:2301.03988, section 4.1): GPT-2
  layout with multi-query attention (``multi_query``, default true: one key/value head), ``n_embd``,
  ``n_head``, ``n_layer``, ``n_inner`` (default 4 x n_embd), learned positions of ``n_positions``.
* ``gpt2`` (Radford et al. 2019): ``n_embd``, ``n_head``, ``n_layer``, ``n_inner``, learned
  positions ``wpe`` of ``n_positions``, Conv1D layers with biases (a Conv1D of in x out holds what a
  Linear does), tied head.
* ``falcon`` (Almazrouei et al. 2023, arXiv:2311.16867, section 4): ``new_decoder_architecture``
  (grouped KV heads ``num_kv_heads``, two parallel LayerNorms ``ln_attn``/``ln_mlp``), else
  ``multi_query`` (one KV head) and one shared LayerNorm when ``parallel_attn``; ``bias`` false: no
  linear biases; MLP of ``ffn_hidden_size`` (default 4 x hidden); tied head. Old Hub configs say
  ``RefinedWeb``/``RefinedWebModel`` and ``n_head``/``n_layer``/``n_head_kv``.
* ``olmo`` (Groeneveld et al. 2024, arXiv:2402.00838, section 2.1): Llama layout with a LayerNorm
  without parameters. ``olmo2`` (OLMo 2, arXiv:2501.00656, section 3.1): Llama layout with the norms
  after attention and after the MLP (``post_attention_layernorm``, ``post_feedforward_layernorm``)
  and RMSNorms on the full q and k projections.
* ``t5`` / ``mt5`` (Raffel et al. 2020, arXiv:1910.10683, section 3.1; T5 v1.1 and Flan-T5's gated
  GELU): ``d_model``, ``d_kv``, ``d_ff``, ``num_layers`` encoder and ``num_decoder_layers`` decoder
  blocks, ``num_heads``; no biases, an RMS-style LayerNorm with a weight only, a relative-position
  bias table of ``relative_attention_num_buckets`` x heads in the first block of each stack; each
  decoder block adds a cross-attention over the encoder output. ``feed_forward_proj`` ``relu`` (T5 v1)
  is a plain MLP, ``gated-gelu`` (v1.1, Flan-T5) a gated one.

Only the parameter layout and the activation-relevant switches are read; dropout settings are not
(see :data:`DROPOUT_NOTE`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from hwdash.core.models import family_deepseek, family_encoders, family_llama4
from hwdash.core.models.fields import (
    ACTIVATIONS,
    FLAG,
    Activation,
    _activation,
    _bool,
    _checkpoint_bits,
    _int,
    _probability,
    _shown,
)
from hwdash.core.specs import ModelSpec
from hwdash.errors import UsageError

#: BLOOM has no ``max_position_embeddings`` (ALiBi): it was trained on sequences of 2048 tokens
#: (BigScience 2022, arXiv:2211.05100, section 3.3.1 and Table 3).
BLOOM_TRAINED_CONTEXT = 2048
#: T5 has no position table either; it was pre-trained with inputs of 512 tokens (Raffel et al.
#: 2020, arXiv:1910.10683, section 3.1.2), which its configs record as ``n_positions``.
T5_TRAINED_CONTEXT = 512
#: T5's default number of relative-position buckets (``T5Config.relative_attention_num_buckets``).
T5_DEFAULT_BUCKETS = 32
#: Falcon's default context when the config omits it (``FalconConfig.max_position_embeddings``).
FALCON_DEFAULT_CONTEXT = 2048

DROPOUT_NOTE = (
    "dropout masks are not counted: set the config's dropout to 0 for fine-tuning, as TRL and "
    "PEFT recipes do for these models, or expect a little more"
)


def _gpt_neox(fields: dict[str, Any], source: str) -> dict[str, Any]:
    # The Hugging Face standard dimension keys, read as for Llama; what GPT-NeoX does otherwise:
    return {
        "module_names": "gpt_neox",
        **_llama_layout(fields, source),
        "kv_heads": _int(fields, ("num_attention_heads",), source),
        # GPTNeoXConfig.attention_bias defaults to True (older configs do not carry the key).
        "attention_bias": _bool(fields, "attention_bias", source, True),
        "mlp": "standard",
        "mlp_bias": True,
        "norm_bias": True,
        "norm_type": "layernorm",
        "norm_saves_input": True,
        "parallel_block": _bool(fields, "use_parallel_residual", source, True),
        "mlp_activation": _activation(fields, ("hidden_act",), "gelu"),
    }


def _bloom(fields: dict[str, Any], source: str) -> dict[str, Any]:
    hidden = _int(fields, ("hidden_size", "n_embed"), source)
    heads = _int(fields, ("n_head", "num_attention_heads"), source)
    return {
        "module_names": "bloom",
        "layers": _int(fields, ("n_layer", "num_hidden_layers"), source),
        "hidden_size": hidden,
        "heads": heads,
        "kv_heads": heads,
        "head_dim": hidden // heads,
        # BloomMLP: dense_h_to_4h is hidden -> 4 * hidden (modeling_bloom.py); no config key.
        "intermediate_size": 4 * hidden,
        "vocab_size": _int(fields, ("vocab_size",), source),
        "max_context": _int(fields, ("seq_length",), source, default=BLOOM_TRAINED_CONTEXT),
        "tied_embeddings": _bool(fields, "tie_word_embeddings", source, True),
        "attention_bias": True,
        "mlp": "standard",
        "mlp_bias": True,
        "norm_bias": True,
        "norm_type": "layernorm",
        "norm_saves_input": True,
        "embedding_norm": True,
        "position_encoding": "alibi",
        "eager_attention_only": True,
        # the tanh approximation of GELU, but run as BloomGelu's GeLUFunction, a custom autograd
        # function that keeps only its input (as one fused op would): counted as "gelu"
        "mlp_activation": "gelu",
    }


def _gpt2_like(fields: dict[str, Any], source: str, *, multi_query_default: bool) -> dict[str, Any]:
    hidden = _int(fields, ("n_embd", "hidden_size"), source)
    heads = _int(fields, ("n_head", "num_attention_heads"), source)
    positions = _int(fields, ("n_positions", "max_position_embeddings"), source, default=1024)
    inner = fields.get("n_inner")
    multi_query = _bool(fields, "multi_query", source, multi_query_default)
    return {
        "module_names": "gpt2",
        "layers": _int(fields, ("n_layer", "num_hidden_layers"), source),
        "hidden_size": hidden,
        "heads": heads,
        "kv_heads": 1 if multi_query else heads,
        "head_dim": hidden // heads,
        # n_inner null means 4 * n_embd (GPT2MLP / GPTBigCodeMLP)
        "intermediate_size": 4 * hidden if inner is None else _int(fields, ("n_inner",), source),
        "vocab_size": _int(fields, ("vocab_size",), source),
        "max_context": positions,
        "learned_positions": positions,
        "tied_embeddings": _bool(fields, "tie_word_embeddings", source, True),
        "attention_bias": True,
        "mlp": "standard",
        "mlp_bias": True,
        "norm_bias": True,
        "norm_type": "layernorm",
        "norm_saves_input": True,
        "position_encoding": "learned",
        "mlp_activation": _activation(fields, ("activation_function",), "gelu_new"),
        # GPT2Attention's resid_dropout and GPT2MLP's dropout (modeling_gpt2.py; the same in
        # modeling_gpt_bigcode.py), both of resid_pdrop: GPT2Config and GPTBigCodeConfig default
        # it to 0.1, and a fine-tune keeps the config's value unless it is edited
        "hidden_dropout": _probability(fields, "resid_pdrop", source, 0.1),
    }


def _gpt2(fields: dict[str, Any], source: str) -> dict[str, Any]:
    return _gpt2_like(fields, source, multi_query_default=False)


def _gpt_bigcode(fields: dict[str, Any], source: str) -> dict[str, Any]:
    return _gpt2_like(fields, source, multi_query_default=True)


def _falcon(fields: dict[str, Any], source: str) -> dict[str, Any]:
    hidden = _int(fields, ("hidden_size", "n_embed"), source)
    heads = _int(fields, ("num_attention_heads", "n_head"), source)
    new_architecture = _bool(fields, "new_decoder_architecture", source, False)
    parallel = _bool(fields, "parallel_attn", source, True)
    if new_architecture:
        kv_heads = _int(fields, ("num_kv_heads", "n_head_kv"), source, default=heads)
        # FalconDecoderLayer: ln_attn and ln_mlp unless num_ln_in_parallel_attn says 1.
        norms = _int(fields, ("num_ln_in_parallel_attn",), source, default=2)
    else:
        kv_heads = 1 if _bool(fields, "multi_query", source, True) else heads
        # input_layernorm, plus post_attention_layernorm when attention and MLP run in sequence
        norms = 1 if parallel else 2
    bias = _bool(fields, "bias", source, False)
    alibi = _bool(fields, "alibi", source, False)
    inner = fields.get("ffn_hidden_size")
    return {
        "module_names": "bloom",
        "layers": _int(fields, ("num_hidden_layers", "n_layer"), source),
        "hidden_size": hidden,
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": hidden // heads,
        "intermediate_size": 4 * hidden
        if inner is None
        else _int(fields, ("ffn_hidden_size",), source),
        "vocab_size": _int(fields, ("vocab_size",), source),
        "max_context": _int(
            fields, ("max_position_embeddings",), source, default=FALCON_DEFAULT_CONTEXT
        ),
        "tied_embeddings": _bool(fields, "tie_word_embeddings", source, True),
        "attention_bias": bias,
        "mlp": "standard",
        "mlp_bias": bias,
        "norm_bias": True,
        "norm_type": "layernorm",
        "norm_saves_input": True,
        "norms_per_layer": norms,
        "norm_weights_per_layer": norms,
        "parallel_block": parallel,
        "position_encoding": "alibi" if alibi else "rope",
        # the new decoder architecture broadcasts each K/V head to its query group and the reshape
        # in FalconAttention.forward copies it (modeling_falcon.py): cache and kept K, V at all heads.
        # Found by the held-out falcon-11B inference row (-6.4%: the cache at 8 of 32 heads).
        "kv_expanded": new_architecture and kv_heads != heads,
        # With ALiBi, modeling_falcon.py (transformers 5.24) adds the ALiBi biases to the 4-D
        # attention mask and still calls SDPA (FalconAttention.forward's `alibi is not None`
        # branch), so the s^2 scores are kept only under eager; FalconFlashAttention2 refuses
        # ALiBi (see estimate._attention_the_model_has). Found by the held-out falcon-rw-1b rows
        # (docs/accuracy.md: +68..+117% when counted as eager).
        "eager_attention_only": False,
        "mlp_activation": _activation(fields, ("activation",), "gelu"),
    }


def _llama_layout(fields: dict[str, Any], source: str) -> dict[str, Any]:
    hidden = _int(fields, ("hidden_size",), source)
    heads = _int(fields, ("num_attention_heads",), source)
    return {
        "layers": _int(fields, ("num_hidden_layers",), source),
        "hidden_size": hidden,
        "heads": heads,
        "kv_heads": _int(fields, ("num_key_value_heads",), source, default=heads),
        "head_dim": hidden // heads,
        "intermediate_size": _int(fields, ("intermediate_size",), source),
        "vocab_size": _int(fields, ("vocab_size",), source),
        "max_context": _int(fields, ("max_position_embeddings",), source, default=2048),
        "tied_embeddings": _bool(fields, "tie_word_embeddings", source, False),
        "attention_bias": _bool(fields, "attention_bias", source, False),
        "mlp": "gated",
        "mlp_activation": _activation(fields, ("hidden_act",), "silu"),
    }


def _olmo(fields: dict[str, Any], source: str) -> dict[str, Any]:
    # OlmoLayerNorm: F.layer_norm without weight or bias, on an fp32 upcast of its input.
    return {**_llama_layout(fields, source), "norm_weights_per_layer": 0}


def _olmo2(fields: dict[str, Any], source: str) -> dict[str, Any]:
    # The q_norm / k_norm weights (q_dim + kv_dim per block, 0.004% of OLMo-2-7B) are not counted,
    # as for Qwen3; their activations are (qk_norm).
    # Olmo2RMSNorm multiplies by its weight in fp32 before casting back (rmsnorm_fp32_scale).
    return {**_llama_layout(fields, source), "qk_norm": True, "norm_type": "rmsnorm_fp32_scale"}


def _t5(fields: dict[str, Any], source: str) -> dict[str, Any]:
    hidden = _int(fields, ("d_model",), source)
    layers = _int(fields, ("num_layers",), source)
    projection = fields.get("feed_forward_proj", "relu")
    if not isinstance(projection, str) or projection.removeprefix("gated-") not in ACTIVATIONS:
        raise UsageError(
            f"{source}: 'feed_forward_proj' must be relu, gated-gelu or another "
            f"'[gated-]activation', got {_shown(projection)}",
            flag=FLAG,
        )
    gated = projection.startswith("gated-")
    act = projection.removeprefix("gated-")
    # T5Config: "gated-gelu" runs gelu_new (the tanh approximation)
    activation: Activation = "gelu_new" if act == "gelu" and gated else ACTIVATIONS[act]
    return {
        "module_names": "t5",
        "layers": layers,
        "decoder_layers": _int(fields, ("num_decoder_layers",), source, default=layers),
        "hidden_size": hidden,
        "heads": _int(fields, ("num_heads",), source),
        "kv_heads": _int(fields, ("num_heads",), source),
        "head_dim": _int(fields, ("d_kv",), source),
        "intermediate_size": _int(fields, ("d_ff",), source),
        "vocab_size": _int(fields, ("vocab_size",), source),
        "max_context": _int(fields, ("n_positions",), source, default=T5_TRAINED_CONTEXT),
        "tied_embeddings": _bool(fields, "tie_word_embeddings", source, True),
        "attention_bias": False,
        "mlp": "gated" if gated else "standard",
        "mlp_bias": False,
        "norm_bias": False,
        "position_encoding": "relative",
        "relative_attention_buckets": _int(
            fields, ("relative_attention_num_buckets",), source, default=T5_DEFAULT_BUCKETS
        ),
        "eager_attention_only": True,
        "mlp_activation": activation,
    }


#: ``model_type`` -> the reader of its config. ``RefinedWeb*`` are Falcon's pre-transformers names.
FAMILY_READERS: dict[str, Callable[[dict[str, Any], str], dict[str, Any]]] = {
    "gpt_neox": _gpt_neox,
    "bloom": _bloom,
    "gpt_bigcode": _gpt_bigcode,
    "gpt2": _gpt2,
    "falcon": _falcon,
    "RefinedWeb": _falcon,
    "RefinedWebModel": _falcon,
    "olmo": _olmo,
    "olmo2": _olmo2,
    "t5": _t5,
    "mt5": _t5,
    **{"deepseek_v2": family_deepseek.deepseek_v2, "deepseek_v3": family_deepseek.deepseek_v3},
    **{"llama4": family_llama4.llama4, "llama4_text": family_llama4.llama4},
    **family_encoders.READERS,
}

#: Families whose training usually runs with dropout from the config (a note on the model).
_DROPOUT_FAMILIES = {"t5", "mt5"}


def _text_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """The fields the tracer builds the language model from: a multimodal config's text fields
    (already merged over it) without its sub-configs."""
    return {k: v for k, v in fields.items() if k not in ("text_config", "vision_config")}


def family_model(model_type: str, fields: dict[str, Any], *, name: str, source: str) -> ModelSpec:
    """The :class:`ModelSpec` of a config of one of :data:`FAMILY_READERS`' types."""
    layout = FAMILY_READERS[model_type](fields, source)
    notes = layout.pop("notes", "")
    hf_config = layout.pop("hf_config", None) or _text_fields(fields)
    name_or_path = fields.get("_name_or_path")
    try:
        return ModelSpec(
            id=name.lower(),
            name=name,
            hf_id=name_or_path[:200] if isinstance(name_or_path, str) else "",
            checkpoint_bits=_checkpoint_bits(fields.get("quantization_config"), source),
            source=f"config.json ({model_type}): {source}",
            notes=DROPOUT_NOTE if model_type in _DROPOUT_FAMILIES else notes,
            model_type=model_type,
            hf_config=hf_config,
            **layout,
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        raise UsageError(f"{source}: {field}: {first['msg']}", flag=FLAG) from None
