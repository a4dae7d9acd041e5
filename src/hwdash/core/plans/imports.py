"""``hwdash plan --from FILE``: read the plan a training config describes.

Understood: a DeepSpeed JSON config, Hugging Face ``TrainingArguments`` / TRL config as JSON or YAML
(or the Python snippet ``--export trainer`` writes: literal keyword arguments only, read with
:mod:`ast`, never executed), an accelerate config YAML, and the YAML files of axolotl and
LLaMA-Factory where their fields map onto a plan; and a serving engine's command line in a shell or
text file (one ``vllm serve`` or ``python -m sglang.launch_server`` line, what ``--export vllm``
writes: :mod:`~hwdash.core.plans.from_server`). Keys the plan has no use for (learning rates,
logging) are reported once as ignored. Values are checked: a wrong type is a usage error naming the
file and the key.

The result is a set of plan field updates; the CLI applies them under the flags given on the
command line (flags win).

The readers of each format live beside this module (``from_deepspeed``, ``from_accelerate``,
``from_trainer``, ``from_snippet``, ``from_axolotl``, ``from_llama_factory``, ``from_server``, sharing
``from_reader``); this one reads the file, tells its format and hands it to its reader.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hwdash.core.plans.from_accelerate import read_accelerate
from hwdash.core.plans.from_axolotl import read_axolotl
from hwdash.core.plans.from_deepspeed import read_deepspeed
from hwdash.core.plans.from_llama_factory import read_llama_factory
from hwdash.core.plans.from_reader import FLAG, ConfigReader, ImportedPlan, resolved_path
from hwdash.core.plans.from_server import read_server_command, server_words
from hwdash.core.plans.from_snippet import read_snippet
from hwdash.core.plans.from_trainer import OPTIMIZERS, UNMODELLED_OPTIMIZERS, read_trainer_mapping
from hwdash.errors import UsageError

__all__ = [
    "FLAG",
    "OPTIMIZERS",
    "UNMODELLED_OPTIMIZERS",
    "ImportedPlan",
    "read_plan_file",
]

_HF_JOBS_COMMAND = "hf jobs uv run "
"""What ``--export hf-jobs`` writes (:func:`hwdash.core.plans.exports.hf_jobs_command`)."""


def read_plan_file(path: Path) -> ImportedPlan:
    """The plan a config file describes. Raises :class:`UsageError` (exit 2) for an unreadable
    or malformed file, naming the file and, where the parser knows it, the line, and for files
    whose ``deepspeed`` entries lead back to a file already being read."""
    return _read_file(path, ())


def _read_file(path: Path, outer: tuple[Path, ...]) -> ImportedPlan:
    """The plan in ``path``, read inside the files ``outer`` (a ``deepspeed`` entry's file is read
    with its referrers outside it); each reader is handed this function for such nested files."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UsageError(f"cannot read '{path}': {exc}", flag=FLAG) from None
    chain = (*outer, resolved_path(path) or path.absolute())
    suffix = path.suffix.lower()
    if suffix == ".py":
        return read_snippet(path, text, chain, _read_file)
    servers = server_words(text) if suffix not in (".json", ".yaml", ".yml") else []
    if len(servers) > 1:
        raise UsageError(
            f"'{path}' holds {len(servers)} server command lines: --from reads one "
            "(keep the vllm serve or sglang.launch_server line to plan)",
            flag=FLAG,
        )
    if servers:
        return read_server_command(path, servers[0])
    if any(line.startswith(_HF_JOBS_COMMAND) for line in text.splitlines()):
        raise UsageError(
            f"'{path}' is an hf-jobs command (a flavor and a timeout): it holds none of the "
            "plan's settings; give --from the trainer, deepspeed or accelerate export",
            flag=FLAG,
        )
    data = _parse(path, text, suffix)
    if not isinstance(data, Mapping):
        raise UsageError(f"'{path}' holds no table of settings", flag=FLAG)
    reader = ConfigReader(path, data, chain, _read_file)
    kind, read = _detect(path, data)
    result = ImportedPlan(kind=kind)
    read(reader, result)
    result.ignored = reader.ignored()
    if "method" not in result.updates:
        # DeepSpeed, accelerate and TrainingArguments configs: the method (LoRA, QLoRA, PPO...)
        # lives in the training code (peft, bitsandbytes, the TRL trainer), never in them.
        result.not_carried += ["method", "rl_method"]
    return result


def _parse(path: Path, text: str, suffix: str) -> Any:
    """The JSON (``.json``) or YAML (anything else) in ``text``; a usage error names the line."""
    if suffix == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise UsageError(
                f"'{path}' is not valid JSON (line {exc.lineno}: {exc.msg})", flag=FLAG
            ) from None
        except (RecursionError, ValueError):
            raise UsageError(f"'{path}' is not usable JSON", flag=FLAG) from None
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark is not None else "?"
        raise UsageError(
            f"'{path}' is not valid YAML (line {line}: {exc.problem})", flag=FLAG
        ) from None
    except (yaml.YAMLError, RecursionError, ValueError) as exc:
        raise UsageError(f"'{path}' is not valid YAML: {exc}", flag=FLAG) from None


def _detect(
    path: Path, data: Mapping[str, Any]
) -> tuple[str, Callable[[ConfigReader, ImportedPlan], None]]:
    """The format of a table of settings, by the keys only it has, and the reader of that format."""
    if "zero_optimization" in data or "train_micro_batch_size_per_gpu" in data:
        return "deepspeed", read_deepspeed
    if "distributed_type" in data or "deepspeed_config" in data:
        return "accelerate", read_accelerate
    if "base_model" in data:
        return "axolotl", read_axolotl
    if "model_name_or_path" in data and ("finetuning_type" in data or "stage" in data):
        return "llama-factory", read_llama_factory
    if "per_device_train_batch_size" in data or "gradient_accumulation_steps" in data:
        return "trainer", read_trainer_mapping
    raise UsageError(
        f"{path}: cannot tell what this file configures (expected a DeepSpeed, TrainingArguments/TRL, "
        "accelerate, axolotl or LLaMA-Factory config)",
        flag=FLAG,
    )
