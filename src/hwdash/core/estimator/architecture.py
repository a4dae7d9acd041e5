"""The parameter layout of a model: the linear layers of one block, the embeddings, the norms.

:func:`architecture` turns a catalog :class:`~hwdash.core.catalog.ModelSpec` into the
:class:`Architecture` every other formula of the estimator reads; :func:`resolve_lora_targets` and
:func:`lora_adapter_params` say which of its linear layers LoRA adapts and how many parameters the
adapters add.

Sources:

* Hugging Face's model implementations (``modeling_llama.py``, ``modeling_qwen2.py``,
  ``modeling_mixtral.py``, ``modeling_phi.py``) for the projections, biases, norms and routers;
  the other families as :mod:`hwdash.core.models.families` reads them from ``config.json``.
* PEFT's LoRA guide, https://huggingface.co/docs/peft/developer_guides/lora (``all-linear``).
* LoRA: Hu et al. 2021, arXiv:2106.09685, section 4 (A and B per adapted matrix).
* DoRA: Liu et al. 2024, arXiv:2402.09353, section 4.1 (a magnitude vector per adapted matrix).
* Kaplan et al. 2020, arXiv:2001.08361 (2N FLOPs per token: :attr:`Architecture.matmul_params_per_token`).
"""

from __future__ import annotations

from typing import Any

from hwdash.core.estimator.encoder import encoder_architecture
from hwdash.core.estimator.layout import Architecture as Architecture
from hwdash.core.estimator.layout import LinearShape as LinearShape
from hwdash.core.estimator.layout import _gated_mlp
from hwdash.core.estimator.layout import is_mlp as is_mlp
from hwdash.core.memo import IdentityMemo
from hwdash.core.module_names import matches, scheme
from hwdash.core.specs import ModelSpec

#: Modules ``all-linear`` adapts: every linear layer inside the transformer blocks (PEFT excludes
#: the LM head), per https://huggingface.co/docs/peft/developer_guides/lora ("all-linear") and
#: ``_maybe_include_all_linear_layers`` in ``peft/tuners/tuners_utils.py`` (every nn.Linear and
#: Conv1D but the output embedding).
ALL_LINEAR = "all-linear"
#: Prefix of a MoE's shared-expert linears (Qwen MoE's ``shared_expert``; DeepSeek calls the same
#: MLP ``shared_experts``, an alias). PEFT matches a target name against the end of each module's
#: path, so ``gate_proj`` adapts the shared expert's too.
SHARED_PREFIX = "shared_expert."
_SHARED_ALIAS = "shared_experts."


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
    if model.encoder_only:  # BERT-style encoders: their own layout
        return encoder_architecture(model)
    hidden, experts = model.hidden_size, model.experts
    norm = _norm_params(model)
    embedding = model.vocab_size * hidden
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
        linears=tuple(_attention_linears(model) + _mlp_linears(model) + _shared_linears(model)),
        norm_params_per_layer=_layer_norm_params(model, norm),
        router_params_per_layer=hidden * experts if experts > 1 else 0,
        embedding_params=embedding + _extra_lookup_params(model, norm),
        lm_head_params=0 if model.tied_embeddings else embedding,
        final_norm_params=_final_norm_params(model, norm),
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
        residual_dropout=model.hidden_dropout > 0 and not model.encoder_only,
        kv_expanded=model.kv_expanded,
        module_names=model.module_names,
        shared_intermediate=model.shared_expert_intermediate_size if experts > 1 else 0,
        shared_expert_gate=model.shared_expert_gate and experts > 1,
        dense_layers=model.dense_mlp_layers if experts > 1 else 0,
        dense_intermediate=model.dense_intermediate_size,
        router_fp32=model.router_fp32,
        router_sigmoid=model.router_sigmoid,
        kv_lora_rank=model.kv_lora_rank,
        q_lora_rank=model.q_lora_rank if model.kv_lora_rank else 0,
        qk_rope_head_dim=model.qk_rope_head_dim if model.kv_lora_rank else 0,
        v_head_dim=model.v_head_dim if model.kv_lora_rank else 0,
        peft_fused_experts=model.peft_fused_experts,
        vision_params=model.vision.params if model.vision else 0,
        **_layer_pattern(model),
    )


