"""The parameter layout the estimator reads: :class:`LinearShape` and :class:`Architecture`.

Data classes only; :mod:`hwdash.core.estimator.architecture` derives them from a
:class:`~hwdash.core.specs.ModelSpec` (decoders) and :mod:`hwdash.core.estimator.encoder` for
encoder-only models, both importing this module rather than each other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from functools import cached_property


@dataclass(frozen=True)
class LinearShape:
    """One linear projection of a transformer block (``copies`` > 1 for MoE experts)."""

    name: str
    in_features: int
    out_features: int
    copies: int = 1
    bias: bool = False
    module: str = ""
    """The module's dotted path inside a block as transformers names it (``attn.c_attn``); ""
    where it is ``name`` (Llama's). ``name`` is the role hwdash counts it by: Llama's names, and
    ``qkv_proj`` / ``gate_up_proj`` for a fused projection."""

    @property
    def path(self) -> str:
        """The module's path inside a block (see :attr:`module`)."""
        return self.module or self.name

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
    self-attention and MLP are among ``layers``). See :mod:`hwdash.core.models.families`."""
    cross_linears: tuple[LinearShape, ...] = ()
    """The cross-attention's q, k, v and o projections (one block's)."""
    cross_norm_params: int = 0
    """The norm before each cross-attention."""
    parallel_block: bool = False
    """Attention and MLP read the same block input (``ModelSpec.parallel_block``)."""
    norm_saves_input: bool = False
    """Native LayerNorm keeping its input in the activations' dtype (``ModelSpec.norm_saves_input``)."""
    kv_expanded: bool = False
    """K and V copied out to all heads before attention and the cache (``ModelSpec.kv_expanded``)."""
    residual_dropout: bool = False
    """A decoder whose config keeps dropout on the attention and MLP outputs in training (GPT-2's
    and GPT-BigCode's ``resid_pdrop``; ``ModelSpec.hidden_dropout`` > 0 on a decoder)."""
    module_names: str = ""
    """How transformers names the modules (``ModelSpec.module_names``)."""
    shared_intermediate: int = 0
    """MoE: the shared expert's width (``ModelSpec.shared_expert_intermediate_size``); its linears
    are among ``linears``, named ``shared_expert.*``."""
    shared_expert_gate: bool = False
    """Qwen MoE's sigmoid gate on the shared expert's output (``shared_expert_gate`` in ``linears``)."""
    dense_layers: int = 0
    """MoE: blocks (of ``layers``) with one dense MLP of ``dense_intermediate`` instead of the
    experts (DeepSeek's ``first_k_dense_replace``); see :attr:`block_kinds`."""
    dense_intermediate: int = 0
    """Width of those dense MLPs."""
    router_fp32: bool = False
    """DeepSeek's router: an fp32 copy of its input times an fp32 weight."""
    router_sigmoid: bool = False
    """DeepSeek-V3's sigmoid router scores (``noaux_tc``)."""
    kv_lora_rank: int = 0
    """Multi-head latent attention (DeepSeek-V2/V3): the key/value latent's width; 0 without MLA.
    With MLA, ``head_dim`` is the query/key head width (nope + rope parts)."""
    q_lora_rank: int = 0
    """MLA: the query latent's width (0: a plain q_proj)."""
    qk_rope_head_dim: int = 0
    """MLA: the rotary part of a query/key head (the key's is one tensor shared by all heads)."""
    v_head_dim: int = 0
    """MLA: per-head value width."""
    peft_fused_experts: bool = True
    """MoE: what LoRA target names reach (``ModelSpec.peft_fused_experts``; :func:`lora_candidates`)."""
    experts_every_token: bool = False
    """MoE: every expert runs on every token (``ModelSpec.experts_every_token``: Llama 4), so the
    routed experts' activations count :attr:`routed_copies` times."""
    qk_norm_weight: bool = True
    """The Q/K norms have a weight (``ModelSpec.qk_norm_weight``; Llama 4's have none)."""
    nope_layers: tuple[int, ...] = ()
    """Llama 4: the blocks without RoPE, Q/K norm or chunking (``ModelSpec.nope_layers``);
    see :attr:`block_kinds`."""
    moe_layer_indices: tuple[int, ...] = ()
    """The MoE blocks where they are not the last ones (``ModelSpec.moe_layer_indices``)."""
    vision_params: int = 0
    """A vision-language model's vision tower and projector (``ModelSpec.vision``): loaded with the
    model, so among :attr:`total_params`, outside the blocks."""
    experts_fused: bool = True
    """MoE: transformers keeps the routed experts (the ``copies`` > 1 linears) as fused 3-D
    parameters of one ``...Experts`` module per block, not ``nn.Linear`` (transformers 5.24:
    ``MixtralExperts`` in ``modeling_mixtral.py``, ``Qwen2MoeExperts`` / ``Qwen3MoeExperts``,
    ``DeepseekV2Experts`` / ``DeepseekV3Experts``, ``Llama4TextExperts``: ``gate_up_proj`` and
    ``down_proj``). Weight quantization that swaps modules then leaves them in the load dtype:
    bitsandbytes' ``replace_with_bnb_linear`` (``integrations/bitsandbytes.py``) replaces only
    ``nn.Linear`` and ``Conv1D``, as ``replace_with_awq_linear`` (``integrations/awq.py``) and
    optimum's GPTQ ``convert_model`` do. See :attr:`quantizable_params`."""
    layer_attention: tuple[str, ...] = ()
    """Each decoder layer's attention, ``full``, ``sliding`` or ``chunked``
    (``ModelSpec.layer_attention``); empty: every layer full."""
    sliding_window: int = 0
    """Tokens a sliding layer attends to (``ModelSpec.sliding_window``)."""
    attention_chunk_size: int = 0
    """Tokens of a chunked layer's chunk (``ModelSpec.attention_chunk_size``). In a block kind of
    :attr:`block_kinds` (whose ``layer_attention`` is empty), set only on a chunked block, as
    :attr:`sliding_window` only on a sliding one: from that length on transformers hands SDPA a
    mask (:attr:`local_span`)."""

    @property
    def local_span(self) -> int:
        """A block kind's attention span: its window (sliding) or chunk (chunked), 0 for full
        attention or a whole stack (:attr:`layer_attention` set; its :attr:`block_kinds` say)."""
        if self.layer_attention:
            return 0
        return self.attention_chunk_size or self.sliding_window

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
    def mla(self) -> bool:
        """Multi-head latent attention (DeepSeek-V2/V3)."""
        return self.kv_lora_rank > 0

    @cached_property
    def latent_kv_width(self) -> int:
        """Elements per token per layer of MLA's compressed key/value: the normalised latent
        (``kv_lora_rank``) and the rotary key shared by all heads (``qk_rope_head_dim``), what
        ``DeepseekV2Attention`` / ``DeepseekV3Attention`` hand to ``cache.update``
        (``modeling_deepseek_v2.py``, ``modeling_deepseek_v3.py``; DeepSeek-V2 paper,
        arXiv:2405.04434, section 2.1.2: (d_c + d_h^R) per token per layer). Without MLA: the
        ordinary key and value (``2 * kv_dim``)."""
        if self.mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        if self.kv_expanded:
            return 2 * self.heads * self.head_dim
        return 2 * self.kv_dim

    @cached_property
    def decompressed_kv_width(self) -> int:
        """Elements per token per layer of the per-head keys (``head_dim``: nope + rope) and values
        (``v_head_dim``) MLA expands its latent into (``expand_kv``); ``2 * kv_dim`` without MLA."""
        if self.mla:
            return self.heads * (self.head_dim + self.v_head_dim)
        return 2 * self.kv_dim

    @cached_property
    def kv_cache_width(self) -> int:
        """Elements per token per layer that transformers' ``generate`` caches. With MLA the
        latent (:attr:`latent_kv_width`): transformers 5 caches ``k_nope`` (the normalised latent)
        and ``k_pe`` and re-expands them through ``kv_b_proj`` at every step."""
        return self.latent_kv_width

    @property
    def routed_copies(self) -> int:
        """How many copies of each token the routed experts run in training: the top-k, or every
        expert where they all run on every token (:attr:`experts_every_token`)."""
        return self.experts if self.experts_every_token else self.experts_per_token

    @cached_property
    def block_kinds(self) -> tuple[tuple[int, Architecture], ...]:
        """(count, layout) for each kind of block: the MoE blocks (this layout) and, for DeepSeek's
        ``first_k_dense_replace``, the dense ones (:attr:`dense_block`). One kind otherwise.
        Llama 4 (:attr:`nope_layers`): each of those split into its RoPE blocks (chunked attention,
        Q/K norm) and its NoPE blocks (neither: ``Llama4TextAttention``, modeling_llama4.py).
        A stack with sliding-window or chunked layers (:attr:`layer_attention`): split by attention
        kind as well, each windowed kind carrying its span (:attr:`local_span`)."""
        if self.nope_layers or self.layer_attention:
            return self._rope_kinds
        if not self.dense_layers:
            return ((self.layers, self),)
        return ((self.layers - self.dense_layers, self), (self.dense_layers, self.dense_block))

    @cached_property
    def _rope_kinds(self) -> tuple[tuple[int, Architecture], ...]:
        """:attr:`block_kinds` of a Llama 4 stack or one with windowed layers: its blocks grouped
        by MLP (MoE, then dense), RoPE or not (a NoPE block has no Q/K norm) and attention kind
        (windowed before full); a kind carries ``attention_chunk_size`` only when it is chunked,
        ``sliding_window`` only when it is sliding, and no ``layer_attention``."""
        plain = replace(self, nope_layers=(), moe_layer_indices=(), layer_attention=())
        if self.experts <= 1:
            moe = set(range(self.layers))
        else:
            moe = set(self.moe_layer_indices or range(self.dense_layers, self.layers))
        attention = self.layer_attention or ("full",) * self.layers
        counts: dict[tuple[bool, bool, bool, str], int] = {}
        for i in range(self.layers):
            kind = attention[i]
            key = (i in moe, i not in self.nope_layers, kind != "full", kind)
            counts[key] = counts.get(key, 0) + 1
        kinds = []
        for (is_moe, rope, _, attending), count in sorted(counts.items(), reverse=True):
            block = plain if is_moe or self.experts <= 1 else plain.dense_block
            kinds.append(
                (
                    count,
                    replace(
                        block,
                        qk_norm=block.qk_norm and rope,
                        attention_chunk_size=(
                            self.attention_chunk_size if attending == "chunked" else 0
                        ),
                        sliding_window=self.sliding_window if attending == "sliding" else 0,
                    ),
                )
            )
        return tuple(kinds)

    @cached_property
    def leading_block(self) -> Architecture:
        """This layout with the first layer's attention kind (its window or chunk, as a kind of
        :attr:`block_kinds` carries it), for the formulas that take one block of the stack (the
        first layer's backward, the recomputed layer); this layout itself without windows."""
        if not self.layer_attention:
            return self
        first = self.layer_attention[0]
        return replace(
            self,
            layer_attention=(),
            attention_chunk_size=self.attention_chunk_size if first == "chunked" else 0,
            sliding_window=self.sliding_window if first == "sliding" else 0,
        )

    @cached_property
    def dense_block(self) -> Architecture:
        """The layout of a dense block of a MoE model with leading dense blocks: the same attention
        and norms, one gated MLP of ``dense_intermediate`` (``DeepseekV2MLP``), no router."""
        attention = tuple(
            linear for linear in self.linears if linear.copies == 1 and not is_mlp(linear.name)
        )
        mlp = _gated_mlp(self.hidden, self.dense_intermediate, 1, False)
        return replace(
            self,
            layers=self.dense_layers,
            intermediate=self.dense_intermediate,
            experts=1,
            experts_per_token=1,
            linears=attention + tuple(mlp),
            router_params_per_layer=0,
            shared_intermediate=0,
            shared_expert_gate=False,
            dense_layers=0,
            dense_intermediate=0,
            router_fp32=False,
            router_sigmoid=False,
        )

    def _over_blocks(self, per_block: Callable[[Architecture], int]) -> int:
        return sum(count * per_block(kind) for count, kind in self.block_kinds)

    @cached_property
    def quantized_linears(self) -> tuple[LinearShape, ...]:
        """The block linears a weight quantizer replaces: all of them, less the routed experts
        where transformers fuses them into 3-D parameters (:attr:`experts_fused`). A shared
        expert and a dense block's MLP are ``nn.Linear`` and are quantized."""
        if not self.experts_fused:
            return self.linears
        return tuple(linear for linear in self.linears if linear.copies == 1)

    @cached_property
    def linear_rows(self) -> int:
        """Output rows of every quantized block linear of every block (LLM.int8()'s per-row
        scales)."""
        return self._over_blocks(
            lambda kind: sum(
                linear.out_features * linear.copies for linear in kind.quantized_linears
            )
        )

    @cached_property
    def linear_inputs(self) -> int:
        """Input features of every quantized block linear of every block (GPTQ's group indices)."""
        return self._over_blocks(
            lambda kind: sum(
                linear.in_features * linear.copies for linear in kind.quantized_linears
            )
        )

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
    def layer_windows(self) -> tuple[int | None, ...]:
        """Each cached layer's attention span in tokens: the window of a sliding layer, the chunk
        of a chunked one, None for full attention (every layer None without windows)."""
        spans = {"full": None, "sliding": self.sliding_window, "chunked": self.attention_chunk_size}
        if not self.layer_attention:
            return (None,) * self.kv_cache_layers
        return tuple(spans[kind] for kind in self.layer_attention)

    @cached_property
    def attention_groups(self) -> tuple[tuple[str, int, int], ...]:
        """(kind, span, layers) for each kind of attention layer, in the order they first appear
        (span 0 for full attention): one ``("full", 0, kv_cache_layers)`` without windows."""
        if not self.layer_attention:
            return (("full", 0, self.kv_cache_layers),)
        counts: dict[str, int] = {}
        for kind in self.layer_attention:
            counts[kind] = counts.get(kind, 0) + 1
        spans = {"full": 0, "sliding": self.sliding_window, "chunked": self.attention_chunk_size}
        return tuple((kind, spans[kind], count) for kind, count in counts.items())

    def kv_layer_tokens(self, tokens: int) -> int:
        """Tokens cached over all layers after ``tokens`` tokens once decoding has begun: a full
        layer holds them all, a sliding or chunked one at most its span (transformers'
        ``DynamicSlidingWindowLayer`` keeps ``span - 1`` tokens as a view of the ``span``-token
        tensor each decoding step's ``torch.cat`` makes; ``cache_utils.py``)."""
        return sum(tokens if span is None else min(tokens, span) for span in self.layer_windows)

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
        """Parameters bitsandbytes quantizes: every ``nn.Linear`` inside the blocks
        (:attr:`quantized_linears`). The fused routed experts of a MoE are not among them
        (:attr:`experts_fused`): they stay in the load dtype, with the embeddings and norms in
        :attr:`unquantized_params` (Mixtral-8x7B: 45.1B of its 46.7B parameters)."""
        cross = self.cross_attention_layers * self.cross_params_per_layer
        return (
            self._over_blocks(lambda kind: sum(linear.params for linear in kind.quantized_linears))
            + cross
        )

    @cached_property
    def total_params(self) -> int:
        """Every parameter, all experts included."""
        cross = self.cross_attention_layers * (self.cross_params_per_layer + self.cross_norm_params)
        return (
            self._over_blocks(lambda kind: kind.block_params)
            + cross
            + self.embedding_params
            + self.lm_head_params
            + self.final_norm_params
            + self.vision_params
        )

    @cached_property
    def unquantized_params(self) -> int:
        """Embeddings, LM head, norms, routers and a MoE's fused routed experts: left in 16 bits
        by bitsandbytes."""
        return self.total_params - self.quantizable_params

    @cached_property
    def largest_quantized_linear(self) -> LinearShape:
        """The largest weight matrix a quantizer replaces in a block (one of
        :attr:`quantized_linears`): the one bitsandbytes quantizes or dequantizes at a time.
        :attr:`largest_linear` where nothing is left out."""
        kinds = [kind for _, kind in self.block_kinds if kind.quantized_linears]
        if not kinds:
            return self.largest_linear
        return max(
            (linear for kind in kinds for linear in kind.quantized_linears),
            key=lambda linear: linear.in_features * linear.out_features,
        )

    @cached_property
    def largest_fused_expert_params(self) -> int:
        """Parameters of the largest fused expert tensor (:attr:`experts_fused`): one block's
        ``gate_up_proj`` (gate and up of every expert, one 3-D parameter in ``MixtralExperts``,
        ``modeling_mixtral.py``) or ``down_proj``; 0 without fused experts."""
        if not self.experts_fused:
            return 0
        routed = [linear for linear in self.linears if linear.copies > 1]
        gate_up = sum(linear.params for linear in routed if is_gate_or_up(linear.name))
        others = [linear.params for linear in routed if not is_gate_or_up(linear.name)]
        return max([gate_up, *others], default=0)

    @cached_property
    def largest_linear(self) -> LinearShape:
        """The single largest weight matrix of a block (one expert's, for MoE)."""
        return max(self.linears, key=lambda linear: linear.in_features * linear.out_features)

    @cached_property
    def matmul_params_per_token(self) -> int:
        """Parameters one token multiplies through (MoE: only its routed experts; embedding lookup
        excluded, LM head included even when tied). The N of 2N FLOPs per token (Kaplan et al. 2020)."""
        return self._over_blocks(_active_block_params) + self.vocab * self.hidden

    @cached_property
    def trained_matmul_params_per_token(self) -> int:
        """:attr:`matmul_params_per_token` as transformers runs a training step: the same, except
        where every expert runs on every token (:attr:`experts_every_token`: ``Llama4TextMoe``
        repeats each token once per expert, scales each copy by its router score, 0 outside the
        top-k, and ``Llama4TextExperts`` multiplies all copies through all experts with
        ``torch.bmm``; modeling_llama4.py), where each routed expert linear counts
        :attr:`routed_copies` (every expert) times. Serving engines (vLLM) run the top-k only."""
        if not self.experts_every_token:
            return self.matmul_params_per_token
        return self._over_blocks(_every_expert_block_params) + self.vocab * self.hidden

    @cached_property
    def active_params(self) -> int:
        """Parameters one token passes through, embedding included (MoE: its routed experts, the
        shared expert, the router): the N of 6ND for sparse models."""
        return (
            self._over_blocks(_active_block_params)
            + self.embedding_params
            + self.lm_head_params
            + self.final_norm_params
            + self._over_blocks(lambda kind: kind.norm_params_per_layer)
        )


