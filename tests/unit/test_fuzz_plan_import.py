"""Fuzz `hwdash plan --from FILE`: random DeepSpeed, TrainingArguments/TRL, accelerate, axolotl and
LLaMA-Factory documents (JSON or YAML) and ``--export trainer`` snippets, built from the keys each
reader knows, with values of every type, nesting, missing and extra keys, YAML aliases that hold the
document itself, and ``deepspeed`` entries naming the file itself, a second file that may name the
first, or nothing. Each must give a plan or a :class:`UsageError` (exit 2), never another exception.

Each format group gets ``HWDASH_FUZZ_EXAMPLES`` examples (default 200, sized for CI) through what the
CLI calls (``read_plan_file`` then ``apply_imported``), and a tenth of that through the whole CLI
(``hwdash.cli.main``, whose JSON output must be finite). ``HWDASH_FUZZ_EXAMPLES=10000`` is the full
run the issue asks for.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hwdash.cli import main
from hwdash.commands.plan import apply_imported
from hwdash.core import strict_json
from hwdash.core.plan import Plan
from hwdash.core.plans.imports import read_plan_file
from hwdash.errors import UsageError

EXAMPLES = int(os.environ.get("HWDASH_FUZZ_EXAMPLES", "200"))
THROUGH_CLI = max(20, EXAMPLES // 10)

FUZZ = settings(
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)

# -- the keys each reader knows (plan_import's readers), each with the type it expects ---------------

#: Type tags: whole number, number, true/false, a word, a list of words (or one word); and nested
#: tables with their own keys.
INT, NUM, BOOL, WORD, LIST = "int", "number", "bool", "word", "words"
OFFLOAD = {"device": WORD, "pin_memory": BOOL}
FORMATS: dict[str, dict[str, Any]] = {
    "deepspeed": {
        "train_micro_batch_size_per_gpu": INT,
        "gradient_accumulation_steps": INT,
        "train_batch_size": INT,
        "gradient_clipping": NUM,
        "zero_optimization": {"stage": INT, "offload_optimizer": OFFLOAD, "offload_param": OFFLOAD},
        "bf16": {"enabled": BOOL},
        "fp16": {"enabled": BOOL},
    },
    "trainer": {
        "per_device_train_batch_size": INT,
        "gradient_accumulation_steps": INT,
        "max_seq_length": INT,
        "max_length": INT,
        "num_train_epochs": NUM,
        "gradient_checkpointing": BOOL,
        "optim": WORD,
        "torch_compile": BOOL,
        "use_liger_kernel": BOOL,
        "activation_offloading": BOOL,
        "fsdp": LIST,
        "model_init_kwargs": {"torch_dtype": WORD, "dtype": WORD},
        "bf16": BOOL,
        "fp16": BOOL,
        "deepspeed": WORD,
    },
    "accelerate": {
        "distributed_type": WORD,
        "num_processes": INT,
        "num_machines": INT,
        "mixed_precision": WORD,
        "deepspeed_config": {
            "zero_stage": INT,
            "gradient_accumulation_steps": INT,
            "offload_param_device": WORD,
            "offload_optimizer_device": WORD,
        },
        "fsdp_config": {
            "fsdp_sharding_strategy": WORD,
            "fsdp_reshard_after_forward": BOOL,
            "fsdp_offload_params": BOOL,
            "fsdp_version": INT,
        },
    },
    "axolotl": {
        "base_model": WORD,
        "adapter": WORD,
        "load_in_4bit": BOOL,
        "load_in_8bit": BOOL,
        "peft_use_dora": BOOL,
        "lora_r": INT,
        "lora_dropout": NUM,
        "lora_target_linear": BOOL,
        "lora_target_modules": LIST,
        "sequence_len": INT,
        "micro_batch_size": INT,
        "gradient_accumulation_steps": INT,
        "num_epochs": NUM,
        "gradient_checkpointing": BOOL,
        "flash_attention": BOOL,
        "sdp_attention": BOOL,
        "bf16": BOOL,
        "fp16": BOOL,
        "bfloat16": BOOL,
        "float16": BOOL,
        "optimizer": WORD,
        "deepspeed": WORD,
    },
    "llama-factory": {
        "model_name_or_path": WORD,
        "stage": WORD,
        "finetuning_type": WORD,
        "quantization_bit": INT,
        "use_dora": BOOL,
        "lora_rank": INT,
        "lora_dropout": NUM,
        "lora_target": WORD,
        "cutoff_len": INT,
        "per_device_train_batch_size": INT,
        "gradient_accumulation_steps": INT,
        "num_train_epochs": NUM,
        "flash_attn": WORD,
        "bf16": BOOL,
        "fp16": BOOL,
        "pure_bf16": BOOL,
        "gradient_checkpointing": BOOL,
        "disable_gradient_checkpointing": BOOL,
        "optim": WORD,
        "deepspeed": WORD,
    },
}
#: Keys that make plan_import._detect pick each format, with a usual value.
DETECTED_BY: dict[str, list[dict[str, Any]]] = {
    "deepspeed": [{"zero_optimization": {}}, {"train_micro_batch_size_per_gpu": 1}],
    "trainer": [{"per_device_train_batch_size": 2}, {"gradient_accumulation_steps": 4}],
    "accelerate": [{"distributed_type": "FSDP"}, {"deepspeed_config": {}}],
    "axolotl": [{"base_model": "qwen2.5-7b"}],
    "llama-factory": [{"model_name_or_path": "qwen2.5-7b", "stage": "sft"}],
}
ALL_KEYS = sorted({key for keys in FORMATS.values() for key in keys})

# -- values ----------------------------------------------------------------------------------------

#: Words the readers look for, so that the fuzz reaches their branches.
WORDS = [
    "auto", "true", "false", "cpu", "nvme", "none", "no", "bf16", "fp16", "bfloat16", "float16",
    "FULL_SHARD", "HYBRID_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "1", "4", "DEEPSPEED", "FSDP",
    "MULTI_GPU", "lora", "qlora", "full", "freeze", "ppo", "sft", "pt", "dpo", "all",
    "q_proj,v_proj", " , ", "fa2", "sdpa", "disabled", "adamw_torch_fused", "adamw_torch",
    "paged_adamw_8bit", "adafactor", "lion", "full_shard auto_wrap", "hybrid_shard offload",
    "offload", "qwen2.5-7b", "llama-3-8b", "unsloth", "", " ", "\x00", "..", "/", "~",
]  # fmt: skip
EDGE_NUMBERS = [0, 1, 2, 3, 4, 8, -1, 10**400, 2**63, 2**64 - 1, 10**18]
EDGE_FLOATS = [5e-324, 1e-300, 0.5, 1.5, 1e308, -1e308, -0.0, float("inf"), float("nan")]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**6), max_value=10**6),
    st.integers(min_value=10**6, max_value=10**30),
    st.sampled_from(EDGE_NUMBERS),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(EDGE_FLOATS),
    st.text(max_size=12),
    st.sampled_from(WORDS),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=6) | st.sampled_from(ALL_KEYS), inner, max_size=3)
    ),
    max_leaves=6,
)
words = st.sampled_from(WORDS)
#: Values of the type each tag asks for (with "auto" and null, which every reader takes).
TYPED = {
    INT: st.integers(min_value=0, max_value=64) | st.sampled_from([None, "auto", 10**6]),
    NUM: st.floats(min_value=0, max_value=10) | st.sampled_from([0, 1, 3, None]),
    BOOL: st.booleans() | st.sampled_from([None, "auto"]),
    WORD: words | st.none(),
    LIST: st.lists(words, max_size=3) | words,
}

#: Stand-ins that the writer turns into text JSON and YAML cannot dump from a value: an alias of the
#: whole document, a list nested past the recursion limit, the file's own name, the other file's.
SELF_ALIAS = "<alias of the document>"
DEEP = "<nested 5000 deep>"
THIS_FILE = "<this file>"
OTHER_FILE = "<the other file>"
#: What a ``deepspeed`` entry names.
DEEPSPEED_NAMES = st.one_of(
    st.sampled_from([THIS_FILE, OTHER_FILE, "missing.json", "", ".", "/", "a" * 300, "x\x00y"]),
    values,
)


def table(keys: dict[str, Any], hostile: bool) -> st.SearchStrategy[dict[Any, Any]]:
    """A table holding some of ``keys``, nested tables by their own keys: each value of its type
    or, in a hostile table, now and then of any type; a hostile table also gets other keys."""

    def value(tag: Any) -> st.SearchStrategy[Any]:
        typed = table(tag, hostile) if isinstance(tag, dict) else TYPED[tag]
        return st.one_of(typed, typed, typed, values) if hostile else typed

    known = {key: value(tag) for key, tag in keys.items()}
    if "deepspeed" in keys:
        known["deepspeed"] = DEEPSPEED_NAMES
    chosen = st.fixed_dictionaries({}, optional=known)
    if not hostile:
        return chosen
    extra = st.dictionaries(
        st.text(max_size=8) | st.integers() | st.sampled_from(ALL_KEYS),
        values | st.sampled_from([SELF_ALIAS, DEEP, THIS_FILE]),
        max_size=2,
    )
    return st.tuples(chosen, extra).map(lambda parts: {**parts[1], **parts[0]})


def document(group: str) -> st.SearchStrategy[Any]:
    """A document of ``group`` (with keys that make it read as that format, most of the time):
    well typed, hostile, keys of every format mixed, or no table at all."""

    def detected(data: dict[Any, Any], keys: dict[str, Any]) -> dict[Any, Any]:
        return {**data, **{key: value for key, value in keys.items() if key not in data}}

    marks = st.sampled_from([*DETECTED_BY[group], {}])
    clean = st.builds(detected, table(FORMATS[group], hostile=False), marks)
    hostile = st.builds(detected, table(FORMATS[group], hostile=True), marks)
    mixed = table({key: WORD for key in ALL_KEYS}, hostile=True)
    return st.one_of(clean, clean, hostile, hostile, mixed, values)


def dumped(data: Any, kind: str, this: str, other: str) -> str:
    """``data`` as JSON or YAML text, with the stand-ins written out."""
    if kind == "json":
        text = json.dumps(data, default=str)  # NaN and Infinity too: Python's json reads them
    else:
        text = yaml.safe_dump(data, allow_unicode=True, default_flow_style=None, width=1 << 20)
    deep = "[" * 5000 + "]" * 5000
    for mark, replacement in ((THIS_FILE, this), (OTHER_FILE, other), (DEEP, deep)):
        text = text.replace(f'"{mark}"' if mark == DEEP else mark, replacement)
        text = text.replace(f"'{mark}'" if mark == DEEP else mark, replacement)
    if kind == "yaml" and SELF_ALIAS in text and isinstance(data, dict):
        text = "--- &top\n" + text.replace(f"'{SELF_ALIAS}'", "*top").replace(SELF_ALIAS, "*top")
    return text


# -- the --export trainer snippet ---------------------------------------------------------------------

CALLS = ["TrainingArguments", "SFTConfig", "GRPOConfig", "PPOConfig", "LoraConfig", "Helper"]
SNIPPET_KEYS = [*FORMATS["trainer"], "r", "target_modules", "lora_dropout", "use_dora"]
SNIPPET_KEYS += ["load_in_4bit", "load_in_8bit"]


#: Arguments that are not literals, or that ast.literal_eval cannot build.
NOT_LITERALS = [
    "torch.bfloat16", "{[1]: 2}", "{1, [2]}", "-'a'", "1 + 'a'", "x", "f()", "(1, [2])",
    "'a' * 3", "2 ** 1000", "-(-1)", "1e999", "-1e999", "1j", "b'x'", "...", "{1: {}}",
]  # fmt: skip


@st.composite
def snippet(draw: st.DrawFn) -> str:
    """Python in the shape ``--export trainer`` writes, with random literals and some that are not
    literals (names, calls, ``{[1]: 2}``, which ``ast.literal_eval`` refuses or cannot hash)."""
    odd = st.sampled_from(NOT_LITERALS)
    literal = st.one_of(values.map(repr), values.map(repr), DEEPSPEED_NAMES.map(repr), odd)
    lines = []
    for name in draw(st.lists(st.sampled_from(["MODEL", "MAX_LENGTH", "MODEL_DTYPE"]), max_size=3)):
        lines.append(f"{name} = {draw(literal)}")
    for call in draw(st.lists(st.sampled_from([*CALLS, "BitsAndBytesConfig"]), max_size=4)):
        keys = draw(st.lists(st.sampled_from(SNIPPET_KEYS), max_size=5))
        arguments = ", ".join(f"{key}={draw(literal)}" for key in keys)
        lines.append(f"value = {call}({arguments})")
    if draw(st.integers(0, 3)) == 0:
        lines.append(draw(st.text(max_size=20)))  # anything, a syntax error or a null byte
    return "\n".join(lines) + "\n"


# -- running ---------------------------------------------------------------------------------------

BASE = Plan(model="qwen2.5-7b", batch=1, seq=512)
GROUPS = [*FORMATS, "snippet"]


@pytest.fixture
def quiet_machine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No GPU, and no user catalog or plans file from the machine running the tests."""
    monkeypatch.setenv("HWDASH_FAKE_NVML", "no-driver")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.delenv("HWDASH_CATALOG", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))


