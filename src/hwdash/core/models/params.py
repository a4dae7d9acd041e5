"""Parameter counts from a transformer's architecture fields (pure, no I/O).

The count follows the decoder-only layout shared by Llama, Qwen, Mistral, Gemma and Phi
(Vaswani et al. 2017, "Attention Is All You Need", section 3; grouped-query attention from
Ainslie et al. 2023, "GQA", section 2; gated MLPs from Shazeer 2020, "GLU Variants Improve
Transformer"; sparse MoE from Jiang et al. 2024, "Mixtral of Experts", section 2):

- token embedding ``vocab x hidden``, plus an LM head of the same size unless the weights are tied;
- per layer, attention projections q (``hidden x heads*head_dim``), k and v (``hidden x kv_heads*head_dim``
  each) and o (``heads*head_dim x hidden``), plus q/k/v biases where ``attention_bias`` is set;
- per layer, the MLP: three ``hidden x intermediate`` matrices when gated (SwiGLU/GeGLU), two when
  standard, times the number of experts, plus a ``hidden x experts`` router for MoE;
- RMSNorm/LayerNorm weights: two per layer and one final, ``hidden`` each.

Not modelled (each well under 0.1% of the total for the catalog's models): output-projection and MLP
biases (Phi-2), extra norms (Gemma 2/3 have four per layer, Qwen3 and Gemma 3 normalise q and k),
LayerNorm biases, and vision towers of multimodal checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass

from hwdash.core.specs import ModelSpec


@dataclass(frozen=True)
class ParameterBreakdown:
    """Parameters of one model by part. All fields are counts of scalars."""

    embedding: int
    """Input token embedding (``vocab_size x hidden_size``)."""
    lm_head: int
    """Output projection to the vocabulary; 0 when tied to the embedding."""
    attention: int
    """q/k/v/o projections (and q/k/v biases) over all layers."""
    mlp: int
    """MLP matrices over all layers and all experts, routers included."""
    norms: int
    """Normalisation weights over all layers plus the final norm."""

    @property
    def total(self) -> int:
        """Every parameter held in memory."""
        return self.embedding + self.lm_head + self.attention + self.mlp + self.norms


def attention_parameters_per_layer(model: ModelSpec) -> int:
    """q, k, v and o projections of one layer, GQA-aware, with q/k/v biases when the model has them."""
    q_width = model.heads * model.head_dim
    kv_width = model.kv_heads * model.head_dim
    weights = model.hidden_size * q_width  # q
    weights += 2 * model.hidden_size * kv_width  # k and v
    weights += q_width * model.hidden_size  # o
    biases = (q_width + 2 * kv_width) if model.attention_bias else 0
    return weights + biases


def mlp_parameters_per_expert(model: ModelSpec) -> int:
    """One expert's MLP (the whole MLP of a dense layer): 3 matrices when gated, 2 when standard."""
    matrices = 3 if model.mlp == "gated" else 2
    return matrices * model.hidden_size * model.intermediate_size


def mlp_parameters_per_layer(model: ModelSpec) -> int:
    """One layer's MLP: every expert plus the router (``hidden x experts``) for MoE."""
    router = model.hidden_size * model.experts if model.experts > 1 else 0
    return model.experts * mlp_parameters_per_expert(model) + router


def parameter_breakdown(model: ModelSpec) -> ParameterBreakdown:
    """Count a model's parameters part by part from its architecture fields."""
    embedding = model.vocab_size * model.hidden_size
    return ParameterBreakdown(
        embedding=embedding,
        lm_head=0 if model.tied_embeddings else embedding,
        attention=model.layers * attention_parameters_per_layer(model),
        mlp=model.layers * mlp_parameters_per_layer(model),
        norms=(2 * model.layers + 1) * model.hidden_size,
    )


def _outside_llama_layout(model: ModelSpec) -> bool:
    """Whether the model sets a field of the families :mod:`hwdash.core.models.families` reads (an
    encoder-decoder, learned positions, bias or norm layouts of its own): those are counted by
    the estimator's :func:`~hwdash.core.estimator.architecture`, which knows them."""
    return bool(
        model.decoder_layers
        or model.learned_positions
        or model.embedding_norm
        or model.relative_attention_buckets
        or model.mlp_bias is not None
        or model.norm_bias is not None
        or model.norm_weights_per_layer != 2
        or model.kv_lora_rank
        or model.shared_expert_intermediate_size
        or model.dense_mlp_layers
    )


def count_parameters(model: ModelSpec) -> int:
    """Total parameters held in memory (all MoE experts included), counted from the architecture."""
    if _outside_llama_layout(model):
        from hwdash.core.estimator import architecture

        return architecture(model).total_params
    return parameter_breakdown(model).total


def count_active_parameters(model: ModelSpec) -> int:
    """Parameters one token passes through: only ``experts_per_token`` experts for MoE.

    This is the N in the 6*N*D training-FLOPs rule for sparse models (Mixtral paper, section 2).
    Shared experts, latent attention and dense leading blocks are counted by the estimator's
    :attr:`~hwdash.core.estimator.Architecture.active_params`.
    """
    if model.kv_lora_rank or model.shared_expert_intermediate_size or model.dense_mlp_layers:
        from hwdash.core.estimator import architecture

        return architecture(model).active_params
    parts = parameter_breakdown(model)
    inactive = (model.experts - model.experts_per_token) * mlp_parameters_per_expert(model)
    return parts.total - model.layers * inactive
