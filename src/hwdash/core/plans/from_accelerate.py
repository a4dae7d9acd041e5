"""``--from`` an accelerate config YAML (what ``accelerate config`` writes): processes, its
``deepspeed_config`` or ``fsdp_config`` block, and ``mixed_precision``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hwdash.core.plan import FsdpMode, FsdpStateDict, FsdpWrap, Offload, Precision
from hwdash.core.plans.from_deepspeed import deepspeed_path
from hwdash.core.plans.from_reader import ConfigReader, ImportedPlan, copy_declared_keys


def read_accelerate(reader: ConfigReader, out: ImportedPlan) -> None:
    """An accelerate config: the processes, its DeepSpeed or FSDP block and ``mixed_precision``."""
    for key in ("compute_environment", "num_machines", "machine_rank", "use_cpu"):
        reader.get(key)
    copy_declared_keys(reader, out, "accelerate")  # the processes: data-parallel GPUs
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
        if "deepspeed_config_file" in deepspeed:
            # the DeepSpeed JSON beside the config: its buffers (and stage, offload) are read
            nested = ConfigReader(reader.path, deepspeed, reader.chain, reader.read_nested)
            deepspeed_path(nested, "deepspeed_config_file", out)
    fsdp = reader.mapping("fsdp_config")
    if fsdp or distributed == "FSDP":
        _fsdp_block(reader, fsdp, out)
    _parallelism_block(reader, reader.mapping("parallelism_config"), out)
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
FSDP_STRATEGIES = {
    "FULL_SHARD": FsdpMode.FULL,
    "1": FsdpMode.FULL,
    "SHARD_GRAD_OP": FsdpMode.SHARD_GRAD_OP,
    "2": FsdpMode.SHARD_GRAD_OP,
    "HYBRID_SHARD": FsdpMode.HYBRID,
    "4": FsdpMode.HYBRID,
}


def no_shard(out: ImportedPlan) -> None:
    """FSDP's ``NO_SHARD``: every GPU holds the whole model and all-reduces each unit's flat
    gradient in place, which is plain data parallelism without DDP's bucket copy
    (``--ddp-bucket-view``)."""
    out.updates["fsdp"] = FsdpMode.NONE
    out.updates["ddp_bucket_view"] = True
    out.notes.append(
        "FSDP NO_SHARD planned as plain data parallelism whose gradients are reduced in place "
        "(--fsdp none --ddp-bucket-view): nothing is sharded"
    )


def reshard_strategy(reader: ConfigReader, key: str, value: object, fsdp2: bool) -> str:
    """``fsdp_reshard_after_forward`` (the Trainer's ``reshard_after_forward``, read at ``key``) as
    a sharding strategy's name. FSDP2 reads it and not
    ``fsdp_sharding_strategy`` (``FullyShardedDataParallelPlugin.__post_init__``,
    accelerate/utils/dataclasses.py; ``accelerate launch`` passes it on as
    ``FSDP_RESHARD_AFTER_FORWARD``): true is full shard, false keeps each unit gathered from its
    forward to its backward (SHARD_GRAD_OP). FSDP1 configs may name a strategy there instead."""
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        value = value.strip().lower() == "true"
    if isinstance(value, bool):
        return "FULL_SHARD" if value else "SHARD_GRAD_OP"
    if isinstance(value, str) and value.strip() and not fsdp2:
        return value.strip()  # FULL_SHARD, SHARD_GRAD_OP or NO_RESHARD (FSDP1)
    raise reader.bad(key, "true or false", value)


def _fsdp_block(reader: ConfigReader, fsdp: Mapping[str, Any], out: ImportedPlan) -> None:
    """accelerate's ``fsdp_config``: the sharding strategy, parameter offload and, for hybrid
    sharding, the GPUs of a node."""
    strategy = fsdp.get("fsdp_sharding_strategy")
    fsdp2 = str(fsdp.get("fsdp_version", 1)).strip() == "2"
    reshard = fsdp.get("fsdp_reshard_after_forward")
    # FSDP2 takes full shard's resharding from fsdp_reshard_after_forward (hybrid: the mesh)
    full = FSDP_STRATEGIES.get(str(strategy).upper()) is FsdpMode.FULL
    if strategy is None or (fsdp2 and full and reshard is not None):
        key = "fsdp_config.fsdp_reshard_after_forward"
        strategy = reshard_strategy(reader, key, True if reshard is None else reshard, fsdp2)
    key = str(strategy).upper()
    if key in ("NO_SHARD", "3"):
        no_shard(out)
        return
    mode = FSDP_STRATEGIES.get(key)
    if mode is None:
        if isinstance(strategy, bool) or not isinstance(strategy, (str, int)):
            raise reader.bad("fsdp_config.fsdp_sharding_strategy", "a sharding strategy", strategy)
        out.notes.append(
            f"FSDP sharding strategy {strategy!r} is not modelled: planned as full shard (less "
            "memory than it needs)"
        )
        mode = FsdpMode.FULL
    out.updates["fsdp"] = mode
    _fsdp_version_keys(reader, fsdp, out)
    policy = fsdp.get("fsdp_auto_wrap_policy")
    if policy is None:
        # FullyShardedDataParallelPlugin.__post_init__ (accelerate/utils/dataclasses.py): with no
        # policy in the config (the FSDP_AUTO_WRAP_POLICY variable unset) it is NO_WRAP
        out.notes.append(
            "fsdp_auto_wrap_policy absent: accelerate's default NO_WRAP, the whole model one "
            "FSDP unit (--fsdp-wrap none)"
        )
        policy = "NO_WRAP"
    read_wrap_policy(reader, "fsdp_config.fsdp_auto_wrap_policy", policy, out)
    offload = fsdp.get("fsdp_offload_params", False)
    if not isinstance(offload, bool):
        raise reader.bad("fsdp_config.fsdp_offload_params", "true or false", offload)
    out.updates["fsdp_offload"] = offload
    machines = reader.integer("num_machines")
    processes = out.updates.get("gpus")
    if mode is FsdpMode.HYBRID and machines and processes and processes % machines == 0:
        out.updates["gpus_per_node"] = processes // machines


#: accelerate's auto-wrap policies (accelerate/utils/constants.py ``FSDP_AUTO_WRAP_POLICY``); a
#: size-based policy (``min_num_params``, 1e8 by default) wraps a decoder block, or its parts, in
#: a unit of its own, which hwdash plans as one block a unit.
_WRAP_POLICIES = {
    "TRANSFORMER_BASED_WRAP": FsdpWrap.TRANSFORMER,
    "SIZE_BASED_WRAP": FsdpWrap.TRANSFORMER,
    "NO_WRAP": FsdpWrap.NONE,
}


def read_wrap_policy(reader: ConfigReader, key: str, policy: Any, out: ImportedPlan) -> None:
    """An auto-wrap policy's name (accelerate's ``fsdp_auto_wrap_policy``, the Trainer's
    ``fsdp_config.auto_wrap_policy``) as ``--fsdp-wrap``; a name that is none of accelerate's
    three is refused, naming the key."""
    wrap = _WRAP_POLICIES.get(str(policy).upper()) if isinstance(policy, str) else None
    if wrap is None:
        raise reader.bad(key, " or ".join(_WRAP_POLICIES), policy)
    if str(policy).upper() == "SIZE_BASED_WRAP":
        out.notes.append(f"{key} SIZE_BASED_WRAP planned as one decoder block a unit")
    if wrap is FsdpWrap.NONE:
        out.updates["fsdp_wrap"] = wrap


#: accelerate's ``fsdp_state_dict_type`` (accelerate/utils/constants.py ``FSDP_STATE_DICT_TYPE``).
STATE_DICTS = {
    "FULL_STATE_DICT": FsdpStateDict.FULL,
    "SHARDED_STATE_DICT": FsdpStateDict.SHARDED,
}


def _fsdp_version_keys(reader: ConfigReader, fsdp: Mapping[str, Any], out: ImportedPlan) -> None:
    """``fsdp_version`` (absent: 1, accelerate's default, ``FullyShardedDataParallelPlugin``
    in accelerate/utils/dataclasses.py) and ``fsdp_state_dict_type``."""
    version = fsdp.get("fsdp_version", 1)
    if isinstance(version, str) and version.strip() in ("1", "2"):
        version = int(version)
    if isinstance(version, bool) or version not in (1, 2):
        raise reader.bad("fsdp_config.fsdp_version", "1 or 2", version)
    out.updates["fsdp_version"] = version
    kind = fsdp.get("fsdp_state_dict_type")
    if kind is None:
        return
    state_dict = STATE_DICTS.get(str(kind).upper())
    if state_dict is None:
        out.notes.append(
            f"fsdp_state_dict_type {kind!r} is not modelled: saved as a sharded state dict"
        )
        state_dict = FsdpStateDict.SHARDED
    out.updates["fsdp_state_dict"] = state_dict


def _parallelism_block(reader: ConfigReader, block: Mapping[str, Any], out: ImportedPlan) -> None:
    """accelerate's ``parallelism_config`` (accelerate/commands/config/cluster.py writes its keys
    with the ``parallelism_config_`` prefix): ``cp_size`` is ``--cp``, ``sp_size`` is
    ``--sp-ulysses``; the data-parallel sizes follow from the processes."""
    for key, field in (("cp_size", "cp"), ("sp_size", "sp_ulysses")):
        value = block.get(f"parallelism_config_{key}")
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise reader.bad(
                f"parallelism_config.parallelism_config_{key}", "a whole number", value
            )
        out.updates[field] = value
