"""Llama 4 (Scout, Maverick) from its ``config.json`` (``model_type`` ``llama4_text``, or ``llama4``
with ``text_config`` and ``vision_config``).

Read as transformers 5.24 builds it (``configuration_llama4.py``, ``modeling_llama4.py``):

* ``Llama4TextDecoderLayer``: Llama's attention (``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``,
  biases when ``attention_bias``) and two RMSNorms; its ``feed_forward`` is a ``Llama4TextMoe`` on
  the layers listed in ``moe_layers`` (default: every ``interleave_moe_layer_step``-th layer,
  counting from ``step - 1``) and a dense gated MLP of ``intermediate_size_mlp`` on the others;
* ``Llama4TextMoe``: ``num_local_experts`` experts of ``intermediate_size`` held as two 3-D
  parameters (``Llama4TextExperts.gate_up_proj``, ``down_proj``), a router (``Llama4Router``, an
  ``nn.Linear`` of hidden -> experts without bias, sigmoid of the top ``num_experts_per_tok``
  logits) and a ``shared_expert``, a gated MLP of ``intermediate_size`` every token goes through.
  Its forward repeats every token once per expert (``hidden_states.repeat(num_experts, 1)``),
  scales each copy by its router score (0 outside the top-k) and runs all experts on all copies
  with ``torch.bmm``: in training every expert's intermediate tensors are kept for every token;
* ``use_qk_norm``: ``Llama4TextL2Norm`` (an RMS normalisation without a weight, in fp32) on Q and
  K after RoPE, only on the RoPE layers;
* iRoPE: ``no_rope_layers`` (1 = RoPE, default: every ``no_rope_layer_interval``-th layer is
  NoPE); the RoPE layers attend within chunks of ``attention_chunk_size`` tokens
  (``layer_types`` ``chunked_attention``), the NoPE layers over the whole sequence;
* ``llama4`` adds ``Llama4VisionModel`` and ``Llama4MultiModalProjector`` (:func:`_vision`).

Dimension keys default as ``Llama4TextConfig`` / ``Llama4VisionConfig`` default them, except the
five that size the model (hidden_size, num_hidden_layers, num_attention_heads,
intermediate_size, vocab_size), which a config must state.
"""

from __future__ import annotations

from typing import Any

from hwdash.core.models import family_vision, windows
from hwdash.core.models.fields import FLAG, _activation, _bool, _int, _shown
from hwdash.core.specs import VisionSpec
from hwdash.errors import UsageError

#: ``Llama4TextConfig`` defaults (configuration_llama4.py, transformers 5.24) of the keys a config
#: may leave out.
_TEXT_DEFAULTS = {
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size_mlp": 16384,
    "num_local_experts": 16,
    "num_experts_per_tok": 1,
    "interleave_moe_layer_step": 1,
    "no_rope_layer_interval": 4,
    "max_position_embeddings": 4096 * 32,
}

#: ``Llama4VisionConfig`` defaults (configuration_llama4.py).
_VISION_DEFAULTS = {
    "hidden_size": 768,
    "intermediate_size": 5632,
    "num_hidden_layers": 34,
    "num_attention_heads": 16,
    "num_channels": 3,
    "image_size": 448,
    "patch_size": 14,
    "projector_input_dim": 4096,
    "projector_output_dim": 4096,
    "vision_output_dim": 7680,
}

#: ``Llama4ImageProcessor.max_patches`` (image_processing_llama4.py): an image is cut into at most
#: 16 tiles of ``image_size``; with more than one, a resized whole image is added
#: (``Llama4Processor._prompt_split_image``, processing_llama4.py).
MAX_TILES = 16


#: PEFT 0.21's ``all-linear`` wraps every ``nn.Linear`` but the output layer
#: (``_maybe_include_all_linear_layers``, peft/tuners/tuners_utils.py), ``Llama4Router`` included,
#: whose forward returns a tuple that ``lora.Linear.forward`` cannot take (AttributeError, seen in
#: a trace of the tiny config): LoRA on Llama 4 names its modules.
PEFT_NOTE = (
    "LoRA: name the modules (q_proj, v_proj, gate_proj...): PEFT's all-linear also wraps the "
    "MoE router, whose tuple output PEFT 0.21 cannot take"
)


