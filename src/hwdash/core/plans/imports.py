"""``hwdash plan --from FILE``: read the plan a training config describes.

Understood: a DeepSpeed JSON config, Hugging Face ``TrainingArguments`` / TRL config as JSON or YAML
(or the Python snippet ``--export trainer`` writes: literal keyword arguments only, read with
:mod:`ast`, never executed), an accelerate config YAML, and the YAML files of axolotl and
LLaMA-Factory where their fields map onto a plan. Keys the plan has no use for (learning rates,
logging) are reported once as ignored. Values are checked: a wrong type is a usage error naming the
file and the key.

The result is a set of plan field updates; the CLI applies them under the flags given on the
command line (flags win).
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hwdash.core.plan import (
    Attention,
    FsdpMode,
    Loss,
    Method,
    Offload,
    Optimizer,
    OptimizerImpl,
    Precision,
)
from hwdash.errors import UsageError

FLAG = "--from"


@dataclass
class ImportedPlan:
    """What a config file says about a plan."""

    kind: str
    """deepspeed, trainer, accelerate, axolotl or llama-factory."""
    updates: dict[str, Any] = field(default_factory=dict)
    """Plan field -> value."""
    ignored: list[str] = field(default_factory=list)
    """Keys read but not used (named in one warning line)."""
    notes: list[str] = field(default_factory=list)
    """What the reader had to assume."""
    not_carried: list[str] = field(default_factory=list)
    """Plan fields this kind of file has no key for (a DeepSpeed config never says the training
    method): the plan keeps the flag typed or the default, and the CLI says which it used."""
    refused: dict[str, str] = field(default_factory=dict)
    """Plan field -> why the file's setting cannot be planned (an optimizer hwdash does not count):
    the CLI exits 2 with the message unless the field's flag was typed, which replaces it."""


class _Reader:
    """Typed access to one file's values, recording which keys were used."""

    def __init__(self, path: Path, data: Mapping[str, Any], chain: tuple[Path, ...] = ()) -> None:
        self.path = path
        self.data = data
        # the files being read, outermost first, this one last (resolved): a file that names
        # one of them again would be read forever
        self.chain = chain
        self.used: set[str] = set()

    def bad(self, key: str, wanted: str, value: Any) -> UsageError:
        shown = repr(value)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        return UsageError(f"{self.path}: '{key}' must be {wanted}, got {shown}", flag=FLAG)

    def get(self, key: str) -> Any:
        self.used.add(key)
        value = self.data.get(key)
        return None if value == "auto" else value  # DeepSpeed/HF "auto": decided elsewhere

    def integer(self, key: str) -> int | None:
        value = self.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self.bad(key, "a whole number", value)
        return value

    def number(self, key: str) -> float | None:
        value = self.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.bad(key, "a number", value)
        return float(value)

    def flag(self, key: str) -> bool | None:
        value = self.get(key)
        if value is None:
            return None
        if not isinstance(value, bool):
            raise self.bad(key, "true or false", value)
        return value

    def text(self, key: str) -> str | None:
        value = self.get(key)
        if value is None:
            return None
        if not isinstance(value, str):
            raise self.bad(key, "a string", value)
        return value

    def mapping(self, key: str) -> Mapping[str, Any]:
        value = self.get(key)
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise self.bad(key, "a table of settings", value)
        return value

    def ignored(self) -> list[str]:
        return sorted(str(key) for key in self.data if key not in self.used)


def _copy_numbers(
    reader: _Reader, out: ImportedPlan, integers: Mapping[str, str], numbers: Mapping[str, str]
) -> None:
    """File key -> plan field, for whole numbers (kept when positive) and numbers."""
    for key, name in integers.items():
        value = reader.integer(key)
        if value:
            out.updates[name] = value
    for key, name in numbers.items():
        number = reader.number(key)
        if number is not None and (number > 0 or name == "lora_dropout"):
            out.updates[name] = number


# -- reading files ------------------------------------------------------------------------------


_HF_JOBS_COMMAND = "hf jobs uv run "
"""What ``--export hf-jobs`` writes (:func:`hwdash.core.plans.exports.hf_jobs_command`)."""


