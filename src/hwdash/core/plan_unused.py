"""Which plan settings a plan's method ignores (:func:`unused_settings`): the command line warns
about them and the planner hides their rows."""

from __future__ import annotations

from collections.abc import Iterable

from hwdash.core.plan import (
    LORA_STYLE_METHODS,
    Engine,
    FsdpMode,
    Method,
    Plan,
)

#: Settings that only LoRA-style training reads (the policy's method, for RL).
_LORA_FIELDS = ("lora_r", "lora_targets", "lora_dropout", "lora_modules_to_save")
#: Settings that only RL plans read.
_RL_FIELDS = ("rl_method", "rl_reference", "rl_reward_model", "vllm_memory_utilization")
#: Settings that only Megatron plans read, and why they are unused elsewhere.
_MEGATRON_FIELDS = ("sequence_parallel", "selective_recompute", "hidden_dropout")
_MEGATRON_ONLY = (
    "only Megatron plans (--tp, --pp, --cp or --ep above 1, or --framework megatron full training) "
    "use it"
)
#: Why ``--optimizer-offload-fraction`` does nothing outside Megatron's optimizer offload.
_MEGATRON_OFFLOAD_ONLY = (
    "only Megatron's optimizer CPU offload reads it (--tp/--pp with --zero 1 --offload optimizer)"
)
#: Settings that only training reads.
#: Plan fields only training reads (an inference plan ignores them; the planner hides their rows).
TRAINING_ONLY_FIELDS = (
    "grad_ckpt",
    "grad_accum",
    "optimizer",
    "optimizer_impl",
    "examples",
    "epochs",
    "loss",
    "compile",
    "activation_offload",
    "tiled_mlp",
    "liger",
    "optimizer_in_backward",
    "sync_each_batch",
    "ddp_bucket_view",
)
#: Settings that only adapters on a quantized base read.
_QUANTIZED_BASE_FIELDS = ("qlora_frozen_dtype",)
#: Settings that only PPO reads.
_PPO_FIELDS = ("value_head",)


#: Why ``--ddp-bucket-view`` does nothing outside PyTorch DDP.
_DDP_ONLY = (
    "only plain data parallelism over --gpus above 1 keeps DDP's gradient buckets (ZeRO, FSDP, "
    "Megatron, a sequence split and the RL trainers reduce through their own buffers)"
)


def plain_data_parallel(plan: Plan, gpus: int | None = None) -> bool:
    """Whether PyTorch DDP wraps the plan's trained model on ``gpus`` GPUs (the plan's own by
    default): training over more than one GPU that no ZeRO, FSDP, Megatron, sequence split or
    RL trainer reduces through buffers of its own. The one test behind DDP's buckets
    (:func:`hwdash.core.estimator.collectives.ddp_bucket_bytes`), ``--ddp-bucket-view``'s
    warning, its make-it-fit knob and the exports."""
    others = plan.zero or plan.fsdp is not FsdpMode.NONE or plan.megatron or plan.is_rl
    split = plan.sequence_shards > 1 or plan.method is Method.INFERENCE
    return (plan.gpus if gpus is None else gpus) > 1 and not (others or split)


def _generates_with_transformers(plan: Plan) -> bool:
    """Whether transformers' ``generate`` makes the plan's KV cache (``Plan.generation``)."""
    if plan.method is Method.INFERENCE:
        return True
    return plan.is_rl and plan.vllm_memory_utilization == 0