def _layer_list(fields: dict[str, Any], key: str, layers: int, source: str) -> list[int] | None:
    """A list of whole numbers (``moe_layers``, ``no_rope_layers``); None when absent or empty
    (transformers then derives it)."""
    value = fields.get(key)
    if value is None or value == []:
        return None
    if not isinstance(value, list) or not all(
        type(item) is int and 0 <= item < 1_000_000 for item in value
    ):
        raise UsageError(
            f"{source}: '{key}' must be a list of whole numbers, got {_shown(value)}", flag=FLAG
        )
    return value


def moe_layers(fields: dict[str, Any], layers: int, source: str) -> tuple[int, ...]:
    """The layers whose feed-forward is a ``Llama4TextMoe``: those of ``moe_layers`` below the
    depth, else every ``interleave_moe_layer_step``-th from ``step - 1``
    (``Llama4TextConfig.__post_init__``)."""
    listed = _layer_list(fields, "moe_layers", layers, source)
    if listed is not None or fields.get("moe_layers") == []:
        return tuple(sorted({index for index in listed or [] if index < layers}))
    step = _int(fields, ("interleave_moe_layer_step",), source, default=1)
    return tuple(range(step - 1, layers, step))


def rope_layers(fields: dict[str, Any], layers: int, source: str) -> list[bool]:
    """Per layer, whether it applies RoPE (``no_rope_layers``: 1 = RoPE; absent or empty: every
    ``no_rope_layer_interval``-th layer is NoPE, ``Llama4TextConfig.__post_init__``)."""
    listed = _layer_list(fields, "no_rope_layers", layers, source)
    if listed is not None:
        if len(listed) < layers:
            raise UsageError(
                f"{source}: 'no_rope_layers' has {len(listed)} entries for {layers} layers",
                flag=FLAG,
            )
        return [bool(flag) for flag in listed[:layers]]
    interval = _int(fields, ("no_rope_layer_interval",), source, default=4)
    return [(index + 1) % interval != 0 for index in range(layers)]


def _experts(experts: int, per_token: int, source: str) -> tuple[int, int]:
    """``num_local_experts`` (at least 2) and ``num_experts_per_tok`` (at most those)."""
    if experts < 2:
        raise UsageError(
            f"{source}: 'num_local_experts' must be at least 2 (Llama 4's MoE blocks), got {experts}",
            flag=FLAG,
        )
    if per_token > experts:
        raise UsageError(
            f"{source}: 'num_experts_per_tok' ({per_token}) is more than the {experts} experts",
            flag=FLAG,
        )
    return experts, per_token


def llama4(fields: dict[str, Any], source: str) -> dict[str, Any]:
    """The ModelSpec fields of a ``llama4_text`` config (or a ``llama4`` one: its ``text_config``
    merged over it, the vision tower from ``vision_config``)."""

    def whole(key: str) -> int:
        return _int(fields, (key,), source, default=_TEXT_DEFAULTS.get(key))

    layers, hidden = whole("num_hidden_layers"), whole("hidden_size")
    experts, per_token = _experts(whole("num_local_experts"), whole("num_experts_per_tok"), source)
    moe = moe_layers(fields, layers, source)
    # the chunked layers as hwdash.core.models.windows reads every family's windows
    window = windows.chunked_layout(fields, layers, source)
    rope = rope_layers(fields, layers, source)
    expert_width, dense_width = whole("intermediate_size"), whole("intermediate_size_mlp")
    layout: dict[str, Any] = {
        "layers": layers,
        "hidden_size": hidden,
        "heads": whole("num_attention_heads"),
        "kv_heads": whole("num_key_value_heads"),
        "head_dim": whole("head_dim"),
        "vocab_size": whole("vocab_size"),
        "max_context": whole("max_position_embeddings"),
        "tied_embeddings": _bool(fields, "tie_word_embeddings", source, False),
        "attention_bias": _bool(fields, "attention_bias", source, False),
        "mlp_activation": _activation(fields, ("hidden_act",), "silu"),
        # Llama4TextL2Norm: no weight; on the RoPE layers only
        "qk_norm": _bool(fields, "use_qk_norm", source, True) and any(rope),
        "notes": _notes(rope, window["attention_chunk_size"], bool(moe)),
        **window,
        "nope_layers": tuple(index for index, uses_rope in enumerate(rope) if not uses_rope),
        "qk_norm_weight": False,
        "hf_config": transformers_text_config(fields),
    }
    if "text_config" in fields or "vision_config" in fields:
        # llama4: Llama4ForConditionalGeneration always builds the vision model
        layout["vision"] = read_vision(fields, hidden, source)
    if not moe:  # every block dense: no MoE at all
        return {**layout, "intermediate_size": dense_width}
    return {
        **layout,
        "intermediate_size": expert_width,
        "experts": experts,
        "experts_per_token": per_token,
        # Llama4TextMoe.shared_expert: Llama4TextMLP(config), intermediate_size wide
        "shared_expert_intermediate_size": expert_width,
        "dense_mlp_layers": layers - len(moe),
        "dense_intermediate_size": dense_width if layers > len(moe) else 0,
        "moe_layer_indices": moe,
        "experts_every_token": True,
        # transformers 5.24 has no weight conversion for llama4 and PEFT 0.21 none either
        # (peft/utils/transformers_weight_conversion.py): the experts' 3-D parameters are no
        # nn.Linear, so LoRA names reach the shared expert and the dense MLPs only
        "peft_fused_experts": False,
    }