def read_plan_file(path: Path) -> ImportedPlan:
    """The plan a config file describes. Raises :class:`UsageError` (exit 2) for an unreadable
    or malformed file, naming the file and, where the parser knows it, the line, and for files
    whose ``deepspeed`` entries lead back to a file already being read."""
    return _read_file(path, ())


def _resolved(path: Path) -> Path | None:
    """``path`` made absolute with its links followed; None where the system cannot (a link
    loop, a name too long, a null byte)."""
    try:
        return path.resolve()
    except (OSError, RuntimeError, ValueError):
        return None


def _read_file(path: Path, outer: tuple[Path, ...]) -> ImportedPlan:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UsageError(f"cannot read '{path}': {exc}", flag=FLAG) from None
    chain = (*outer, _resolved(path) or path.absolute())
    suffix = path.suffix.lower()
    if suffix == ".py":
        return _from_snippet(path, text, chain)
    if any(line.startswith(_HF_JOBS_COMMAND) for line in text.splitlines()):
        raise UsageError(
            f"'{path}' is an hf-jobs command (a flavor and a timeout): it holds none of the "
            "plan's settings; give --from the trainer, deepspeed or accelerate export",
            flag=FLAG,
        )
    data = _parse(path, text, suffix)
    if not isinstance(data, Mapping):
        raise UsageError(f"'{path}' holds no table of settings", flag=FLAG)
    reader = _Reader(path, data, chain)
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
) -> tuple[str, Callable[[_Reader, ImportedPlan], None]]:
    if "zero_optimization" in data or "train_micro_batch_size_per_gpu" in data:
        return "deepspeed", _read_deepspeed
    if "distributed_type" in data or "deepspeed_config" in data:
        return "accelerate", _read_accelerate
    if "base_model" in data:
        return "axolotl", _read_axolotl
    if "model_name_or_path" in data and ("finetuning_type" in data or "stage" in data):
        return "llama-factory", _read_llama_factory
    if "per_device_train_batch_size" in data or "gradient_accumulation_steps" in data:
        return "trainer", _read_trainer_mapping
    raise UsageError(
        f"{path}: cannot tell what this file configures (expected a DeepSpeed, TrainingArguments/TRL, "
        "accelerate, axolotl or LLaMA-Factory config)",
        flag=FLAG,
    )


# -- DeepSpeed ----------------------------------------------------------------------------------


def _read_deepspeed(reader: _Reader, out: ImportedPlan) -> None:
    micro = reader.integer("train_micro_batch_size_per_gpu")
    accum = reader.integer("gradient_accumulation_steps")
    total = reader.integer("train_batch_size")
    if micro:
        out.updates["batch"] = micro
    if accum:
        out.updates["grad_accum"] = accum
    if total and micro and accum and total % (micro * accum) == 0:
        out.updates["gpus"] = total // (micro * accum)
    reader.get("gradient_clipping")
    zero = reader.mapping("zero_optimization")
    _zero_block(reader, zero, out)
    bf16 = reader.mapping("bf16").get("enabled")
    fp16 = reader.mapping("fp16").get("enabled")
    if bf16 is True or fp16 is True:
        # DeepSpeed's bf16/fp16 keeps an fp32 master copy and fp32 Adam states.
        out.updates["precision"] = Precision.MIXED
    elif bf16 is False and fp16 is False:
        out.updates["precision"] = Precision.FP32


def _zero_block(reader: _Reader, zero: Mapping[str, Any], out: ImportedPlan) -> None:
    stage = zero.get("stage")
    if stage is not None:
        if isinstance(stage, bool) or not isinstance(stage, int) or not 0 <= stage <= 3:
            raise reader.bad("zero_optimization.stage", "0, 1, 2 or 3", stage)
        out.updates["zero"] = stage
    optimizer = zero.get("offload_optimizer") or {}
    param = zero.get("offload_param") or {}
    if isinstance(param, Mapping) and param.get("device") in ("cpu", "nvme"):
        out.updates["offload"] = Offload.PARAMS
    elif isinstance(optimizer, Mapping) and optimizer.get("device") in ("cpu", "nvme"):
        out.updates["offload"] = Offload.OPTIMIZER
    elif zero:
        out.updates["offload"] = Offload.NONE


# -- accelerate ---------------------------------------------------------------------------------


