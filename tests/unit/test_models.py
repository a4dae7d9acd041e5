"""Model resolution: catalog ids, Hugging Face config.json files, bare parameter counts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hwdash.core.catalog import Catalog, load_catalog, load_catalog_from
from hwdash.core.estimator import architecture
from hwdash.core.models.config import model_from_config, resolve_model, synthetic_model
from hwdash.core.models.params import count_parameters
from hwdash.core.units import parse_count
from hwdash.errors import UsageError

DATA = Path(__file__).resolve().parent.parent / "data"
CONFIGS = DATA / "model_configs"


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog_from([DATA / "catalog_estimator"])


def test_catalog_id_name_and_hf_id_resolve(catalog: Catalog) -> None:
    assert resolve_model("fx-8b-gqa", catalog).id == "fx-8b-gqa"
    assert resolve_model("Fixture 8B GQA", catalog).id == "fx-8b-gqa"
    assert resolve_model("fixture/eight-b", catalog).id == "fx-8b-gqa"
    assert resolve_model("  FX-1B ", catalog).id == "fx-1b"


def test_real_catalog_models_resolve_by_hf_id() -> None:
    real = load_catalog(include_user=False)
    assert resolve_model("Qwen/Qwen2.5-7B", real).id == "qwen2.5-7b"


def test_llama_style_config_folder(catalog: Catalog) -> None:
    model = resolve_model(str(CONFIGS / "llama-style"), catalog)
    assert (model.layers, model.hidden_size, model.heads, model.kv_heads) == (32, 4096, 32, 8)
    assert model.head_dim == 128  # hidden / heads, absent from the config
    assert model.intermediate_size == 14336
    assert not model.tied_embeddings
    assert model.experts == 1
    # A Llama-3-8B config: 8.03B parameters (Meta's model card).
    assert count_parameters(model) == pytest.approx(8.03e9, rel=0.005)


def test_mixtral_style_config_file(catalog: Catalog) -> None:
    model = resolve_model(str(CONFIGS / "mixtral-style" / "config.json"), catalog)
    assert (model.experts, model.experts_per_token) == (8, 2)
    assert model.max_context == 32768
    # Mixtral 8x7B: 46.7B total parameters (Jiang et al. 2024, arXiv:2401.04088), ~12.9B active.
    assert architecture(model).total_params == pytest.approx(46.7e9, rel=0.005)
    active = architecture(model).matmul_params_per_token
    assert active == pytest.approx(12.9e9, rel=0.03)


def test_gemma3_multimodal_config_reads_text_config(catalog: Catalog) -> None:
    model = resolve_model(str(CONFIGS / "gemma3-multimodal"), catalog)
    assert model.layers == 34
    assert model.hidden_size == 2560
    assert model.head_dim == 256  # explicit, not hidden / heads (= 320)
    assert model.kv_heads == 4
    assert model.vocab_size == 262208
    assert model.tied_embeddings  # Gemma ties by default when the config leaves it out
    assert model.max_context == 131072
    # Gemma-3-4B's language model: ~3.88B with the 0.4B vision tower, so ~3.9B minus it.
    assert 3.3e9 < count_parameters(model) < 3.9e9


def test_qwen2_config_gets_qkv_bias() -> None:
    config = {
        "model_type": "qwen2",
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": True,
    }
    model = model_from_config(config, name="Qwen2.5-0.5B", source="inline")
    assert model.attention_bias
    # Qwen2.5-0.5B: 494,032,768 parameters (Hub safetensors metadata).
    assert count_parameters(model) == 494_032_768


@pytest.mark.parametrize(
    ("file", "message"),
    [
        ("unsupported.json", "model_type 'xlnet' is not supported"),
        ("broken.json", "not valid JSON"),
        ("missing_layers.json", "no 'num_hidden_layers'"),
    ],
)
def test_bad_configs_are_usage_errors_naming_model(
    catalog: Catalog, file: str, message: str
) -> None:
    with pytest.raises(UsageError, match=message) as info:
        resolve_model(str(CONFIGS / "bad" / file), catalog)
    assert info.value.flag == "--model"
    assert str(info.value).startswith("--model: ")


def test_folder_without_config(tmp_path: Path, catalog: Catalog) -> None:
    with pytest.raises(UsageError, match=r"has no config\.json"):
        resolve_model(str(tmp_path), catalog)


def test_config_that_is_not_an_object(tmp_path: Path, catalog: Catalog) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps([1, 2, 3]))
    with pytest.raises(UsageError, match=r"not a config\.json object"):
        resolve_model(str(path), catalog)


def test_config_with_inconsistent_heads(tmp_path: Path, catalog: Catalog) -> None:
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 1024,
                "intermediate_size": 4096,
                "num_hidden_layers": 4,
                "num_attention_heads": 16,
                "num_key_value_heads": 5,
                "vocab_size": 1000,
            }
        )
    )
    with pytest.raises(UsageError, match="multiple of kv_heads"):
        resolve_model(str(path), catalog)


@pytest.mark.parametrize("text", ["7B", "500M", "1.5b", "70B", "2M", "124000000"])
def test_bare_counts_give_a_model_of_that_size(catalog: Catalog, text: str) -> None:
    model = resolve_model(text, catalog)
    wanted = {"7B": 7e9, "500M": 5e8, "1.5b": 1.5e9, "70B": 70e9, "2M": 2e6, "124000000": 1.24e8}[
        text
    ]
    assert architecture(model).total_params == pytest.approx(wanted, rel=0.03)
    assert count_parameters(model) == pytest.approx(wanted, rel=0.03)
    assert model.mlp == "gated"


def test_synthetic_7b_has_a_llama_shape() -> None:
    model = synthetic_model(7_000_000_000)
    assert model.hidden_size == 4096  # Llama-2-7B's width
    assert 30 <= model.layers <= 34  # Llama-2-7B has 32
    assert model.heads == 32


@pytest.mark.parametrize(
    ("count", "layers"),
    [
        # the layer counts of the released models of those sizes
        # (catalog/shapes/reference_models.toml: Llama-7B, Llama-13B, Llama-3.1-70B, Llama-3.1-8B)
        (7_000_000_000, 32),
        (13_000_000_000, 40),
        (70_000_000_000, 80),
        (8_000_000_000, 32),
    ],
)
def test_synthetic_models_take_a_released_models_layer_count(count: int, layers: int) -> None:
    model = synthetic_model(count)
    assert model.layers == layers
    assert architecture(model).total_params == pytest.approx(count, rel=0.01)


@pytest.mark.parametrize("text", ["500M", "1B", "3B", "10B", "20B", "34B", "100B", "405B"])
def test_synthetic_layer_counts_are_released_ones(text: str) -> None:
    from hwdash.core.models.config import reference_shapes

    count = parse_count(text)
    model = synthetic_model(count)
    assert model.layers in {shape.layers for shape in reference_shapes()[0]}
    assert model.heads % model.kv_heads == 0
    assert architecture(model).total_params == pytest.approx(count, rel=0.01)


def test_synthetic_large_models_use_gqa() -> None:
    model = synthetic_model(70_000_000_000)
    assert model.kv_heads == 8
    assert model.heads % 8 == 0


def test_too_small_a_count_is_rejected(catalog: Catalog) -> None:
    with pytest.raises(UsageError, match="too small"):
        resolve_model("1000", catalog)


def test_unknown_model_suggests_close_matches(catalog: Catalog) -> None:
    with pytest.raises(UsageError) as info:
        resolve_model("fx-8b", catalog)
    assert "did you mean" in str(info.value)
    assert "fx-8b-gqa" in str(info.value)
    assert info.value.flag == "--model"


def test_unknown_model_on_the_real_catalog() -> None:
    real = load_catalog(include_user=False)
    with pytest.raises(UsageError, match=r"qwen2\.5-7b"):
        resolve_model("qwen2.5-7", real)


def test_missing_json_path(catalog: Catalog) -> None:
    with pytest.raises(UsageError, match="no such file"):
        resolve_model("does/not/exist/config.json", catalog)


# -- hostile or odd config.json files: a usage error naming the file and the field, never a crash ---

_TINY_CONFIG = {
    "model_type": "llama",
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "vocab_size": 1000,
}


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"num_experts": 4, "num_experts_per_tok": "two"}, "num_experts_per_tok"),
        ({"num_experts": 4, "num_experts_per_tok": [2]}, "num_experts_per_tok"),
        ({"num_experts": 4, "num_experts_per_tok": 8}, "num_experts_per_tok"),
        ({"vocab_size": 10**400}, "vocab_size"),
        ({"hidden_size": 1.5}, "hidden_size"),
        ({"num_hidden_layers": True}, "num_hidden_layers"),
        ({"tie_word_embeddings": "false"}, "tie_word_embeddings"),
        ({"attention_bias": 1}, "attention_bias"),
        ({"model_type": ["llama"]}, "model_type"),
        ({"num_key_value_heads": 3}, "kv_heads"),
        ({"head_dim": False}, "head_dim"),
        ({"num_experts": False}, "num_experts"),
        ({"num_local_experts": "8"}, "num_local_experts"),
        ({"num_local_experts": 10**6}, "num_local_experts"),
        ({"num_experts": 4, "moe_intermediate_size": False}, "moe_intermediate_size"),
    ],
)
def test_hostile_config_values_are_usage_errors_naming_the_field(
    tmp_path: Path, catalog: Catalog, changes: dict[str, object], field: str
) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**_TINY_CONFIG, **changes}))
    with pytest.raises(UsageError) as caught:
        resolve_model(str(path), catalog)
    assert str(path) in str(caught.value)
    assert field in str(caught.value)


def test_a_deeply_nested_config_is_a_usage_error(tmp_path: Path, catalog: Catalog) -> None:
    path = tmp_path / "config.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(UsageError, match="nested too deeply"):
        resolve_model(str(path), catalog)


def test_tie_word_embeddings_false_as_a_real_boolean_is_honoured(
    tmp_path: Path, catalog: Catalog
) -> None:
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps({**_TINY_CONFIG, "model_type": "gemma", "tie_word_embeddings": False})
    )
    assert resolve_model(str(path), catalog).tied_embeddings is False


# -- quantized checkpoints count their weights at their precision ----------------------------------

_LLAMA_8B = {
    "model_type": "llama",
    "num_hidden_layers": 32,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
}


@pytest.mark.parametrize(
    ("quantization", "bits"),
    [
        ({"quant_method": "gptq", "bits": 4, "group_size": 128}, 4),
        ({"quant_method": "awq", "bits": 4}, 4),
        ({"quant_method": "bitsandbytes", "load_in_4bit": True}, 4),
        ({"quant_method": "bitsandbytes", "load_in_8bit": True}, 8),
        ({"load_in_8bit": True}, 8),
    ],
)
def test_quantized_checkpoints_load_at_their_precision(
    tmp_path: Path, catalog: Catalog, quantization: dict[str, object], bits: int
) -> None:
    from hwdash.core.estimator import estimate_memory
    from hwdash.core.plan import Method, Plan

    path = tmp_path / "config.json"
    path.write_text(json.dumps({**_LLAMA_8B, "quantization_config": quantization}))
    quantized = resolve_model(str(path), catalog)
    assert quantized.checkpoint_bits == bits
    full = model_from_config(_LLAMA_8B, name="llama", source="test")
    plan = Plan(model="x", method=Method.INFERENCE, seq=1024)
    weights = estimate_memory(plan, quantized).per_gpu.weights
    sixteen = estimate_memory(plan, full).per_gpu.weights
    # The block linears shrink to about bits/16 of their 16-bit size; embeddings stay 16-bit.
    assert weights < sixteen * (0.40 if bits == 4 else 0.65)
    assert weights > sixteen * (bits / 16) * 0.9
    # LoRA on the 4-bit checkpoint trains over 4-bit weights: the QLoRA base.
    if bits == 4:
        lora = estimate_memory(Plan(model="x", method=Method.LORA, seq=512), quantized)
        qlora = estimate_memory(Plan(model="x", method=Method.QLORA, seq=512), full)
        assert lora.per_gpu.weights == qlora.per_gpu.weights


def test_a_quantized_checkpoint_cannot_be_fully_fine_tuned(
    tmp_path: Path, catalog: Catalog, capsys: pytest.CaptureFixture[str]
) -> None:
    from hwdash.cli import main

    folder = tmp_path / "llama-gptq"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps({**_LLAMA_8B, "quantization_config": {"quant_method": "gptq", "bits": 4}})
    )
    assert main(["plan", "--model", str(folder), "--method", "full"]) == 2
    assert "4-bit checkpoint" in capsys.readouterr().err


def test_an_unknown_quantization_is_refused_not_counted_as_16_bit(
    tmp_path: Path, catalog: Catalog
) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**_LLAMA_8B, "quantization_config": {"quant_method": "hqq"}}))
    with pytest.raises(UsageError, match="hqq"):
        resolve_model(str(path), catalog)


@pytest.mark.parametrize("key", ["num_hidden_layers", "model_type", "tie_word_embeddings"])
def test_a_value_nested_past_the_recursion_limit_is_a_usage_error(key: str) -> None:
    # Parsed JSON cannot nest this deep, but model_from_config takes any dict: its message must
    # not need repr() of the value.
    nested: list[object] = []
    for _ in range(5000):
        nested = [nested]
    with pytest.raises(UsageError, match=key):
        model_from_config({**_TINY_CONFIG, key: nested}, name="deep", source="deep/config.json")


def test_null_fields_take_their_defaults_and_zero_experts_is_dense() -> None:
    # Hugging Face writes None as null: "no GQA", "head_dim from the width", "no experts".
    config = {
        **_TINY_CONFIG,
        "num_key_value_heads": None,
        "head_dim": None,
        "num_local_experts": None,
        "num_experts": 0,
        "moe_intermediate_size": None,
    }
    model = model_from_config(config, name="nulls", source="nulls/config.json")
    assert (model.kv_heads, model.head_dim, model.experts) == (4, 16, 1)


def test_an_unsupported_model_type_is_named_on_one_line() -> None:
    # found by the config.json fuzz test in CI: a model_type holding a newline was printed raw, so
    # the one-line error ran over two lines
    with pytest.raises(UsageError) as info:
        model_from_config({"model_type": "\n", "num_hidden_layers": 2}, name="x", source="c.json")
    assert "\n" not in str(info.value)
    assert "model_type '\\n' is not supported" in str(info.value)
