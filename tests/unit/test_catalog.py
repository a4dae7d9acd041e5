"""The built-in catalog, the loader's error messages, user overrides, and parameter counting."""

from __future__ import annotations

from pathlib import Path

import pytest

from hwdash.core.catalog import CatalogError, load_catalog, load_catalog_from, parse_catalog_file
from hwdash.core.data_files import packaged_catalog_dir
from hwdash.core.models.params import (
    count_active_parameters,
    count_parameters,
    parameter_breakdown,
)
from hwdash.core.specs import ModelSpec
from hwdash.core.units import GIB, MIB

DATA = Path(__file__).resolve().parent.parent / "data"
BAD = DATA / "catalog_bad"
USER = DATA / "catalog_user"

# Ids other parts of hwdash (planner, monitor, tests) rely on.
ACCELERATOR_IDS = [
    "t4",
    "l4",
    "a10g",
    "l40s",
    "a100-40gb",
    "a100-80gb",
    "h100-sxm",
    "h100-pcie",
    "h200",
    "rtx-3060",
    "rtx-3090",
    "rtx-4060",
    "rtx-4090",
    "rtx-5060",
    "rtx-pro-6000",
    "apple-m4-pro",
    "tpu-v5e",
    "cpu",
]
HF_JOBS_FLAVOR_IDS = [
    "cpu-basic",
    "cpu-upgrade",
    "cpu-performance",
    "cpu-xl",
    "t4-small",
    "t4-medium",
    "l4x1",
    "l4x4",
    "l40sx1",
    "l40sx4",
    "l40sx8",
    "a10g-small",
    "a10g-large",
    "a10g-largex2",
    "a10g-largex4",
    "a100-large",
    "a100x4",
    "a100x8",
    "h200",
    "h200x2",
    "h200x4",
    "h200x8",
    "rtx-pro-6000",
    "rtx-pro-6000x2",
    "rtx-pro-6000x4",
    "rtx-pro-6000x8",
]
TPU_FLAVOR_IDS = ["v5e-1x1", "v5e-2x2", "v5e-2x4"]
LOCAL_FLAVOR_IDS = [
    "local-rtx-5060",
    "local-rtx-4060",
    "local-rtx-3060",
    "local-rtx-4090",
    "local-rtx-3090",
    "local-m4-pro-32gb",
    "local-2x-rtx-3090",
    "local-a100-80gb",
    "local-2x-a100-80gb",
    "local-a100-40gb",
    "local-2x-a100-40gb",
    "local-4x-a100-40gb",
    "local-cpu",
]
MODEL_IDS = [
    "qwen2.5-0.5b",
    "qwen2.5-1.5b",
    "qwen2.5-3b",
    "qwen2.5-7b",
    "qwen2.5-14b",
    "qwen2.5-32b",
    "qwen2.5-72b",
    "tinyllama-1.1b",
    "phi-2",
    "mistral-7b",
    "llama-3-8b",
    "llama-3-70b",
    "llama-3.1-8b",
    "llama-3.1-70b",
    "llama-3.2-1b",
    "llama-3.2-3b",
    "mixtral-8x7b",
    "qwen3-0.6b",
    "qwen3-1.7b",
    "qwen3-4b",
    "qwen3-8b",
    "qwen3-14b",
    "qwen3-32b",
    "gemma-2-2b",
    "gemma-2-9b",
    "gemma-2-27b",
    "gemma-3-1b",
    "gemma-3-4b",
    "gemma-3-12b",
    "gemma-3-27b",
    "seed-2m",
    "seed-10m",
    "seed-70m",
    "seed-200m",
]

BUILTIN = load_catalog_from([packaged_catalog_dir()])


@pytest.fixture(autouse=True)
def _no_user_catalog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the developer's own ~/.config/hwdash/catalog and HWDASH_CATALOG out of every test."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "empty-config"))
    monkeypatch.delenv("HWDASH_CATALOG", raising=False)


# --- the built-in catalog ------------------------------------------------------------------------