def _layer_pattern(model: ModelSpec) -> dict[str, Any]:
    """Llama 4's block layout (``modeling_llama4.py``): experts run on every token, weightless Q/K
    norms, NoPE blocks and interleaved MoE blocks (ModelSpec's fields), and every model's
    attention windows (:func:`_window_fields`)."""
    moe = model.experts > 1
    return {
        "experts_every_token": model.experts_every_token and moe,
        "qk_norm_weight": model.qk_norm_weight,
        "nope_layers": model.nope_layers,
        "moe_layer_indices": model.moe_layer_indices if moe else (),
        **_window_fields(model),
    }


def _window_fields(model: ModelSpec) -> dict[str, Any]:
    """The per-layer attention kinds and spans (``ModelSpec.layer_attention``); without kinds
    every layer attends fully, so a span written alone (a catalog entry) is dropped, as the
    serving formulas drop it: only :attr:`~Architecture.block_kinds` carry one."""
    if not model.layer_attention:
        return {"layer_attention": (), "sliding_window": 0, "attention_chunk_size": 0}
    return {
        "layer_attention": model.layer_attention,
        "sliding_window": model.sliding_window,
        "attention_chunk_size": model.attention_chunk_size,
    }


def _layer_norm_params(model: ModelSpec, norm: int) -> int:
    """The norm weights of one layer: its block norms, and MLA's latent norms."""
    # MLA's q_a_layernorm and kv_a_layernorm: RMSNorms over the latents
    return model.norm_weights_per_layer * norm + (
        model.q_lora_rank + model.kv_lora_rank if model.kv_lora_rank else 0
    )


def _final_norm_params(model: ModelSpec, norm: int) -> int:
    """The final norm's weights (none for a family without norm weights)."""
    # an encoder-decoder ends each stack with a norm
    stacks = 2 if model.decoder_layers else 1
    return stacks * norm if model.norm_weights_per_layer else 0


def _mlp_bias(model: ModelSpec) -> bool:
    """Whether the MLP (and the attention output) has biases. Families read by
    hwdash.core.models.families say outright where biases are; the Llama-style ones follow the MLP kind
    (a standard MLP, as Phi-2, has them)."""
    return (model.mlp != "gated") if model.mlp_bias is None else model.mlp_bias


def _linear(
    model: ModelSpec,
    role: str,
    in_features: int,
    out_features: int,
    *,
    copies: int = 1,
    bias: bool = False,
) -> LinearShape:
    """A projection named by its role, carrying its module path in the model's family."""
    path = scheme(model.module_names).path(role)
    return LinearShape(
        role, in_features, out_features, copies, bias, module="" if path == role else path
    )


def _attention_linears(model: ModelSpec, prefix: str = "") -> list[LinearShape]:
    """q, k, v and o of one block's attention (``prefix`` "cross_": an encoder-decoder's
    cross-attention, shaped the same); q/k/v biases when ``attention_bias``. Families that fuse
    q, k and v into one matrix (GPT-2's ``c_attn``, GPT-NeoX's, BLOOM's and Falcon's
    ``query_key_value``, Phi-3's ``qkv_proj``; ``catalog/shapes/module_names.toml``) get it as one
    ``qkv_proj`` of ``q_dim + 2 kv_dim`` outputs, as their modeling files build it."""
    hidden, head_dim, bias = model.hidden_size, model.head_dim, model.attention_bias
    q_dim, kv_dim = model.heads * head_dim, model.kv_heads * head_dim
    if model.kv_lora_rank and not prefix:
        return _latent_attention_linears(model)
    out = _linear(model, f"{prefix}o_proj", q_dim, hidden, bias=_mlp_bias(model))
    if not prefix and scheme(model.module_names).fused_qkv:
        return [_linear(model, "qkv_proj", hidden, q_dim + 2 * kv_dim, bias=bias), out]
    return [
        _linear(model, f"{prefix}q_proj", hidden, q_dim, bias=bias),
        _linear(model, f"{prefix}k_proj", hidden, kv_dim, bias=bias),
        _linear(model, f"{prefix}v_proj", hidden, kv_dim, bias=bias),
        out,
    ]