def _read_accelerate(reader: _Reader, out: ImportedPlan) -> None:
    for key in ("compute_environment", "num_machines", "machine_rank", "use_cpu"):
        reader.get(key)
    processes = reader.integer("num_processes")
    if processes:
        out.updates["gpus"] = processes
    distributed = reader.text("distributed_type")
    deepspeed = reader.mapping("deepspeed_config")
    precision = reader.text("mixed_precision")
    if deepspeed or distributed == "DEEPSPEED":
        stage = deepspeed.get("zero_stage", 0)
        if isinstance(stage, bool) or not isinstance(stage, int) or not 0 <= stage <= 3:
            raise reader.bad("deepspeed_config.zero_stage", "0, 1, 2 or 3", stage)
        out.updates["zero"] = stage
        accum = deepspeed.get("gradient_accumulation_steps")
        if isinstance(accum, int) and not isinstance(accum, bool) and accum > 0:
            out.updates["grad_accum"] = accum
        if deepspeed.get("offload_param_device") in ("cpu", "nvme"):
            out.updates["offload"] = Offload.PARAMS
        elif deepspeed.get("offload_optimizer_device") in ("cpu", "nvme"):
            out.updates["offload"] = Offload.OPTIMIZER
        else:
            out.updates["offload"] = Offload.NONE
    fsdp = reader.mapping("fsdp_config")
    if fsdp or distributed == "FSDP":
        _fsdp_block(reader, fsdp, out)
    if precision in ("bf16", "fp16"):
        # accelerate autocasts an fp32 model; under DeepSpeed the fp32 master copy is kept. Under
        # FSDP the config cannot say the model's dtype: read as a bf16-loaded model, everything
        # bf16 (torchtune's and hwdash's FSDP default), and said so.
        if out.updates.get("zero"):
            out.updates["precision"] = Precision.MIXED
        elif out.updates.get("fsdp"):
            out.updates["precision"] = Precision.BF16
            out.notes.append(
                "FSDP with mixed_precision bf16 read as a model loaded in bf16 (--precision bf16); "
                "a model loaded in fp32 is --precision mixed"
            )
        else:
            out.updates["precision"] = Precision.AMP
            out.notes.append(
                f"mixed_precision {precision} read as autocast over an fp32 model (--precision "
                "amp): the config cannot say a model loaded in bf16 (--precision bf16)"
            )
    elif precision == "no":
        out.updates["precision"] = Precision.FP32


#: accelerate's ``fsdp_sharding_strategy``, by name or by the number older configs wrote
#: (torch.distributed.fsdp.ShardingStrategy: 1 FULL_SHARD, 2 SHARD_GRAD_OP, 3 NO_SHARD,
#: 4 HYBRID_SHARD, 5 _HYBRID_SHARD_ZERO2).
_FSDP_STRATEGIES = {
    "FULL_SHARD": FsdpMode.FULL,
    "1": FsdpMode.FULL,
    "HYBRID_SHARD": FsdpMode.HYBRID,
    "4": FsdpMode.HYBRID,
}


def _fsdp_block(reader: _Reader, fsdp: Mapping[str, Any], out: ImportedPlan) -> None:
    strategy = fsdp.get("fsdp_sharding_strategy")
    if strategy is None:
        # FSDP2 configs (fsdp_version: 2) say fsdp_reshard_after_forward instead: true is full
        # shard, false keeps the gathered parameters as ZeRO-2 does (not modelled)
        strategy = "FULL_SHARD" if fsdp.get("fsdp_reshard_after_forward", True) else "ZERO2"
    key = str(strategy).upper()
    mode = _FSDP_STRATEGIES.get(key)
    if mode is None:
        if isinstance(strategy, bool) or not isinstance(strategy, (str, int)):
            raise reader.bad("fsdp_config.fsdp_sharding_strategy", "a sharding strategy", strategy)
        out.notes.append(
            f"FSDP sharding strategy {strategy!r} is not modelled: planned as full shard (less "
            "memory than it needs)"
        )
        mode = FsdpMode.FULL
    out.updates["fsdp"] = mode
    offload = fsdp.get("fsdp_offload_params", False)
    if not isinstance(offload, bool):
        raise reader.bad("fsdp_config.fsdp_offload_params", "true or false", offload)
    out.updates["fsdp_offload"] = offload
    machines = reader.integer("num_machines")
    processes = out.updates.get("gpus")
    if mode is FsdpMode.HYBRID and machines and processes and processes % machines == 0:
        out.updates["gpus_per_node"] = processes // machines


