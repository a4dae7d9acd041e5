"""The config file keys of the plan field registry (:class:`hwdash.core.plan_fields.FileKeys`):
every key a ``--from`` reader copies onto a plan field is declared there for its format, every
declared key is read, and the exports write each field under its declared key and nowhere else."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args

import pytest

from hwdash.core.plan import Plan
from hwdash.core.plan_fields import PLAN_FIELDS, FileFormat, fields_with_keys
from hwdash.core.plans.exports import accelerate_config, deepspeed_config, trainer_snippet
from hwdash.core.plans.from_accelerate import read_accelerate
from hwdash.core.plans.from_axolotl import read_axolotl
from hwdash.core.plans.from_deepspeed import read_deepspeed
from hwdash.core.plans.from_llama_factory import read_llama_factory
from hwdash.core.plans.from_reader import ConfigReader, ImportedPlan, key_reading
from hwdash.core.plans.from_snippet import read_snippet
from hwdash.core.plans.from_trainer import read_trainer_mapping
from hwdash.errors import UsageError

READERS: dict[str, Callable[[ConfigReader, ImportedPlan], None]] = {
    "trainer": read_trainer_mapping,
    "deepspeed": read_deepspeed,
    "accelerate": read_accelerate,
    "axolotl": read_axolotl,
    "llama-factory": read_llama_factory,
    "peft": lambda reader, out: None,  # read inside a snippet: _read
}

#: The keys the readers copied onto a plan field from their own tables before the registry held
#: them (format -> key -> field): the registry declares each of them.
KEYS_BEFORE: dict[str, dict[str, str]] = {
    "trainer": {
        "per_device_train_batch_size": "batch",
        "gradient_accumulation_steps": "grad_accum",
        "max_seq_length": "seq",
        "max_length": "seq",
        "num_train_epochs": "epochs",
        "gradient_checkpointing": "grad_ckpt",
        # --liger (issue 29): the key once read as --loss fused-linear, now the kernels' own field
        "use_liger_kernel": "liger",
    },
    "deepspeed": {
        "train_micro_batch_size_per_gpu": "batch",
        "gradient_accumulation_steps": "grad_accum",
    },
    "accelerate": {"num_processes": "gpus"},
    "axolotl": {
        "lora_r": "lora_r",
        "sequence_len": "seq",
        "micro_batch_size": "batch",
        "gradient_accumulation_steps": "grad_accum",
        "lora_dropout": "lora_dropout",
        "num_epochs": "epochs",
        "tiled_mlp": "tiled_mlp",  # added with --tiled-mlp (issue 29), declared from the start
    },
    "llama-factory": {
        "lora_rank": "lora_r",
        "cutoff_len": "seq",
        "per_device_train_batch_size": "batch",
        "gradient_accumulation_steps": "grad_accum",
        "lora_dropout": "lora_dropout",
        "num_train_epochs": "epochs",
        "enable_liger_kernel": "liger",  # added with --liger (issue 29), declared from the start
    },
    "peft": {"r": "lora_r", "lora_dropout": "lora_dropout"},
}

#: A value of each reading that no reader's default or conversion gives.
SAMPLES = {"whole": 7, "number": 0.375, "toggle": True}


def _read(file_format: str, data: dict[str, Any], tmp_path: Path) -> ImportedPlan:
    path = tmp_path / "config.yaml"
    if file_format == "peft":
        # PEFT's LoraConfig keywords, as the --export trainer snippet holds them
        keywords = ", ".join(f"{key}={value!r}" for key, value in data.items())
        text = f"args = TrainingArguments()\nconfig = LoraConfig({keywords})\n"
        return read_snippet(path, text, (path,), _no_nested)
    reader = ConfigReader(path, data, (path,), _no_nested)
    out = ImportedPlan(kind=file_format)
    READERS[file_format](reader, out)
    return out


def _no_nested(nested: Path, chain: tuple[Path, ...]) -> ImportedPlan:
    raise AssertionError(f"read {nested}")


def _declared(file_format: str) -> dict[str, str]:
    """Declared key -> plan field, for ``file_format``."""
    return {key: f.name for f, keys in fields_with_keys(file_format) for key in keys}  # type: ignore[arg-type]


def test_the_formats_are_those_the_readers_read() -> None:
    assert set(get_args(FileFormat)) == set(READERS) == set(KEYS_BEFORE)


def test_every_keyed_field_is_one_the_readers_can_copy() -> None:
    for entry in PLAN_FIELDS:
        if any(entry.keys.of(fmt) for fmt in get_args(FileFormat)):
            assert key_reading(entry) in SAMPLES, entry.name


@pytest.mark.parametrize("file_format", sorted(KEYS_BEFORE))
def test_the_registry_declares_the_keys_the_readers_took(file_format: str) -> None:
    assert _declared(file_format) == KEYS_BEFORE[file_format]


@pytest.mark.parametrize("file_format", sorted(READERS))
def test_every_declared_key_is_read_onto_its_field(file_format: str, tmp_path: Path) -> None:
    for entry, keys in fields_with_keys(file_format):  # type: ignore[arg-type]
        value = SAMPLES[str(key_reading(entry))]
        for key in keys:
            out = _read(file_format, {key: value}, tmp_path)
            assert out.updates.get(entry.name) == value, (file_format, key)


@pytest.mark.parametrize("file_format", sorted(READERS))
def test_every_key_a_reader_copies_onto_a_keyed_field_is_declared(
    file_format: str, tmp_path: Path
) -> None:
    """Any key of any format, given a sample value: where the value lands on a field the registry
    keys (as it is, not converted), the key is declared for that field in this format."""
    universe = {key for keys in KEYS_BEFORE.values() for key in keys}
    universe |= {key for fmt in READERS for key in _declared(fmt)}
    keyed = {f.name for f in PLAN_FIELDS if any(f.keys.of(fmt) for fmt in get_args(FileFormat))}
    declared = _declared(file_format)
    for key in sorted(universe):
        for value in (SAMPLES["whole"], SAMPLES["number"]):
            try:
                out = _read(file_format, {key: value}, tmp_path)
            except UsageError:
                continue
            copied = {name for name in keyed if out.updates.get(name) == value}
            assert copied <= {declared.get(key)}, (file_format, key, copied)


def test_the_first_declared_key_wins(tmp_path: Path) -> None:
    out = _read("trainer", {"max_seq_length": 512, "max_length": 1024}, tmp_path)
    assert out.updates["seq"] == 1024


PLAN = Plan(model="7B", method="lora", batch=3, grad_accum=5, seq=1536, epochs=2.5, gpus=6,
            grad_ckpt=True, liger=True)  # fmt: skip


def _check_written(file_format: str, written: dict[str, Any]) -> None:
    """Each keyed field written under its first key, none under another key; and the plan's
    value of a keyed field (a number: true/false says too little) appears under no other key."""
    declared = _declared(file_format)
    for entry, keys in fields_with_keys(file_format):  # type: ignore[arg-type]
        assert written[keys[0]] == getattr(PLAN, entry.name), (file_format, entry.name)
        assert not set(keys[1:]) & set(written), (file_format, keys)
    values = {entry.name: getattr(PLAN, entry.name) for entry, _ in fields_with_keys(file_format)}  # type: ignore[arg-type]
    for key, value in written.items():
        for name, planned in values.items():
            if not isinstance(planned, bool) and type(value) is type(planned) and value == planned:
                assert declared.get(key) == name, (file_format, key, name)


def test_the_deepspeed_export_writes_the_declared_keys() -> None:
    _check_written("deepspeed", deepspeed_config(PLAN, PLAN.gpus))


def test_the_accelerate_export_writes_the_declared_keys() -> None:
    _check_written("accelerate", accelerate_config(PLAN, PLAN.gpus))


def _snippet_keywords(call_name: str) -> dict[str, Any]:
    """The literal keyword arguments of the ``call_name(...)`` call of the plan's snippet."""
    tree = ast.parse(trainer_snippet(PLAN, "org/model"))
    call = next(
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == call_name
    )
    return {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg is not None}


def test_the_trainer_snippet_writes_the_declared_keys() -> None:
    _check_written("trainer", _snippet_keywords("SFTConfig"))


def test_the_snippets_lora_config_writes_the_declared_keys() -> None:
    _check_written("peft", _snippet_keywords("LoraConfig"))
