"""Encoder-only families read from their Hugging Face ``config.json``: BERT, RoBERTa (and
XLM-RoBERTa), DeBERTa-v2/v3 and ModernBERT, with a masked-LM or a sequence-classification head.

Each reader maps one ``model_type``'s keys onto :class:`~hwdash.core.catalog.ModelSpec` (the
encoder fields at the end of it); the key names and their defaults come from transformers 5.24's
``configuration_*.py``, the layout from its ``modeling_*.py``:

* ``bert`` (``models/bert/modeling_bert.py``; Devlin et al. 2019, arXiv:1810.04805): word,
  position (``max_position_embeddings``) and token-type (``type_vocab_size``, default 2)
  embeddings and a LayerNorm; per block ``query``/``key``/``value`` and ``attention.output.dense``,
  ``intermediate.dense`` and ``output.dense``, all with biases, each sub-block followed by dropout
  (``hidden_dropout_prob``), a residual add and a post-LayerNorm with bias; dropout on the attention
  probabilities (``attention_probs_dropout_prob``, default 0.1). ``BertForMaskedLM``: no pooler, a
  transform (dense + GELU + LayerNorm) and a decoder tied to the word embedding with its own bias.
  ``BertForSequenceClassification``: the pooler (dense + tanh on the first token), dropout
  (``classifier_dropout``, else ``hidden_dropout_prob``) and ``classifier`` (hidden x labels).
* ``roberta``/``xlm-roberta`` (``models/roberta/modeling_roberta.py``; Liu et al. 2019,
  arXiv:1907.11692): BERT's blocks; ``RobertaForSequenceClassification`` has no pooler but a
  ``RobertaClassificationHead`` (dense hidden x hidden + tanh, dropout, ``out_proj``).
* ``deberta-v2`` (``models/deberta_v2/modeling_deberta_v2.py``; He et al. 2021,
  arXiv:2006.03654, section 3.1, and DeBERTa-v3, arXiv:2111.09543): ``query_proj``/``key_proj``/
  ``value_proj`` with biases; no absolute positions when ``position_biased_input`` is false; a
  relative-position table of ``2 * position_buckets`` rows (else ``2 * max_relative_positions``,
  else ``2 * max_position_embeddings``) with a LayerNorm (``norm_rel_ebd``); separate
  ``pos_key_proj``/``pos_query_proj`` unless ``share_att_key``. Its disentangled attention adds the
  content-to-position and position-to-content scores to the s^2 scores itself: no SDPA path.
  ``DebertaV2ForSequenceClassification``: ``ContextPooler`` (dense ``pooler_hidden_size``) and the
  classifier.
* ``modernbert`` (``models/modernbert/modeling_modernbert.py``; Warner et al. 2024,
  arXiv:2412.13663, section 2.1): pre-norm blocks with LayerNorms without bias (``norm_bias``),
  a fused ``Wqkv`` and ``Wo`` without biases (``attention_bias``), a GeGLU MLP ``Wi`` (hidden x
  2 intermediate) and ``Wo`` (``mlp_bias``), rotary positions; every
  ``global_attn_every_n_layers``-th layer attends globally, the others within ``local_attention``
  tokens; the first block has no attention norm. Its MLM head is a dense + GELU + LayerNorm and a
  tied ``decoder`` with a bias (``decoder_bias``); the classification head the same transform,
  then ``classifier`` (hidden x labels, with bias).
"""

from __future__ import annotations

from typing import Any

from hwdash.core.models import fields as cfg_fields
from hwdash.errors import UsageError

FLAG = "--model"

#: ``BertConfig.type_vocab_size`` / ``RobertaConfig`` default when a config leaves it out.
BERT_DEFAULT_TYPE_VOCAB = 2
#: transformers' ``PretrainedConfig.num_labels`` default.
DEFAULT_NUM_LABELS = 2
#: BERT/RoBERTa/DeBERTa-v2's ``hidden_dropout_prob`` and ``attention_probs_dropout_prob`` default.
BERT_DEFAULT_DROPOUT = 0.1
#: ``ModernBertConfig.local_attention`` / ``global_attn_every_n_layers`` defaults.
MODERNBERT_DEFAULT_WINDOW = 128
MODERNBERT_DEFAULT_GLOBAL_EVERY = 3