def _latent_attention_linears(model: ModelSpec) -> list[LinearShape]:
    """Multi-head latent attention (``DeepseekV2Attention``, ``modeling_deepseek_v2.py``; the same
    in ``modeling_deepseek_v3.py``; DeepSeek-V2 paper, arXiv:2405.04434, section 2.1): the query
    through ``q_proj`` (``q_lora_rank`` null) or ``q_a_proj`` -> ``q_a_layernorm`` -> ``q_b_proj``;
    keys and values from ``kv_a_proj_with_mqa`` (the latent plus the shared rotary key),
    ``kv_a_layernorm`` and ``kv_b_proj`` (per head: the key's nope part and the value); ``o_proj``
    over the values. ``attention_bias`` puts biases on q_a, kv_a and o only."""
    hidden, heads, bias = model.hidden_size, model.heads, model.attention_bias
    q_out = heads * model.head_dim
    nope = model.head_dim - model.qk_rope_head_dim
    if model.q_lora_rank:
        query = [
            LinearShape("q_a_proj", hidden, model.q_lora_rank, bias=bias),
            LinearShape("q_b_proj", model.q_lora_rank, q_out),
        ]
    else:
        query = [LinearShape("q_proj", hidden, q_out)]
    latent = model.kv_lora_rank
    return [
        *query,
        LinearShape("kv_a_proj_with_mqa", hidden, latent + model.qk_rope_head_dim, bias=bias),
        LinearShape("kv_b_proj", latent, heads * (nope + model.v_head_dim)),
        LinearShape("o_proj", heads * model.v_head_dim, hidden, bias=bias),
    ]


def _shared_linears(model: ModelSpec) -> list[LinearShape]:
    """A MoE's shared expert: one gated MLP every token goes through (``Qwen2MoeSparseMoeBlock``'s
    ``shared_expert`` in ``modeling_qwen2_moe.py``; ``DeepseekV2Moe``'s ``shared_experts``, of
    ``n_shared_experts x moe_intermediate_size``, in ``modeling_deepseek_v2.py``), and Qwen's
    ``shared_expert_gate``, a linear of hidden -> 1 whose sigmoid scales its output."""
    if model.experts <= 1 or not model.shared_expert_intermediate_size:
        return []
    shared = _gated_mlp(
        model.hidden_size, model.shared_expert_intermediate_size, 1, False, SHARED_PREFIX
    )
    if model.shared_expert_gate:
        shared.append(LinearShape("shared_expert_gate", model.hidden_size, 1))
    return shared