# -- TrainingArguments / TRL --------------------------------------------------------------------

#: The Trainer's ``optim`` names (``OptimizerNames``, transformers/training_args.py) whose memory
#: hwdash counts, as the plan's optimizer. The Trainer builds them in ``get_optimizer_cls_and_kwargs``
#: (transformers/trainer_optimizer.py): ``adamw_torch`` is ``torch.optim.AdamW`` with torch's
#: default (foreach on CUDA), ``adamw_torch_fused`` the same with ``fused=True``; ``adamw_hf`` was
#: transformers' own AdamW (removed in 5.x), a per-tensor loop kept here as foreach as before;
#: ``adamw_bnb_8bit``, ``adamw_8bit``, ``paged_adamw_8bit`` and ``paged_adamw_32bit`` are
#: bitsandbytes' ``AdamW`` with ``optim_bits`` 8 or 32 ("8bit" in the name) and ``is_paged``
#: ("paged" in the name); ``adafactor`` is transformers' Adafactor; ``sgd`` is ``torch.optim.SGD``.
OPTIMIZERS = {
    "adamw_torch_fused": (Optimizer.ADAMW, OptimizerImpl.FUSED),
    "adamw_torch": (Optimizer.ADAMW, OptimizerImpl.FOREACH),
    "adamw_hf": (Optimizer.ADAMW, OptimizerImpl.FOREACH),
    "adamw_bnb_8bit": (Optimizer.ADAMW_8BIT, None),
    "adamw_8bit": (Optimizer.ADAMW_8BIT, None),
    "paged_adamw_8bit": (Optimizer.ADAMW_8BIT_PAGED, None),
    "paged_adamw_32bit": (Optimizer.ADAMW_32BIT_PAGED, None),
    "adafactor": (Optimizer.ADAFACTOR, None),
    "sgd": (Optimizer.SGD, None),
}

#: What the Trainer's other ``optim`` names are, by a part of the name, for the refusal: their
#: states differ from every optimizer hwdash counts (transformers/trainer_optimizer.py).
UNMODELLED_OPTIMIZERS = (
    ("ademamix", "AdEMAMix keeps three states per parameter"),
    ("lion", "Lion keeps one state per parameter"),
    ("rmsprop", "RMSprop keeps one state per parameter"),
    ("adagrad", "Adagrad keeps one state per parameter"),
    ("galore", "GaLore keeps states of low-rank projected gradients"),
    ("apollo", "APOLLO keeps states of low-rank projected gradients"),
    ("lomo", "LOMO and AdaLomo update the weights inside the backward pass"),
    ("schedule_free", "a schedule-free optimizer (facebookresearch/schedule_free)"),
    ("grokadamw", "GrokAdamW"),
    ("stable_adamw", "StableAdamW (torch-optimi)"),
    ("anyprecision", "AnyPrecisionAdamW (torchdistx)"),
    ("adamw_torch_4bit", "torchao's 4-bit AdamW"),
    ("adamw_torch_8bit", "torchao's 8-bit AdamW"),
    ("xla", "AdamW on XLA devices (TPUs)"),
    ("npu", "AdamW on Ascend NPUs"),
)


def _optimizer(reader: _Reader, key: str, out: ImportedPlan) -> None:
    name = reader.text(key)
    if name is None:
        return
    if name not in OPTIMIZERS:
        what = next((what for part, what in UNMODELLED_OPTIMIZERS if part in name), None)
        known = f" ({what})" if what else ""
        choices = ", ".join(o.value for o in Optimizer)
        out.refused["optimizer"] = (
            f"{reader.path}: '{key}' is {name!r}{known}: hwdash does not model this optimizer's "
            f"memory yet; give --optimizer ({choices}) to plan one it counts"
        )
        return
    optimizer, impl = OPTIMIZERS[name]
    out.updates["optimizer"] = optimizer
    if impl is not None:
        out.updates["optimizer_impl"] = impl


