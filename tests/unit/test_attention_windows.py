"""Sliding-window and chunked attention layers, by hand: the config readers
(hwdash.core.models.windows), generate's KV cache (transformers 5.24 cache_utils.py) and vLLM V1's
hybrid KV cache manager (vllm/v1/core/kv_cache_utils.py, vllm/v1/kv_cache_interface.py).

The Gemma-3-like model: 12 layers, 5 sliding : 1 full (layers 5 and 11 full), a window of 1024, 4
key/value heads of 256: one layer caches 2 x 4 x 256 x 2 = 4096 bytes per token in bf16.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from hwdash.core.catalog import load_catalog
from hwdash.core.estimator.architecture import architecture
from hwdash.core.estimator.inference import kv_cache_after_prefill_bytes, kv_cache_bytes
from hwdash.core.estimator.serving import ServingSettings, kv_groups, serving_memory
from hwdash.core.models.config import model_from_config, resolve_model
from hwdash.core.models.windows import chunked_layout
from hwdash.errors import UsageError

CATALOG = load_catalog(include_user=False)
LAYER_BYTES = 2 * 4 * 256 * 2  # one layer's K and V per token, bf16


def _gemma3_like(**extra: Any) -> dict[str, Any]:
    return {
        "model_type": "gemma3_text",
        "num_hidden_layers": 12,
        "hidden_size": 1024,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "intermediate_size": 4096,
        "vocab_size": 32000,
        "max_position_embeddings": 32768,
        "sliding_window": 1024,
        **extra,
    }


def _spec(config: dict[str, Any]) -> Any:
    return model_from_config(config, name="m", source="test config")


def _llama_like() -> dict[str, Any]:
    config = _gemma3_like(model_type="llama")
    del config["sliding_window"]
    return config


# ---- config readers ---------------------------------------------------------------------------


def test_gemma3_pattern_five_sliding_to_one_full() -> None:
    model = _spec(_gemma3_like())
    # Gemma3TextConfig: sliding unless (i + 1) % 6 == 0
    assert model.layer_attention == ("sliding",) * 5 + ("full",) + ("sliding",) * 5 + ("full",)
    assert model.sliding_window == 1024
    arch = architecture(model)
    assert arch.layer_windows[5] is None and arch.layer_windows[0] == 1024
    assert arch.attention_groups == (("sliding", 1024, 10), ("full", 0, 2))


def test_gemma3_legacy_pattern_and_layer_types() -> None:
    assert _spec(_gemma3_like(sliding_window_pattern=3)).layer_attention.count("full") == 4
    listed = ["full_attention"] * 11 + ["sliding_attention"]
    model = _spec(_gemma3_like(layer_types=listed))  # layer_types wins over the pattern
    assert model.layer_attention == ("full",) * 11 + ("sliding",)


def test_gemma2_alternates_with_its_default_window() -> None:
    config = _gemma3_like(model_type="gemma2")
    del config["sliding_window"]  # Gemma2Config's default: 4096
    model = _spec(config)
    assert model.layer_attention == ("sliding", "full") * 6
    assert model.sliding_window == 4096


def test_mistral_window_on_every_layer_and_null_for_none() -> None:
    config = {**_llama_like(), "model_type": "mistral", "sliding_window": 4096}
    model = _spec(config)
    assert model.layer_attention == ("sliding",) * 12 and model.sliding_window == 4096
    assert _spec({**config, "sliding_window": None}).layer_attention == ()
    # MistralConfig defaults sliding_window to 4096 when the key is absent
    del config["sliding_window"]
    assert _spec(config).sliding_window == 4096


def test_qwen_windows_only_with_use_sliding_window() -> None:
    config = {**_llama_like(), "model_type": "qwen2", "sliding_window": 2048}
    assert _spec({**config, "max_window_layers": 8}).layer_attention == ()
    model = _spec({**config, "use_sliding_window": True, "max_window_layers": 8})
    assert model.layer_attention == ("full",) * 8 + ("sliding",) * 4
    assert model.sliding_window == 2048


def test_a_model_without_windows_has_none() -> None:
    model = _spec(_llama_like())
    assert model.layer_attention == () and model.sliding_window == 0
    assert architecture(model).layer_windows == (None,) * 12


def test_llama4_chunked_layout_on_a_config_dict() -> None:
    # Llama4TextConfig: no_rope_layers default int((i + 1) % 4 != 0); chunked where 1
    layout = chunked_layout({"attention_chunk_size": 8192}, 8, "cfg")
    assert layout["layer_attention"] == ("chunked",) * 3 + ("full",) + ("chunked",) * 3 + ("full",)
    assert layout["attention_chunk_size"] == 8192
    assert chunked_layout({}, 4, "cfg")["attention_chunk_size"] == 8192  # the class default
    assert chunked_layout({"attention_chunk_size": None}, 4, "cfg")["layer_attention"] == ()
    listed = chunked_layout({"no_rope_layers": [1, 0, 0, 1]}, 4, "cfg")
    assert listed["layer_attention"] == ("chunked", "full", "full", "chunked")


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ({"layer_types": ["sliding_attention"] * 3}, "layer_types"),
        ({"layer_types": ["linear_attention"] * 12}, "layer_types"),
        ({"sliding_window": "1024"}, "sliding_window"),
        ({"sliding_window_pattern": 0}, "sliding_window_pattern"),
    ],
)
def test_bad_window_keys_are_refused_naming_the_key(extra: dict[str, Any], key: str) -> None:
    with pytest.raises(UsageError, match=key) as caught:
        _spec(_gemma3_like(**extra))
    assert caught.value.flag == "--model"
    with pytest.raises(UsageError, match="no_rope_layers"):
        chunked_layout({"no_rope_layers": [1, 2]}, 2, "cfg")


# ---- generate's KV cache ------------------------------------------------------------------------


def test_generate_cache_by_hand_at_32k() -> None:
    arch = architecture(_spec(_gemma3_like()))
    seq = 32_768
    # from the first decoding step: 2 full layers x 32768 + 10 sliding layers x 1024
    decoding = (2 * seq + 10 * 1024) * LAYER_BYTES
    assert kv_cache_after_prefill_bytes(arch, 1, seq, 2) == decoding == 310_378_496
    # a 1024-token prompt: the prefill (12 x 1024) is below the decoding cache, which is the peak
    assert kv_cache_bytes(arch, 1, seq, 2, prompt=1024) == decoding
    # a 16k prompt: the prefill keeps 16384 tokens in all 12 layers, above the decoding cache
    assert kv_cache_bytes(arch, 1, seq, 2, prompt=16_384) == 12 * 16_384 * LAYER_BYTES
    # the plan's default: the prefill covers --seq, every layer holds it at the peak
    assert kv_cache_bytes(arch, 2, seq, 2) == 2 * 12 * seq * LAYER_BYTES


def test_generate_cache_without_windows_unchanged() -> None:
    arch = architecture(_spec(_llama_like()))
    full = 12 * 32_768 * LAYER_BYTES
    assert kv_cache_bytes(arch, 1, 32_768, 2) == full
    assert kv_cache_bytes(arch, 1, 32_768, 2, prompt=1024) == full
    assert kv_cache_after_prefill_bytes(arch, 1, 32_768, 2) == full


def test_inference_plan_names_the_decoding_cache() -> None:
    from hwdash.core.estimator.estimate import estimate_memory
    from hwdash.core.plan import Method, Plan

    plan = Plan(model="m", method=Method.INFERENCE, seq=32_768, batch=1)
    windowed = estimate_memory(plan, _spec(_gemma3_like()))
    label = next(label for label, _ in windowed.details if label.startswith("KV cache"))
    assert "sliding window 1,024 on 10 of 12 layers: 0.29 GiB once decoding begins" in label
    assert windowed.per_gpu.kv_cache == 12 * 32_768 * LAYER_BYTES
    plain = estimate_memory(plan, _spec(_llama_like()))
    assert ("KV cache", 12 * 32_768 * LAYER_BYTES) in plain.details


# ---- vLLM's hybrid KV cache manager ---------------------------------------------------------------


def test_vllm_groups_by_hand() -> None:
    arch = architecture(_spec(_gemma3_like()))
    groups = kv_groups(arch, LAYER_BYTES, 16, 32_768, 2048)
    assert groups is not None
    # 10 sliding and 2 full layers: groups of 2 (10 >= 1.5 x 2): 5 sliding groups, 1 full
    assert groups.group_size == 2 and groups.count == 6 and groups.padding_layers == 0
    assert groups.block_bytes == 16 * LAYER_BYTES * 2
    # full: cdiv(32768, 16) = 2048; sliding: cdiv(min(1023 + 2048, 32768), 16) + 1 = 193, x 5
    assert groups.request_blocks == 2048 + 5 * 193 == 3013
    # a short max_model_len caps the sliding groups too: cdiv(2000, 16) + 1 = 126
    assert kv_groups(arch, LAYER_BYTES, 16, 2000, 2048).request_blocks == 125 + 5 * 126  # type: ignore[union-attr]
    assert kv_groups(architecture(_spec(_llama_like())), LAYER_BYTES, 16, 32_768, 2048) is None


def _on_h100(config: dict[str, Any], **settings: Any) -> Any:
    arch = architecture(_spec(config))
    # 2048 batched tokens, as the hand computations below: vllm serve's default on an H100 is
    # 8192 (engines.toml batch_defaults_by_gpu; test_serving_batch_defaults.py)
    defaults: dict[str, Any] = {"max_model_len": 32_768, "max_num_batched_tokens": 2048}
    return serving_memory(
        arch,
        CATALOG.accelerators["h100-sxm"],
        ServingSettings(**{"engine": "vllm", **defaults, **settings}),
    )


def test_vllm_serving_with_windows_by_hand() -> None:
    windowed = _on_h100(_gemma3_like())
    full = _on_h100(_gemma3_like(model_type="gemma3_text", layer_types=["full_attention"] * 12))
    pool = windowed.kv_cache_bytes
    assert pool == full.kv_cache_bytes  # the same weights and profile run
    assert windowed.kv_blocks == pool // (16 * LAYER_BYTES) // 2
    assert windowed.kv_tokens == windowed.kv_blocks // 6 * 16  # "GPU KV cache size"
    assert windowed.max_concurrency == pytest.approx(windowed.kv_blocks / 3013)
    assert windowed.whole_requests == windowed.kv_blocks // 3013
    assert windowed.request_bytes == 3013 * 16 * LAYER_BYTES * 2
    assert windowed.fits
    # every layer full: the formula before windows
    assert full.groups is None and full.kv_blocks == pool // (16 * 12 * LAYER_BYTES)
    assert full.max_concurrency == full.kv_tokens / 32_768
    assert windowed.max_concurrency > 3.5 * full.max_concurrency
    assert (
        "6 groups of 2 layers (5 sliding of a 1,024-token window, 1 full)"
        in (windowed.group_lines()[0])
    )


def test_without_the_hybrid_manager_every_layer_is_full() -> None:
    full = _on_h100(_gemma3_like(layer_types=["full_attention"] * 12))
    disabled = _on_h100(_gemma3_like(), hybrid_kv_cache=False)  # --disable-hybrid-kv-cache-manager
    assert disabled.groups is None
    assert (disabled.kv_blocks, disabled.kv_tokens, disabled.max_concurrency) == (
        full.kv_blocks,
        full.kv_tokens,
        full.max_concurrency,
    )
    for engine in ("vllm-v0", "sglang"):  # neither keeps windows for these families
        a = _on_h100(_gemma3_like(), engine=engine)
        b = _on_h100(_gemma3_like(layer_types=["full_attention"] * 12), engine=engine)
        assert a.groups is None and a == b


def test_mistral_all_sliding_is_one_group() -> None:
    config = {**_llama_like(), "model_type": "mistral", "sliding_window": 4096}
    windowed = _on_h100(config)
    plain = _on_h100({**config, "sliding_window": None})
    assert windowed.groups is not None and windowed.groups.count == 1
    # one group of all 12 layers: the same blocks and tokens as without the window
    assert (windowed.kv_blocks, windowed.kv_tokens) == (plain.kv_blocks, plain.kv_tokens)
    # a request needs cdiv(min(4095 + 2048, 32768), 16) + 1 = 385 blocks instead of 2048
    assert windowed.groups.request_blocks == 385
    assert windowed.max_concurrency == pytest.approx(plain.kv_blocks / 385)


def test_serving_changes_exactly_for_the_catalog_models_with_windows() -> None:
    changed = set()
    h100 = CATALOG.accelerators["h100-sxm"]
    for model in CATALOG.models.values():
        if model.encoder_only or model.decoder_layers:
            continue
        arch = architecture(model)
        plain = dataclasses.replace(arch, layer_attention=(), sliding_window=0)
        settings = ServingSettings("vllm", min(model.max_context, 8192))
        if serving_memory(arch, h100, settings) != serving_memory(plain, h100, settings):
            changed.add(model.id)
    assert changed == {
        "gemma-2-2b",
        "gemma-2-9b",
        "gemma-2-27b",
        "gemma-3-1b",
        "gemma-3-4b",
        "gemma-3-12b",
        "gemma-3-27b",
        "mistral-7b",
    }


def test_catalog_gemma3_carries_its_config_window() -> None:
    assert resolve_model("gemma-3-27b", CATALOG).sliding_window == 1024
    assert resolve_model("gemma-3-1b", CATALOG).sliding_window == 512


@pytest.mark.usefixtures("quiet_machine")
def test_cli_serving_and_max_concurrency_with_windows(capsys: pytest.CaptureFixture[str]) -> None:
    from monitor_cli import run_plan

    args = "--model gemma-3-12b --method inference --engine vllm --flavor l40sx1"
    args += " --max-model-len 32768 --max concurrency"
    status, out, _err = run_plan(capsys, *args.split(), "--json")
    assert status == 0
    document = json.loads(out)
    serving, found = document["serving"], document["max"]
    # 40 sliding and 8 full layers: groups of 8, 5 sliding groups and 1 full
    assert serving["kv_tokens"] == serving["kv_blocks"] // 6 * 16
    # a request: cdiv(32768, 16) + 5 x (cdiv(1023 + 2048, 16) + 1) = 2048 + 965 blocks
    assert serving["max_concurrency"] == round(serving["kv_blocks"] / 3013, 2)
    assert found["value"] == serving["kv_blocks"] // 3013
    # the headroom is the pool left after that many requests: under one more request
    # (one block of a group: 16 tokens x 8 layers x 2 x 8 heads x 256 x 2 bytes)
    request = 3013 * 16 * 8 * 2 * 8 * 256 * 2
    assert found["headroom_bytes"] == serving["kv_cache_bytes"] - found["value"] * request
    assert 0 <= found["headroom_bytes"] < request
    status, text, _err = run_plan(capsys, *args.split()[:-2])
    assert (
        "hybrid KV cache: 6 groups of 8 layers (5 sliding of a 1,024-token window, 1 full)" in text
    )


def test_a_spec_written_field_by_field_is_checked() -> None:
    from pydantic import ValidationError

    fields = _spec(_gemma3_like()).model_dump()
    with pytest.raises(ValidationError, match="12 layer kinds for 11 layers"):
        type(_spec(_llama_like())).model_validate({**fields, "layers": 11})
    with pytest.raises(ValidationError, match="sliding layers need a sliding_window"):
        type(_spec(_llama_like())).model_validate({**fields, "sliding_window": 0})


# ---- training activations: SDPA's mask past the window ----------------------------------------


def _activations(config: dict[str, Any], seq: int, attention: Any, batch: int = 2) -> int:
    from hwdash.core.estimator.activations import training_activation_bytes

    arch = architecture(_spec(config))
    return training_activation_bytes(arch, batch, seq, 2, attention, False)


def test_sliding_blocks_are_their_own_kind_with_their_window() -> None:
    kinds = architecture(_spec(_gemma3_like())).block_kinds
    assert [(count, kind.sliding_window, kind.local_span) for count, kind in kinds] == [
        (10, 1024, 1024),
        (2, 0, 0),
    ]
    assert all(not kind.layer_attention for _, kind in kinds)


def test_sdpa_keeps_a_mask_and_repeated_kv_in_each_sliding_layer_past_the_window() -> None:
    """Gemma-3-like, bf16, batch 2: from the window (1024) on, each of the 10 sliding layers keeps
    SDPA's additive mask (2 b s^2 bytes) and K, V repeated from 4 to 8 heads of 256 (2 x 2 b s x
    (8 - 4) x 256 bytes more); the 2 full layers get is_causal and no mask. Below the window, and
    with flash or eager attention, SDPA's count is unchanged."""
    from hwdash.core.plan import Attention

    config = _gemma3_like()
    for seq in (512, 1023):
        assert _activations(config, seq, Attention.SDPA) == _activations(
            config, seq, Attention.FLASH
        )
    for seq in (1024, 4096):
        per_layer = 2 * 2 * seq * seq + 2 * 2 * (2 * seq) * (8 - 4) * 256
        extra = _activations(config, seq, Attention.SDPA) - _activations(
            config, seq, Attention.FLASH
        )
        assert extra == 10 * per_layer


