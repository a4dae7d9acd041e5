"""Fuzz the three ways outside data gets in: `hwdash plan` flags, config.json files and catalog
overlays. Each generated input must give a result or a usage error (exit 2), never a traceback or an
unexpected exception, and JSON output never holds NaN or Infinity.

Each kind gets ``HWDASH_FUZZ_EXAMPLES`` examples (default 1000, sized for CI): most call the parsing
functions directly (argparse + ``plan_from_args``, ``model_from_config[_file]``, the catalog loader),
a tenth go through the whole CLI (``hwdash.cli.main``). ``HWDASH_FUZZ_EXAMPLES=10000`` is the full
run the reliability issue asks for.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from hwdash.cli import build_parser, main
from hwdash.commands.plan import FIELD_FLAGS, plan_from_args
from hwdash.commands.plan_args import plan_arguments
from hwdash.core import strict_json
from hwdash.core.catalog import Catalog, CatalogError, load_catalog, load_catalog_from
from hwdash.core.models.config import model_from_config, model_from_config_file, resolve_model
from hwdash.core.plan import (
    RL_TRAINABLE_METHODS,
    Attention,
    Method,
    Offload,
    Optimizer,
    OptimizerImpl,
    Plan,
    Precision,
)
from hwdash.core.planning.fit import evaluate_plan
from hwdash.core.specs import Accelerator, Flavor, ModelSpec, Slowdown
from hwdash.errors import UsageError

EXAMPLES = int(os.environ.get("HWDASH_FUZZ_EXAMPLES", "1000"))
#: A tenth of each kind goes through the whole CLI (slower: catalog loading, local GPU probe).
THROUGH_CLI = max(20, EXAMPLES // 10)
DIRECT = max(50, EXAMPLES - THROUGH_CLI)


def fuzz(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[
            HealthCheck.function_scoped_fixture,
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
        ],
    )


CATALOG = load_catalog(include_user=False)
PARSER = build_parser()


@pytest.fixture
def quiet_machine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No GPU, and no user catalog or plans file from the machine running the tests."""
    monkeypatch.setenv("HWDASH_FAKE_NVML", "no-driver")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.delenv("HWDASH_CATALOG", raising=False)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    return tmp_path


# -- values a hostile or careless file or command line holds ----------------------------------------

#: Just past the edges: denormals and huge floats (a "positive" rate of 5e-324 once made hours
#: infinite), integers past 64 bits and past any bound, negative zero.
EDGE_NUMBERS = [0, 1, 2, -1, 10**400, 2**63, 2**64 - 1, 10**18, 10**19, 100_001, 1_000_000_001]
EDGE_FLOATS = [5e-324, 1e-300, 1e-9, 0.5, 0.999, 1.5, 2.0, 1e308, -1e308, -0.0, 2.0**53]

hostile_numbers = st.one_of(
    st.integers(min_value=-(10**6), max_value=10**6),
    st.integers(min_value=10**6, max_value=10**30),
    st.sampled_from(EDGE_NUMBERS),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(EDGE_FLOATS),
)
hostile_scalars = st.one_of(
    hostile_numbers,
    st.booleans(),
    st.none(),
    st.text(max_size=12),
    st.sampled_from(["false", "true", "two", "8", "1e9", "[/x]", "inf", "nan", "", "0x10"]),
)
hostile_values = st.recursive(
    hostile_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)


def deeply_nested(depth: int) -> list[Any]:
    """``[[[...]]]``, ``depth`` levels (built without recursion)."""
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


#: A value nested past Python's recursion limit (repr of it raises RecursionError). Examples hold
#: DEEP_MARK in its place, so that hypothesis can print a failing example.
DEEP = deeply_nested(5000)
DEEP_MARK = "<5000 brackets deep>"


def edge_values(field: FieldInfo) -> list[Any]:
    """Numbers on and just past each bound of a pydantic field (``gt=0`` gives 0 and 5e-324 for a
    float, ``le=1`` gives 1 and the next float up), minus one and, for floats, inf and nan."""
    whole = "float" not in str(field.annotation)
    values: list[Any] = [-1]
    for rule in field.metadata:
        for name, outward in (("gt", -1), ("ge", -1), ("lt", 1), ("le", 1)):
            bound = getattr(rule, name, None)
            if bound is None:
                continue
            inward = -outward
            if whole:
                values += [bound, bound + inward, bound + outward]
            else:
                step = math.inf * inward
                values += [bound, math.nextafter(bound, step), math.nextafter(bound, -step)]
    if not whole:
        values += [math.inf, math.nan]
    return list(dict.fromkeys(values))


