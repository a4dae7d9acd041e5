"""The parameter layout of a model: the linear layers of one block, the embeddings, the norms.

:func:`architecture` turns a catalog :class:`~hwdash.core.catalog.ModelSpec` into the
:class:`Architecture` every other formula of the estimator reads; :func:`resolve_lora_targets` and
:func:`lora_adapter_params` say which of its linear layers LoRA adapts and how many parameters the
adapters add.

Sources:

* Hugging Face's model implementations (``modeling_llama.py``, ``modeling_qwen2.py``,
  ``modeling_mixtral.py``, ``modeling_phi.py``) for the projections, biases, norms and routers;
  the other families as :mod:`hwdash.core.families` reads them from ``config.json``.
* PEFT's LoRA guide, https://huggingface.co/docs/peft/developer_guides/lora (``all-linear``).
* LoRA: Hu et al. 2021, arXiv:2106.09685, section 4 (A and B per adapted matrix).
* DoRA: Liu et al. 2024, arXiv:2402.09353, section 4.1 (a magnitude vector per adapted matrix).
* Kaplan et al. 2020, arXiv:2001.08361 (2N FLOPs per token: :attr:`Architecture.matmul_params_per_token`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import cached_property

from hwdash.core.catalog import ModelSpec
from hwdash.core.memo import IdentityMemo

#: Modules ``all-linear`` adapts: every linear layer inside the transformer blocks (PEFT excludes
#: the LM head), per https://huggingface.co/docs/peft/developer_guides/lora ("all-linear").
ALL_LINEAR = "all-linear"
#: Common alternative names of the same projections (Mixtral's w1/w2/w3, Phi's dense).
MODULE_ALIASES = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj", "dense": "o_proj"}


@dataclass(frozen=True)
class LinearShape:
    """One linear projection of a transformer block (``copies`` > 1 for MoE experts)."""

    name: str
    in_features: int
    out_features: int
    copies: int = 1
    bias: bool = False

    @cached_property
    def params(self) -> int:
        """Parameters of every copy together."""
        return self.copies * (
            self.in_features * self.out_features + (self.out_features if self.bias else 0)
        )


@dataclass(frozen=True)
class Architecture:
    """Parameter layout of a decoder-only transformer, derived from a :class:`ModelSpec`."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    experts: int
    experts_per_token: int
    gated_mlp: bool
    linears: tuple[LinearShape, ...]
    """The linear layers of one block."""
    norm_params_per_layer: int
    router_params_per_layer: int
    embedding_params: int
    lm_head_params: int
    """0 when tied to the embedding."""
    final_norm_params: int
    qk_norm: bool = False
    """Per-head RMSNorms on Q and K (``ModelSpec.qk_norm``: Qwen3, Gemma 3)."""
    norms_per_layer: int = 2
    """Norms on the residual stream per block (``ModelSpec.norms_per_layer``)."""
    norm_scale_in_fp32: bool = False
    """Gemma's and OLMo 2's RMSNorm (``ModelSpec.norm_type``: ``rmsnorm_offset``,
    ``rmsnorm_fp32_scale``). Gemma's scales by ``1 + weight`` in
    fp32 before casting back, so it keeps an fp32 normalised tensor and an fp32 ``1 + weight``."""
    mlp_activation: str = "silu"
    """The MLP's activation (``ModelSpec.mlp_activation``): ``gelu_new`` keeps more."""
    norm_offset: bool = False
    """Gemma's ``1 + weight`` (``rmsnorm_offset``): an fp32 vector the norm makes and keeps. OLMo 2's
    norm (``rmsnorm_fp32_scale``) also scales in fp32, by the weight itself: no such vector."""
    attn_logit_softcap: bool = False
    """Gemma 2's ``cap * tanh(scores / cap)`` on the attention scores (eager attention)."""
    final_logit_softcap: bool = False
    """Gemma 2's ``cap * tanh(logits / cap)`` on the output logits."""
    checkpoint_bits: int | None = None
    """A quantized checkpoint's bits (``ModelSpec.checkpoint_bits``): its block linears load at
    that precision (inference), and LoRA on it trains as QLoRA (4) or 8-bit LoRA (8)."""
    cross_attention_layers: int = 0
    """Encoder-decoder: blocks that also attend to the encoder output (T5's decoder blocks; their
    self-attention and MLP are among ``layers``). See :mod:`hwdash.core.families`."""
    cross_linears: tuple[LinearShape, ...] = ()
    """The cross-attention's q, k, v and o projections (one block's)."""
    cross_norm_params: int = 0
    """The norm before each cross-attention."""
    parallel_block: bool = False
    """Attention and MLP read the same block input (``ModelSpec.parallel_block``)."""
    norm_saves_input: bool = False
    """Native LayerNorm keeping its input in the activations' dtype (``ModelSpec.norm_saves_input``)."""

    def __hash__(self) -> int:
        # Kept by the dataclass decorator (an explicit __hash__ wins): the fields never change, so
        # they are hashed once, not on every cache lookup of the formulas that take a layout.
        return self._field_hash

    @cached_property
    def _field_hash(self) -> int:
        return hash(tuple(getattr(self, field.name) for field in fields(self)))

    @cached_property
    def q_dim(self) -> int:
        """Width of the query projection (heads x head_dim)."""
        return self.heads * self.head_dim

    @cached_property
    def kv_dim(self) -> int:
        """Width of each of the key and value projections."""
        return self.kv_heads * self.head_dim

    @cached_property
    def cross_params_per_layer(self) -> int:
        """One cross-attention block's linears (0 for a decoder-only model)."""
        return sum(linear.params for linear in self.cross_linears)

    @cached_property
    def kv_cache_layers(self) -> int:
        """Attention layers whose keys and values a generating model caches: every block of a
        decoder-only model; an encoder-decoder's decoder blocks twice (self- and cross-attention;
        Hugging Face's ``EncoderDecoderCache``), its encoder blocks never."""
        if self.cross_attention_layers:
            return 2 * self.cross_attention_layers
        return self.layers

    @cached_property
    def linear_params_per_layer(self) -> int:
        """Parameters in one block's linear layers (what NF4/int8 quantize)."""
        return sum(linear.params for linear in self.linears)

    @cached_property
    def block_params(self) -> int:
        """Parameters of one transformer block."""
        return (
            self.linear_params_per_layer + self.norm_params_per_layer + self.router_params_per_layer
        )

    @cached_property
    def quantizable_params(self) -> int:
        """Parameters bitsandbytes quantizes: every linear layer inside the blocks."""
        cross = self.cross_attention_layers * self.cross_params_per_layer
        return self.layers * self.linear_params_per_layer + cross

    @cached_property
    def total_params(self) -> int:
        """Every parameter, all experts included."""
        cross = self.cross_attention_layers * (self.cross_params_per_layer + self.cross_norm_params)
        return (
            self.layers * self.block_params
            + cross
            + self.embedding_params
            + self.lm_head_params
            + self.final_norm_params
        )

    @cached_property
    def unquantized_params(self) -> int:
        """Embeddings, LM head, norms, routers: left in 16 bits by bitsandbytes."""
        return self.total_params - self.quantizable_params

    @cached_property
    def largest_linear(self) -> LinearShape:
        """The single largest weight matrix of a block (one expert's, for MoE)."""
        return max(self.linears, key=lambda linear: linear.in_features * linear.out_features)

    @cached_property
    def matmul_params_per_token(self) -> int:
        """Parameters one token multiplies through (MoE: only its routed experts; embedding lookup
        excluded, LM head included even when tied). The N of 2N FLOPs per token (Kaplan et al. 2020)."""
        per_layer = 0
        for linear in self.linears:
            single = linear.params // linear.copies
            per_layer += single * (self.experts_per_token if linear.copies > 1 else 1)
        return self.layers * (per_layer + self.router_params_per_layer) + self.vocab * self.hidden