def test_every_file_in_catalog_dir_loads_and_is_counted() -> None:
    files = sorted(packaged_catalog_dir().glob("*.toml"))
    assert [Path(f).name for f in BUILTIN.files] == [f.name for f in files]
    for path in files:
        parsed = parse_catalog_file(path)
        assert any(parsed.values()), f"{path.name} holds no entries"


def test_required_ids_are_present() -> None:
    assert set(ACCELERATOR_IDS) <= set(BUILTIN.accelerators)
    flavor_ids = HF_JOBS_FLAVOR_IDS + TPU_FLAVOR_IDS + LOCAL_FLAVOR_IDS
    assert set(flavor_ids) <= set(BUILTIN.flavors)
    assert set(MODEL_IDS) <= set(BUILTIN.models)


def test_providers_match_the_flavor_groups() -> None:
    for ident in HF_JOBS_FLAVOR_IDS:
        assert BUILTIN.flavors[ident].provider == "hf-jobs", ident
    for ident in TPU_FLAVOR_IDS:
        assert BUILTIN.flavors[ident].provider == "hf-tpu", ident
    for ident in LOCAL_FLAVOR_IDS:
        assert BUILTIN.flavors[ident].provider == "local", ident


def test_every_flavor_accelerator_exists() -> None:
    for flavor in BUILTIN.flavors.values():
        acc = BUILTIN.accelerator_for(flavor)
        if flavor.accelerator is None:
            assert flavor.gpu_count == 0, flavor.id
            assert flavor.ram_gb, f"CPU-only {flavor.id} needs ram_gb to be sized"
        else:
            assert acc is not None and acc.id == flavor.accelerator
            assert flavor.gpu_count >= 1


def test_every_hf_jobs_flavor_has_a_dated_sourced_price() -> None:
    for flavor in BUILTIN.flavors.values():
        if flavor.provider == "hf-jobs":
            assert flavor.price_per_hour is not None and flavor.price_per_hour > 0, flavor.id
            assert flavor.price_date, flavor.id
            assert flavor.price_source, flavor.id


def test_local_and_tpu_flavors_carry_no_price() -> None:
    for ident in LOCAL_FLAVOR_IDS + TPU_FLAVOR_IDS:
        assert BUILTIN.flavors[ident].price_per_hour is None, ident
    for ident in TPU_FLAVOR_IDS:
        assert "no price" in BUILTIN.flavors[ident].notes


def test_a100_large_uses_todays_80gb_card_and_keeps_the_seed_figure() -> None:
    flavor = BUILTIN.flavors["a100-large"]
    assert flavor.accelerator == "a100-80gb"
    assert flavor.price_per_hour == 2.50  # hub-docs jobs-pricing.md
    assert "40 GB" in flavor.notes and "$8-12" in flavor.notes


def test_multi_gpu_flavor_ids_match_their_gpu_count() -> None:
    expected = {"l4x4": 4, "l40sx8": 8, "a10g-largex2": 2, "a100x8": 8, "h200x4": 4}
    expected |= {"rtx-pro-6000x8": 8, "v5e-2x2": 4, "v5e-2x4": 8, "local-4x-a100-40gb": 4}
    for ident, count in expected.items():
        assert BUILTIN.flavors[ident].gpu_count == count, ident


def test_usable_memory_prefers_nvml_total() -> None:
    t4 = BUILTIN.accelerators["t4"]
    assert t4.usable_bytes == 15360 * MIB
    assert t4.usable_bytes < 16 * GIB  # NVML shows less than the 16 GiB of GDDR6 on the board
    # Apple unified memory: only a share of RAM is usable by the GPU.
    m4 = BUILTIN.accelerators["apple-m4-pro-32gb"]
    assert m4.usable_bytes == int(32e9 * m4.usable_memory_fraction)
    assert BUILTIN.flavors["local-m4-pro-32gb"].accelerator == "apple-m4-pro-32gb"


def test_t4_runs_fp16_and_a100_bf16() -> None:
    assert BUILTIN.accelerators["t4"].matmul_tflops() == (65, "fp16")
    assert BUILTIN.accelerators["a100-80gb"].matmul_tflops() == (312, "bf16")