#: What the second file holds: files that name the first (a loop) or themselves, a DeepSpeed
#: config, no table; now and then a whole random document (drawing one each time is slow).
SECOND = st.one_of(
    st.sampled_from(
        [
            {"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}},
            {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}},
            {"per_device_train_batch_size": 1, "deepspeed": OTHER_FILE},
            {"base_model": "qwen2.5-7b", "deepspeed": OTHER_FILE},
            {"model_name_or_path": "x", "stage": "sft", "deepspeed": THIS_FILE},
            {"gradient_accumulation_steps": 2, "deepspeed": "missing.json"},
            ["not", "a", "table"],
            "text",
        ]
    ),
    st.sampled_from(list(FORMATS)).flatmap(document),
)


def files(group: str) -> st.SearchStrategy[tuple[str, str, str, str]]:
    """(this file's name, its text, the other file's name, its text)."""
    if group == "snippet":
        first = st.tuples(st.just("train.py"), snippet())
    else:
        first = st.tuples(st.sampled_from(["config.json", "config.yaml"]), document(group))
    second = st.tuples(st.sampled_from(["other.json", "other.yml", "other.py"]), SECOND)
    return st.tuples(first, second).map(lambda pair: (*pair[0], *pair[1]))


def written(folder: Path, example: tuple[Any, Any, Any, Any]) -> Path:
    """Both files of an example in ``folder``; the first one's path."""
    name, data, other, other_data = example
    for file, content, named in ((name, data, other), (other, other_data, name)):
        if isinstance(content, str) and file.endswith(".py"):
            text = content.replace(THIS_FILE, file).replace(OTHER_FILE, named)
        else:
            text = dumped(content, "json" if file.endswith(".json") else "yaml", file, named)
        (folder / file).write_text(text, encoding="utf-8", errors="surrogatepass")
    return folder / name


