"""The ``--selective-ac`` and ``--tiled-mlp`` entries of the plan field registry
(:mod:`hwdash.core.plan_fields`), in the ``--help`` section on batch and checkpointing, right after
``--grad-ckpt``: torchtitan's selective activation checkpointing outside Megatron
(:mod:`hwdash.core.estimator.selective_ac`) and DeepSpeed's TiledMLP
(:func:`hwdash.core.estimator.activations.tiled_mlp_bytes`). Kept here so that the registry module
stays under the size limit, as :mod:`hwdash.core.plan_fields_serving` does for the serving fields.
"""

from __future__ import annotations

from hwdash.core.plan_field_types import FileKeys, PlanField

#: The ``--help`` section of the batch, checkpointing and ZeRO fields.
SHAPE = "batch, checkpointing and DeepSpeed ZeRO"

TILED_MLP_FIELD = PlanField(
    "tiled_mlp", "--tiled-mlp", SHAPE,
    "DeepSpeed's TiledMLP (Arctic Long Sequence Training; axolotl's tiled_mlp): each MLP runs "
    "in tiles of the sequence, ceil(tokens per GPU / hidden) of them, keeps only its input and "
    "recomputes one tile at a time in backward (default off)",
    kind="toggle", unset_unless_given=True, keys=FileKeys(axolotl=("tiled_mlp",)),
)  # fmt: skip

LIGER_FIELD = PlanField(
    "liger", "--liger", SHAPE,
    "Liger-Kernel (the Trainer's use_liger_kernel, LLaMA-Factory's enable_liger_kernel, "
    "axolotl's liger_rms_norm + liger_glu_activation): fused RMSNorms keep their 16-bit input, "
    "the fused SwiGLU/GeGLU keeps gate and up and recomputes the activation; the loss is "
    "fused-linear unless --loss says otherwise (default off)",
    kind="toggle", unset_unless_given=True,
    keys=FileKeys(trainer=("use_liger_kernel",), llama_factory=("enable_liger_kernel",)),
)  # fmt: skip

SELECTIVE_AC_FIELD = PlanField(
    "selective_ac", "--selective-ac", SHAPE,
    "torchtitan's selective activation checkpointing instead of --grad-ckpt (not under "
    "Megatron: --selective-recompute): op saves every second matmul's and SDPA's outputs "
    "and recomputes the rest (full training); N checkpoints every N-th block; K/N checkpoints "
    "K of every N blocks, evenly spaced (fms-fsdp's ratio) (default off)",
    metavar="op|N|K/N",
)  # fmt: skip
