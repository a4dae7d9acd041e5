"""Fuzz the three ways outside data gets in: `hwdash plan` flags, config.json files and catalog
overlays. Each generated input must give a result or a usage error (exit 2), never a traceback, and
JSON output never holds NaN or Infinity.

The default run is sized for CI; ``HWDASH_FUZZ_EXAMPLES=10000`` runs the full 10,000 per kind.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hwdash.cli import main
from hwdash.core.catalog import CatalogError, load_catalog, load_catalog_from, packaged_catalog_dir
from hwdash.core.fit import evaluate_plan
from hwdash.core.models import model_from_config, model_from_config_file
from hwdash.core.plan import Method, Plan
from hwdash.errors import UsageError

EXAMPLES = int(os.environ.get("HWDASH_FUZZ_EXAMPLES", "150"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
CATALOG = load_catalog(include_user=False)

# -- values a hostile or careless file or command line holds ----------------------------------------

hostile_numbers = st.one_of(
    st.integers(min_value=-(10**6), max_value=10**6),
    st.integers(min_value=10**6, max_value=10**30),
    st.sampled_from([0, 1, 2, 10**400, -1, 2**63, 2**64 - 1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.5, 1.5, 1e308, -0.0]),
)
hostile_scalars = st.one_of(
    hostile_numbers,
    st.booleans(),
    st.none(),
    st.text(max_size=12),
    st.sampled_from(["false", "true", "two", "8", "1e9", "[/x]", "inf", "nan"]),
)
hostile_values = st.recursive(
    hostile_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)


def finite_json(document: Any) -> None:
    """The document dumps as strict JSON (no NaN, no Infinity)."""
    json.dumps(document, allow_nan=False)


def check_report(plan: Plan, catalog: Any = CATALOG, model: Any = None) -> None:
    """The plan on every flavor: a report whose JSON is finite, or a usage error (exit 2)."""
    try:
        report = evaluate_plan(plan, catalog, model)
    except UsageError:
        return
    finite_json(report.to_json())


# -- hwdash plan flags --------------------------------------------------------------------------

FLAG_VALUES: dict[str, st.SearchStrategy[str]] = {
    "--model": st.sampled_from(
        ["qwen2.5-0.5b", "qwen2.5-7b", "mixtral-8x7b", "7B", "0.1B", "9e99B", "x"]
    ),
    "--method": st.sampled_from([m.value for m in Method] + ["bogus"]),
    "--precision": st.sampled_from(["fp32", "amp", "bf16", "mixed", "int3"]),
    "--batch": st.sampled_from(["1", "4", "0", "-2", "65536", "10**9", "4.5", "1e9"]),
    "--seq": st.sampled_from(["1", "512", "4096", "0", "10000000", "99999999999", "nan"]),
    "--grad-accum": st.sampled_from(["1", "8", "0", "4097"]),
    "--lora-r": st.sampled_from(["1", "16", "0", "100000", "-3"]),
    "--lora-dropout": st.sampled_from(["0", "0.05", "1", "nan", "inf", "-0.1"]),
    "--zero": st.sampled_from(["0", "1", "2", "3", "4", "-1"]),
    "--offload": st.sampled_from(["none", "optimizer", "params", "disk"]),
    "--gpus": st.sampled_from(["1", "8", "0", "100001"]),
    "--examples": st.sampled_from(["1000", "1k", "10M", "0", "1e400", "nan", "-5", "9" * 30]),
    "--epochs": st.sampled_from(["1", "0.5", "inf", "nan", "1e308", "0", "-1"]),
    "--tokens": st.sampled_from(["1B", "0", "1e30", "5T", "abc"]),
    "--mfu": st.sampled_from(["0.4", "0", "1.5", "nan", "inf"]),
    "--vllm-util": st.sampled_from(["0", "0.3", "0.99", "1", "nan", "-1"]),
    "--attn": st.sampled_from(["flash", "sdpa", "eager", "magic"]),
    "--flavor": st.sampled_from(["l4x1", "a100-large", "nope", "l4x1,t4-small", "local"]),
    "--fit": st.sampled_from(["l4x1", "any", "local", "l4", "a10g-small"]),
    "--rl-method": st.sampled_from(["full", "lora", "qlora", "ppo"]),
}
SWITCHES = ["--grad-ckpt", "--no-reference", "--no-reward-model", "--check"]


@st.composite
def plan_argvs(draw: st.DrawFn) -> list[str]:
    argv: list[str] = []
    flags = draw(st.lists(st.sampled_from(sorted(FLAG_VALUES)), max_size=6, unique=True))
    if "--model" not in flags and draw(st.booleans()):
        flags.append("--model")
    for flag in flags:
        argv += [flag, draw(FLAG_VALUES[flag])]
    argv += draw(st.lists(st.sampled_from(SWITCHES), max_size=2, unique=True))
    return argv


@pytest.fixture
def quiet_machine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HWDASH_FAKE_NVML", "no-driver")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))


@FUZZ
@given(argv=plan_argvs())
def test_plan_flags_give_a_result_or_exit_2(
    quiet_machine: None, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    try:
        status = main(["plan", *argv, "--json"])
    except SystemExit as exc:  # argparse refusing a flag or a choice
        assert exc.code == 2
        capsys.readouterr()
        return
    captured = capsys.readouterr()
    assert status in (0, 1, 2), captured.err
    assert "Traceback" not in captured.err
    if status == 0 and "--check" not in argv:
        document = json.loads(captured.out)  # strict JSON: no NaN, no Infinity
        finite_json(document)
        assert math.isfinite(document["memory"]["total"])


# -- config.json --------------------------------------------------------------------------------

CONFIG_KEYS = [
    "model_type",
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "moe_intermediate_size",
    "vocab_size",
    "max_position_embeddings",
    "num_local_experts",
    "num_experts",
    "num_experts_per_tok",
    "tie_word_embeddings",
    "attention_bias",
    "text_config",
    "_name_or_path",
]
SANE_CONFIG = {
    "model_type": "llama",
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "vocab_size": 1000,
}


@st.composite
def configs(draw: st.DrawFn) -> dict[str, Any]:
    config: dict[str, Any] = dict(SANE_CONFIG) if draw(st.booleans()) else {}
    for key in draw(st.lists(st.sampled_from(CONFIG_KEYS), max_size=5, unique=True)):
        config[key] = draw(
            hostile_values
            | st.sampled_from(["llama", "qwen2_moe", "mixtral", "gemma2", "phi"])
            | st.integers(1, 10**5)
        )
    return config


@FUZZ
@given(config=configs())
def test_config_json_gives_a_model_or_a_usage_error(config: dict[str, Any]) -> None:
    try:
        model = model_from_config(config, name="fuzzed", source="fuzz")
    except UsageError:
        return
    check_report(Plan(model="fuzzed", batch=1, seq=128), model=model)


@settings(max_examples=max(20, EXAMPLES // 10), deadline=None)
@given(text=st.text(max_size=200) | st.binary(max_size=200).map(lambda b: b.decode("latin-1")))
def test_config_json_files_of_any_text_give_a_model_or_a_usage_error(
    tmp_path_factory: pytest.TempPathFactory, text: str
) -> None:
    path = tmp_path_factory.mktemp("cfg") / "config.json"
    path.write_text(text, encoding="utf-8")
    with contextlib.suppress(UsageError):  # a usage error is an answer; anything else fails
        model_from_config_file(path)


# -- catalog overlays ---------------------------------------------------------------------------


def toml_value(value: Any) -> str:
    """A TOML literal for a fuzzed value (TOML has inf and nan; None becomes an empty array)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        items = ", ".join(f"{json.dumps(str(k))} = {toml_value(v)}" for k, v in value.items())
        return "{" + items + "}"
    return "[]"


