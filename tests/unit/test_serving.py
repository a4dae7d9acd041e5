"""The serving estimator's terms (hwdash.core.estimator.serving) against hand computations.

Llama-3.1-8B (catalog): 32 layers, 8 key/value heads of 128, hidden 4096, MLP 14336, vocabulary
128256, 8,030,261_248 parameters. RTX 3090: CUDA total 24146 MiB (catalog/accelerators.toml).
"""

from __future__ import annotations

import dataclasses

import pytest

from hwdash.core.catalog import load_catalog
from hwdash.core.estimator.architecture import architecture
from hwdash.core.estimator.serving import (
    MIB,
    KvDtype,
    ServingSettings,
    cuda_total_bytes,
    kv_bytes_per_token,
    packaged_engines,
    profile_tokens,
    serving_memory,
)
from hwdash.core.estimator.software import packaged_software
from hwdash.core.models.config import resolve_model

CATALOG = load_catalog(include_user=False)
LLAMA = architecture(resolve_model("llama-3.1-8b", CATALOG))
RTX_3090 = CATALOG.accelerators["rtx-3090"]
PARAMS = 8_030_261_248


def test_per_token_kv_bytes_by_hand() -> None:
    # layers x (K and V) x kv_heads x head_dim x bytes
    assert kv_bytes_per_token(LLAMA, 2, 1) == 32 * 2 * 8 * 128 * 2 == 131_072
    assert kv_bytes_per_token(LLAMA, 2, 2) == 65_536  # 4 heads per rank
    assert kv_bytes_per_token(LLAMA, 1, 1) == 65_536  # fp8 / int8: one byte
    # TP 16 over 8 key/value heads: each rank keeps one head (replicated)
    assert kv_bytes_per_token(LLAMA, 2, 16) == 32 * 2 * 1 * 128 * 2


def test_cuda_total_is_below_nvml_where_the_catalog_knows_it() -> None:
    assert cuda_total_bytes(RTX_3090) == 24146 * MIB
    assert RTX_3090.nvml_total_mib is not None and RTX_3090.nvml_total_mib > 24146
    h100 = CATALOG.accelerators["h100-sxm"]
    assert h100.cuda_total_mib is None
    assert cuda_total_bytes(h100) == h100.nvml_total_mib * MIB  # type: ignore[operator]


def test_profile_tokens_by_engine_and_version() -> None:
    engines = packaged_engines()
    v1, v0, sglang = engines["vllm"], engines["vllm-v0"], engines["sglang"]
    assert profile_tokens(v1, ServingSettings("vllm", 20000)) == 2048  # chunked prefill budget
    assert profile_tokens(v1, ServingSettings("vllm", 20000, max_num_batched_tokens=8192)) == 8192
    assert profile_tokens(v0, ServingSettings("vllm-v0", 20000)) == 20000  # the whole length
    assert profile_tokens(v0, ServingSettings("vllm-v0", 40000)) == 2048  # V0 chunks above 32K
    assert profile_tokens(sglang, ServingSettings("sglang", 20000)) == 0


def test_vllm_v1_pool_blocks_tokens_and_concurrency_by_hand() -> None:
    memory = serving_memory(LLAMA, RTX_3090, ServingSettings("vllm", 8192))
    budget = int(0.9 * 24146 * MIB)
    weights = PARAMS * 2
    # one layer of a 2048-token no-grad forward: fp32 + bf16 norm, then the gated MLP's three
    # intermediates (bigger than Q/K/V), plus the last token's logits (bf16 + fp32)
    forward = (4 + 2) * 2048 * 4096 + 3 * 2 * 2048 * 14336 + 128256 * (2 + 4)
    sampler = 2 * 256 * 128256  # engines.toml: 2 bytes per logit, 256 sequences
    assert memory.budget_bytes == budget
    assert memory.weight_bytes == weights
    assert memory.activation_bytes == forward + sampler
    assert memory.non_torch_bytes == 0  # V1: the context is in its baseline
    pool = budget - weights - forward - sampler
    assert memory.kv_cache_bytes == pool
    assert memory.kv_blocks == pool // (16 * 131_072)
    assert memory.kv_tokens == memory.kv_blocks * 16
    assert memory.max_concurrency == pytest.approx(memory.kv_tokens / 8192)
    assert memory.fits
    assert memory.to_json() == {
        "kv_cache_bytes": pool,
        "kv_blocks": memory.kv_blocks,
        "block_tokens": 16,
        "kv_tokens": memory.kv_tokens,
        "max_concurrency": round(memory.kv_tokens / 8192, 2),
    }


