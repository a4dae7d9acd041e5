"""LoRA targets by the model's own module names, as PEFT takes them (issue 24).

PEFT selects a module when its dotted name is the target or ends with ``"." + target``
(``check_target_module_exists``, peft/tuners/tuners_utils.py); each family's names are those of its
transformers modeling file (catalog/shapes/module_names.toml). Fused projections (GPT-2's
``c_attn``, GPT-NeoX's ``query_key_value``, Phi-3's ``qkv_proj``) are one matrix, so one adapter.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hwdash.cli import main
from hwdash.core.catalog import Catalog, ModelSpec, load_catalog
from hwdash.core.estimator import architecture, lora_adapter_params, resolve_lora_targets
from hwdash.core.models import model_from_config, model_from_config_file

FAMILIES = Path(__file__).resolve().parent.parent / "data" / "model_configs" / "families"


def _model(name: str) -> ModelSpec:
    return model_from_config_file(FAMILIES / name / "config.json")


@pytest.fixture(scope="module")
def real_catalog() -> Catalog:
    return load_catalog(include_user=False)


def _paths(model: ModelSpec, *targets: str) -> list[str]:
    return [linear.path for linear in resolve_lora_targets(architecture(model), targets)]


@pytest.mark.parametrize(
    ("family", "targets", "paths"),
    [
        ("gpt2", ("c_attn",), ["attn.c_attn"]),
        # "c_proj" ends both GPT-2 projections' names, as in PEFT
        ("gpt2", ("c_proj",), ["attn.c_proj", "mlp.c_proj"]),
        ("gpt2", ("mlp.c_proj", "c_fc"), ["mlp.c_fc", "mlp.c_proj"]),
        ("gpt_bigcode-santacoder", ("c_attn", "c_fc"), ["attn.c_attn", "mlp.c_fc"]),
        ("pythia-1.4b", ("query_key_value",), ["attention.query_key_value"]),
        (
            "gpt-neox-20b",
            ("dense", "dense_h_to_4h", "dense_4h_to_h"),
            ["attention.dense", "mlp.dense_h_to_4h", "mlp.dense_4h_to_h"],
        ),
        (
            "bloom-560m",
            ("query_key_value", "dense"),
            ["self_attention.query_key_value", "self_attention.dense"],
        ),
        ("falcon-7b", ("query_key_value",), ["self_attention.query_key_value"]),
        (
            "t5-base",
            ("q", "v", "wi", "wo"),
            ["SelfAttention.q", "SelfAttention.v", "DenseReluDense.wi", "DenseReluDense.wo"],
        ),
        ("flan-t5-large", ("wi_0", "wi_1"), ["DenseReluDense.wi_0", "DenseReluDense.wi_1"]),
        ("OLMo-1B-hf", ("q_proj", "down_proj"), ["self_attn.q_proj", "mlp.down_proj"]),
    ],
)
def test_native_names_select_the_families_modules(
    family: str, targets: tuple[str, ...], paths: list[str]
) -> None:
    assert _paths(_model(family), *targets) == paths


@pytest.mark.parametrize(
    ("family", "typed", "listed"),
    [
        ("gpt2", "q_proj", "c_attn, c_proj, c_fc"),
        ("pythia-1.4b", "o_proj", "query_key_value, dense, dense_h_to_4h, dense_4h_to_h"),
        ("bloom-7b1", "c_attn", "query_key_value, dense, dense_h_to_4h, dense_4h_to_h"),
        ("flan-t5-large", "q_proj", "q, k, v, o, wi_0, wi_1, wo"),
    ],
)
def test_a_name_the_model_lacks_is_refused_with_its_real_names(
    family: str, typed: str, listed: str
) -> None:
    with pytest.raises(ValueError, match=f"no module '{typed}'") as info:
        resolve_lora_targets(architecture(_model(family)), (typed,))
    assert f"its linear modules: {listed}, all-linear" in str(info.value)


def test_fused_qkv_is_one_adapter_as_peft_builds_it() -> None:
    # GPT-2's c_attn is one Conv1D of n_embd -> 3 * n_embd (modeling_gpt2.py): one lora_A of
    # r x h and one lora_B of 3h x r, not three pairs
    model = _model("gpt2")
    arch = architecture(model)
    h, r = model.hidden_size, 8
    (c_attn,) = resolve_lora_targets(arch, ("c_attn",))
    assert (c_attn.in_features, c_attn.out_features, c_attn.bias) == (h, 3 * h, True)
    assert lora_adapter_params(arch, (c_attn,), r) == model.layers * r * (h + 3 * h)
    every = resolve_lora_targets(arch, ("all-linear",))
    per_layer = r * (h + 3 * h) + r * (h + h) + r * (h + 4 * h) + r * (4 * h + h)
    assert lora_adapter_params(arch, every, r) == model.layers * per_layer
    # the parameter count is the same as with separate projections
    assert arch.total_params == pytest.approx(124_439_808, rel=1e-6)


def test_falcon_multi_query_fuses_one_kv_head() -> None:
    # FalconAttention: query_key_value of hidden -> (heads + 2 * kv_heads) * head_dim
    model = _model("falcon-7b")
    (qkv,) = resolve_lora_targets(architecture(model), ("query_key_value",))
    assert qkv.out_features == (model.heads + 2 * model.kv_heads) * model.head_dim == 4544 + 128


def test_phi3_fuses_qkv_and_gate_up() -> None:
    config = {
        "model_type": "phi3",
        "num_hidden_layers": 2,
        "hidden_size": 256,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "intermediate_size": 512,
        "vocab_size": 1000,
    }
    model = model_from_config(config, name="tiny-phi3", source="test")
    arch = architecture(model)
    assert [linear.path for linear in arch.linears] == [
        "self_attn.qkv_proj",
        "self_attn.o_proj",
        "mlp.gate_up_proj",
        "mlp.down_proj",
    ]
    qkv, gate_up = resolve_lora_targets(arch, ("qkv_proj", "gate_up_proj"))
    assert qkv.out_features == 256 + 2 * 128
    assert gate_up.out_features == 2 * 512


def test_phi2_takes_dense_and_refuses_o_proj(real_catalog: Catalog) -> None:
    arch = architecture(real_catalog.models["phi-2"])
    assert [linear.name for linear in resolve_lora_targets(arch, ("dense",))] == ["o_proj"]
    with pytest.raises(ValueError, match="q_proj, k_proj, v_proj, dense, fc1, fc2"):
        resolve_lora_targets(arch, ("o_proj",))


def test_mixtral_keeps_its_older_expert_names(real_catalog: Catalog) -> None:
    arch = architecture(real_catalog.models["mixtral-8x7b"])
    names = [linear.name for linear in resolve_lora_targets(arch, ("w1", "w2", "w3"))]
    assert names == ["gate_proj", "up_proj", "down_proj"]
    # a dense Llama never had them: PEFT would find no such module
    with pytest.raises(ValueError, match="no module 'w1'"):
        resolve_lora_targets(architecture(real_catalog.models["llama-3.2-1b"]), ("w1",))


def test_cli_plans_with_native_names(capsys: pytest.CaptureFixture[str]) -> None:
    config = str(FAMILIES / "gpt2" / "config.json")
    argv = ["plan", "--model", config, "--method", "lora", "--json"]
    assert main([*argv, "--lora-targets", "c_attn,c_proj", "--lora-r", "8"]) == 0
    document = json.loads(capsys.readouterr().out)
    h, layers = 768, 12
    # c_attn (h -> 3h) and both c_proj (h -> h, 4h -> h)
    per_layer = 8 * ((h + 3 * h) + (h + h) + (4 * h + h))
    assert document["plan"]["trainable_params"] == layers * per_layer


def test_cli_refuses_a_name_the_model_lacks(capsys: pytest.CaptureFixture[str]) -> None:
    config = str(FAMILIES / "gpt2" / "config.json")
    status = main(["plan", "--model", config, "--method", "lora", "--lora-targets", "q_proj"])
    assert status == 2
    err = capsys.readouterr().err
    assert "--lora-targets" in err
    assert "no module 'q_proj'" in err
    assert "c_attn, c_proj, c_fc" in err