ENTRY_FIELDS = {
    "accelerator": {
        "id": "fuzz-gpu",
        "name": "Fuzz GPU",
        "vendor": "nvidia",
        "kind": "gpu",
        "memory_gb": 24,
        "bf16": True,
        "bf16_tflops": 100,
        "source": "fuzz",
    },
    "flavor": {
        "id": "fuzz-box",
        "name": "Fuzz box",
        "provider": "local",
        "accelerator": "fuzz-gpu",
        "gpu_count": 1,
        "source": "fuzz",
    },
    "model": {
        "id": "fuzz-model",
        "name": "Fuzz model",
        "layers": 2,
        "hidden_size": 64,
        "heads": 4,
        "kv_heads": 4,
        "head_dim": 16,
        "intermediate_size": 128,
        "vocab_size": 1000,
        "max_context": 2048,
        "source": "fuzz",
    },
}
OVERLAY_KEYS = sorted(
    {key for fields in ENTRY_FIELDS.values() for key in fields}
    | {"price_per_hour", "price_date", "nvml_total_mib", "experts", "experts_per_token", "ram_gb"}
)


@st.composite
def overlays(draw: st.DrawFn) -> str:
    lines = []
    for kind, base in ENTRY_FIELDS.items():
        entry: dict[str, Any] = dict(base)
        for key in draw(st.lists(st.sampled_from(OVERLAY_KEYS), max_size=3, unique=True)):
            entry[key] = draw(hostile_values)
        lines.append(f"[[{kind}]]")
        lines += [f"{key} = {toml_value(value)}" for key, value in entry.items()]
    if draw(st.integers(0, 9)) == 0:
        lines.append("deep = " + "[" * 3000 + "]" * 3000)
    return "\n".join(lines) + "\n"


@FUZZ
@given(text=overlays())
def test_catalog_overlays_load_or_name_the_problem(
    tmp_path_factory: pytest.TempPathFactory, text: str
) -> None:
    path = tmp_path_factory.mktemp("overlay") / "overlay.toml"
    path.write_text(text, encoding="utf-8")
    try:
        catalog = load_catalog_from([packaged_catalog_dir(), path])
    except CatalogError as exc:
        assert str(path) in str(exc)
        assert "\n" not in str(exc)
        return
    check_report(Plan(model="fuzz-model", batch=2, seq=256, examples=1000), catalog=catalog)
