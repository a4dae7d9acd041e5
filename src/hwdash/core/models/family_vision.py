"""Vision towers and projectors of vision-language models, read from their ``config.json``.

A vision-language model is a language model (read as its text family by
:mod:`hwdash.core.models.config`) plus a vision encoder whose output a projector maps to the
language model's width; the projected image tokens then take the place of the image placeholders
in the language model's sequence. This module reads the encoder and projector of four families and
counts, from their dimensions, what the estimator needs (:class:`~hwdash.core.specs.VisionSpec`):

* ``qwen2_5_vl`` (``configuration_qwen2_5_vl.py``, ``modeling_qwen2_5_vl.py``): ``vision_config``
  ``depth`` blocks of ``hidden_size`` (``Qwen2_5_VLVisionBlock``: two RMSNorms ``norm1``/``norm2``
  of ``hidden`` weights, a fused ``attn.qkv`` of hidden -> 3 hidden and ``attn.proj``, both with
  biases, and a gated SiLU MLP ``gate_proj``/``up_proj``/``down_proj`` of ``intermediate_size``
  with biases); ``patch_embed.proj``, a Conv3d without bias of ``in_channels x temporal_patch_size
  x patch_size^2`` inputs; the ``merger`` (``Qwen2_5_VLPatchMerger``): an RMSNorm ``ln_q`` of
  ``hidden``, then ``spatial_merge_size^2`` neighbouring patches concatenated into one row of
  ``hidden * merge^2``, a Linear to the same width, GELU, and a Linear to ``out_hidden_size``, all
  with biases. Each image token is ``merge^2`` patches. Dynamic resolution: the image tokens per
  image depend on the image's size, so ``--image-tokens`` must be given.
* ``gemma3`` with ``vision_config`` (``configuration_gemma3.py``, ``modeling_gemma3.py``): a SigLIP
  encoder (``modeling_siglip.py``) and ``Gemma3MultiModalProjector``: average pooling of the
  ``(image_size / patch_size)^2`` patches down to ``mm_tokens_per_image`` tokens, an RMSNorm
  ``mm_soft_emb_norm`` of the vision width and one weight ``mm_input_projection_weight`` of vision
  x text width (no bias).
* ``llava`` (``configuration_llava.py``, ``modeling_llava.py``): a CLIP encoder
  (``modeling_clip.py``) and ``LlavaMultiModalProjector``: ``linear_1`` vision -> text width, the
  ``projector_hidden_act``, ``linear_2`` text -> text, with biases when
  ``multimodal_projector_bias`` (default true). ``image_seq_length`` (576 for 336 px / 14 px
  patches, CLS dropped by the default ``vision_feature_select_strategy``) tokens per image.
* ``llava_next`` (``configuration_llava_next.py``, ``modeling_llava_next.py``): LLaVA's layout plus
  an ``image_newline`` vector of the text width; "anyres" cuts an image into tiles of
  ``image_size`` by the best of ``image_grid_pinpoints`` plus one resized whole image, each tile
  through the encoder. Its default image tokens are the most any pinpoint gives (all tiles and the
  base image at ``(image_size / patch_size)^2`` each; the unpadding makes real images a little less).

SigLIP and CLIP encoder layers (``SiglipEncoderLayer``, ``CLIPEncoderLayer``): ``layer_norm1``,
``self_attn`` (``q_proj``, ``k_proj``, ``v_proj``, ``out_proj``, all with biases), ``layer_norm2``,
``mlp`` (``fc1``, ``fc2`` with biases); LayerNorms with weight and bias. Embeddings: a Conv2d patch
embedding with bias (CLIP: without, plus a ``class_embedding``) and a learned position per patch
(CLIP: plus one for the class token); CLIP adds ``pre_layrnorm``, both a ``post_layernorm``;
SigLIP's attention-pooling ``head`` (``vision_use_head``: a probe, a torch MultiheadAttention, a
LayerNorm and an MLP) is counted where the config keeps it.

Saved activations of the tower in training (:func:`_block_elements`,
:func:`_qwen_block_elements`) follow Korthikanti et al.
2022, "Reducing Activation Recomputation in Large Transformer Models" (arXiv:2205.05198, section
4.1): per token and block, the two norms' inputs, the attention's input, Q, K and V and its output
(no s^2 scores with SDPA or flash attention, no dropout masks), and the MLP's input and its
intermediate tensors (a plain MLP: the first linear's output and the activation's; a gated one: gate,
up, the activated gate and the product).
"""