def _precision_from(
    bf16: bool | None, fp16: bool | None, dtype: str | None, fsdp: bool = False
) -> Precision | None:
    if bf16 or fp16:
        # Weights loaded in 16 bits train in 16 bits; loaded in fp32 they are autocast (amp), or
        # under FSDP sharded in fp32 and gathered in 16 bits (FSDP's mixed-precision policy).
        if dtype in ("bfloat16", "float16", "bf16", "fp16"):
            return Precision.BF16
        return Precision.MIXED if fsdp else Precision.AMP
    if bf16 is False and fp16 is False:
        return Precision.FP32
    return None


def _read_trainer_mapping(reader: _Reader, out: ImportedPlan) -> None:
    _copy_numbers(
        reader,
        out,
        {
            "per_device_train_batch_size": "batch",
            "gradient_accumulation_steps": "grad_accum",
            "max_seq_length": "seq",
            "max_length": "seq",
        },
        {"num_train_epochs": "epochs"},
    )
    ckpt = reader.flag("gradient_checkpointing")
    if ckpt is not None:
        out.updates["grad_ckpt"] = ckpt
    reader.get("max_grad_norm")
    reader.get("output_dir")
    # GRPOConfig: completions of each prompt; the batch already counts completions (TRL's
    # per_device_train_batch_size), so it changes no memory
    reader.get("num_generations")
    _optimizer(reader, "optim", out)
    if reader.flag("torch_compile"):
        out.updates["compile"] = True
    if reader.flag("use_liger_kernel"):
        out.updates["loss"] = Loss.FUSED_LINEAR  # Liger's fused linear cross-entropy
    if reader.flag("activation_offloading"):
        out.updates["activation_offload"] = True
    _trainer_fsdp(reader, out)
    _accelerator_config(reader, out)
    init = reader.mapping("model_init_kwargs")
    dtype = init.get("torch_dtype") or init.get("dtype")
    precision = _precision_from(
        reader.flag("bf16"), reader.flag("fp16"), dtype, fsdp="fsdp" in out.updates
    )
    if precision is not None:
        out.updates["precision"] = precision
    _deepspeed_path(reader, "deepspeed", out)


def _trainer_fsdp(reader: _Reader, out: ImportedPlan) -> None:
    """The Trainer's ``fsdp`` option: a string of words or a list of them (``full_shard``,
    ``hybrid_shard``, ``offload``, ``auto_wrap``...)."""
    value = reader.get("fsdp")
    if value in (None, "", False, []):
        return
    if isinstance(value, str):
        words = value.split()
    elif isinstance(value, list) and all(isinstance(word, str) for word in value):
        words = list(value)
    else:
        raise reader.bad("fsdp", "FSDP options such as 'full_shard auto_wrap'", value)
    if "hybrid_shard" in words:
        out.updates["fsdp"] = FsdpMode.HYBRID
    elif "full_shard" in words:
        out.updates["fsdp"] = FsdpMode.FULL
    else:
        out.notes.append(
            f"fsdp {' '.join(words)!r} is not modelled (full or hybrid shard): ignored"
        )
        return
    out.updates["fsdp_offload"] = "offload" in words


def _accelerator_config(reader: _Reader, out: ImportedPlan) -> None:
    """The Trainer's ``accelerator_config``: a table, or the path of a JSON file holding one
    (transformers/trainer_pt_utils.py ``AcceleratorConfig.from_json_file``); its
    ``gradient_accumulation_kwargs.sync_each_batch`` is accelerate's (issue 22)."""
    value = reader.get("accelerator_config")
    if value is None:
        return
    key = "accelerator_config"
    if isinstance(value, str):
        path = (reader.path.parent / value).resolve()
        try:
            value = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError):
            out.notes.append(f"accelerator_config {value!r} not readable next to the file: ignored")
            return
        key = f"accelerator_config ({path.name})"
    if not isinstance(value, Mapping):
        raise reader.bad(key, "a table of settings or a JSON file's path", value)
    kwargs = value.get("gradient_accumulation_kwargs") or {}
    if not isinstance(kwargs, Mapping):
        raise reader.bad(f"{key}.gradient_accumulation_kwargs", "a table of settings", kwargs)
    sync = kwargs.get("sync_each_batch")
    if sync is None:
        return
    if not isinstance(sync, bool):
        raise reader.bad(
            f"{key}.gradient_accumulation_kwargs.sync_each_batch", "true or false", sync
        )
    out.updates["sync_each_batch"] = sync


