"""``--from`` the Python snippet ``--export trainer`` writes: its literal keyword arguments and
constants, read with :mod:`ast` and never executed.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hwdash.core.plan import FsdpMode, Method
from hwdash.core.plan_fields import file_key
from hwdash.core.plans.from_reader import (
    FLAG,
    ConfigReader,
    ImportedPlan,
    NestedRead,
    module_names,
)
from hwdash.core.plans.from_trainer import read_trainer_mapping
from hwdash.errors import UsageError

_CONFIG_CALLS = {"TrainingArguments", "SFTConfig", "GRPOConfig", "PPOConfig"}
"""The calls that build the Trainer's arguments (transformers, TRL)."""


def read_snippet(
    path: Path, text: str, chain: tuple[Path, ...], read_nested: NestedRead
) -> ImportedPlan:
    """The plan of a ``--export trainer`` snippet (``text``, read from ``path`` inside the files
    ``chain``): its config call's keywords read as Trainer keys, the constants it names the
    model and length with, and the method its PEFT, bitsandbytes and TRL calls imply."""
    constants, calls = _literals(path, text)
    config_name = next((name for name in _CONFIG_CALLS if name in calls), None)
    if config_name is None:
        raise UsageError(
            f"'{path}' builds no TrainingArguments, SFTConfig, GRPOConfig or PPOConfig", flag=FLAG
        )
    arguments = dict(calls[config_name])
    dtype = constants.get("MODEL_DTYPE")
    if isinstance(dtype, str):
        arguments.setdefault("model_init_kwargs", {"torch_dtype": dtype})
    reader = ConfigReader(path, arguments, chain, read_nested)
    out = ImportedPlan(kind="trainer")
    read_trainer_mapping(reader, out)
    out.ignored = reader.ignored()
    _parallelism_mesh(calls.get("ParallelismConfig", {}), out)
    if isinstance(constants.get("MODEL"), str):
        out.updates["model"] = constants["MODEL"]
    if isinstance(constants.get("MAX_LENGTH"), int):
        out.updates["seq"] = constants["MAX_LENGTH"]
    _snippet_method(path, config_name, calls, out)
    return out


def _literals(path: Path, text: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The snippet's constants (``NAME = literal``) and its calls by name, each with its literal
    keyword arguments (the others, ``torch.bfloat16`` and the like, are left out)."""
    try:
        tree = ast.parse(text, filename=str(path))
    except SyntaxError as exc:
        where = f"line {exc.lineno}: " if exc.lineno is not None else ""  # None: a null byte
        raise UsageError(f"'{path}' is not valid Python ({where}{exc.msg})", flag=FLAG) from None
    constants: dict[str, Any] = {}
    calls: dict[str, dict[str, Any]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and isinstance(node.value, ast.Constant):
                constants[target.id] = node.value.value
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            keywords = {}
            for keyword in node.keywords:
                if keyword.arg is None:
                    continue
                try:
                    keywords[keyword.arg] = ast.literal_eval(keyword.value)
                except (ValueError, TypeError, MemoryError, RecursionError):
                    # torch.bfloat16 and the like: not a literal, not needed; TypeError: a dict
                    # key or set member that cannot be hashed ({[1]: 2})
                    continue
            calls[node.func.id] = keywords
    return constants, calls


def _snippet_method(
    path: Path, config_name: str, calls: Mapping[str, dict[str, Any]], out: ImportedPlan
) -> None:
    """The method the snippet trains with: LoRA or DoRA where it builds a ``LoraConfig`` (whose
    fields are read), QLoRA or 8-bit LoRA where a ``BitsAndBytesConfig`` quantizes, full tuning
    otherwise; under ``GRPOConfig`` or ``PPOConfig`` that is the policy's (``rl_method``)."""
    method = Method.FULL
    lora = calls.get("LoraConfig")
    if lora is not None:
        method = Method.DORA if lora.get("use_dora") else Method.LORA
        _lora_fields(Path(path), lora, out)
    quantization = calls.get("BitsAndBytesConfig", {})
    if quantization.get("load_in_4bit"):
        method = Method.QLORA
    elif quantization.get("load_in_8bit"):
        method = Method.LORA_8BIT
    if config_name == "GRPOConfig":
        out.updates["method"] = Method.GRPO
        out.updates["rl_method"] = method
    elif config_name == "PPOConfig":
        out.updates["method"] = Method.PPO
        out.updates["rl_method"] = method
    else:
        out.updates["method"] = method


def _parallelism_mesh(mesh: Mapping[str, Any], out: ImportedPlan) -> None:
    """accelerate's ``ParallelismConfig(dp_replicate_size=R, dp_shard_size=S)`` next to full
    sharding: FSDP2's hybrid sharding when R > 1 (sharded over S GPUs of a node, replicated over
    R nodes; accelerate/parallelism_config.py), what ``--export trainer`` writes for
    ``--fsdp hybrid``."""
    replicas = mesh.get("dp_replicate_size", 1)
    shard = mesh.get("dp_shard_size", 1)
    if out.updates.get("fsdp") is not FsdpMode.FULL:
        return
    counts = (replicas, shard)
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in counts):
        return
    if replicas > 1 and shard > 1:
        out.updates["fsdp"] = FsdpMode.HYBRID
        out.updates["gpus_per_node"] = shard


def _lora_fields(path: Path, lora: Mapping[str, Any], out: ImportedPlan) -> None:
    """PEFT's ``LoraConfig(...)`` keyword arguments: rank, target modules, dropout and the modules
    trained in full."""
    rank = lora.get(file_key("lora_r", "peft"))
    if isinstance(rank, int) and not isinstance(rank, bool) and rank > 0:
        out.updates["lora_r"] = rank
    targets = lora.get("target_modules")
    if isinstance(targets, str) or (
        isinstance(targets, (list, tuple)) and all(isinstance(t, str) for t in targets)
    ):
        out.updates["lora_targets"] = module_names(path, "target_modules", targets)
    dropout = lora.get(file_key("lora_dropout", "peft"))
    if isinstance(dropout, (int, float)) and not isinstance(dropout, bool):
        # out of range (an int past float's too: inf), Plan's own check says so
        out.updates["lora_dropout"] = float(dropout) if abs(dropout) <= 1e300 else math.inf
    saved = lora.get("modules_to_save")
    if isinstance(saved, (list, tuple)) and saved and all(isinstance(m, str) for m in saved):
        # PEFT's LoraConfig.modules_to_save: modules trained in full next to the adapters
        out.updates["lora_modules_to_save"] = module_names(path, "modules_to_save", saved)