from __future__ import annotations

from typing import Any

from hwdash.core.models.fields import FLAG, _bool, _int, _shown
from hwdash.core.specs import VisionSpec
from hwdash.errors import UsageError

#: Vision-language ``model_type`` values this module reads (the outer type of the config).
VISION_FAMILIES = ("qwen2_5_vl", "gemma3", "llava", "llava_next")

#: Config-class defaults of each encoder's keys when ``vision_config`` leaves them out:
#: ``Qwen2_5_VLVisionConfig`` (configuration_qwen2_5_vl.py), ``SiglipVisionConfig``
#: (configuration_siglip.py; what ``Gemma3Config`` builds), ``CLIPVisionConfig``
#: (configuration_clip.py). ``LlavaConfig`` without a ``vision_config`` builds CLIP-L/14 at 336 px
#: (configuration_llava.py), kept as the ``llava`` defaults.
_VISION_DEFAULTS: dict[str, dict[str, int]] = {
    "qwen2_5_vl": {
        "depth": 32,
        "hidden_size": 3584,
        "intermediate_size": 3420,
        "num_heads": 16,
        "in_channels": 3,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "out_hidden_size": 3584,
    },
    "siglip": {
        "hidden_size": 768,
        "intermediate_size": 3072,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "num_channels": 3,
        "image_size": 224,
        "patch_size": 16,
    },
    "clip": {
        "hidden_size": 768,
        "intermediate_size": 3072,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "num_channels": 3,
        "image_size": 224,
        "patch_size": 32,
    },
    "clip_llava": {
        "hidden_size": 1024,
        "intermediate_size": 4096,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "num_channels": 3,
        "image_size": 336,
        "patch_size": 14,
    },
}

#: Patches per image tile past any real encoder (Gemma 3's SigLIP: 4096 at 896 px), so a hostile
#: config cannot make the counts overflow.
MAX_PATCHES = 10_000_000
#: ``Gemma3Config.mm_tokens_per_image`` default (configuration_gemma3.py).
GEMMA3_TOKENS_PER_IMAGE = 256


def _vision_int(vision: dict[str, Any], key: str, defaults: dict[str, int], where: str) -> int:
    return _int(vision, (key,), where, default=defaults.get(key))


def _block_elements(hidden: int, intermediate: int, activation: str) -> int:
    """Elements a CLIP or SigLIP encoder layer keeps per token for backward (module docstring:
    Korthikanti et al. 2022, section 4.1, without dropout or s^2 scores): norm inputs 2h,
    attention input, Q, K, V and output 5h, the MLP's input h and its intermediates: fc1's output
    and the activation's (2 x intermediate), and with CLIP's ``quick_gelu`` (x * sigmoid(1.702 x),
    three ops, activations.py) the sigmoid's output too (3 x). Traced per layer within 0.2% for
    SigLIP (Gemma 3's) and CLIP-L/336 (LLaVA's) by bench/vlm_tower_trace.py's method."""
    return 8 * hidden + (3 if activation == "quick_gelu" else 2) * intermediate


def _qwen_block_elements(hidden: int, intermediate: int) -> int:
    """Elements a ``Qwen2_5_VLVisionBlock`` keeps per patch for backward, at the activations'
    element size (fp32 tensors count twice), as traced by ``bench/vlm_tower_trace.py`` (within
    0.2% per block at Qwen2.5-VL-3B's widths): each RMSNorm (``Qwen2RMSNorm``, normalising in
    fp32) its fp32 input copy (2 h), the normalised 16-bit tensor and its output (4 h per norm);
    the fused ``qkv`` output, kept whole because V is a view of it (3 h), the rotary Q and K (2 h),
    the per-window SDPA outputs and their concatenation (2 h); the gated MLP's gate, up, activated
    gate and product (4 x intermediate)."""
    return 15 * hidden + 4 * intermediate