ENCODER_MODEL_TYPES = ("bert", "roberta", "xlm-roberta", "deberta-v2", "modernbert")


def _float(fields: dict[str, Any], key: str, source: str, default: float) -> float:
    value = fields.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
        raise UsageError(
            f"{source}: '{key}' must be a probability in [0, 1), got {value!r}", flag=FLAG
        )
    return float(value)


def _count(fields: dict[str, Any], key: str, source: str, default: int) -> int:
    """A count that may be 0 (``type_vocab_size``, ``position_buckets``: -1 and 0 mean none)."""
    value = fields.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value > 1_000_000_000:
        raise UsageError(f"{source}: '{key}' must be a whole number, got {value!r}", flag=FLAG)
    return max(value, 0) if key == "type_vocab_size" else value


def _head(fields: dict[str, Any], source: str) -> dict[str, Any]:
    """The task head the config's ``architectures`` names (masked LM unless a
    ``*ForSequenceClassification``), and its label count."""
    names = fields.get("architectures") or []
    classify = any(isinstance(n, str) and n.endswith("ForSequenceClassification") for n in names)
    labels = fields.get("num_labels")
    id2label = fields.get("id2label")
    if labels is None and isinstance(id2label, dict) and id2label:
        labels = len(id2label)
    if labels is None:
        labels = DEFAULT_NUM_LABELS
    if isinstance(labels, bool) or not isinstance(labels, int) or labels < 1:
        raise UsageError(f"{source}: 'num_labels' must be a positive integer", flag=FLAG)
    return {
        "encoder_only": True,
        "encoder_head": "classification" if classify else "mlm",
        "num_labels": labels,
    }


def _bert(fields: dict[str, Any], source: str) -> dict[str, Any]:
    hidden = cfg_fields._int(fields, ("hidden_size",), source)
    heads = cfg_fields._int(fields, ("num_attention_heads",), source)
    positions = cfg_fields._int(fields, ("max_position_embeddings",), source, default=512)
    hidden_dropout = _float(fields, "hidden_dropout_prob", source, BERT_DEFAULT_DROPOUT)
    classifier = fields.get("classifier_dropout")
    return {
        **_head(fields, source),
        "encoder_family": "bert",
        "layers": cfg_fields._int(fields, ("num_hidden_layers",), source),
        "hidden_size": hidden,
        "heads": heads,
        "kv_heads": heads,
        "head_dim": hidden // heads,
        "intermediate_size": cfg_fields._int(fields, ("intermediate_size",), source),
        "vocab_size": cfg_fields._int(fields, ("vocab_size",), source),
        "max_context": positions,
        "learned_positions": positions,
        "type_vocab_size": _count(fields, "type_vocab_size", source, BERT_DEFAULT_TYPE_VOCAB),
        "tied_embeddings": True,
        "attention_bias": True,
        "mlp": "standard",
        "mlp_bias": True,
        "norm_bias": True,
        "norm_type": "layernorm",
        "norm_saves_input": True,
        "embedding_norm": True,
        "position_encoding": "learned",
        "mlp_activation": cfg_fields._activation(fields, ("hidden_act",), "gelu"),
        "attention_dropout": _float(
            fields, "attention_probs_dropout_prob", source, BERT_DEFAULT_DROPOUT
        ),
        "hidden_dropout": hidden_dropout,
        "embedding_dropout": hidden_dropout,
        "classifier_dropout": hidden_dropout
        if classifier is None
        else _float(fields, "classifier_dropout", source, hidden_dropout),
    }