def _notes(rope: list[bool], chunk: int, moe: bool) -> str:
    """The iRoPE layout in words (which layers attend in chunks, which over everything) and, for
    a MoE, :data:`PEFT_NOTE`."""
    notes = [PEFT_NOTE] if moe else []
    nope = [index for index, uses_rope in enumerate(rope) if not uses_rope]
    if chunk and nope:
        shown = ", ".join(str(index) for index in nope[:4]) + (", ..." if len(nope) > 4 else "")
        notes.insert(
            0,
            f"iRoPE: {len(rope) - len(nope)} RoPE layers attend within chunks of {chunk:,} "
            f"tokens (attention_chunk_size), {len(nope)} NoPE layers ({shown}; no_rope_layers) "
            "over the whole sequence",
        )
    return "; ".join(notes)


def _vision_int(vision: dict[str, Any], key: str, where: str) -> int:
    return _int(vision, (key,), where, default=_VISION_DEFAULTS.get(key))


def _tile_tokens(vision: dict[str, Any], image: int, patch: int, where: str) -> tuple[int, int]:
    """(patches, image tokens) of one tile: ``(image_size / patch_size)^2`` patches, shuffled to
    ``pixel_shuffle_ratio^2`` as many tokens (``pixel_shuffle``, modeling_llama4.py)."""
    ratio = vision.get("pixel_shuffle_ratio", 0.5)
    if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not 0 < ratio <= 1:
        raise UsageError(
            f"{where}: 'pixel_shuffle_ratio' must be a number above 0 and at most 1, got "
            f"{_shown(ratio)}",
            flag=FLAG,
        )
    grid = (image // patch) ** 2
    tokens = int(grid * ratio * ratio)
    if patch > image or not 0 < grid <= family_vision.MAX_PATCHES or tokens < 1:
        raise UsageError(
            f"{where}: 'image_size' / 'patch_size' ({image} / {patch}) with pixel_shuffle_ratio "
            f"{ratio} gives no image tokens to count",
            flag=FLAG,
        )
    return grid, tokens


def read_vision(config: dict[str, Any], text_hidden: int, source: str) -> VisionSpec:
    """``Llama4VisionModel`` and ``Llama4MultiModalProjector`` (modeling_llama4.py), counted from
    ``vision_config`` (``Llama4VisionConfig`` defaults for what it leaves out):

    * ``patch_embedding``: an ``nn.Unfold`` of ``patch_size`` and a Linear without bias from
      ``num_channels x patch_size^2`` to the width; a ``class_embedding`` and a learned
      ``positional_embedding_vlm`` for every patch and the class token; ``layernorm_pre`` and
      ``layernorm_post`` (LayerNorms with bias);
    * ``num_hidden_layers`` ``Llama4VisionEncoderLayer``: q, k, v, o with biases, a GELU MLP
      ``fc1``/``fc2`` with biases, two LayerNorms, the layout of a CLIP layer
      (:func:`~hwdash.core.models.family_vision._vit_layer_params`), with 2-D rotary positions
      (no parameters);
    * ``vision_adapter``: the class token dropped, ``pixel_shuffle`` folds each
      ``1 / pixel_shuffle_ratio^2`` neighbouring patches into one row, then ``fc1`` (from
      ``intermediate_size`` to ``projector_input_dim``), GELU, ``fc2`` (``projector_output_dim``
      square), GELU, all without bias; ``multi_modal_projector.linear_1``: ``vision_output_dim``
      to the text width, without bias.

    Each tile of ``image_size`` px gives ``(image_size / patch_size)^2 x ratio^2`` image tokens
    (144 for 336 px, 14 px patches, ratio 0.5); an image takes up to :data:`MAX_TILES` tiles and
    a whole-image tile, the default image tokens. Saved activations per tower token as a CLIP
    layer's (:func:`~hwdash.core.models.family_vision._block_elements`: Korthikanti et al. 2022,
    arXiv:2205.05198, section 4.1), plus the unfolded patch and the two outer LayerNorms' inputs;
    per image token the adapter's fc1 input, fc1 and GELU outputs, fc2 and GELU outputs."""
    vision = config.get("vision_config") or {}
    if not isinstance(vision, dict):
        raise UsageError(f"{source}: 'vision_config' must be a table", flag=FLAG)
    where = f"{source}: vision_config"
    dims = {key: _vision_int(vision, key, where) for key in _VISION_DEFAULTS}
    hidden, intermediate = dims["hidden_size"], dims["intermediate_size"]
    layers, image, patch = dims["num_hidden_layers"], dims["image_size"], dims["patch_size"]
    grid, tokens = _tile_tokens(vision, image, patch, where)
    pixels = dims["num_channels"] * patch * patch  # one unfolded patch
    params = pixels * hidden + hidden + (grid + 1) * hidden + 4 * hidden
    params += layers * family_vision._vit_layer_params(hidden, intermediate)
    params += intermediate * dims["projector_input_dim"] + dims["projector_output_dim"] ** 2
    params += dims["vision_output_dim"] * text_hidden
    per_tower = pixels + 2 * hidden
    per_tower += layers * family_vision._block_elements(hidden, intermediate, "gelu")
    tower_ratio = (grid + 1) / tokens
    saved = tower_ratio * per_tower + intermediate
    saved += 2 * dims["projector_input_dim"] + 2 * dims["projector_output_dim"]
    working = tower_ratio * family_vision._block_working(hidden, intermediate, False)
    return VisionSpec(
        family="llama4",
        params=params,
        image_tokens=tokens * (MAX_TILES + 1),
        tower_tokens_per_image_token=tower_ratio,
        saved_elements_per_image_token=round(saved),
        working_elements_per_image_token=round(working),
        summary=(
            f"vision tower {layers} layers of {hidden} (MLP {intermediate}), {image} px tiles "
            f"of {grid} patches shuffled to {tokens} tokens, up to {MAX_TILES} tiles and a "
            f"whole-image tile, projected to {text_hidden}"
        ),
    )


def transformers_text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The fields transformers builds Llama 4's language model (``Llama4ForCausalLM``) from, for
    the tracer: a ``llama4`` config's ``text_config`` over its own keys, without the sub-configs.
    The published configs say ``"attn_temperature_tuning": 4`` (read as true by ``if
    self.attn_temperature_tuning`` in ``Llama4TextAttention.forward``), which transformers 5.24's
    strict ``Llama4TextConfig`` refuses as not a bool: it is passed as the truth value it has."""
    text = config.get("text_config")
    fields = {k: v for k, v in config.items() if k not in ("text_config", "vision_config")}
    fields.update(text if isinstance(text, dict) else {})
    tuning = fields.get("attn_temperature_tuning")
    if isinstance(tuning, int | float) and not isinstance(tuning, bool):
        fields["attn_temperature_tuning"] = bool(tuning)
    return {**fields, "model_type": "llama4_text"}