#: Layouts already derived, by (frozen) ModelSpec: the make-it-fit search estimates thousands of
#: plans of one model.
_LAYOUTS: IdentityMemo[Architecture] = IdentityMemo()


def architecture(model: ModelSpec) -> Architecture:
    """The parameter layout of ``model`` (derived once per model object; see :func:`_derive`)."""
    return _LAYOUTS.get(model, lambda: _derive(model))


def _derive(model: ModelSpec) -> Architecture:
    """The parameter layout of ``model``: Llama-style blocks (q, k, v, o + gated or plain MLP).

    Counts follow the Hugging Face implementations (``modeling_llama.py``, ``modeling_qwen2.py``,
    ``modeling_mixtral.py``, ``modeling_phi.py``): q/k/v biases when ``attention_bias``; a gated MLP
    has gate, up and down projections, a plain one fc1 and fc2 with biases; MoE repeats the MLP per
    expert and adds a router of hidden x experts; RMSNorm has ``hidden`` weights (LayerNorm twice that).
    """
    if model.encoder_only:  # BERT-style encoders: their own layout (imported late: it imports us)
        from hwdash.core.estimator.encoder import encoder_architecture

        return encoder_architecture(model)
    hidden, experts = model.hidden_size, model.experts
    norm = _norm_params(model)
    embedding = model.vocab_size * hidden
    stacks = 2 if model.decoder_layers else 1
    return Architecture(
        layers=model.layers + model.decoder_layers,
        hidden=hidden,
        heads=model.heads,
        kv_heads=model.kv_heads,
        head_dim=model.head_dim,
        intermediate=model.intermediate_size,
        vocab=model.vocab_size,
        experts=experts,
        experts_per_token=model.experts_per_token,
        gated_mlp=model.mlp == "gated",
        linears=tuple(_attention_linears(model) + _mlp_linears(model)),
        norm_params_per_layer=model.norm_weights_per_layer * norm,
        router_params_per_layer=hidden * experts if experts > 1 else 0,
        embedding_params=embedding + _extra_lookup_params(model, norm),
        lm_head_params=0 if model.tied_embeddings else embedding,
        # an encoder-decoder ends each stack with a norm
        final_norm_params=stacks * norm if model.norm_weights_per_layer else 0,
        qk_norm=model.qk_norm,
        norms_per_layer=model.norms_per_layer,
        norm_scale_in_fp32=model.norm_type in ("rmsnorm_offset", "rmsnorm_fp32_scale"),
        norm_offset=model.norm_type == "rmsnorm_offset",
        mlp_activation=model.mlp_activation,
        attn_logit_softcap=model.attn_logit_softcap is not None,
        final_logit_softcap=model.final_logit_softcap is not None,
        checkpoint_bits=model.checkpoint_bits,
        cross_attention_layers=model.decoder_layers,
        cross_linears=tuple(_attention_linears(model, "cross_") if model.decoder_layers else ()),
        cross_norm_params=norm if model.decoder_layers and model.norm_weights_per_layer else 0,
        parallel_block=model.parallel_block,
        norm_saves_input=model.norm_saves_input,
    )