def _deberta_v2(fields: dict[str, Any], source: str) -> dict[str, Any]:
    layout = _bert(fields, source)
    positions = layout["max_context"]
    relative = cfg_fields._bool(fields, "relative_attention", source, False)
    rows = 0
    if relative:
        # DebertaV2Encoder: 2 * position_buckets rows, else 2 * max_relative_positions (< 1: the
        # max_position_embeddings)
        buckets = _count(fields, "position_buckets", source, -1)
        max_relative = _count(fields, "max_relative_positions", source, -1)
        rows = 2 * (buckets if buckets > 0 else max_relative if max_relative > 0 else positions)
    if fields.get("embedding_size") not in (None, layout["hidden_size"]):
        raise UsageError(
            f"{source}: DeBERTa's 'embedding_size' other than hidden_size (an embed_proj) is not "
            "supported",
            flag=FLAG,
        )
    if relative and not cfg_fields._bool(fields, "share_att_key", source, False):
        raise UsageError(
            f"{source}: DeBERTa without 'share_att_key' (separate pos_key_proj/pos_query_proj, "
            "DeBERTa-v2 xlarge/xxlarge style) is not supported",
            flag=FLAG,
        )
    biased = cfg_fields._bool(fields, "position_biased_input", source, True)
    return {
        **layout,
        "encoder_family": "deberta",
        "learned_positions": positions if biased else 0,
        "position_encoding": "relative" if relative else "learned",
        "type_vocab_size": _count(fields, "type_vocab_size", source, 0),
        "relative_position_buckets": rows,
        # DisentangledSelfAttention computes the scores itself (c2p/p2c added): eager only
        "eager_attention_only": True,
        # DebertaV2ForSequenceClassification: ContextPooler's dropout is pooler_dropout (0.0)
        "classifier_dropout": _float(fields, "pooler_dropout", source, 0.0),
    }


def _modernbert(fields: dict[str, Any], source: str) -> dict[str, Any]:
    hidden = cfg_fields._int(fields, ("hidden_size",), source)
    heads = cfg_fields._int(fields, ("num_attention_heads",), source)
    bias = cfg_fields._bool(fields, "mlp_bias", source, False)
    return {
        **_head(fields, source),
        "encoder_family": "modernbert",
        "layers": cfg_fields._int(fields, ("num_hidden_layers",), source),
        "hidden_size": hidden,
        "heads": heads,
        "kv_heads": heads,
        "head_dim": hidden // heads,
        "intermediate_size": cfg_fields._int(fields, ("intermediate_size",), source),
        "vocab_size": cfg_fields._int(fields, ("vocab_size",), source),
        "max_context": cfg_fields._int(fields, ("max_position_embeddings",), source, default=8192),
        "tied_embeddings": True,
        "attention_bias": cfg_fields._bool(fields, "attention_bias", source, False),
        "mlp": "gated",
        "mlp_bias": bias,
        "norm_bias": cfg_fields._bool(fields, "norm_bias", source, False),
        "norm_type": "layernorm",
        "norm_saves_input": True,
        "embedding_norm": True,
        "position_encoding": "rope",
        "mlp_activation": cfg_fields._activation(fields, ("hidden_activation",), "gelu"),
        "attention_dropout": _float(fields, "attention_dropout", source, 0.0),
        "hidden_dropout": _float(fields, "mlp_dropout", source, 0.0),
        "embedding_dropout": _float(fields, "embedding_dropout", source, 0.0),
        "classifier_dropout": _float(fields, "classifier_dropout", source, 0.0),
        "local_attention_window": cfg_fields._int(
            fields, ("local_attention",), source, default=MODERNBERT_DEFAULT_WINDOW
        ),
        "global_attention_every": cfg_fields._int(
            fields, ("global_attn_every_n_layers",), source, default=MODERNBERT_DEFAULT_GLOBAL_EVERY
        ),
    }


READERS = {
    "bert": _bert,
    "roberta": _bert,
    "xlm-roberta": _bert,
    "deberta-v2": _deberta_v2,
    "modernbert": _modernbert,
}