def _mlp_linears(model: ModelSpec) -> list[LinearShape]:
    """One block's MLP, once per expert: gate, up and down (gated; gate and up as one
    ``gate_up_proj`` where the family fuses them, Phi-3's ``modeling_phi3.py``) or fc1 and fc2
    (plain)."""
    hidden, inter, experts = model.hidden_size, model.intermediate_size, model.experts
    if model.mlp == "gated":
        bias = bool(model.mlp_bias)
        down = _linear(model, "down_proj", inter, hidden, copies=experts, bias=bias)
        if scheme(model.module_names).fused_gate_up:
            return [
                _linear(model, "gate_up_proj", hidden, 2 * inter, copies=experts, bias=bias),
                down,
            ]
        return [
            _linear(model, "gate_proj", hidden, inter, copies=experts, bias=bias),
            _linear(model, "up_proj", hidden, inter, copies=experts, bias=bias),
            down,
        ]
    return [
        _linear(model, "fc1", hidden, inter, copies=experts, bias=_mlp_bias(model)),
        _linear(model, "fc2", inter, hidden, copies=experts, bias=_mlp_bias(model)),
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


def module_short_names(arch: Architecture) -> list[str]:
    """The last component of each block linear's module name (``c_attn``, ``c_proj``, ``c_fc``),
    in block order, each once: the names a PEFT target list uses."""
    return list(dict.fromkeys(linear.path.rsplit(".", 1)[-1] for linear in arch.linears))


def resolve_lora_targets(arch: Architecture, targets: tuple[str, ...]) -> tuple[LinearShape, ...]:
    """The block's linear layers LoRA adapts, matched by module name as PEFT matches
    ``target_modules`` (a name selects every module whose dotted name is it or ends with
    ``"." + name``: ``c_proj`` both of GPT-2's, ``mlp.c_proj`` the MLP's). ``all-linear`` means all
    of them. The family's aliases (``catalog/shapes/module_names.toml``) select their role.

    Raises ``ValueError`` naming a module the model does not have, and the modules it has.
    """
    candidates = lora_candidates(arch)
    if any(target == ALL_LINEAR for target in targets):
        return candidates
    names = scheme(arch.module_names)
    aliases = dict(names.aliases)
    chosen: dict[str, LinearShape] = {}
    outside = resolve_top_level(arch, targets, strict=False)
    for target in targets:
        if any(
            matches(target, names.embedding if part == EMBEDDING else names.lm_head)
            for part in outside
        ):
            continue  # the embedding or the LM head: resolve_top_level's
        role = aliases.get(target)
        # DeepSeek calls its shared expert ``shared_experts``, Qwen MoE ``shared_expert``: one
        # layout name for both
        wanted = (
            SHARED_PREFIX + target.removeprefix(_SHARED_ALIAS)
            if target.startswith(_SHARED_ALIAS)
            else target
        )
        found = [
            linear
            for linear in candidates
            if matches(wanted, linear.path) or (role is not None and linear.name == role)
        ]
        if not found:
            known = ", ".join([*module_short_names(arch), ALL_LINEAR])
            raise ValueError(f"the model has no module '{target}' (its linear modules: {known})")
        for linear in found:
            chosen[linear.name] = linear
    if not chosen:
        raise ValueError(
            "LoRA on the embedding or the LM head alone is not counted: add the block modules "
            f"({', '.join(module_short_names(arch))}) or all-linear"
        )
    # in block order, whatever order the targets were given in
    return tuple(linear for linear in candidates if linear.name in chosen)


#: The two modules outside the blocks that PEFT can adapt or train in full (``modules_to_save``).
EMBEDDING = "embedding"
LM_HEAD = "lm_head"


def resolve_top_level(
    arch: Architecture, names: tuple[str, ...], *, strict: bool = True
) -> tuple[str, ...]:
    """Which of the token embedding (:data:`EMBEDDING`) and the output layer (:data:`LM_HEAD`)
    ``names`` select, by the family's module names (``embed_tokens``/``lm_head``; GPT-2's ``wte``,
    GPT-NeoX's ``embed_in``, BLOOM's ``word_embeddings``, T5's ``shared``), matched as PEFT matches
    them. ``strict``: any other name is a ``ValueError`` naming the two (PEFT's
    ``modules_to_save`` may name other modules, such as a classifier head; only these two are
    counted)."""
    family = scheme(arch.module_names)
    found: list[str] = []
    for name in names:
        hit = False
        for part, module in ((EMBEDDING, family.embedding), (LM_HEAD, family.lm_head)):
            if matches(name, module):
                hit = True
                if part not in found:
                    found.append(part)
        if strict and not hit:
            raise ValueError(
                f"'{name}' is not a module hwdash counts trained in full (it counts the "
                f"model's {family.embedding} and {family.lm_head})"
            )
    return tuple(part for part in (EMBEDDING, LM_HEAD) if part in found)


def top_level_params(arch: Architecture, part: str) -> int:
    """Parameters of the token embedding or the output layer as one matrix of vocab x hidden
    (tied or not: PEFT's ``modules_to_save`` deep-copies each module it wraps, so a tied head gets
    a copy of its own; traced, peft 0.21 ``ModulesToSaveWrapper.update``)."""
    return arch.vocab * arch.hidden


def top_level_adapter_params(arch: Architecture, parts: tuple[str, ...], rank: int) -> int:
    """LoRA on the embedding (PEFT's ``lora.Embedding``: ``lora_embedding_A`` of r x vocab,
    looked up, and ``lora_embedding_B`` of hidden x r) or on the LM head (a Linear: A of r x hidden,
    B of vocab x r): r (vocab + hidden) each (peft/tuners/lora/layer.py, ``Embedding.update_layer``)."""
    return len(parts) * rank * (arch.vocab + arch.hidden)


def lora_candidates(arch: Architecture) -> tuple[LinearShape, ...]:
    """The block linears PEFT (0.21) can adapt, all of them for a dense model. A MoE's routed
    experts are 3-D parameters, not ``nn.Linear``: PEFT's ``transformers_weight_conversion.py``
    maps the MLP projection names (``all-linear`` included) onto them for the model types it knows
    (Mixtral, Qwen3 MoE, DeepSeek-V2/V3), and the names then no longer reach the shared expert's
    or a dense block's ``nn.Linear`` (traced: a DeepSeek-V2 LoRA on all-linear adapts the
    attention, the routed experts and the router, whose adapter :func:`lora_adapter_params`
    counts). For ``qwen2_moe`` it has no mapping: the routed
    experts stay frozen and the names reach the shared expert (``peft_fused_experts`` False)."""
    if arch.experts <= 1:
        return arch.linears
    if arch.peft_fused_experts:
        return tuple(
            linear for linear in arch.linears if linear.copies > 1 or not is_mlp(linear.name)
        )
    return tuple(linear for linear in arch.linears if linear.copies == 1)


def lora_adapter_params(
    arch: Architecture,
    targets: tuple[LinearShape, ...],
    rank: int,
    *,
    dora: bool = False,
    router: bool = False,
) -> int:
    """Adapter parameters: A (r x in) and B (out x r) per targeted matrix per layer, per expert.

    LoRA: Hu et al. 2021, arXiv:2106.09685, section 4. DoRA adds a magnitude vector of ``out``
    values per adapted matrix (Liu et al. 2024, arXiv:2402.09353, section 4.1).

    A MoE whose routed experts are fused 3-D parameters (``arch.peft_fused_experts``): PEFT 0.21
    (``_convert_peft_config_moe`` in ``peft/utils/transformers_weight_conversion.py``) adapts the
    stacked ``gate_up_proj`` once when both ``gate_proj`` and ``up_proj`` are targeted, at rank
    2r (its ``rank_pattern``): per expert 2r x (hidden + 2 x intermediate), where two rank-r
    adapters would take 2r x (hidden + intermediate). ``router``: ``all-linear`` also maps the
    router ``gate`` onto ``gate.weight`` (a ``lora.ParamWrapper`` of rank r over experts x hidden,
    one per MoE block). Both traced on DeepSeek-V2-Lite (transformers 5.24, PEFT 0.21).
    """
    moe_blocks = arch.layers - arch.dense_layers
    names = {linear.name for linear in targets if linear.copies > 1}
    fused_gate_up = arch.peft_fused_experts and {"gate_proj", "up_proj"} <= names
    total = 0
    for linear in targets:
        out = linear.out_features
        if fused_gate_up and linear.copies > 1 and linear.name in ("gate_proj", "up_proj"):
            # half of the fused 2r x (in + 2 out): r x (in + 2 out) for each of gate and up
            per_copy = rank * (linear.in_features + 2 * out)
        else:
            per_copy = rank * (linear.in_features + out)
        if dora:
            per_copy += out
        # routed and shared experts only in the MoE blocks (not DeepSeek's or Llama 4's dense ones)
        moe_only = linear.copies > 1 or linear.name.startswith(SHARED_PREFIX)
        blocks = moe_blocks if moe_only else arch.layers
        total += blocks * per_copy * linear.copies
    if router and arch.peft_fused_experts and arch.experts > 1:
        total += moe_blocks * rank * (arch.hidden + arch.experts)
    # the dense blocks' MLPs the same names reach (their attention is counted above)
    total += _dense_mlp_adapter_params(arch, targets, rank, dora)
    return total


def _dense_mlp_adapter_params(
    arch: Architecture, targets: tuple[LinearShape, ...], rank: int, dora: bool
) -> int:
    """Adapters on the MLPs of a MoE model's dense blocks that the adapted names reach
    (:func:`dense_block_adapted`: Llama 4's, where PEFT has no fused-expert mapping)."""
    if not arch.dense_layers:
        return 0
    names = {linear.name for linear in targets}
    total = 0
    for linear in dense_block_adapted(arch, arch.dense_block, names):
        if is_mlp(linear.name):
            per_copy = rank * (linear.in_features + linear.out_features)
            total += arch.dense_layers * (per_copy + (linear.out_features if dora else 0))
    return total


def dense_block_adapted(
    arch: Architecture, kind: Architecture, names: set[str]
) -> tuple[LinearShape, ...]:
    """The linears of a MoE model's dense block (``kind``) that the adapted ``names`` of its MoE
    block reach: the same names, but not the MLP's where PEFT maps the MLP names onto the fused
    experts (DeepSeek). Without that mapping (Llama 4: ``peft_fused_experts`` False) a name such
    as ``gate_proj`` reaches the dense MLP's ``gate_proj`` as it reaches the shared expert's
    (PEFT matches the end of the module path; traced on the tiny Llama 4: LoRA on gate, up and
    down adapts both)."""
    shared = {name.removeprefix(SHARED_PREFIX) for name in names if name.startswith(SHARED_PREFIX)}
    return tuple(
        linear
        for linear in kind.linears
        if (linear.name in names and not (arch.peft_fused_experts and is_mlp(linear.name)))
        or (not arch.peft_fused_experts and linear.name in shared)
    )
