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
from hwdash.core.catalog import Catalog, load_catalog
from hwdash.core.estimator import architecture, lora_adapter_params, resolve_lora_targets
from hwdash.core.models.config import model_from_config, model_from_config_file
from hwdash.core.specs import ModelSpec

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


# -- modules_to_save and LoRA on the embedding and LM head --------------------------------------


def _lora(real_catalog: Catalog, model_id: str, **fields: object) -> object:
    from hwdash.core.estimator import estimate_memory
    from hwdash.core.plan import Method, Plan

    plan = Plan(model=model_id, method=Method.LORA, batch=1, seq=512, lora_dropout=0, **fields)
    return estimate_memory(plan, real_catalog.models[model_id])


def test_modules_to_save_trains_a_full_copy_of_each(real_catalog: Catalog) -> None:
    # PEFT's ModulesToSaveWrapper keeps the frozen original and trains a deep copy in the base's
    # dtype: bf16 weights, gradients and two Adam states per copied parameter. qwen2.5-0.5b ties
    # its head to the embedding; each wrapped module still gets a copy of its own (traced: peft
    # 0.21 gives embed_tokens and lm_head two separate trainable 151936 x 896 weights).
    plain = _lora(real_catalog, "qwen2.5-0.5b")
    saved = _lora(real_catalog, "qwen2.5-0.5b", lora_modules_to_save=("embed_tokens", "lm_head"))
    copies = 2 * 151936 * 896
    assert saved.trainable_params - plain.trainable_params == copies  # type: ignore[attr-defined]
    assert saved.per_gpu.weights - plain.per_gpu.weights == 2 * copies  # type: ignore[attr-defined]
    assert saved.per_gpu.optimizer - plain.per_gpu.optimizer == 4 * copies  # type: ignore[attr-defined]


def test_lora_on_embedding_and_head_adds_r_times_vocab_plus_hidden_each(
    real_catalog: Catalog,
) -> None:
    # lora.Embedding: lora_embedding_A r x vocab and lora_embedding_B hidden x r; the head's
    # lora_A r x hidden and lora_B vocab x r (peft/tuners/lora/layer.py)
    block = ("q_proj", "v_proj")
    plain = _lora(real_catalog, "llama-3.2-1b", lora_targets=block, lora_r=16)
    both = _lora(
        real_catalog, "llama-3.2-1b", lora_targets=(*block, "embed_tokens", "lm_head"), lora_r=16
    )
    extra = both.trainable_params - plain.trainable_params  # type: ignore[attr-defined]
    assert extra == 2 * 16 * (128256 + 2048)


def test_gpt2_names_its_embedding_wte(capsys: pytest.CaptureFixture[str]) -> None:
    config = str(FAMILIES / "gpt2" / "config.json")
    argv = ["plan", "--model", config, "--method", "lora", "--lora-targets", "c_attn", "--json"]
    assert main([*argv, "--lora-modules-to-save", "wte,lm_head"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["plan"]["lora_modules_to_save"] == ["wte", "lm_head"]
    assert document["plan"]["trainable_params"] == 12 * 16 * (768 + 3 * 768) + 2 * 50257 * 768
    status = main([*argv, "--lora-modules-to-save", "embed_tokens"])
    assert status == 2
    assert "it counts the model's wte and lm_head" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "flag", "text"),
    [
        (["--lora-targets", "lm_head"], "--lora-targets", "alone is not counted"),
        (
            ["--lora-targets", "q_proj,lm_head", "--lora-modules-to-save", "lm_head"],
            "--lora-modules-to-save",
            "both a LoRA target and trained in full",
        ),
        (
            ["--lora-modules-to-save", "lm_head", "--fsdp", "full", "--gpus", "2"],
            "--lora-modules-to-save",
            "not counted under --fsdp",
        ),
    ],
)
def test_setups_not_counted_are_refused_naming_the_flag(
    capsys: pytest.CaptureFixture[str], extra: list[str], flag: str, text: str
) -> None:
    status = main(["plan", "--model", "qwen2.5-0.5b", "--method", "lora", *extra])
    assert status == 2
    err = capsys.readouterr().err
    assert f"error: {flag}:" in err and text in err