def _active_block_params(kind: Architecture, routed: int | None = None) -> int:
    """One block's linears a token multiplies through (its k routed experts, or ``routed`` of
    them), plus the router."""
    per_layer = 0
    copies = kind.experts_per_token if routed is None else routed
    for linear in kind.linears:
        single = linear.params // linear.copies
        per_layer += single * (copies if linear.copies > 1 else 1)
    return per_layer + kind.router_params_per_layer


def _every_expert_block_params(kind: Architecture) -> int:
    """:func:`_active_block_params` with each routed expert linear counted
    :attr:`~Architecture.routed_copies` times (every expert where all run on every token)."""
    return _active_block_params(kind, kind.routed_copies)


#: The MLP's linears, by name (a dense block keeps the others: the attention's).
_MLP_NAMES = ("gate_proj", "up_proj", "down_proj", "fc1", "fc2", "shared_expert_gate")


def is_gate_or_up(name: str) -> bool:
    """Whether a block linear is a gated MLP's gate or up projection (or the two fused)."""
    return name.split(".")[-1] in ("gate_proj", "up_proj", "gate_up_proj")


def is_mlp(name: str) -> bool:
    """Whether a block linear (by its name) belongs to the MLP rather than the attention."""
    return name.split(".")[-1] in _MLP_NAMES


def _gated_mlp(
    hidden: int, inter: int, copies: int, bias: bool, prefix: str = ""
) -> list[LinearShape]:
    """gate, up and down of a gated MLP (``copies`` experts)."""
    return [
        LinearShape(f"{prefix}gate_proj", hidden, inter, copies=copies, bias=bias),
        LinearShape(f"{prefix}up_proj", hidden, inter, copies=copies, bias=bias),
        LinearShape(f"{prefix}down_proj", inter, hidden, copies=copies, bias=bias),
    ]