def test_nvml_names_are_unique_and_match() -> None:
    seen: dict[str, str] = {}
    for acc in BUILTIN.accelerators.values():
        for name in acc.nvml_names:
            assert name not in seen, f"{name} on both {seen[name]} and {acc.id}"
            seen[name] = acc.id
    assert BUILTIN.match_nvml_name("NVIDIA A100-SXM4-80GB") is BUILTIN.accelerators["a100-80gb"]
    assert BUILTIN.match_nvml_name("Tesla T4") is BUILTIN.accelerators["t4"]
    assert BUILTIN.match_nvml_name("NVIDIA GeForce GTX 1080") is None


def test_default_mfu_is_marked_as_a_guess() -> None:
    for acc in BUILTIN.accelerators.values():
        assert "guess" in acc.source.lower(), acc.id


def test_find_model_by_id_name_or_hub_id() -> None:
    assert BUILTIN.find_model("Qwen2.5-7B") is BUILTIN.models["qwen2.5-7b"]
    assert BUILTIN.find_model("meta-llama/Llama-3.1-8B") is BUILTIN.models["llama-3.1-8b"]
    assert BUILTIN.find_model("no-such-model") is None


# --- parameter counts ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "model_id", [m.id for m in BUILTIN.models.values() if m.params is not None]
)
def test_counted_parameters_within_3_percent_of_published(model_id: str) -> None:
    model = BUILTIN.models[model_id]
    assert model.params is not None
    counted = count_parameters(model)
    assert abs(counted - model.params) / model.params < 0.03, (counted, model.params)


def test_every_non_seed_model_has_a_published_count() -> None:
    for model in BUILTIN.models.values():
        if not model.id.startswith("seed-"):
            assert model.params is not None, model.id


def _tiny(**changes: object) -> ModelSpec:
    fields: dict[str, object] = dict(
        id="tiny",
        name="tiny",
        layers=2,
        hidden_size=8,
        heads=4,
        kv_heads=2,
        head_dim=2,
        intermediate_size=16,
        vocab_size=10,
        max_context=32,
        source="test",
    )
    fields.update(changes)
    return ModelSpec.model_validate(fields)


def test_count_parameters_by_hand() -> None:
    # embedding 10*8 = 80, untied head 80;
    # per layer: q 8*8=64, k and v 8*4=32 each, o 64 -> 192; gated MLP 3*8*16 = 384; 2 layers -> 1152;
    # norms (2*2+1)*8 = 40.
    assert count_parameters(_tiny()) == 80 + 80 + 1152 + 40
    # tying drops the head; q/k/v biases add 8+4+4 per layer; a standard MLP has 2 matrices.
    assert count_parameters(_tiny(tied_embeddings=True)) == 80 + 1152 + 40
    assert count_parameters(_tiny(attention_bias=True)) == 80 + 80 + 1152 + 2 * 16 + 40
    assert count_parameters(_tiny(mlp="standard")) == 80 + 80 + 2 * (192 + 256) + 40


def test_moe_counts_every_expert_and_a_router_but_activates_top_k() -> None:
    dense = _tiny()
    moe = _tiny(experts=4, experts_per_token=2)
    per_layer_extra = 3 * 384 + 8 * 4  # three more experts and an 8x4 router
    assert count_parameters(moe) == count_parameters(dense) + 2 * per_layer_extra
    assert count_active_parameters(moe) == count_parameters(moe) - 2 * 2 * 384
    assert count_active_parameters(dense) == count_parameters(dense)


def test_mixtral_active_parameters_match_the_paper() -> None:
    # Mixtral of Experts (Jiang et al. 2024): 47B total, 13B active per token.
    mixtral = BUILTIN.models["mixtral-8x7b"]
    assert abs(count_active_parameters(mixtral) - 12.9e9) / 12.9e9 < 0.03


def test_breakdown_sums_to_total() -> None:
    model = BUILTIN.models["qwen2.5-7b"]
    parts = parameter_breakdown(model)
    assert parts.total == count_parameters(model)
    assert parts.lm_head == parts.embedding  # Qwen2.5-7B does not tie embeddings
    assert parameter_breakdown(BUILTIN.models["qwen2.5-0.5b"]).lm_head == 0


