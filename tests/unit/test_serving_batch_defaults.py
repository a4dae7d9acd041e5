"""vLLM V1's scheduler defaults by GPU (catalog/engines.toml ``batch_defaults_by_gpu``, from
vllm/engine/arg_utils.py): ``vllm serve`` on a device of at least 70 GiB whose name has no
"a100" gets max_num_batched_tokens 8192 and max_num_seqs 1024, any other 2048 and 256.

By hand from catalog/accelerators.toml's CUDA totals: H100 SXM 81,559 MiB = 79.6 GiB (large),
A100 80GB 80 GiB (an A100: flat), L40S 45 GiB (under 70: flat). Mistral-7B v0.1 (32 sliding layers,
window 4096) at --max-model-len 32768 needs cdiv(min(4095 + batched, 32768), 16) + 1 blocks per
request in its one group: 769 at 8192, 385 at 2048.
"""

from __future__ import annotations

import pytest

from hwdash.core.catalog import load_catalog
from hwdash.core.estimator.architecture import architecture
from hwdash.core.estimator.serving import (
    ServingSettings,
    engine_on,
    packaged_engines,
    serving_memory,
)
from hwdash.core.models.config import resolve_model

CATALOG = load_catalog(include_user=False)
MISTRAL = architecture(resolve_model("mistral-7b", CATALOG))


@pytest.mark.parametrize(
    ("engine", "gpu", "batched", "seqs"),
    [
        ("vllm", "h100-sxm", 8192, 1024),
        ("vllm", "h200", 8192, 1024),
        ("vllm", "a100-80gb", 2048, 256),
        ("vllm", "l40s", 2048, 256),
        ("vllm-v0", "h100-sxm", 2048, 256),
    ],
)
def test_the_engine_default_by_gpu(engine: str, gpu: str, batched: int, seqs: int) -> None:
    on = engine_on(packaged_engines()[engine], CATALOG.accelerators[gpu])
    assert (on.max_num_batched_tokens, on.max_num_seqs) == (batched, seqs)


def test_the_default_sets_the_profile_and_the_blocks_and_a_flag_overrides_it() -> None:
    h100 = CATALOG.accelerators["h100-sxm"]
    default = serving_memory(MISTRAL, h100, ServingSettings(engine="vllm", max_model_len=32768))
    assert default.profile_tokens == 8192 and default.engine.max_num_seqs == 1024
    assert default.request_blocks == 769
    given = ServingSettings(engine="vllm", max_model_len=32768, max_num_batched_tokens=2048)
    flagged = serving_memory(MISTRAL, h100, given)
    assert flagged.profile_tokens == 2048 and flagged.request_blocks == 385
    assert flagged.activation_bytes < default.activation_bytes


def test_the_rule_is_data() -> None:
    vllm = packaged_engines()["vllm"]
    assert vllm.batch_defaults_by_gpu is not None
    higher = vllm.batch_defaults_by_gpu.model_copy(update={"min_total_gib": 100})
    engines = {"vllm": vllm.model_copy(update={"batch_defaults_by_gpu": higher})}
    settings = ServingSettings(engine="vllm", max_model_len=32768)
    h100 = CATALOG.accelerators["h100-sxm"]
    assert serving_memory(MISTRAL, h100, settings, engines=engines).profile_tokens == 2048
    h200 = CATALOG.accelerators["h200"]
    assert serving_memory(MISTRAL, h200, settings, engines=engines).profile_tokens == 8192
