"""Per-layer attention kinds from a ``config.json``: which decoder layers attend over a sliding
window or a chunk instead of the whole sequence, and how wide it is.

Read as transformers 5.24 reads them (``configuration_*.py`` ``__post_init__`` of each family, and
``cache_utils.py`` ``get_layer_types_and_kwargs``, which builds the cache from the same fields):

* ``layer_types`` (a list with one of ``"full_attention"``, ``"sliding_attention"``,
  ``"chunked_attention"`` per layer) wins wherever a config writes it;
* Gemma 2 (``configuration_gemma2.py``): ``sliding_window`` (default 4096), layer ``i`` sliding when
  ``(i + 1) % 2`` (even layers local, odd layers global);
* Gemma 3 (``configuration_gemma3.py``): ``sliding_window`` (default 4096) and the legacy
  ``sliding_window_pattern`` (default 6): layer ``i`` sliding unless ``(i + 1) % pattern == 0``
  (5 local : 1 global);
* Mistral (``configuration_mistral.py``, default 4096, may be null), Mixtral and Phi-3 (default
  null): one model-level ``sliding_window``; without ``layer_types``, ``get_layer_types_and_kwargs``
  makes every layer a sliding one when it is set;
* Qwen2 / Qwen3 (``configuration_qwen2.py``, ``configuration_qwen3.py``): the window only when
  ``use_sliding_window`` (default false), on layers ``i >= max_window_layers`` (default 28);
  Qwen2-MoE (``configuration_qwen2_moe.py``): on even layers below ``max_window_layers``; Qwen3-MoE
  (``configuration_qwen3_moe.py``, no ``layer_types``): on every layer;
* Llama 4 (``configuration_llama4.py``): ``attention_chunk_size`` (default 8192, may be null) on the
  layers whose ``no_rope_layers`` entry is 1 (default: all but every ``no_rope_layer_interval``-th,
  4), chunked attention there (:func:`chunked_layout`, for that family's reader).

What a reader returns is :class:`~hwdash.core.specs.ModelSpec`'s ``layer_attention`` (empty when
every layer attends fully), ``sliding_window`` and ``attention_chunk_size``.
"""

from __future__ import annotations

from typing import Any

from hwdash.core.models.fields import FLAG, _get_bool, _get_int, _shown
from hwdash.errors import UsageError

#: transformers' layer type names -> ModelSpec.layer_attention's.
LAYER_KINDS = {
    "full_attention": "full",
    "sliding_attention": "sliding",
    "chunked_attention": "chunked",
}

#: Each family's config-class default for ``sliding_window`` when the key is absent (an explicit
#: null means none): ``Gemma2Config``, ``Gemma3TextConfig``, ``MistralConfig``, ``Qwen2Config``,
#: ``Qwen3Config``, ``Qwen2MoeConfig``, ``Qwen3MoeConfig`` default to 4096; ``MixtralConfig`` and
#: ``Phi3Config`` to None.
_WINDOW_DEFAULTS: dict[str, int | None] = {
    "gemma2": 4096,
    "gemma3_text": 4096,
    "mistral": 4096,
    "mixtral": None,
    "phi3": None,
    "qwen2": 4096,
    "qwen2_5_vl_text": 4096,
    "qwen3": 4096,
    "qwen2_moe": 4096,
    "qwen3_moe": 4096,
}
#: ``Qwen2Config.max_window_layers`` (and Qwen3's, Qwen2-MoE's) default.
_QWEN_MAX_WINDOW_LAYERS = 28
#: ``Gemma3TextConfig``'s ``sliding_window_pattern`` default (``kwargs.get(..., 6)``).
_GEMMA3_PATTERN = 6
#: ``Llama4TextConfig`` defaults: ``attention_chunk_size`` 8192, ``no_rope_layer_interval`` 4.
LLAMA4_CHUNK_DEFAULT = 8192
LLAMA4_NO_ROPE_INTERVAL = 4

NO_WINDOWS: dict[str, Any] = {"layer_attention": (), "sliding_window": 0, "attention_chunk_size": 0}


def _window(fields: dict[str, Any], key: str, default: int | None, source: str) -> int | None:
    """A window width: the key's whole number, None for an explicit null, ``default`` if absent."""
    if key not in fields:
        return default
    if fields[key] is None:
        return None
    return _get_int(fields, key, source)