# --- broken files: one fixture per failure mode --------------------------------------------------

# (fixture, entry named in the message, field named, words of the reason)
FAILURES = [
    ("unknown_field.toml", "accelerator 'typo-gpu'", "memory_gib", "unknown field"),
    ("wrong_type.toml", "model 'wrong-type-model'", "layers", "valid integer"),
    ("duplicate_id.toml", "flavor 'twin-box'", "id", "duplicate id"),
    ("negative_memory.toml", "accelerator 'minus-gpu'", "memory_gb", "greater than or equal to 0"),
    ("unknown_accelerator.toml", "flavor 'mystery-box'", "accelerator", "unknown accelerator"),
    ("missing_field.toml", "accelerator 'unsourced-gpu'", "source", "required"),
    ("price_without_date.toml", "flavor 'undated-box'", "price_date", "needs price_date"),
    ("uppercase_id.toml", "model 'My-Model'", "id", "lowercase"),
    ("infinite_memory.toml", "accelerator 'endless-gpu'", "memory_gb", "finite number"),
    ("infinite_price.toml", "flavor 'priceless-box'", "price_per_hour", "finite number"),
    ("string_bool.toml", "accelerator 'stringly-gpu'", "bf16", "valid boolean"),
    ("too_many_experts.toml", "model 'greedy-moe'", "experts_per_token", "larger than experts"),
    ("huge_vocab.toml", "model 'endless-vocab'", "vocab_size", "less than or equal"),
    ("vanishing_rate.toml", "accelerator 'crawling-gpu'", "bf16_tflops", "greater than or equal"),
    (
        "vanishing_bandwidth.toml",
        "accelerator 'trickle-gpu'",
        "memory_bandwidth_gbps",
        "greater than or equal",
    ),
]


@pytest.mark.parametrize(("name", "entry", "field", "reason"), FAILURES)
def test_bad_file_message_names_file_entry_and_field(
    name: str, entry: str, field: str, reason: str
) -> None:
    path = BAD / name
    with pytest.raises(CatalogError) as caught:
        load_catalog_from([packaged_catalog_dir(), path])
    error = caught.value
    assert error.path == str(path)
    assert error.entry == entry
    assert error.field == field
    message = str(error)
    assert message.startswith(str(path))
    assert f"{entry}: field '{field}'" in message
    assert reason in message
    assert "\n" not in message


def test_bad_toml_names_file_and_line() -> None:
    path = BAD / "bad_toml.toml"
    with pytest.raises(CatalogError) as caught:
        load_catalog_from([packaged_catalog_dir(), path])
    message = str(caught.value)
    assert message.startswith(str(path)) and "not valid TOML" in message and "line 5" in message


def test_unknown_table_names_file_and_table() -> None:
    path = BAD / "unknown_table.toml"
    with pytest.raises(CatalogError) as caught:
        parse_catalog_file(path)
    assert caught.value.entry is None
    assert str(caught.value).startswith(str(path))
    assert "unknown table 'gpu'" in str(caught.value)


def test_every_bad_fixture_is_covered() -> None:
    covered = {name for name, *_ in FAILURES} | {"bad_toml.toml", "unknown_table.toml"}
    assert {p.name for p in BAD.glob("*.toml")} == covered


def test_same_id_in_two_files_of_one_folder_is_an_error(tmp_path: Path) -> None:
    text = (USER / "my-hardware.toml").read_text(encoding="utf-8")
    (tmp_path / "a.toml").write_text(text, encoding="utf-8")
    (tmp_path / "b.toml").write_text(text, encoding="utf-8")
    with pytest.raises(CatalogError) as caught:
        load_catalog_from([packaged_catalog_dir(), tmp_path])
    assert caught.value.path == str(tmp_path / "b.toml")
    assert caught.value.field == "id"
    assert "a.toml" in str(caught.value)


