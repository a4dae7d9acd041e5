"""``--from`` a DeepSpeed JSON config, and the DeepSpeed config other formats point at (a path
or an inline table under their ``deepspeed`` key).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hwdash.core.plan import Offload, Precision
from hwdash.core.plan_fields import ZERO_KEYS
from hwdash.core.plans.from_reader import (
    FLAG,
    ConfigReader,
    ImportedPlan,
    copy_declared_keys,
    resolved_path,
)
from hwdash.errors import UsageError


def read_deepspeed(reader: ConfigReader, out: ImportedPlan) -> None:
    """A DeepSpeed JSON config: batch sizes (and the GPUs their product implies), ZeRO, offload
    and precision."""
    copy_declared_keys(reader, out, "deepspeed")  # the micro-batch and accumulation steps
    micro = out.updates.get("batch")
    accum = out.updates.get("grad_accum")
    total = reader.integer("train_batch_size")
    if total and micro and accum and total % (micro * accum) == 0:
        out.updates["gpus"] = total // (micro * accum)
    reader.get("gradient_clipping")
    zero = reader.mapping("zero_optimization")
    zero_block(reader, zero, out)
    bf16 = reader.mapping("bf16").get("enabled")
    fp16 = reader.mapping("fp16").get("enabled")
    if bf16 is True or fp16 is True:
        # DeepSpeed's bf16/fp16 keeps an fp32 master copy and fp32 Adam states.
        out.updates["precision"] = Precision.MIXED
    elif bf16 is False and fp16 is False:
        out.updates["precision"] = Precision.FP32


def zero_block(reader: ConfigReader, zero: Mapping[str, Any], out: ImportedPlan) -> None:
    """DeepSpeed's ``zero_optimization`` table: the stage and what is offloaded."""
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
    zero_buffer_keys(reader, zero, out)


#: The DeepSpeed buffers whose ``"auto"`` the Hugging Face Trainer fills from the model
#: (transformers/integrations/deepspeed.py, ``trainer_config_finalize``).
_AUTO_KEYS = ("ds_reduce_bucket", "ds_prefetch_bucket", "ds_persistence_threshold")
#: The true/false settings among them.
_SWITCH_KEYS = ("ds_overlap_comm", "ds_contiguous_gradients")


def zero_buffer_keys(reader: ConfigReader, zero: Mapping[str, Any], out: ImportedPlan) -> None:
    """The buffer sizes and switches of a ``zero_optimization`` table (DeepSpeed's names,
    :data:`~hwdash.core.plan_fields.ZERO_KEYS`): element counts (``5e8`` reads as a float in
    JSON), true/false, or ``"auto"`` where the Trainer fills it in."""
    for name, key in ZERO_KEYS.items():
        value = zero.get(key)
        where = f"zero_optimization.{key}"
        if value is None:
            continue
        if value == "auto":
            if name in _AUTO_KEYS:
                out.updates[name] = "auto"
            else:
                out.notes.append(f"{where} 'auto' has no Trainer value: DeepSpeed's default used")
        elif name in _SWITCH_KEYS:
            if not isinstance(value, bool):
                raise reader.bad(where, "true or false", value)
            # DeepSpeed's own default (overlap_comm: on at stage 3 only; contiguous_gradients:
            # on) stays unset, as the plan says it
            default = zero.get("stage") == 3 if name == "ds_overlap_comm" else True
            if value != default:
                out.updates[name] = value
        else:
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not 0 <= value <= 10**13  # first: float() refuses an int past its range
                or not float(value).is_integer()
            ):
                raise reader.bad(where, "a whole number of elements (e.g. 5e8)", value)
            if name == "ds_sub_group_size" and value == 0:
                raise reader.bad(where, "a whole number of elements above 0", value)
            out.updates[name] = int(value)


def deepspeed_path(reader: ConfigReader, key: str, out: ImportedPlan) -> None:
    """The DeepSpeed config under ``key`` (TrainingArguments, axolotl, LLaMA-Factory): an inline
    table, whose ZeRO block is read, or the path of a DeepSpeed JSON next to the file."""
    value = reader.get(key)
    if value is None:
        return
    if isinstance(value, Mapping):
        zero = value.get("zero_optimization")
        if isinstance(zero, Mapping):
            zero_block(reader, zero, out)
    elif isinstance(value, str):
        _deepspeed_file(reader, key, value, out)
    else:
        raise reader.bad(key, "a path to a DeepSpeed JSON", value)


def _deepspeed_file(reader: ConfigReader, key: str, value: str, out: ImportedPlan) -> None:
    """The DeepSpeed JSON ``value`` names (relative to the file), read as ``--from`` reads it: its
    ZeRO stage, offload and mixed precision are taken; a missing file is a note, one already
    being read a usage error."""
    path = resolved_path(reader.path.parent / value)
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
        loop = " -> ".join(str(file) for file in (*reader.chain[reader.chain.index(path) :], path))
        raise UsageError(
            f"{reader.path}: '{key}' leads back to a file already being read ({loop})",
            flag=FLAG,
        )
    nested = reader.read_nested(path, reader.chain)
    for name in ("zero", "offload", *ZERO_KEYS):
        if name in nested.updates:
            out.updates[name] = nested.updates[name]
    if nested.updates.get("precision") is Precision.MIXED:
        out.updates["precision"] = Precision.MIXED
