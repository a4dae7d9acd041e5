"""The ``--selective-ac`` entry of the plan field registry (:mod:`hwdash.core.plan_fields`), in
the ``--help`` section on batch and checkpointing, right after ``--grad-ckpt``: torchtitan's
selective activation checkpointing outside Megatron
(:mod:`hwdash.core.estimator.selective_ac`). Kept here so that the registry module stays under
the size limit, as :mod:`hwdash.core.plan_fields_serving` does for the serving fields.
"""

from __future__ import annotations

from hwdash.core.plan_field_types import PlanField

#: The ``--help`` section of the batch, checkpointing and ZeRO fields.
SHAPE = "batch, checkpointing and DeepSpeed ZeRO"

SELECTIVE_AC_FIELD = PlanField(
    "selective_ac", "--selective-ac", SHAPE,
    "torchtitan's selective activation checkpointing instead of --grad-ckpt (not under "
    "Megatron: --selective-recompute): op saves every second matmul's and SDPA's outputs "
    "and recomputes the rest (full training); N checkpoints every N-th block (default off)",
    metavar="op|N",
)  # fmt: skip