def _mlp_bias(model: ModelSpec) -> bool:
    """Whether the MLP (and the attention output) has biases. Families read by
    hwdash.core.families say outright where biases are; the Llama-style ones follow the MLP kind
    (a standard MLP, as Phi-2, has them)."""
    return (model.mlp != "gated") if model.mlp_bias is None else model.mlp_bias


def _attention_linears(model: ModelSpec, prefix: str = "") -> list[LinearShape]:
    """q, k, v and o of one block's attention (``prefix`` "cross_": an encoder-decoder's
    cross-attention, shaped the same); q/k/v biases when ``attention_bias``."""
    hidden, head_dim, bias = model.hidden_size, model.head_dim, model.attention_bias
    q_dim, kv_dim = model.heads * head_dim, model.kv_heads * head_dim
    return [
        LinearShape(f"{prefix}q_proj", hidden, q_dim, bias=bias),
        LinearShape(f"{prefix}k_proj", hidden, kv_dim, bias=bias),
        LinearShape(f"{prefix}v_proj", hidden, kv_dim, bias=bias),
        LinearShape(f"{prefix}o_proj", q_dim, hidden, bias=_mlp_bias(model)),
    ]


def _mlp_linears(model: ModelSpec) -> list[LinearShape]:
    """One block's MLP, once per expert: gate, up and down (gated) or fc1 and fc2 (plain)."""
    hidden, inter, experts = model.hidden_size, model.intermediate_size, model.experts
    if model.mlp == "gated":
        bias = bool(model.mlp_bias)
        return [
            LinearShape("gate_proj", hidden, inter, copies=experts, bias=bias),
            LinearShape("up_proj", hidden, inter, copies=experts, bias=bias),
            LinearShape("down_proj", inter, hidden, copies=experts, bias=bias),
        ]
    return [
        LinearShape("fc1", hidden, inter, copies=experts, bias=_mlp_bias(model)),
        LinearShape("fc2", inter, hidden, copies=experts, bias=_mlp_bias(model)),
    ]


def _norm_params(model: ModelSpec) -> int:
    """Parameters of one norm: RMSNorm weight vs LayerNorm weight + bias."""
    norm_bias = (model.mlp != "gated") if model.norm_bias is None else model.norm_bias
    return 2 * model.hidden_size if norm_bias else model.hidden_size


def _extra_lookup_params(model: ModelSpec, norm: int) -> int:
    """Lookups besides the token embedding: a learned position table (GPT-2's wpe), BLOOM's
    embedding LayerNorm and T5's relative-position bias tables (an nn.Embedding of buckets x heads
    in the first block of the encoder and of the decoder): all left unquantized."""
    extra = model.learned_positions * model.hidden_size + (norm if model.embedding_norm else 0)
    stacks = 2 if model.decoder_layers else 1
    return extra + stacks * model.relative_attention_buckets * model.heads


def resolve_lora_targets(arch: Architecture, targets: tuple[str, ...]) -> tuple[LinearShape, ...]:
    """The block's linear layers LoRA adapts. ``all-linear`` means all of them.

    Raises ``ValueError`` naming a module the model does not have.
    """
    by_name = {linear.name: linear for linear in arch.linears}
    if any(target == ALL_LINEAR for target in targets):
        return arch.linears
    chosen: dict[str, LinearShape] = {}
    for target in targets:
        name = MODULE_ALIASES.get(target, target)
        if name not in by_name:
            known = ", ".join([*by_name, ALL_LINEAR])
            raise ValueError(f"the model has no module '{target}' (it has {known})")
        chosen[name] = by_name[name]
    return tuple(chosen.values())


def lora_adapter_params(
    arch: Architecture, targets: tuple[LinearShape, ...], rank: int, *, dora: bool = False
) -> int:
    """Adapter parameters: A (r x in) and B (out x r) per targeted matrix per layer, per expert.

    LoRA: Hu et al. 2021, arXiv:2106.09685, section 4. DoRA adds a magnitude vector of ``out``
    values per adapted matrix (Liu et al. 2024, arXiv:2402.09353, section 4.1).
    """
    per_layer = 0
    for linear in targets:
        per_copy = rank * (linear.in_features + linear.out_features)
        if dora:
            per_copy += linear.out_features
        per_layer += per_copy * linear.copies
    return arch.layers * per_layer