def finite_json(document: Any) -> None:
    """The document dumps as strict JSON (no NaN, no Infinity)."""
    strict_json.dumps(document)


def check_report(plan: Plan, catalog: Catalog = CATALOG, model: Any = None) -> None:
    """The plan on every flavor: a report whose JSON is finite, or a usage error (exit 2)."""
    try:
        report = evaluate_plan(plan, catalog, model)
    except UsageError:
        return
    finite_json(report.to_json())


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``hwdash <argv>`` in-process: exit status, stdout, stderr. argparse's exit 2 included;
    any other exception fails the test (that would be a traceback)."""
    try:
        status = main(argv)
    except SystemExit as exc:  # argparse refusing a flag or a choice
        status = exc.code if isinstance(exc.code, int) else 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return status, captured.out, captured.err


def assert_result_or_exit_2(status: int, out: str, err: str, *, json_out: bool) -> None:
    assert "not a JSON number" not in err  # the output guard fired: a number went non-finite
    if status == 2:
        lines = err.strip().splitlines()
        # One error line (and where help is), never a usage dump for one wrong value.
        assert any(line.startswith(("hwdash: ", "hwdash plan: ")) for line in lines), err
        assert not any(line.startswith("usage:") for line in lines), err
        return
    assert status == 0, err
    if json_out:
        # json.loads takes NaN and Infinity: refuse them on the way in, as a strict reader would.
        def no_constants(name: str) -> None:
            raise AssertionError(f"{name} in JSON output")

        finite_json(json.loads(out, parse_constant=no_constants))


# -- hwdash plan flags --------------------------------------------------------------------------

numbers_as_text = st.one_of(
    st.integers(-10, 10**12).map(str),
    st.floats().map(repr),
    st.sampled_from(EDGE_FLOATS).map(repr),
    st.sampled_from(["1e400", "nan", "inf", "-inf", "-0", "0x10", "1_000", "", " 4", "1e-300"]),
)
counts_as_text = st.one_of(
    numbers_as_text,
    st.sampled_from(["1k", "10M", "5T", "1000T", "9" * 30, "1e30", "2.5B", "1e400", "abc", "0B"]),
)
FLAG_VALUES: dict[str, st.SearchStrategy[str]] = {
    "--model": st.sampled_from(
        ["qwen2.5-0.5b", "qwen2.5-7b", "mixtral-8x7b", "7B", "0.1B", "9e99B", "x", "", "1T"]
    ),
    "--params": counts_as_text,
    "--method": st.sampled_from([m.value for m in Method] + ["bogus"]),
    "--precision": st.sampled_from(["fp32", "amp", "bf16", "mixed", "int3"]),
    "--optimizer": st.sampled_from(["adamw", "adamw-8bit", "sgd", "adafactor", "lion"]),
    "--optimizer-impl": st.sampled_from(["fused", "foreach", "for-loop", "magic"]),
    "--batch": st.sampled_from(["1", "4", "65536", "65537"]) | numbers_as_text,
    "--seq": st.sampled_from(["1", "512", "100000000", "100000001"]) | numbers_as_text,
    "--grad-accum": st.sampled_from(["1", "8", "4096", "4097"]) | numbers_as_text,
    "--lora-r": st.sampled_from(["1", "16", "65536"]) | numbers_as_text,
    "--lora-targets": st.sampled_from(["q_proj,v_proj", "all-linear", ",", "x" * 300]),
    "--lora-dropout": st.sampled_from(["0", "0.05", "0.999", "1"]) | numbers_as_text,
    "--zero": st.sampled_from(["0", "1", "2", "3", "4"]) | numbers_as_text,
    "--offload": st.sampled_from(["none", "optimizer", "params", "disk"]),
    "--gpus": st.sampled_from(["1", "8", "100000", "100001"]) | numbers_as_text,
    "--examples": counts_as_text,
    "--epochs": st.sampled_from(["1", "0.5", "100000", "100001"]) | numbers_as_text,
    "--tokens": counts_as_text,
    "--mfu": st.sampled_from(["0.4", "0.001", "0.0009", "1", "1e-300", "5e-324"]) | numbers_as_text,
    "--vllm-util": st.sampled_from(["0", "0.3", "0.99"]) | numbers_as_text,
    "--attn": st.sampled_from(["flash", "sdpa", "eager", "magic"]),
    "--flavor": st.sampled_from(["l4x1", "a100-large", "nope", "l4x1,t4-small", "local", ""]),
    "--rl-method": st.sampled_from(["full", "lora", "qlora", "ppo"]),
}
#: Only the whole CLI runs these (they search options or write files).
CLI_ONLY_FLAG_VALUES: dict[str, st.SearchStrategy[str]] = {
    "--fit": st.sampled_from(["l4x1", "any", "local", "l4", "a10g-small", "nope"]),
    "--export": st.sampled_from(["deepspeed", "trainer", "accelerate", "hf-jobs", "yaml"]),
    "--max": st.sampled_from(["seq", "batch", "concurrency", "gpus", "GPUs", "tokens", ""]),
}
SWITCHES = ["--grad-ckpt", "--no-reference", "--reward-model", "--no-reward-model"]


@st.composite
def plan_argvs(draw: st.DrawFn, flag_values: dict[str, st.SearchStrategy[str]]) -> list[str]:
    argv: list[str] = []
    flags = draw(st.lists(st.sampled_from(sorted(flag_values)), max_size=7, unique=True))
    if "--model" not in flags and "--params" not in flags and draw(st.integers(0, 9)):
        flags.append("--model")
    if "--examples" not in flags and "--tokens" not in flags and draw(st.integers(0, 2)):
        flags.append(draw(st.sampled_from(["--examples", "--tokens"])))  # hours and cost too
    for flag in flags:
        argv += [flag, draw(flag_values[flag])]
    argv += draw(st.lists(st.sampled_from(SWITCHES), max_size=2, unique=True))
    return argv


@st.composite
def valid_plans(draw: st.DrawFn, *, with_data: bool = False) -> Plan:
    """Plans anywhere inside the bounds, not only the usual ones (``with_data``: with examples or
    tokens, so that hours and cost are computed too)."""
    method = draw(st.sampled_from(list(Method)))
    zero = 0 if method is Method.INFERENCE else draw(st.integers(0, 3))
    offload = Offload.NONE
    if zero == 3:
        offload = draw(st.sampled_from(list(Offload)))
    elif zero:
        offload = draw(st.sampled_from([Offload.NONE, Offload.OPTIMIZER]))
    return Plan(
        model=draw(st.sampled_from(["qwen2.5-0.5b", "qwen2.5-7b", "mixtral-8x7b", "1M", "1T"])),
        method=method,
        precision=draw(st.sampled_from(list(Precision))),
        batch=draw(st.integers(1, 65536)),
        seq=draw(st.integers(1, 100_000_000)),
        grad_ckpt=draw(st.booleans()),
        grad_accum=draw(st.integers(1, 4096)),
        attention=draw(st.sampled_from(list(Attention))),
        optimizer=draw(st.sampled_from(list(Optimizer))),
        optimizer_impl=draw(st.sampled_from(list(OptimizerImpl))),
        lora_r=draw(st.integers(1, 65536)),
        lora_dropout=draw(st.floats(0, 1, exclude_max=True)),
        zero=zero,
        offload=offload,
        gpus=draw(st.integers(1, 100_000)),
        examples=draw(st.integers(1, 10**13) if with_data else st.none() | st.integers(1, 10**13)),
        epochs=draw(st.floats(0, 100_000, exclude_min=True)),
        tokens=draw(st.none() | st.integers(1, 10**18)),
        mfu=draw(st.none() | st.floats(0.001, 1)),
        flavors=draw(st.sampled_from([(), ("l4x1",), ("a10g-large", "t4-small"), ("cpu-basic",)])),
        rl_method=draw(st.sampled_from(list(RL_TRAINABLE_METHODS))),
        rl_reference=draw(st.booleans()),
        rl_reward_model=draw(st.booleans()),
        vllm_memory_utilization=draw(st.floats(0, 1, exclude_max=True)),
    )


#: Plan fields typed on the command line as a number, and the flag each comes from.
NUMBER_FLAGS = {
    FIELD_FLAGS[name]: field
    for name, field in Plan.model_fields.items()
    if any(kind_of in str(field.annotation) for kind_of in ("int", "float"))
}


@st.composite
def edged_plan_argvs(draw: st.DrawFn) -> list[str]:
    """A plan inside the bounds, written as flags, then one or two number flags on or past an
    edge (argparse keeps the last value of a repeated flag)."""
    argv = plan_arguments(draw(valid_plans(with_data=True)))
    for flag in draw(st.lists(st.sampled_from(sorted(NUMBER_FLAGS)), min_size=1, max_size=2)):
        value = draw(st.sampled_from(edge_values(NUMBER_FLAGS[flag])))
        argv += [flag, repr(value) if isinstance(value, float) else str(value)]
    return argv


def any_plan_argvs() -> st.SearchStrategy[list[str]]:
    """Mostly plans inside the bounds with an edge value (where arithmetic breaks), then plans
    inside the bounds, then flags drawn from hostile lists."""
    return st.integers(0, 4).flatmap(
        lambda pick: (
            plan_argvs(FLAG_VALUES)
            if pick == 0
            else valid_plans().map(plan_arguments)
            if pick == 1
            else edged_plan_argvs()
        )
    )


@fuzz(DIRECT)
@given(argv=any_plan_argvs())
def test_plan_flags_parse_to_a_plan_whose_report_is_finite_or_a_usage_error(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    # What `hwdash plan` does between parsing and printing, without the CLI's per-run setup.
    try:
        args = PARSER.parse_args(["plan", *argv])
    except SystemExit as exc:  # argparse refusing a value: exit 2 with its usage line
        assert exc.code == 2
        capsys.readouterr()
        return
    try:
        plan = plan_from_args(args)
        model = resolve_model(plan.model, CATALOG)
        report = evaluate_plan(plan, CATALOG, model)
    except UsageError as exc:
        assert "\n" not in str(exc)
        return
    document = report.to_json()
    finite_json(document)
    assert math.isfinite(document["memory"]["total"])


@fuzz(THROUGH_CLI)
@given(
    argv=plan_argvs({**FLAG_VALUES, **CLI_ONLY_FLAG_VALUES}),
    mode=st.sampled_from(["--json", "--check", "table"]),
)
def test_plan_command_gives_a_result_or_exit_2(
    quiet_machine: Path, capsys: pytest.CaptureFixture[str], argv: list[str], mode: str
) -> None:
    extra = [] if mode == "table" else [mode]
    status, out, err = run_cli(["plan", *argv, *extra], capsys)
    if mode == "--check" and status == 1:  # tight or does not fit: a result
        return
    if "--max" in argv and status == 1:  # --max found nothing that fits: a result
        assert "none" in out, out
        return
    exported = "--export" in argv
    json_out = mode == "--json" and (not exported or "deepspeed" in argv)
    assert_result_or_exit_2(status, out, err, json_out=json_out and status == 0)


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
    "quantization_config",
    "_name_or_path",
    # keys of the families in hwdash.core.models.families
    "n_embd",
    "n_layer",
    "n_head",
    "n_inner",
    "multi_query",
    "d_model",
    "num_layers",
    "num_heads",
    "feed_forward_proj",
    "new_decoder_architecture",
    "num_kv_heads",
]
SANE_CONFIG = {
    "model_type": "llama",
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "intermediate_size": 128,
    "vocab_size": 1000,
}
config_values = st.one_of(
    hostile_values,
    st.sampled_from(
        [
            "llama",
            "qwen2_moe",
            "mixtral",
            "gemma2",
            "phi",
            "gpt2",
            "gpt_neox",
            "bloom",
            "falcon",
            "t5",
        ]
    ),
    st.integers(1, 10**5),
    st.sampled_from(
        [
            {"quant_method": "gptq", "bits": 4},
            {"quant_method": "awq", "bits": 3},
            {"load_in_4bit": "true"},
            {"quant_method": ["gptq"]},
            {"model_type": "llama", "hidden_size": 10**7},
        ]
    ),
)


@st.composite
def configs(draw: st.DrawFn, *, deep: bool) -> dict[str, Any]:
    config: dict[str, Any] = dict(SANE_CONFIG) if draw(st.booleans()) else {}
    for key in draw(st.lists(st.sampled_from(CONFIG_KEYS), max_size=5, unique=True)):
        config[key] = draw(config_values)
    if deep and draw(st.integers(0, 19)) == 0:
        config[draw(st.sampled_from(CONFIG_KEYS))] = DEEP_MARK
    return config


@fuzz(DIRECT)
@given(config=configs(deep=True))
def test_config_json_gives_a_model_or_a_usage_error_naming_it(config: dict[str, Any]) -> None:
    config = {key: DEEP if value is DEEP_MARK else value for key, value in config.items()}
    try:
        model = model_from_config(config, name="fuzzed", source="fuzz/config.json")
    except UsageError as exc:
        assert "fuzz/config.json" in str(exc)  # the file, then the field
        assert "\n" not in str(exc)
        return
    check_report(Plan(model="fuzzed", batch=1, seq=128, examples=1000), model=model)


def config_text(config: dict[str, Any], nesting: int) -> str:
    """The config as the text of a file: NaN/Infinity as Python's json writes them, and, when
    ``nesting`` is set, one value buried that many brackets deep (past json's recursion limit
    from about 1000)."""
    text = json.dumps(config)  # allow_nan: "NaN" and "Infinity", which json.loads reads back
    if nesting:
        text = text[:-1] + ("," if config else "") + '"deep": ' + "[" * nesting + "]" * nesting
        text += "}"
    return text


@fuzz(DIRECT)
@given(
    config=configs(deep=False),
    nesting=st.sampled_from([0, 0, 0, 10, 990, 1000, 5000, 100_000]),
    junk=st.sampled_from(["", "", "", "\x00", "\ufeff", "]", " garbage", "\udcff"]),
)
def test_config_json_files_give_a_model_or_a_usage_error(
    tmp_path_factory: pytest.TempPathFactory, config: dict[str, Any], nesting: int, junk: str
) -> None:
    path = tmp_path_factory.mktemp("cfg") / "config.json"
    path.write_bytes(
        (config_text(config, nesting) + junk).encode("utf-8", errors="surrogateescape")
    )
    try:
        model = model_from_config_file(path)
    except UsageError as exc:
        assert str(path) in str(exc)
        return
    check_report(Plan(model="cfg", batch=1, seq=128), model=model)


@fuzz(THROUGH_CLI)
@given(
    config=configs(deep=False),
    nesting=st.sampled_from([0, 0, 0, 5000]),
    method=st.sampled_from(["lora", "full", "inference", "qlora", "grpo"]),
)
def test_plan_with_a_config_json_gives_a_result_or_exit_2(
    quiet_machine: Path,
    capsys: pytest.CaptureFixture[str],
    config: dict[str, Any],
    nesting: int,
    method: str,
) -> None:
    folder = quiet_machine / "model"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(config_text(config, nesting), encoding="utf-8")
    argv = ["plan", "--model", str(folder), "--method", method, "--examples", "1000", "--json"]
    status, out, err = run_cli(argv, capsys)
    assert_result_or_exit_2(status, out, err, json_out=True)


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


ENTRY_FIELDS: dict[str, dict[str, Any]] = {
    "accelerator": {
        "id": "fuzz-gpu",
        "name": "Fuzz GPU",
        "vendor": "nvidia",
        "kind": "gpu",
        "memory_gb": 24,
        "bf16": True,
        "bf16_tflops": 100,
        "memory_bandwidth_gbps": 900,
        "source": "fuzz",
    },
    "flavor": {
        "id": "fuzz-box",
        "name": "Fuzz box",
        "provider": "hf-jobs",
        "accelerator": "fuzz-gpu",
        "gpu_count": 1,
        "price_per_hour": 1.5,
        "price_date": "2026-11-01",
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
    "slowdown": {
        "id": "qlora",
        "factor": 1.5,
        "compared_with": "fuzz",
        "source": "fuzz",
    },
}
#: Every field the schemas know (a fuzzed value may land on any of them), plus a few they do not.
OVERLAY_KEYS = sorted(
    {key for fields in ENTRY_FIELDS.values() for key in fields}
    | {
        "nvml_total_mib",
        "fp16_tflops",
        "fp32_tflops",
        "power_w",
        "default_mfu",
        "usable_memory_fraction",
        "nvml_names",
        "vcpu",
        "ram_gb",
        "experts",
        "experts_per_token",
        "params",
        "checkpoint_bits",
        "norms_per_layer",
        "attn_logit_softcap",
        "tied_embeddings",
        "memory_gib",
    }
)


#: The number fields of each kind of entry, to put an edge value on one of them.
SCHEMAS: dict[str, type[BaseModel]] = {
    "accelerator": Accelerator,
    "flavor": Flavor,
    "model": ModelSpec,
    "slowdown": Slowdown,
}
NUMBER_FIELDS = {
    kind: sorted(
        name
        for name, field in schema.model_fields.items()
        if any(kind_of in str(field.annotation) for kind_of in ("int", "float"))
    )
    for kind, schema in SCHEMAS.items()
}


@st.composite
def overlays(draw: st.DrawFn) -> str:
    lines = []
    # Mostly one entry changed and the others valid, so that a bad number reaches the arithmetic;
    # sometimes every entry changed at once.
    storm = draw(st.integers(0, 3)) == 0
    changed = set(ENTRY_FIELDS) if storm else {draw(st.sampled_from(sorted(ENTRY_FIELDS)))}
    for kind, base in ENTRY_FIELDS.items():
        if storm and draw(st.integers(0, 9)) == 0:
            continue  # an entry left out (a flavor without its accelerator, ...)
        entry: dict[str, Any] = dict(base)
        if kind in changed and (storm or draw(st.integers(0, 3)) == 0):
            for key in draw(st.lists(st.sampled_from(OVERLAY_KEYS), max_size=3, unique=True)):
                entry[key] = draw(hostile_values)
        elif kind in changed:
            names = draw(st.lists(st.sampled_from(NUMBER_FIELDS[kind]), min_size=1, max_size=2))
            for name in names:
                field = SCHEMAS[kind].model_fields[name]
                entry[name] = draw(st.sampled_from(edge_values(field)))
        copies = 2 if draw(st.integers(0, 19)) == 0 else 1  # the same id twice in one file
        for _ in range(copies):
            lines.append(f"[[{kind}]]")
            lines += [f"{key} = {toml_value(value)}" for key, value in entry.items()]
    shape = draw(st.integers(0, 19))
    if shape == 0:
        lines.append("deep = " + "[" * 3000 + "]" * 3000)
    elif shape == 1:
        lines.append("[[model]]\nid = 'x'\nlayers = " + "{a = " * 600 + "1" + "}" * 600)
    elif shape == 2:
        lines.append("[[accelerator]]\nid = 'x'\nmemory_gb = 1" + "0" * 5000)
    elif shape == 3:
        lines.append("model = 3")
    return "\n".join(lines) + "\n"


FUZZ_PLAN = Plan(model="fuzz-model", batch=2, seq=256, examples=1000, flavors=("fuzz-box",))


@fuzz(DIRECT)
@given(text=overlays())
def test_catalog_overlays_load_or_name_the_problem(
    tmp_path_factory: pytest.TempPathFactory, text: str
) -> None:
    path = tmp_path_factory.mktemp("overlay") / "overlay.toml"
    path.write_text(text, encoding="utf-8")
    try:
        catalog = load_catalog_from([path])  # the overlay alone: the built-ins are the CLI's share
    except CatalogError as exc:
        assert exc.path == str(path)
        assert str(path) in str(exc)
        assert "\n" not in str(exc)
        return
    if "fuzz-model" in catalog.models and "fuzz-box" in catalog.flavors:
        for method in (Method.LORA, Method.FULL, Method.INFERENCE):  # FLOPs, and bandwidth
            check_report(FUZZ_PLAN.model_copy(update={"method": method}), catalog=catalog)


@fuzz(THROUGH_CLI)
@given(
    text=overlays(),
    how=st.sampled_from(["xdg", "--catalog"]),
    command=st.sampled_from(["plan", "catalog"]),
)
def test_commands_with_an_overlay_give_a_result_or_exit_2_naming_the_file(
    quiet_machine: Path, capsys: pytest.CaptureFixture[str], text: str, how: str, command: str
) -> None:
    # Loaded automatically from the user's config folder, or named with --catalog.
    folder = quiet_machine / "config" / "hwdash" / "catalog" if how == "xdg" else quiet_machine
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "overlay.toml"
    path.write_text(text, encoding="utf-8")
    flags = ["--catalog", str(path)] if how == "--catalog" else []
    if command == "plan":
        argv = ["plan", "--model", "fuzz-model", "--examples", "1000", "--json", *flags]
    else:
        argv = ["catalog", "list", "--json", *flags]
    try:
        status, out, err = run_cli(argv, capsys)
    finally:
        path.unlink()
    if status == 2 and "catalog error" in err:
        assert str(path) in err
    assert_result_or_exit_2(status, out, err, json_out=True)