def test_tensor_parallel_splits_weights_activations_and_kv() -> None:
    one = serving_memory(LLAMA, RTX_3090, ServingSettings("vllm", 8192))
    two = serving_memory(LLAMA, RTX_3090, ServingSettings("vllm", 8192, tp=2))
    assert two.weight_bytes == PARAMS
    assert two.kv_bytes_per_token == one.kv_bytes_per_token // 2
    assert two.kv_tokens > 2 * one.kv_tokens  # half the weights leave more than twice the pool


def test_v0_counts_its_non_torch_memory_and_the_whole_length() -> None:
    memory = serving_memory(LLAMA, RTX_3090, ServingSettings("vllm-v0", 20000))
    assert memory.non_torch_bytes == 256 * MIB  # engines.toml non_torch_mib
    assert memory.profile_tokens == 20000
    v1 = serving_memory(LLAMA, RTX_3090, ServingSettings("vllm", 20000))
    assert memory.kv_tokens < v1.kv_tokens


def test_sglang_keeps_no_profile_and_counts_the_cuda_context() -> None:
    memory = serving_memory(LLAMA, RTX_3090, ServingSettings("sglang", 8192))
    context = packaged_software().context_for(RTX_3090)[0].bytes
    budget = int(0.88 * 24146 * MIB)
    assert memory.activation_bytes == 0
    assert memory.non_torch_bytes == context
    assert memory.block_tokens == 1
    assert memory.kv_tokens == (budget - PARAMS * 2 - context) // 131_072


def test_fp8_cache_doubles_the_tokens_and_a_fraction_sets_the_budget() -> None:
    auto = serving_memory(LLAMA, RTX_3090, ServingSettings("vllm", 8192))
    fp8 = serving_memory(LLAMA, RTX_3090, ServingSettings("vllm", 8192, kv_dtype=KvDtype.FP8))
    assert fp8.kv_blocks == auto.kv_cache_bytes // (16 * 65_536)
    half = serving_memory(
        LLAMA, RTX_3090, ServingSettings("vllm", 8192, gpu_memory_utilization=0.5)
    )
    assert half.budget_bytes == int(0.5 * 24146 * MIB)


def test_a_pool_under_one_sequence_does_not_fit() -> None:
    memory = serving_memory(LLAMA, RTX_3090, ServingSettings("vllm", 131072))
    assert memory.kv_tokens < 131072 and not memory.fits
    starved = serving_memory(
        LLAMA, RTX_3090, ServingSettings("vllm", 2048, gpu_memory_utilization=0.5)
    )
    assert starved.kv_cache_bytes == 0 and starved.kv_blocks == 0 and not starved.fits


def test_quantized_weights_shrink_and_leave_more_cache() -> None:
    four = serving_memory(LLAMA, RTX_3090, ServingSettings("vllm", 8192, quant_bits=4))
    full = serving_memory(LLAMA, RTX_3090, ServingSettings("vllm", 8192))
    assert four.weight_bytes < full.weight_bytes / 2
    assert four.kv_tokens > full.kv_tokens


def test_every_engine_row_has_a_source() -> None:
    for row in packaged_engines().values():
        assert row.source and 0 < row.memory_fraction <= 1
    assert dataclasses.is_dataclass(ServingSettings)


def test_mla_caches_the_latent_unsplit_over_tp() -> None:
    # DeepSeek-V2-Lite's config.json: 27 layers, kv_lora_rank 512, qk_rope_head_dim 64 (vLLM's MLA
    # backends cache the latent and the rotary key, one copy per rank)
    config = "tests/data/model_configs/heldout/DeepSeek-V2-Lite/config.json"
    mla = architecture(resolve_model(config, CATALOG))
    assert kv_bytes_per_token(mla, 2, 1) == 27 * (512 + 64) * 2
    assert kv_bytes_per_token(mla, 2, 4) == 27 * (512 + 64) * 2


def test_sglang_lowers_its_fraction_as_tp_grows() -> None:
    from hwdash.core.estimator.serving import default_fraction

    sglang, vllm = packaged_engines()["sglang"], packaged_engines()["vllm"]
    # server_args.py: 0.88 at TP 1, 0.87 from 2, 0.85 from 4, 0.81 from 8, 0.79 from 16
    assert [default_fraction(sglang, tp) for tp in (1, 2, 3, 4, 8, 16, 32)] == [
        0.88,
        0.87,
        0.87,
        0.85,
        0.81,
        0.79,
        0.79,
    ]
    assert default_fraction(vllm, 8) == 0.9
    two = serving_memory(LLAMA, RTX_3090, ServingSettings("sglang", 8192, tp=2))
    assert two.fraction == 0.87 and two.budget_bytes == int(0.87 * 24146 * MIB)