def _block_working(hidden: int, intermediate: int, gated: bool) -> int:
    """Elements per token of one block's forward without grad (inference): its input, Q, K, V,
    the attention output, and the MLP's intermediates at once (the largest set alive together)."""
    return 5 * hidden + (3 if gated else 2) * intermediate


def _vit_layer_params(hidden: int, intermediate: int) -> int:
    """A CLIP/SigLIP encoder layer: q, k, v, out (4 h^2 + 4 h), fc1 and fc2 (2 h m + m + h), two
    LayerNorms with bias (4 h)."""
    return 4 * hidden * hidden + 4 * hidden + 2 * hidden * intermediate + intermediate + 5 * hidden


def read_vision(
    config: dict[str, Any], model_type: str, text_hidden: int, source: str
) -> VisionSpec:
    """The vision tower and projector of a ``model_type`` of :data:`VISION_FAMILIES`."""
    vision = config.get("vision_config") or {}
    if not isinstance(vision, dict):
        raise UsageError(f"{source}: 'vision_config' must be a table", flag=FLAG)
    where = f"{source}: vision_config"
    if model_type == "qwen2_5_vl":
        return _qwen2_5_vl(vision, text_hidden, where)
    if model_type == "gemma3":
        return _gemma3(config, vision, text_hidden, source, where)
    return _llava(config, vision, model_type, text_hidden, source, where)


def _qwen2_5_vl(vision: dict[str, Any], text_hidden: int, where: str) -> VisionSpec:
    d = _VISION_DEFAULTS["qwen2_5_vl"]
    depth = _vision_int(vision, "depth", d, where)
    hidden = _vision_int(vision, "hidden_size", d, where)
    intermediate = _vision_int(vision, "intermediate_size", d, where)
    channels = _vision_int(vision, "in_channels", d, where)
    patch = _vision_int(vision, "patch_size", d, where)
    temporal = _vision_int(vision, "temporal_patch_size", d, where)
    merge = _vision_int(vision, "spatial_merge_size", d, where)
    out = _vision_int(vision, "out_hidden_size", d, where)
    if out != text_hidden:
        raise UsageError(
            f"{where}: 'out_hidden_size' ({out}) must be the language model's hidden_size "
            f"({text_hidden}): the merger's output replaces the image tokens' embeddings",
            flag=FLAG,
        )
    pixels = channels * temporal * patch * patch  # one patch's inputs to the Conv3d
    # Qwen2_5_VLVisionBlock: norm1, norm2 (RMSNorm weights), qkv and proj with biases, gated MLP
    # with biases (modeling_qwen2_5_vl.py)
    block = 2 * hidden + (3 * hidden * hidden + 3 * hidden) + (hidden * hidden + hidden)
    block += 3 * hidden * intermediate + 2 * intermediate + hidden
    merged = hidden * merge * merge
    merger = hidden + (merged * merged + merged) + (merged * out + out)
    patches = merge * merge  # patches per image token
    head_dim = hidden // _vision_int(vision, "num_heads", d, where)
    # per image token: the Conv3d's input, every block's saved tensors over its patches
    # (_qwen_block_elements), the rotary tables (fp32 cos and sin of head_dim per patch, shared by
    # the blocks) and the merger's: ln_q as a block's norm (4 h per patch), the first linear's
    # output and GELU's (2 x merged per image token)
    per_patch = pixels + depth * _qwen_block_elements(hidden, intermediate) + 4 * head_dim
    saved = patches * (per_patch + 4 * hidden) + 2 * merged
    return VisionSpec(
        family="qwen2_5_vl",
        params=pixels * hidden + depth * block + merger,
        image_tokens=0,
        tower_tokens_per_image_token=patches,
        saved_elements_per_image_token=saved,
        working_elements_per_image_token=patches * _block_working(hidden, intermediate, True),
        summary=(
            f"vision tower {depth} blocks of {hidden} (MLP {intermediate}), "
            f"{merge}x{merge} patch merger to {out}"
        ),
    )


