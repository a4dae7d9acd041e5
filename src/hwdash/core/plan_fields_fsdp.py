"""The FSDP version's entries of the plan field registry (:mod:`hwdash.core.plan_fields`), in the
``--help`` section on sharding, after ``--gpus-per-node``: ``--fsdp-version`` and its extras
(:mod:`hwdash.core.estimator.fsdp_versions`) and ``--fsdp-wrap``, how FSDP splits the model into
units (:mod:`hwdash.core.estimator.parallelism`). Kept here so that the registry module stays under
the size limit, as :mod:`hwdash.core.plan_fields_checkpointing` does for ``--selective-ac``.
"""

from __future__ import annotations

from hwdash.core.plan import FsdpStateDict, FsdpWrap
from hwdash.core.plan_field_types import PlanField, _values

#: The ``--help`` section of the FSDP and Megatron fields.
SHARDING = "FSDP and Megatron tensor/pipeline parallelism"

FSDP_VERSION_FIELDS = (
    PlanField(
        "fsdp_version", "--fsdp-version", SHARDING,
        "1: FullyShardedDataParallel (flat parameters padded to the shard count, "
        "--fsdp-limit-all-gathers); 2: fully_shard (per-parameter shards, all-gather and "
        "reduce-scatter staging buffers). Default 2, the Trainer's, torchtune's and "
        "torchtitan's; accelerate's own config defaults to 1",
        parse="whole", metavar="1|2",
    ),
    PlanField(
        "fsdp_limit_all_gathers", "--fsdp-limit-all-gathers", SHARDING,
        "FSDP1: at most two all-gathers in flight (default on); off, the CPU may issue more "
        "ahead of the GPU (counted as two more units gathered)",
        kind="toggle", unset_unless_given=True,
    ),
    PlanField(
        "fsdp_reduce_fp32", "--fsdp-reduce-fp32", SHARDING,
        "FSDP mixed precision reduce_dtype=float32 (torchtitan's default): each unit's gradient "
        "reduce-scattered in fp32 (default off: in the gathered dtype, accelerate's policy)",
        kind="toggle", unset_unless_given=True,
    ),
    PlanField(
        "fsdp_state_dict", "--fsdp-state-dict", SHARDING,
        "how FSDP saves: full (FULL_STATE_DICT: each unit gathered, the whole model in rank 0's "
        "host RAM) or sharded (default: full for FSDP1, sharded for FSDP2, as accelerate)",
        choices=_values(FsdpStateDict), unset_unless_given=True,
    ),
    PlanField(
        "fsdp_wrap", "--fsdp-wrap", SHARDING,
        "how FSDP splits the model into units: transformer (each decoder block a unit, gathered "
        "one at a time; the embedding and output layer stay in the root unit, gathered from the "
        "first forward to the end of backward: the Trainer's TRANSFORMER_BASED_WRAP under FSDP1, "
        "and under FSDP2 with accelerate before 1.14), transformer-ends (the embedding and output "
        "layer their own units too: torchtitan, torchtune, accelerate 1.14 and later) or none "
        "(no auto-wrap policy, accelerate's NO_WRAP and Lightning's default: the whole model is "
        "one unit, gathered from the first forward to the end of backward, with its whole "
        "unsharded gradient) (default transformer with --fsdp-version 1, transformer-ends with 2)",
        choices=_values(FsdpWrap), unset_unless_given=True,
    ),
)  # fmt: skip