def test_missing_catalog_folder_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(CatalogError, match="no such catalog folder"):
        load_catalog([tmp_path / "nowhere"])


# --- user catalogs override by id ----------------------------------------------------------------


def _assert_user_example_applied(catalog_dirs: list[str | Path] | None = None) -> None:
    catalog = load_catalog(catalog_dirs or [])
    # Overridden by id: the built-in local 4090 box has no price; the example gives it one.
    assert BUILTIN.flavors["local-rtx-4090"].price_per_hour is None
    assert catalog.flavors["local-rtx-4090"].price_per_hour == 0.15
    # Added: a new accelerator and a flavor that uses it.
    assert "rtx-4080" not in BUILTIN.accelerators
    assert catalog.flavors["my-rtx-4080-box"].accelerator == "rtx-4080"
    assert catalog.accelerators["rtx-4080"].memory_gb == 16
    # Everything else is still there.
    assert set(BUILTIN.flavors) < set(catalog.flavors)
    assert catalog.files[-1] == str(USER / "my-hardware.toml")


def test_override_from_xdg_config_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "config" / "hwdash" / "catalog"
    folder.mkdir(parents=True)
    (folder / "my-hardware.toml").write_text(
        (USER / "my-hardware.toml").read_text(encoding="utf-8"), encoding="utf-8"
    )
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    catalog = load_catalog()
    assert catalog.flavors["local-rtx-4090"].price_per_hour == 0.15
    assert "rtx-4080" in catalog.accelerators
    assert load_catalog(include_user=False).flavors["local-rtx-4090"].price_per_hour is None


def test_override_from_hwdash_catalog_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HWDASH_CATALOG", str(USER))
    _assert_user_example_applied()


def test_override_from_catalog_flag() -> None:
    _assert_user_example_applied([USER])


def test_override_order_is_xdg_then_env_then_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def flavor_file(folder: Path, price: float) -> Path:
        folder.mkdir(parents=True)
        (folder / "price.toml").write_text(
            "[[flavor]]\n"
            'id = "t4-small"\nname = "T4 small"\nprovider = "hf-jobs"\naccelerator = "t4"\n'
            f'gpu_count = 1\nprice_per_hour = {price}\nprice_date = "2026-11-01"\nsource = "test"\n',
            encoding="utf-8",
        )
        return folder

    flavor_file(tmp_path / "config" / "hwdash" / "catalog", 1.0)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    assert load_catalog().flavors["t4-small"].price_per_hour == 1.0
    monkeypatch.setenv("HWDASH_CATALOG", str(flavor_file(tmp_path / "env", 2.0)))
    assert load_catalog().flavors["t4-small"].price_per_hour == 2.0
    flag = flavor_file(tmp_path / "flag", 3.0)
    assert load_catalog([flag]).flavors["t4-small"].price_per_hour == 3.0


def test_a_duplicate_id_in_one_file_is_refused_by_the_file_itself() -> None:
    # Not only by the folder-level check: parsing the one file must refuse it.
    with pytest.raises(CatalogError) as caught:
        parse_catalog_file(BAD / "duplicate_id.toml")
    assert "duplicate id in the same file" in str(caught.value)
    assert caught.value.entry == "flavor 'twin-box'"


def test_deeply_nested_overlay_is_a_catalog_error(tmp_path: Path) -> None:
    path = tmp_path / "deep.toml"
    path.write_text("x = " + "[" * 50_000 + "]" * 50_000 + "\n")
    with pytest.raises(CatalogError) as caught:
        load_catalog_from([packaged_catalog_dir(), path])
    assert caught.value.path == str(path)


def test_a_catalog_path_too_long_for_the_system_is_a_catalog_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ENAMETOOLONG is an OSError that pathlib's is_dir()/is_file() do not swallow.
    long_name = tmp_path / ("x" * 300)
    with pytest.raises(CatalogError, match="cannot be read") as caught:
        load_catalog_from([packaged_catalog_dir(), long_name])
    assert caught.value.path == str(long_name)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(long_name))
    with pytest.raises(CatalogError, match="cannot be read"):
        load_catalog()
