"""Vision-language models (issue 30): the vision tower and projector read from config.json
(``hwdash.core.models.family_vision``), their weights in every plan, and ``--images``' image
tokens and tower activations.

The parameter counts are hand computations from the configs' dimensions, each equal to what
transformers 5.24 builds on the meta device from the same config (the tower from its
``vision_config`` and the projector: counted while writing these tests, see
tests/data/model_configs/vlm/SOURCES.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hwdash.core.estimator import architecture, estimate_memory
from hwdash.core.models.config import model_from_config, model_from_config_file
from hwdash.core.plan import Method, Plan
from hwdash.errors import UsageError

DATA = Path(__file__).resolve().parent.parent / "data" / "model_configs"
QWEN_VL = DATA / "vlm" / "qwen2.5-vl-3b" / "config.json"
LLAVA = DATA / "vlm" / "llava-1.5-7b" / "config.json"
LLAVA_NEXT = DATA / "vlm" / "llava-v1.6-mistral-7b" / "config.json"
GEMMA3 = DATA / "heldout" / "gemma-3-4b-pt" / "config.json"


def _qwen_tower() -> int:
    h, m, out, depth = 1280, 3420, 2048, 32
    patch_embed = 3 * 2 * 14 * 14 * h  # Conv3d, no bias
    block = 2 * h + (3 * h * h + 3 * h) + (h * h + h) + (3 * h * m + 2 * m + h)
    merged = 4 * h
    merger = h + merged * merged + merged + merged * out + out
    return patch_embed + depth * block + merger


def _vit_layer(h: int, m: int) -> int:
    return 4 * h * h + 4 * h + 2 * h * m + m + h + 4 * h


def test_qwen2_5_vl_3b_reads_text_and_vision() -> None:
    model = model_from_config_file(QWEN_VL)
    assert (model.layers, model.hidden_size, model.heads, model.kv_heads) == (36, 2048, 16, 2)
    assert model.intermediate_size == 11008 and model.attention_bias and model.tied_embeddings
    assert model.vision is not None
    assert model.vision.params == _qwen_tower() == 668_684_288
    assert model.vision.image_tokens == 0  # dynamic resolution: --image-tokens must say
    assert model.vision.tower_tokens_per_image_token == 4
    text = architecture(model).total_params - model.vision.params
    assert architecture(model).vision_params == model.vision.params
    # Qwen2.5-VL-3B: 3.75B parameters in all (its model card), 3.09B of them the language model
    assert 3.70e9 < text + model.vision.params < 3.80e9


def test_gemma3_siglip_tower_and_projector() -> None:
    model = model_from_config_file(GEMMA3)
    assert model.vision is not None
    h, m, grid = 1152, 4304, (896 // 14) ** 2
    tower = 3 * 14 * 14 * h + h + grid * h + 27 * _vit_layer(h, m) + 2 * h  # no head
    assert model.vision.params == tower + h + h * 2560 == 419_816_304
    assert model.vision.image_tokens == 256  # mm_tokens_per_image's default
    assert model.vision.tower_tokens_per_image_token == grid / 256
    # per patch: the Conv2d's 3 x 14 x 14 pixels, post_layernorm's input, 27 layers of norms 2h,
    # attention 5h, MLP input h and fc1 / GELU outputs 2m; per image token 16 patches and the
    # projector's norm and matmul inputs (2h). bench/vlm_tower_trace.py --tower siglip: -0.2%.
    per_patch = 3 * 14 * 14 + h + 27 * (8 * h + 2 * m)
    assert model.vision.saved_elements_per_image_token == 16 * per_patch + 2 * h


def test_llava_clip_tower_projector_and_576_tokens() -> None:
    model = model_from_config_file(LLAVA)
    assert model.vision is not None and model.model_type == "llama"
    h, m, grid, text = 1024, 4096, 576, 4096
    tower = 3 * 14 * 14 * h + (grid + 1) * h + 3 * h + 24 * _vit_layer(h, m) + 2 * h
    assert model.vision.params == tower + h * text + text * text + 2 * text == 324_487_168
    assert model.vision.image_tokens == 576


def test_llava_next_anyres_tokens_and_newline() -> None:
    model = model_from_config_file(LLAVA_NEXT)
    llava = model_from_config_file(LLAVA)
    assert model.vision is not None and llava.vision is not None
    assert model.vision.params == llava.vision.params + 4096  # image_newline
    # 672x672 (or 1008x336): 4 tiles of 336 px and the base image, 576 patches each
    assert model.vision.image_tokens == 5 * 576


def test_vision_activations_against_hand_computation() -> None:
    model = model_from_config_file(QWEN_VL)
    text_only = Plan(model="q", method=Method.LORA, batch=2, seq=1024)
    longer = Plan(model="q", method=Method.LORA, batch=2, seq=1024 + 3 * 256)
    with_images = Plan(model="q", method=Method.LORA, batch=2, seq=1024, images=3, image_tokens=256)
    base = estimate_memory(text_only, model)
    lm = estimate_memory(longer, model)
    est = estimate_memory(with_images, model)
    # per patch and block: two fp32-upcasting RMSNorms 8h, qkv 3h + rotary q, k 2h + windowed
    # attention outputs 2h, MLP gate, up, act, product 4m; per patch outside the blocks: the
    # Conv3d's 1176 pixels, the fp32 rotary cos and sin (4 x head_dim 80), the merger's norm 4h;
    # per image token the merger's linear and GELU outputs (2 x 4h). Traced within 0.1% by
    # bench/vlm_tower_trace.py.
    h, m = 1280, 3420
    per_patch = 3 * 2 * 14 * 14 + 32 * (15 * h + 4 * m) + 4 * 80 + 4 * h
    per_token = 4 * per_patch + 2 * 4 * h
    tower = 2 * 3 * 256 * per_token * 2  # batch x images x tokens x elements x bf16
    assert dict(est.details)["vision tower (3 images x 256 tokens) activations"] == tower
    assert est.per_gpu.activations == lm.per_gpu.activations + tower
    assert est.per_gpu.weights == base.per_gpu.weights
    # the text-only plan: the tower's weights (in total_params), no image activations
    assert base.total_params == est.total_params == architecture(model).total_params
    assert not any("vision" in label for label, _ in base.details)


def test_inference_counts_one_block_of_the_tower() -> None:
    model = model_from_config_file(LLAVA)
    plan = Plan(model="l", method=Method.INFERENCE, batch=1, seq=512, images=1)
    est = estimate_memory(plan, model)
    assert model.vision is not None
    value = dict(est.details)["vision tower (1 image x 576 tokens), one block"]
    assert value == 576 * model.vision.working_elements_per_image_token * 2


def test_text_only_vlm_counts_tower_weights() -> None:
    model = model_from_config_file(LLAVA)
    config = json.loads(LLAVA.read_text())
    del config["vision_config"], config["model_type"]
    config["text_config"]["model_type"] = "llama"
    text = model_from_config(config["text_config"], name="t", source="t")
    assert model.vision is not None and text.vision is None
    plan = Plan(model="l", method=Method.FULL, seq=256)
    assert (
        estimate_memory(plan, model).total_params
        == estimate_memory(plan, text).total_params + model.vision.params
    )


@pytest.mark.parametrize(
    ("path", "fields", "flag", "words"),
    [
        (QWEN_VL, {"images": 1}, "--image-tokens", "give --image-tokens"),
        (LLAVA, {"image_tokens": 100}, "--image-tokens", "needs --images"),
        (DATA / "llama-style" / "config.json", {"images": 1}, "--images", "no vision tower"),
    ],
)
def test_bad_image_settings_name_the_flag(
    path: Path, fields: dict[str, int], flag: str, words: str
) -> None:
    model = model_from_config_file(path)
    with pytest.raises(UsageError, match=words) as caught:
        estimate_memory(Plan(model="m", **fields), model)  # type: ignore[arg-type]
    assert caught.value.flag == flag


def test_bad_vision_config_names_the_key() -> None:
    config = json.loads(QWEN_VL.read_text())
    config["vision_config"]["out_hidden_size"] = 1024
    with pytest.raises(UsageError, match="out_hidden_size"):
        model_from_config(config, name="q", source="q.json")
    config["vision_config"]["out_hidden_size"] = 2048
    config["vision_config"]["depth"] = "32"
    with pytest.raises(UsageError, match="'depth'"):
        model_from_config(config, name="q", source="q.json")
    llava = json.loads(LLAVA.read_text())
    llava["vision_config"].update(image_size=10**9, patch_size=1)
    with pytest.raises(UsageError, match="'image_size' / 'patch_size'"):
        model_from_config(llava, name="l", source="l.json")
    llava["vision_config"].update(image_size=336, patch_size=14)
    llava["image_grid_pinpoints"], llava["model_type"] = [[336, "672"]], "llava_next"
    with pytest.raises(UsageError, match="image_grid_pinpoints"):
        model_from_config(llava, name="l", source="l.json")


def test_cli_images_flag(capsys: pytest.CaptureFixture[str]) -> None:
    from hwdash.cli import main

    assert main(["plan", "--model", str(QWEN_VL), "--images", "2", "--image-tokens", "64"]) == 0
    assert "vision tower (2 images x 64 tokens) activations" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["plan", "--model", str(QWEN_VL), "--images", "x"])
    assert "--images" in capsys.readouterr().err


def test_trace_builds_the_language_model_and_compares_without_the_tower() -> None:
    from hwdash.core.models.config import hf_config_of
    from hwdash.tracing import TraceUnavailable, comparable_estimate, trace_settings

    config = json.loads(QWEN_VL.read_text())
    built = hf_config_of(config)
    # transformers has no causal-LM class for qwen2_5_vl: its Qwen2 decoder is built instead
    assert built["model_type"] == "qwen2" and "vision_config" not in built
    assert (built["hidden_size"], built["num_hidden_layers"]) == (2048, 36)
    model = model_from_config_file(QWEN_VL)
    assert model.vision is not None
    plan = Plan(model=str(QWEN_VL), method=Method.LORA, seq=512)
    compared = comparable_estimate(plan, model)
    assert compared.total_params == architecture(model).total_params - model.vision.params
    with pytest.raises(TraceUnavailable, match="--images"):
        trace_settings(plan.model_copy(update={"images": 1, "image_tokens": 64}))