def test_trainer_export_carries_modules_to_save_and_reads_it_back(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "train.py"
    given = ["--model", "qwen2.5-0.5b", "--method", "lora", "--flavor", "l4x1"]
    extra = ["--lora-targets", "q_proj,v_proj,embed_tokens", "--lora-modules-to-save", "lm_head"]
    assert main(["plan", *given, *extra, "--export", "trainer", "-o", str(path)]) in (0, 1)
    text = path.read_text()
    assert "modules_to_save=['lm_head']" in text or 'modules_to_save=["lm_head"]' in text
    capsys.readouterr()
    assert main(["plan", *given, "--from", str(path), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)["plan"]
    assert plan["lora_targets"] == ["q_proj", "v_proj", "embed_tokens"]
    assert plan["lora_modules_to_save"] == ["lm_head"]


def test_native_names_round_trip_through_the_trainer_export(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = str(FAMILIES / "pythia-1.4b" / "config.json")
    path = tmp_path / "train.py"
    given = ["--model", config, "--method", "lora", "--flavor", "l4x1"]
    extra = [
        "--lora-targets",
        "query_key_value,dense_4h_to_h",
        "--lora-modules-to-save",
        "embed_in",
    ]
    assert main(["plan", *given, *extra, "--export", "trainer", "-o", str(path)]) in (0, 1)
    capsys.readouterr()
    assert main(["plan", *given, "--from", str(path), "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)["plan"]
    assert plan["lora_targets"] == ["query_key_value", "dense_4h_to_h"]
    assert plan["lora_modules_to_save"] == ["embed_in"]


@pytest.mark.parametrize(
    ("name", "lines"),
    [
        (
            "axolotl.yaml",
            [
                "base_model: qwen2.5-0.5b",
                "adapter: lora",
                "lora_target_modules: [q_proj, v_proj]",
                "lora_modules_to_save: [embed_tokens, lm_head]",
            ],
        ),
        (
            "llamafactory.yaml",
            [
                "model_name_or_path: qwen2.5-0.5b",
                "stage: sft",
                "finetuning_type: lora",
                "lora_target: q_proj,v_proj",
                "additional_target: embed_tokens,lm_head",
            ],
        ),
    ],
)
def test_from_reads_the_modules_to_save_of_axolotl_and_llama_factory(
    tmp_path: Path, name: str, lines: list[str]
) -> None:
    from hwdash.core.plans.imports import read_plan_file

    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    found = read_plan_file(path)
    assert found.updates["lora_targets"] == ("q_proj", "v_proj")
    assert found.updates["lora_modules_to_save"] == ("embed_tokens", "lm_head")
    assert "additional_target" not in found.ignored and "lora_modules_to_save" not in found.ignored


@pytest.mark.parametrize(
    ("family", "targets"), [("flan-t5-large", ("q", "v")), ("phi-2-like", None), ("gpt2", None)]
)
def test_make_it_fit_offers_attention_only_lora_by_native_names(
    real_catalog: Catalog, family: str, targets: tuple[str, ...] | None
) -> None:
    from hwdash.core.plan import Method, Plan
    from hwdash.core.planning.fit_options import knobs_for

    model = real_catalog.models["phi-2"] if family == "phi-2-like" else _model(family)
    plan = Plan(model=family, method=Method.LORA)
    offered = [
        setting.updates["lora_targets"]
        for knob in knobs_for(plan, model, 1)
        if knob.name == "lora_targets"
        for setting in knob.settings
    ]
    if family == "phi-2-like":
        assert offered == [("q_proj", "v_proj")]
    elif targets is None:
        # GPT-2 fuses q, k and v into c_attn: there is no q-and-v-only choice
        assert offered == []
    else:
        assert offered == [targets]