def _encoder(
    vision: dict[str, Any], defaults: dict[str, int], where: str, *, clip: bool
) -> tuple[int, int, int, int, int, int, int]:
    """(params, hidden, intermediate, layers, patches per tile, image size, saved elements per
    tower token in training) of a CLIP or SigLIP encoder (module docstring)."""
    hidden = _vision_int(vision, "hidden_size", defaults, where)
    intermediate = _vision_int(vision, "intermediate_size", defaults, where)
    layers = _vision_int(vision, "num_hidden_layers", defaults, where)
    channels = _vision_int(vision, "num_channels", defaults, where)
    image = _vision_int(vision, "image_size", defaults, where)
    patch = _vision_int(vision, "patch_size", defaults, where)
    if patch > image:
        raise UsageError(
            f"{where}: 'patch_size' ({patch}) is larger than 'image_size' ({image})", flag=FLAG
        )
    grid = (image // patch) ** 2
    if grid > MAX_PATCHES:
        raise UsageError(
            f"{where}: 'image_size' / 'patch_size' ({image} / {patch}) makes {grid:,} patches "
            f"per image (at most {MAX_PATCHES:,} are counted)",
            flag=FLAG,
        )
    positions = grid + 1 if clip else grid
    embeddings = channels * patch * patch * hidden + positions * hidden
    # CLIP: class_embedding and pre_layrnorm, no conv bias; SigLIP: the conv's bias
    embeddings += hidden + 2 * hidden if clip else hidden
    params = embeddings + layers * _vit_layer_params(hidden, intermediate) + 2 * hidden
    if not clip and _bool(vision, "vision_use_head", where, True):
        # SiglipMultiheadAttentionPoolingHead: probe, MultiheadAttention (in_proj 3h^2 + 3h,
        # out_proj h^2 + h), LayerNorm, MLP
        params += hidden + 4 * hidden * hidden + 4 * hidden + 2 * hidden
        params += 2 * hidden * intermediate + intermediate + hidden
    activation = vision.get("hidden_act") or ("quick_gelu" if clip else "gelu_pytorch_tanh")
    # outside the layers: the patch Conv2d's input, and the LayerNorms' inputs (SigLIP's
    # post_layernorm; CLIP's pre_layrnorm and the embeddings' sum before it)
    saved = channels * patch * patch + (2 if clip else 1) * hidden
    saved += layers * _block_elements(hidden, intermediate, str(activation))
    return params, hidden, intermediate, layers, grid, image, saved


def _gemma3(
    config: dict[str, Any], vision: dict[str, Any], text_hidden: int, source: str, where: str
) -> VisionSpec:
    params, hidden, intermediate, layers, grid, _, per_patch = _encoder(
        vision, _VISION_DEFAULTS["siglip"], where, clip=False
    )
    tokens = _int(config, ("mm_tokens_per_image",), source, default=GEMMA3_TOKENS_PER_IMAGE)
    # (a config whose tower makes fewer patches than mm_tokens_per_image cannot pool them,
    # Gemma3MultiModalProjector's kernel would be 0; its text model still plans, so it is read)
    # Gemma3MultiModalProjector: mm_soft_emb_norm (RMSNorm, vision width) and
    # mm_input_projection_weight (vision x text), modeling_gemma3.py
    params += hidden + hidden * text_hidden
    ratio = grid / tokens
    # projector per image token: the norm's input and the projection's input (vision width each)
    saved = ratio * per_patch + 2 * hidden
    summary = (
        f"SigLIP vision tower {layers} layers of {hidden} (MLP {intermediate}), "
        f"{grid} patches pooled to {tokens} tokens, projected to {text_hidden}"
    )
    return _encoder_spec("gemma3", params, tokens, ratio, saved, (hidden, intermediate), summary)


def _llava(
    config: dict[str, Any],
    vision: dict[str, Any],
    model_type: str,
    text_hidden: int,
    source: str,
    where: str,
) -> VisionSpec:
    # LlavaConfig / LlavaNextConfig build CLIP-L/14-336 when vision_config is absent; a given
    # vision_config of type clip_vision_model fills its gaps from CLIPVisionConfig
    defaults = _VISION_DEFAULTS["clip" if vision else "clip_llava"]
    vision_type = vision.get("model_type", "clip_vision_model")
    if vision_type not in ("clip_vision_model", "siglip_vision_model"):
        raise UsageError(
            f"{where}: model_type {_shown(vision_type)} is not counted (clip_vision_model and "
            "siglip_vision_model are)",
            flag=FLAG,
        )
    clip = vision_type == "clip_vision_model"
    if not clip:
        defaults = _VISION_DEFAULTS["siglip"]
    params, hidden, intermediate, layers, grid, image, per_patch = _encoder(
        vision, defaults, where, clip=clip
    )
    bias = _bool(config, "multimodal_projector_bias", source, True)
    # LlavaMultiModalProjector: linear_1 vision -> text, linear_2 text -> text (modeling_llava.py)
    params += hidden * text_hidden + text_hidden * text_hidden + (2 * text_hidden if bias else 0)
    tiles = 1
    if model_type == "llava_next":
        params += text_hidden  # image_newline (modeling_llava_next.py)
        tiles += _most_tiles(config.get("image_grid_pinpoints"), image, source)
        tokens = tiles * grid
    else:
        tokens = _int(config, ("image_seq_length",), source, default=grid)
    # tower tokens per image token: the CLS token rides along (CLIP), dropped after the tower
    ratio = tiles * (grid + (1 if clip else 0)) / tokens
    # the projector per image token: linear_1's input (vision width), its output and the
    # activation's (text width)
    saved = ratio * per_patch + hidden + 2 * text_hidden
    summary = (
        f"{'CLIP' if clip else 'SigLIP'} vision tower {layers} layers of {hidden} "
        f"(MLP {intermediate}), {image} px in {grid} patches"
        + (f", up to {tiles} tiles" if tiles > 1 else "")
        + f", 2-layer projector to {text_hidden}"
    )
    return _encoder_spec(model_type, params, tokens, ratio, saved, (hidden, intermediate), summary)


def _encoder_spec(
    family: str,
    params: int,
    tokens: int,
    ratio: float,
    saved: float,
    widths: tuple[int, int],
    summary: str,
) -> VisionSpec:
    """The :class:`VisionSpec` of a SigLIP or CLIP tower and its projector (Gemma 3, LLaVA):
    ``ratio`` tower tokens per image token, ``saved`` elements per image token (rounded), and one
    encoder layer's working set (ungated MLP, ``widths`` = hidden and intermediate) over the
    ``ratio`` tower tokens of an image token."""
    hidden, intermediate = widths
    return VisionSpec(
        family=family,
        params=params,
        image_tokens=tokens,
        tower_tokens_per_image_token=ratio,
        saved_elements_per_image_token=round(saved),
        working_elements_per_image_token=round(ratio * _block_working(hidden, intermediate, False)),
        summary=summary,
    )


def _most_tiles(pinpoints: Any, image: int, source: str) -> int:
    """LLaVA-NeXT's "anyres": the most tiles of ``image`` px any ``image_grid_pinpoints``
    resolution is cut into (``get_anyres_image_grid_shape``, modeling_llava_next.py)."""
    if pinpoints is None:
        # LlavaNextConfig's default pinpoints (configuration_llava_next.py): at most 2 x 2 tiles
        return 4
    ok = isinstance(pinpoints, list) and pinpoints
    if ok:
        for pair in pinpoints:
            if not (
                isinstance(pair, list)
                and len(pair) == 2
                and all(type(v) is int and 0 < v <= 100_000 for v in pair)
            ):
                ok = False
    if not ok:
        raise UsageError(
            f"{source}: 'image_grid_pinpoints' must be a list of [height, width] pixel pairs, "
            f"got {_shown(pinpoints)}",
            flag=FLAG,
        )
    return int(max(-(-h // image) * -(-w // image) for h, w in pinpoints))