def _deepspeed_path(reader: _Reader, key: str, out: ImportedPlan) -> None:
    value = reader.get(key)
    if value is None:
        return
    if isinstance(value, Mapping):
        block = value
    elif isinstance(value, str):
        path = _resolved(reader.path.parent / value)
        try:
            found = path is not None and path.is_file()
        except (OSError, ValueError):
            found = False
        if path is None or not found:
            out.notes.append(f"DeepSpeed config {value!r} not found next to the file: ZeRO unknown")
            return
        if path in reader.chain:
            if path == reader.chain[-1]:
                raise UsageError(f"{reader.path}: '{key}' names the file itself", flag=FLAG)
            loop = " -> ".join(
                str(file) for file in (*reader.chain[reader.chain.index(path) :], path)
            )
            raise UsageError(
                f"{reader.path}: '{key}' leads back to a file already being read ({loop})",
                flag=FLAG,
            )
        nested = _read_file(path, reader.chain)
        for name in ("zero", "offload"):
            if name in nested.updates:
                out.updates[name] = nested.updates[name]
        if nested.updates.get("precision") is Precision.MIXED:
            out.updates["precision"] = Precision.MIXED
        return
    else:
        raise reader.bad(key, "a path to a DeepSpeed JSON", value)
    zero = block.get("zero_optimization")
    if isinstance(zero, Mapping):
        _zero_block(reader, zero, out)


# -- the Python snippet of --export trainer -----------------------------------------------------

_CONFIG_CALLS = {"TrainingArguments", "SFTConfig", "GRPOConfig", "PPOConfig"}


def _from_snippet(path: Path, text: str, chain: tuple[Path, ...]) -> ImportedPlan:
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
    config_name = next((name for name in _CONFIG_CALLS if name in calls), None)
    if config_name is None:
        raise UsageError(
            f"'{path}' builds no TrainingArguments, SFTConfig, GRPOConfig or PPOConfig", flag=FLAG
        )
    arguments = dict(calls[config_name])
    dtype = constants.get("MODEL_DTYPE")
    if isinstance(dtype, str):
        arguments.setdefault("model_init_kwargs", {"torch_dtype": dtype})
    reader = _Reader(path, arguments, chain)
    out = ImportedPlan(kind="trainer")
    _read_trainer_mapping(reader, out)
    out.ignored = reader.ignored()
    _parallelism_mesh(calls.get("ParallelismConfig", {}), out)
    if isinstance(constants.get("MODEL"), str):
        out.updates["model"] = constants["MODEL"]
    if isinstance(constants.get("MAX_LENGTH"), int):
        out.updates["seq"] = constants["MAX_LENGTH"]
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
    return out


def _module_names(path: Path, key: str, names: str | Sequence[str]) -> tuple[str, ...]:
    """LoRA target modules from a comma-separated string or a list; none at all is a usage error
    (an empty list would reach the planner as a LoRA on no module)."""
    parts = names.split(",") if isinstance(names, str) else names
    modules = tuple(part.strip() for part in parts if part.strip())
    if not modules:
        raise UsageError(f"{path}: '{key}' names no module", flag=FLAG)
    return modules


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
    rank = lora.get("r")
    if isinstance(rank, int) and not isinstance(rank, bool) and rank > 0:
        out.updates["lora_r"] = rank
    targets = lora.get("target_modules")
    if isinstance(targets, str) or (
        isinstance(targets, (list, tuple)) and all(isinstance(t, str) for t in targets)
    ):
        out.updates["lora_targets"] = _module_names(path, "target_modules", targets)
    dropout = lora.get("lora_dropout")
    if isinstance(dropout, (int, float)) and not isinstance(dropout, bool):
        out.updates["lora_dropout"] = float(dropout)
    saved = lora.get("modules_to_save")
    if isinstance(saved, (list, tuple)) and saved and all(isinstance(m, str) for m in saved):
        # PEFT's LoraConfig.modules_to_save: modules trained in full next to the adapters
        out.updates["lora_modules_to_save"] = _module_names(path, "modules_to_save", saved)


# -- axolotl ------------------------------------------------------------------------------------


