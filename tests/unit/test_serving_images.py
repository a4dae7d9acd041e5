"""Images in serving plans (``--method inference --engine vllm --images N --image-tokens T``)
against hand computations (hwdash.core.estimator.serving_images; vLLM V1's profile_run in
vllm/v1/worker/gpu_model_runner.py, compute_mm_encoder_budget in
vllm/v1/core/encoder_cache_manager.py, MultiModalBudget in vllm/multimodal/encoder_budget.py).

Qwen2.5-VL-3B (tests/data/model_configs/vlm/qwen2.5-vl-3b): language model hidden 2048, 36 layers,
2 key/value heads of 128; vision tower 32 blocks of 1280 with a gated MLP of 3420, 2x2 patches
merged into one image token. One block's no-grad working set per patch is 5 x 1280 + 3 x 3420 =
16,660 elements (family_vision._block_working), 4 patches per image token: 66,640 per image token.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from monitor_cli import run_plan

from hwdash.core.catalog import load_catalog
from hwdash.core.estimator.architecture import architecture
from hwdash.core.estimator.serving import ServingSettings, serving_memory
from hwdash.core.estimator.serving_images import (
    ImageServingMemory,
    encoder_profile,
    request_images,
    request_tokens,
    with_images,
)
from hwdash.core.models.config import model_from_config_file, resolve_model
from hwdash.core.plan import Method, Plan
from hwdash.core.planning.serving_plan import engine_json
from hwdash.errors import UsageError

pytestmark = pytest.mark.usefixtures("quiet_machine")

QWEN_VL = (
    Path(__file__).resolve().parent.parent
    / "data"
    / "model_configs"
    / "vlm"
    / "qwen2.5-vl-3b"
    / "config.json"
)
CATALOG = load_catalog(include_user=False)
A10G = CATALOG.accelerators[CATALOG.flavors["a10g-small"].accelerator]
MODEL = model_from_config_file(QWEN_VL)
WORKING = 4 * (5 * 1280 + 3 * 3420)  # elements per image token, one vision block, no grad


def _images(images: int, tokens: int) -> object:
    plan = Plan(model="vl", method=Method.INFERENCE, images=images, image_tokens=tokens)
    return request_images(plan, MODEL)


def test_profile_encodes_what_the_encoder_budget_holds() -> None:
    # budget max(2048 batched tokens, 1024) = 2048: two 1024-token images, both in one request
    profile = encoder_profile(
        _images(2, 1024),  # type: ignore[arg-type]
        max_num_batched_tokens=2048,
        max_num_seqs=256,
        max_model_len=2560,
        element_bytes=2,
        tp=1,
    )
    assert profile.budget_tokens == 2048 and profile.items == 2
    assert profile.working_bytes == WORKING * 2048 * 2 == 272_957_440
    assert profile.cache_bytes == 2048 * 2048 * 2  # outputs: image tokens x LM hidden x bf16
    # TP 2 splits the tower's forward, not its outputs
    two = encoder_profile(
        _images(2, 1024),  # type: ignore[arg-type]
        max_num_batched_tokens=2048,
        max_num_seqs=256,
        max_model_len=2560,
        element_bytes=2,
        tp=2,
    )
    assert two.working_bytes == 272_957_440 // 2 and two.cache_bytes == profile.cache_bytes


def test_an_item_above_the_batched_tokens_is_profiled_alone() -> None:
    # Qwen2.5-VL's largest image by default (max_pixels 12845056 / 28^2 = 16,384 tokens): the
    # budget grows to one item
    big = encoder_profile(
        _images(2, 16384),  # type: ignore[arg-type]
        max_num_batched_tokens=2048,
        max_num_seqs=256,
        max_model_len=40000,
        element_bytes=2,
        tp=1,
    )
    assert big.budget_tokens == 16384 and big.items == 1
    assert big.working_bytes == WORKING * 16384 * 2


def test_the_decoder_side_limits_the_items() -> None:
    # one sequence of one 256-token image: max_num_seqs x images per prompt = 1 item, though the
    # encoder budget (8192) would hold 32
    one = encoder_profile(
        _images(1, 256),  # type: ignore[arg-type]
        max_num_batched_tokens=8192,
        max_num_seqs=1,
        max_model_len=1024,
        element_bytes=2,
        tp=1,
    )
    assert one.items == 1
    # images per prompt are at most max_model_len // item tokens: 3 of 4 fit 800 tokens
    three = encoder_profile(
        _images(4, 256),  # type: ignore[arg-type]
        max_num_batched_tokens=8192,
        max_num_seqs=1,
        max_model_len=800,
        element_bytes=2,
        tp=1,
    )
    assert three.items == 3


def test_the_pool_loses_the_encoders_peak() -> None:
    arch = architecture(MODEL)
    text = serving_memory(arch, A10G, ServingSettings("vllm", 2560))
    memory = with_images(text, _images(2, 1024))  # type: ignore[arg-type]
    assert isinstance(memory, ImageServingMemory) and memory.encoder is not None
    cache, working = 2048 * 2048 * 2, WORKING * 2048 * 2
    # outputs kept through the dummy forward, plus the larger of the tower's and the LM's forward
    assert memory.activation_bytes == cache + max(working, text.activation_bytes)
    pool = text.budget_bytes - text.weight_bytes - memory.activation_bytes - text.non_torch_bytes
    assert memory.kv_cache_bytes == pool
    assert memory.kv_blocks == pool // (16 * 36 * 2 * 2 * 128 * 2)
    assert memory.kv_blocks < text.kv_blocks
    # the vision tower's weights were in the weights line already: all parameters, bf16
    assert text.weight_bytes == arch.total_params * 2 and arch.vision_params > 600_000_000


def test_text_plans_and_engines_without_a_profile_keep_their_memory() -> None:
    arch = architecture(MODEL)
    text = serving_memory(arch, A10G, ServingSettings("vllm", 2560))
    assert with_images(text, None) is text
    sglang = serving_memory(arch, A10G, ServingSettings("sglang", 2560))
    kept = with_images(sglang, _images(2, 1024))  # type: ignore[arg-type]
    assert kept.kv_cache_bytes == sglang.kv_cache_bytes and kept.encoder is None  # type: ignore[attr-defined]


def test_a_requests_length_counts_its_image_tokens() -> None:
    plan = Plan(model="vl", method=Method.INFERENCE, seq=512, images=2, image_tokens=1024)
    images = request_images(plan, MODEL)
    assert request_tokens(plan, images, None) == 512 + 2 * 1024
    assert request_tokens(plan, images, 8192) == 8192
    with pytest.raises(UsageError, match="2,049") as error:
        request_tokens(plan, images, 2048)
    assert error.value.flag == "--max-model-len"
    llama = resolve_model("llama-3.1-8b", CATALOG)
    text = Plan(model="llama-3.1-8b", method=Method.INFERENCE, seq=512)
    assert request_tokens(text, request_images(text, llama), None) == 512


SERVE = ["--method", "inference", "--engine", "vllm", "--flavor", "a10g-small", "--seq", "512"]


def test_cli_serving_plan_with_images(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--model", str(QWEN_VL), *SERVE, "--images", "2", "--image-tokens", "1024"]
    status, out, _err = run_plan(capsys, *args, "--json")
    assert status == 0
    serving = json.loads(out)["serving"]
    assert serving["encoder_items"] == 2 and serving["encoder_budget_tokens"] == 2048
    assert serving["encoder_activation_bytes"] == 272_957_440
    assert serving["max_concurrency"] == round(serving["kv_tokens"] / 2560, 2)
    status, out, _err = run_plan(capsys, *args)
    assert status == 0 and "profiled with 2 image item(s)" in out
    status, out, _err = run_plan(capsys, *args, "--export", "vllm")
    assert status == 0
    assert "--max-model-len 2560 --limit-mm-per-prompt '{\"image\": 2}'" in out


def test_cli_text_serving_plan_is_unchanged(capsys: pytest.CaptureFixture[str]) -> None:
    # a text model's serving object is serving_memory's own, at --seq
    status, out, _err = run_plan(capsys, "--model", "llama-3.1-8b", *SERVE, "--json")
    assert status == 0
    serving = json.loads(out)["serving"]
    llama = architecture(resolve_model("llama-3.1-8b", CATALOG))
    memory = serving_memory(llama, A10G, ServingSettings("vllm", 512))
    assert serving == {**memory.to_json(), "flavor": "a10g-small", **engine_json(memory)}
    status, out, _err = run_plan(capsys, "--model", "llama-3.1-8b", *SERVE, "--export", "vllm")
    assert status == 0 and "--limit-mm-per-prompt" not in out


def test_cli_images_on_a_text_model_name_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    status, _out, err = run_plan(capsys, "--model", "llama-3.1-8b", *SERVE, "--images", "1")
    assert status == 2 and "--images" in err and "Traceback" not in err
    args = ["--model", str(QWEN_VL), *SERVE, "--images", "2", "--image-tokens", "1024"]
    status, _out, err = run_plan(capsys, *args, "--max-model-len", "1500")
    assert status == 2 and "--max-model-len" in err and "Traceback" not in err