def unused_settings(plan: Plan, given: Iterable[str]) -> list[tuple[str, str]]:
    """The settings in ``given`` (Plan field names the user set) that ``plan``'s method ignores,
    each with the reason in words; the command line warns about them, as it does for ZeRO on
    one GPU."""
    trained = plan.rl_method if plan.is_rl else plan.method
    unused: list[tuple[str, str]] = []
    for name in dict.fromkeys(given):
        if plan.method is Method.INFERENCE and name in TRAINING_ONLY_FIELDS:
            if name == "examples" and plan.output_tokens is not None:
                continue  # a serving plan's batch job: --examples requests
            if name in ("examples", "epochs"):
                why = "inference counts the tokens it generates: use --tokens"
            else:
                why = "inference does not train"
            if name == "grad_ckpt" and not plan.grad_ckpt:
                continue
            unused.append((name, why))
        elif name == "output_tokens" and plan.method is not Method.INFERENCE:
            unused.append(
                (name, "only serving plans (--method inference --engine vllm) run a batch job")
            )
        elif name in _QUANTIZED_BASE_FIELDS and trained not in (Method.QLORA, Method.LORA_8BIT):
            unused.append((name, f"only qlora and lora-8bit use it, not {trained.value}"))
        elif name == "adapter_dtype" and trained not in LORA_STYLE_METHODS:
            unused.append((name, f"only LoRA-style methods use it, not {trained.value}"))
        elif name in _PPO_FIELDS and plan.method is not Method.PPO:
            unused.append((name, f"only ppo has a value model, not {plan.method.value}"))
        elif name in _LORA_FIELDS and trained not in LORA_STYLE_METHODS:
            unused.append((name, f"only LoRA-style methods use it, not {trained.value}"))
        elif name in _RL_FIELDS and not plan.is_rl:
            unused.append((name, f"only RL plans (ppo, grpo) use it, not {plan.method.value}"))
        elif name in _MEGATRON_FIELDS and not plan.megatron:
            unused.append((name, _MEGATRON_ONLY))
        elif name == "optimizer_offload_fraction" and not plan.megatron_offload:
            unused.append((name, _MEGATRON_OFFLOAD_ONLY))
        elif name == "sequence_parallel" and plan.tp == 1 and plan.pp > 1:
            unused.append((name, "sequence parallelism splits over the TP group: --tp is 1"))
        elif name == "tiled_mlp" and plan.megatron:
            unused.append((name, "Megatron-LM runs its own MLP, not DeepSpeed's TiledMLP"))
        elif name == "liger" and plan.megatron:
            unused.append((name, "Megatron-LM runs its own kernels, not Liger's"))
        elif name == "sync_each_batch" and plan.fsdp is FsdpMode.NONE:
            unused.append((name, "only --fsdp keeps unsharded gradients between micro-batches"))
        elif name == "ddp_bucket_view" and not plain_data_parallel(plan):
            unused.append((name, _DDP_ONLY))
        elif name == "gpus_per_node" and plan.fsdp is not FsdpMode.HYBRID:
            unused.append((name, "only --fsdp hybrid shards within a node"))
        elif name == "generation" and not _generates_with_transformers(plan):
            unused.append(
                (name, "only inference and RL generating with the policy (--vllm-util 0)")
            )
        elif name == "engine_version" and plan.engine is not Engine.VLLM:
            unused.append((name, "only --engine vllm has engine versions"))
        elif name == "max_num_batched_tokens" and plan.engine is Engine.SGLANG:
            # SGLang keeps its activations in the share it leaves out: no profile run to size
            unused.append((name, "SGLang's memory does not depend on it (--export writes it)"))
        elif (reason := _unused_sharding_setting(plan, name)) is not None:
            unused.append((name, reason))
    return unused


#: DeepSpeed settings every ZeRO stage reads, and those only stage 3 reads.
_ZERO_FIELDS = ("ds_reduce_bucket", "ds_overlap_comm", "ds_contiguous_gradients")
_ZERO3_FIELDS = (
    "ds_prefetch_bucket",
    "ds_max_live_params",
    "ds_max_reuse_distance",
    "ds_persistence_threshold",
    "ds_sub_group_size",
)
_FSDP_FIELDS = (
    "fsdp_version",
    "fsdp_reduce_fp32",
    "fsdp_state_dict",
    "fsdp_limit_all_gathers",
    "fsdp_wrap",
)


def _unused_sharding_setting(plan: Plan, name: str) -> str | None:
    """Why a DeepSpeed buffer or FSDP setting does nothing in ``plan`` (None: it is used)."""
    if name in (*_ZERO_FIELDS, *_ZERO3_FIELDS, "ds_allgather_bucket") and plan.zero == 0:
        return "only DeepSpeed ZeRO (--zero 1-3) has these buffers"
    if name in _ZERO3_FIELDS and plan.zero != 3:
        return "only ZeRO stage 3 gathers parameters"
    if name == "ds_allgather_bucket" and plan.zero == 3:
        return "ZeRO stage 3 gathers by --ds-prefetch-bucket, not the stage 1-2 all-gather bucket"
    if name in _FSDP_FIELDS and plan.fsdp is FsdpMode.NONE:
        return "only --fsdp uses it"
    if name == "fsdp_limit_all_gathers" and plan.fsdp_version != 1:
        return (
            "only FSDP1 (--fsdp-version 1) has a rate limiter; FSDP2 bounds its all-gathers itself"
        )
    return None