def _read_axolotl(reader: _Reader, out: ImportedPlan) -> None:
    model = reader.text("base_model")
    if model:
        out.updates["model"] = model
    adapter = reader.text("adapter")
    in_4bit = reader.flag("load_in_4bit")
    in_8bit = reader.flag("load_in_8bit")
    if adapter in ("lora", "qlora"):
        method = Method.LORA
        if adapter == "qlora" or in_4bit:
            method = Method.QLORA
        elif in_8bit:
            method = Method.LORA_8BIT
        if reader.flag("peft_use_dora"):
            method = Method.DORA
        out.updates["method"] = method
    elif adapter is None:
        out.updates["method"] = Method.FULL
    _copy_numbers(
        reader,
        out,
        {
            "lora_r": "lora_r",
            "sequence_len": "seq",
            "micro_batch_size": "batch",
            "gradient_accumulation_steps": "grad_accum",
        },
        {"lora_dropout": "lora_dropout", "num_epochs": "epochs"},
    )
    if reader.flag("lora_target_linear"):
        out.updates["lora_targets"] = ("all-linear",)
    modules = reader.get("lora_target_modules")
    if isinstance(modules, list) and modules and all(isinstance(m, str) for m in modules):
        out.updates["lora_targets"] = _module_names(reader.path, "lora_target_modules", modules)
    saved = reader.get("lora_modules_to_save")
    if isinstance(saved, list) and saved and all(isinstance(m, str) for m in saved):
        # axolotl hands it to PEFT's LoraConfig(modules_to_save=...)
        out.updates["lora_modules_to_save"] = _module_names(
            reader.path, "lora_modules_to_save", saved
        )
    ckpt = reader.get("gradient_checkpointing")
    if ckpt is not None:
        out.updates["grad_ckpt"] = bool(ckpt)  # axolotl also takes "unsloth" here
    if reader.flag("flash_attention"):
        out.updates["attention"] = Attention.FLASH
    elif reader.flag("sdp_attention"):
        out.updates["attention"] = Attention.SDPA
    _axolotl_precision(reader, out, in_8bit=bool(in_8bit))
    _optimizer(reader, "optimizer", out)
    _deepspeed_path(reader, "deepspeed", out)


_MISSING = object()


def _axolotl_bf16(reader: _Reader) -> bool | None:
    """axolotl's ``bf16``: true, false, null or "auto" (its schema: ``Literal["auto"] | bool |
    None``, default "auto"; pydantic also takes the words true and false). None means auto."""
    reader.used.add("bf16")  # read raw: the reader's get() turns "auto" into None
    written = reader.data.get("bf16", _MISSING)
    if written is _MISSING or written == "auto":
        return None
    if written is None or isinstance(written, bool):
        return bool(written)
    if isinstance(written, str) and written.lower() in ("true", "false"):
        return written.lower() == "true"
    raise reader.bad("bf16", "true, false or auto", written)


def _axolotl_precision(reader: _Reader, out: ImportedPlan, *, in_8bit: bool) -> None:
    """The dtype axolotl loads and trains the model in, as its ``resolve_dtype`` picks it
    (src/axolotl/utils/config/__init__.py): ``bf16: auto`` (the default) is bf16 where the GPU has
    it, else fp16; then bf16/bfloat16 load in bfloat16, fp16/float16/load_in_8bit in float16, and
    anything else in float32, trained without autocast."""
    bf16 = _axolotl_bf16(reader)
    fp16 = reader.flag("fp16")
    if bf16 is None:  # auto
        bf16 = not fp16
        if bf16 and "bf16" in reader.data:
            out.notes.append(
                "bf16: auto planned as bf16 (axolotl picks bf16 where the GPU supports it, "
                "fp16 elsewhere: the same bytes)"
            )
    sixteen_bits = bf16 or reader.flag("bfloat16") or fp16 or reader.flag("float16") or in_8bit
    # 16 bits: axolotl loads the base weights in the training dtype; bf16 and fp16 weigh the same
    out.updates["precision"] = Precision.BF16 if sixteen_bits else Precision.FP32


# -- LLaMA-Factory ------------------------------------------------------------------------------