def test_one_kv_head_keeps_only_the_mask() -> None:
    """Multi-query (one KV head, as gemma-3-1b): repeat_kv's reshape is a view, so past the
    window each sliding layer keeps only the b x 1 x s x s bf16 mask."""
    from hwdash.core.plan import Attention

    config = _gemma3_like(num_key_value_heads=1)
    extra = _activations(config, 2048, Attention.SDPA) - _activations(config, 2048, Attention.FLASH)
    assert extra == 10 * 2 * 2 * 2048 * 2048


def test_mistral_every_layer_masked_past_its_window() -> None:
    """mistral-7b's config (window 4096 on all 32 layers, 8 of 32 KV heads of 128), batch 1: at
    8192 tokens each layer keeps 2 s^2 bytes of mask and 2 x 2 s x (4096 - 1024) of repeated K, V;
    at 4095 nothing."""
    from hwdash.core.plan import Attention

    path = Path("tests/data/model_configs/catalog/mistral-7b/config.json")
    config = json.loads(path.read_text(encoding="utf-8"))
    assert _activations(config, 4095, Attention.SDPA, 1) == _activations(
        config, 4095, Attention.FLASH, 1
    )
    seq = 8192
    per_layer = 2 * seq * seq + 2 * 2 * seq * (4096 - 1024)
    extra = _activations(config, seq, Attention.SDPA, 1) - _activations(
        config, seq, Attention.FLASH, 1
    )
    assert extra == 32 * per_layer