def read_and_apply(path: Path) -> Plan | None:
    """What ``hwdash plan --from`` does with the file before planning: the plan, or None for a
    usage error."""
    try:
        imported = read_plan_file(path)
        return apply_imported(BASE, imported, [], str(path))
    except UsageError as error:
        assert str(error).strip() and "\n" not in str(error)
        return None


def in_folder(check: Callable[[Path], None]) -> Callable[[tuple[Any, Any, Any, Any]], None]:
    def run(example: tuple[Any, Any, Any, Any]) -> None:
        with tempfile.TemporaryDirectory() as folder:
            check(written(Path(folder), example))

    return run


@pytest.mark.parametrize("group", GROUPS)
def test_a_from_file_gives_a_plan_or_a_usage_error(
    quiet_machine: None, group: str, capsys: pytest.CaptureFixture[str]
) -> None:
    @settings(FUZZ, max_examples=EXAMPLES)
    @given(example=files(group))
    def check(example: tuple[Any, Any, Any, Any]) -> None:
        def body(path: Path) -> None:
            plan = read_and_apply(path)
            assert plan is None or isinstance(plan, Plan)
            capsys.readouterr()

        in_folder(body)(example)

    check()


@pytest.mark.parametrize("group", GROUPS)
def test_the_cli_given_a_from_file_plans_or_exits_2(
    quiet_machine: None, group: str, capsys: pytest.CaptureFixture[str]
) -> None:
    @settings(FUZZ, max_examples=THROUGH_CLI)
    @given(example=files(group), with_model=st.booleans())
    def check(example: tuple[Any, Any, Any, Any], with_model: bool) -> None:
        def body(path: Path) -> None:
            model = ["--model", "qwen2.5-7b"] if with_model else []
            status = main(["plan", *model, "--from", str(path), "--json"])
            captured = capsys.readouterr()
            assert "Traceback" not in captured.err
            assert status in (0, 2), captured.err
            if status == 0:
                strict_json.dumps(json.loads(captured.out))  # finite numbers only
            else:
                assert "error" in captured.err

        in_folder(body)(example)

    check()
