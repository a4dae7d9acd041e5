"""Reading config.json fields: whole numbers, booleans, probabilities, activations and quantisation,
each refused with a message that names the key (``--model``'s errors).

Shared by the config readers (:mod:`hwdash.core.models.config` for the Llama-style families,
:mod:`hwdash.core.models.families` and its siblings for the others), which import this module
rather than each other.
"""

from __future__ import annotations

from typing import Any, Literal

from hwdash.errors import UsageError

FLAG = "--model"


#: Upper bounds for config.json sizes: about 100x the largest released model's value (DeepSeek-V3:
#: 61 layers, 7168 wide, 256 experts, 129k vocabulary; Llama 4: 10M context), so a real config
#: always passes and a hostile one cannot overflow the arithmetic.
CONFIG_LIMITS = {
    "num_hidden_layers": 10_000,
    "hidden_size": 1_000_000,
    "num_attention_heads": 100_000,
    "num_key_value_heads": 100_000,
    "head_dim": 100_000,
    "intermediate_size": 10_000_000,
    "moe_intermediate_size": 10_000_000,
    "shared_expert_intermediate_size": 10_000_000,
    "vocab_size": 100_000_000,
    "max_position_embeddings": 1_000_000_000,
    "num_local_experts": 100_000,
    "num_experts": 100_000,
    "num_experts_per_tok": 100_000,
}


Activation = Literal["silu", "gelu", "gelu_pytorch_tanh", "gelu_new", "relu"]


#: transformers' ACT2FN names we carry, and the ones that mean the same thing.
ACTIVATIONS: dict[str, Activation] = {
    "gelu": "gelu",
    "gelu_new": "gelu_new",
    "gelu_fast": "gelu_new",
    "gelu_pytorch_tanh": "gelu_pytorch_tanh",
    "silu": "silu",
    "swish": "silu",
    "relu": "relu",
}


def _shown(value: Any) -> str:
    """A short ``repr`` for a message. A value nested past the recursion limit (possible in a
    dict handed to :func:`model_from_config`, not in parsed JSON) or an int past Python's digit
    limit cannot be repr'd: say what it is instead."""
    try:
        text = repr(value)
    except (RecursionError, ValueError):
        return f"a {type(value).__name__} too deep or too long to show"
    return text if len(text) <= 40 else text[:37] + "..."


def _get_int(config: dict[str, Any], key: str, where: str, default: int | None = None) -> int:
    """``config[key]`` as a whole number from 1 to its limit; missing or null takes ``default``.
    Refuses booleans, floats (even 2.0), strings and anything else, naming the key."""
    value = config.get(key)
    if value is None:
        value = default
    if value is None:
        raise UsageError(f"{where} has no '{key}' (needed to size the model)", flag=FLAG)
    limit = CONFIG_LIMITS.get(key, 10**9)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= limit:
        raise UsageError(
            f"{where}: '{key}' must be a whole number from 1 to {limit:,}, got {_shown(value)}",
            flag=FLAG,
        )
    return value


def _get_bool(config: dict[str, Any], key: str, where: str, default: bool) -> bool:
    """A JSON true/false (a string "false" would read as true if it were passed to bool())."""
    value = config.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise UsageError(f"{where}: '{key}' must be true or false, got {_shown(value)}", flag=FLAG)
    return value


def _first_key(fields: dict[str, Any], keys: tuple[str, ...]) -> str:
    """The first of ``keys`` the config sets (else the first, whose absence is then reported)."""
    for key in keys:
        if fields.get(key) is not None:
            return key
    return keys[0]


def _int(
    fields: dict[str, Any], keys: tuple[str, ...], source: str, default: int | None = None
) -> int:
    key = _first_key(fields, keys)
    return int(_get_int(fields, key, source, default=default))


def _bool(fields: dict[str, Any], key: str, source: str, default: bool) -> bool:
    return bool(_get_bool(fields, key, source, default))


def _probability(fields: dict[str, Any], key: str, source: str, default: float) -> float:
    """A dropout probability from 0 up to (not including) 1; missing or null takes ``default``."""
    value = fields.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
        raise UsageError(
            f"{source}: '{key}' must be a probability from 0 to below 1, got {_shown(value)}",
            flag=FLAG,
        )
    return float(value)


def _activation(fields: dict[str, Any], keys: tuple[str, ...], default: Activation) -> Activation:
    key = _first_key(fields, keys)
    value = fields.get(key)
    if isinstance(value, str) and value in ACTIVATIONS:
        return ACTIVATIONS[value]
    return default


def _checkpoint_bits(quantization: Any, source: str) -> Literal[4, 8] | None:
    """4 or 8 for a quantized checkpoint's ``quantization_config`` (bitsandbytes ``load_in_4bit``
    / ``load_in_8bit``, GPTQ and AWQ ``bits``); None for none. Other methods or bit widths are a
    usage error rather than a silently wrong 16-bit count."""
    if quantization is None:
        return None
    if not isinstance(quantization, dict):
        raise UsageError(f"{source}: 'quantization_config' must be a table", flag=FLAG)
    method = quantization.get("quant_method", "bitsandbytes")
    if method == "bitsandbytes":
        if quantization.get("load_in_4bit") is True:
            return 4
        if quantization.get("load_in_8bit") is True:
            return 8
        return None
    if method in ("gptq", "awq"):
        bits = quantization.get("bits", quantization.get("w_bit"))
        if bits == 4 and not isinstance(bits, bool):
            return 4
        if bits == 8 and not isinstance(bits, bool):
            return 8
        raise UsageError(
            f"{source}: quantization_config: {method} with {_shown(bits)} bits is not counted "
            "(4 and 8 are)",
            flag=FLAG,
        )
    raise UsageError(
        f"{source}: quantization_config: quant_method {_shown(method)} is not counted "
        "(bitsandbytes, gptq and awq are)",
        flag=FLAG,
    )