def _read_llama_factory(reader: _Reader, out: ImportedPlan) -> None:
    model = reader.text("model_name_or_path")
    if model:
        out.updates["model"] = model
    stage = reader.text("stage") or "sft"
    finetuning = reader.text("finetuning_type") or "lora"
    bits = reader.integer("quantization_bit")
    method = Method.FULL if finetuning in ("full", "freeze") else Method.LORA
    if finetuning == "freeze":
        out.notes.append("finetuning_type freeze is planned as full fine-tuning (an upper bound)")
    if method is Method.LORA:
        if reader.flag("use_dora"):
            method = Method.DORA
        if bits == 4:
            method = Method.QLORA
        elif bits == 8:
            method = Method.LORA_8BIT
        elif bits:
            out.notes.append(
                f"quantization_bit {bits} is not counted (hwdash counts 4 and 8 bits): planned "
                "as LoRA on an unquantized model (more memory than it needs)"
            )
    if stage == "ppo":
        out.updates["method"] = Method.PPO
        out.updates["rl_method"] = method
    else:
        if stage not in ("sft", "pt"):
            out.notes.append(f"stage {stage!r} is planned as supervised fine-tuning")
        out.updates["method"] = method
    _copy_numbers(
        reader,
        out,
        {
            "lora_rank": "lora_r",
            "cutoff_len": "seq",
            "per_device_train_batch_size": "batch",
            "gradient_accumulation_steps": "grad_accum",
        },
        {"lora_dropout": "lora_dropout", "num_train_epochs": "epochs"},
    )
    target = reader.text("lora_target")
    if target:
        out.updates["lora_targets"] = (
            ("all-linear",)
            if target == "all"
            else _module_names(reader.path, "lora_target", target)
        )
    additional = reader.text("additional_target")
    if additional:
        # LLaMA-Factory's FinetuningArguments.additional_target: comma-separated names of modules
        # "apart from LoRA layers to be set as trainable and saved", passed to PEFT's
        # modules_to_save
        out.updates["lora_modules_to_save"] = _module_names(
            reader.path, "additional_target", additional
        )
    attention = reader.text("flash_attn")
    if attention == "fa2":
        out.updates["attention"] = Attention.FLASH
    elif attention == "sdpa":
        out.updates["attention"] = Attention.SDPA
    elif attention == "disabled":
        out.updates["attention"] = Attention.EAGER
    _llama_factory_precision(reader, out, method)
    if reader.flag("gradient_checkpointing") is False:
        out.updates["grad_ckpt"] = False
    elif "disable_gradient_checkpointing" in reader.data:
        out.updates["grad_ckpt"] = not bool(reader.get("disable_gradient_checkpointing"))
    else:
        out.updates["grad_ckpt"] = True  # LLaMA-Factory checkpoints unless told not to
    _optimizer(reader, "optim", out)
    _deepspeed_path(reader, "deepspeed", out)


def _llama_factory_precision(reader: _Reader, out: ImportedPlan, method: Method) -> None:
    """What LLaMA-Factory trains in. Its bf16 and fp16 are TrainingArguments' (default off). It
    loads the model in the compute dtype (bf16/fp16 when set, else the checkpoint's 16 bits where
    the GPU has them: ``infer_optim_dtype``) and then upcasts the trainable parameters to fp32
    unless ``pure_bf16`` (src/llamafactory/model/adapter.py, ``init_adapter``). So full and freeze
    tuning hold fp32 weights, autocast only with bf16/fp16; LoRA's frozen base stays 16 bits."""
    bf16 = reader.flag("bf16")
    fp16 = reader.flag("fp16")
    if reader.flag("pure_bf16"):
        out.updates["precision"] = Precision.BF16
    elif method is not Method.FULL:
        out.updates["precision"] = Precision.BF16
        if not (bf16 or fp16) and method in (Method.LORA, Method.DORA):
            out.notes.append(
                "bf16 and fp16 off: LLaMA-Factory still loads the frozen base in the checkpoint's "
                "16 bits (infer_optim_dtype), planned as bf16; the adapters train in fp32"
            )
    elif bf16 or fp16:
        out.updates["precision"] = Precision.AMP
    else:
        out.updates["precision"] = Precision.FP32
        if bf16 is None and fp16 is None:
            out.notes.append("no bf16 or fp16: LLaMA-Factory trains in fp32 (their default is off)")