def test_first_layers_backward_keeps_its_mask() -> None:
    """The end of backward holds the first layer's activations (recomputed under checkpointing):
    mistral-7b's layer 0 is a sliding one, so at 16384 tokens (b1) it keeps the 2 s^2 mask and
    K, V repeated to 32 heads, 2 x 2 s x (4096 - 1024) more, over flash. SGD keeps no states, so
    the end of backward (all gradients and that layer) is the peak."""
    from hwdash.core.estimator.estimate import estimate_memory
    from hwdash.core.plan import Attention, Method, Optimizer, Plan

    path = Path("tests/data/model_configs/catalog/mistral-7b/config.json")
    model = _spec(json.loads(path.read_text(encoding="utf-8")))
    seq = 16384
    found = {}
    for attention in (Attention.SDPA, Attention.FLASH):
        plan = Plan(
            model="m",
            method=Method.FULL,
            batch=1,
            seq=seq,
            attention=attention,
            grad_ckpt=True,
            optimizer=Optimizer.SGD,
        )
        estimate = estimate_memory(plan, model)
        assert estimate.peak_phase == "end of backward"
        found[attention] = dict(estimate.details)["model first layer's backward"]
    assert found[Attention.SDPA] - found[Attention.FLASH] == 2 * seq * seq + 2 * 2 * seq * 3072


def test_a_window_without_layer_kinds_masks_nothing() -> None:
    """A spec that writes sliding_window but no layer_attention attends fully everywhere (the
    field's own rule, and what serving counts): SDPA's count equals flash's past that width."""
    from hwdash.core.estimator.activations import training_activation_bytes
    from hwdash.core.plan import Attention

    spec = _spec(_llama_like()).model_copy(update={"sliding_window": 512})
    assert not spec.layer_attention
    arch = architecture(spec)
    assert training_activation_bytes(arch, 1, 4096, 2, Attention.SDPA, False) == (
        training_activation_bytes(arch, 1, 4096, 2, Attention.FLASH, False)
    )