def _listed_types(value: Any, layers: int, source: str) -> list[str]:
    """``layer_types`` checked: one known name per layer, as hwdash's kinds."""
    if not isinstance(value, list) or len(value) != layers:
        raise UsageError(
            f"{source}: 'layer_types' must list one attention type for each of the {layers} "
            f"layers, got {_shown(value)}",
            flag=FLAG,
        )
    kinds = []
    for item in value:
        if item not in LAYER_KINDS:
            raise UsageError(
                f"{source}: 'layer_types' entry {_shown(item)} is not counted (known: "
                + ", ".join(LAYER_KINDS)
                + ")",
                flag=FLAG,
            )
        kinds.append(LAYER_KINDS[item])
    return kinds


def _layout(kinds: list[str], window: int | None, chunk: int | None) -> dict[str, Any]:
    """ModelSpec fields from per-layer kinds; a sliding (chunked) layer without a window (chunk)
    attends fully, as its mask does (``masking_utils.py``: no window, a causal mask)."""
    kinds = [
        "full"
        if (kind == "sliding" and window is None) or (kind == "chunked" and chunk is None)
        else kind
        for kind in kinds
    ]
    if all(kind == "full" for kind in kinds):
        return dict(NO_WINDOWS)
    return {
        "layer_attention": tuple(kinds),
        "sliding_window": window if "sliding" in kinds and window is not None else 0,
        "attention_chunk_size": chunk if "chunked" in kinds and chunk is not None else 0,
    }


def window_layout(family: str, fields: dict[str, Any], layers: int, source: str) -> dict[str, Any]:
    """The ModelSpec window fields of a Llama-layout family's config (module docstring's rules);
    :data:`NO_WINDOWS` for a family without windows or a config that sets none."""
    if family not in _WINDOW_DEFAULTS:
        return dict(NO_WINDOWS)
    window = _window(fields, "sliding_window", _WINDOW_DEFAULTS[family], source)
    if family.startswith("qwen") and not _get_bool(fields, "use_sliding_window", source, False):
        # Qwen2Config.__post_init__: sliding_window = ... if use_sliding_window else None
        window = None
    listed = fields.get("layer_types")
    if listed is not None:
        return _layout(_listed_types(listed, layers, source), window, None)
    if family == "gemma2":
        kinds = ["sliding" if (i + 1) % 2 else "full" for i in range(layers)]
    elif family == "gemma3_text":
        pattern = _get_int(fields, "sliding_window_pattern", source, default=_GEMMA3_PATTERN)
        kinds = ["sliding" if (i + 1) % pattern else "full" for i in range(layers)]
    elif family in ("qwen2", "qwen3", "qwen2_5_vl_text", "qwen2_moe"):
        first = _get_int(fields, "max_window_layers", source, default=_QWEN_MAX_WINDOW_LAYERS)
        if family == "qwen2_moe":
            kinds = ["sliding" if (i + 1) % 2 and i < first else "full" for i in range(layers)]
        else:
            kinds = ["sliding" if i >= first else "full" for i in range(layers)]
    else:
        # mistral, mixtral, phi3, qwen3_moe: no layer_types; cache_utils.py
        # get_layer_types_and_kwargs makes every layer sliding when sliding_window is set
        kinds = ["sliding"] * layers
    return _layout(kinds, window, None)


def chunked_layout(fields: dict[str, Any], layers: int, source: str) -> dict[str, Any]:
    """Llama 4's chunked attention (``configuration_llama4.py`` ``Llama4TextConfig``): chunked on
    the layers whose ``no_rope_layers`` entry is 1 (default: every layer but each
    ``no_rope_layer_interval``-th), of ``attention_chunk_size`` tokens; ``layer_types`` wins."""
    chunk = _window(fields, "attention_chunk_size", LLAMA4_CHUNK_DEFAULT, source)
    listed = fields.get("layer_types")
    if listed is not None:
        window = _window(fields, "sliding_window", None, source)
        return _layout(_listed_types(listed, layers, source), window, chunk)
    no_rope = fields.get("no_rope_layers")
    if not no_rope:  # None or [] take the default, as __post_init__ does
        interval = _get_int(
            fields, "no_rope_layer_interval", source, default=LLAMA4_NO_ROPE_INTERVAL
        )
        no_rope = [int((i + 1) % interval != 0) for i in range(layers)]
    if (
        not isinstance(no_rope, list)
        or len(no_rope) != layers
        or any(flag not in (0, 1) or isinstance(flag, bool) for flag in no_rope)
    ):
        raise UsageError(
            f"{source}: 'no_rope_layers' must list 0 or 1 for each of the {layers} layers, "
            f"got {_shown(no_rope)}",
            flag=FLAG,
        )
    return _layout(["chunked" if flag else "full" for flag in no_rope], None, chunk)
