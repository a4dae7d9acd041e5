"""The plan field registry: each :class:`~hwdash.core.plan.Plan` field's command-line flag, help,
form row and place in a written command line, declared once.

``hwdash plan``'s option parser (:func:`hwdash.commands.plan.add_parser`) and its reverse,
:func:`hwdash.commands.plan_args.plan_arguments`, are built from :data:`PLAN_FIELDS`. The bounds
stay on the Plan model's pydantic fields (``Field(ge=..., le=...)``) and the parser's defaults are
the model's own defaults, so neither is repeated here. The planner form
(:mod:`hwdash.ui.planner_controls`) builds its rows from the entries' :class:`FormRow` s, in
:data:`FORM_ORDER`; a ``select`` row's choices are the entry's ``choices`` (or, for a whole number,
the Plan field's bounds). The config files ``--export`` writes and ``--from`` reads take the
key names of each entry's :class:`FileKeys` where a key is the field itself (same value, same
unit); settings that need a conversion (precision from ``bf16``/``fp16``, the method from
``finetuning_type``, optimizer names, ZeRO from nested tables) stay with their readers and writers.

Adding a field: the Plan field, one :class:`PlanField` entry here (``tests/unit/test_plan_fields.py``
fails until there is one), and its estimator formula.
"""

from __future__ import annotations

from hwdash.core.plan import (
    RL_TRAINABLE_METHODS,
    Attention,
    Framework,
    FsdpMode,
    Generation,
    Loss,
    Method,
    Offload,
    Optimizer,
    OptimizerImpl,
    Precision,
    Quant,
    StoreDtype,
    ValueHead,
)

# The registry's types live in plan_field_types; imported from here as before.
from hwdash.core.plan_field_types import (
    FileFormat as FileFormat,
)
from hwdash.core.plan_field_types import (
    FileKeys as FileKeys,
)
from hwdash.core.plan_field_types import (
    FormRow as FormRow,
)
from hwdash.core.plan_field_types import (
    PlanField as PlanField,
)
from hwdash.core.plan_field_types import (
    _values,
)
from hwdash.core.plan_field_types import (
    member_docs as member_docs,
)
from hwdash.core.plan_fields_checkpointing import LIGER_FIELD, SELECTIVE_AC_FIELD, TILED_MLP_FIELD
from hwdash.core.plan_fields_checkpointing import SHAPE as SHAPE
from hwdash.core.plan_fields_fsdp import FSDP_VERSION_FIELDS
from hwdash.core.plan_fields_fsdp import SHARDING as SHARDING
from hwdash.core.plan_fields_serving import SERVING as SERVING
from hwdash.core.plan_fields_serving import SERVING_PLAN_FIELDS


def _precision_help() -> str:
    """``--precision``'s help: each layout with the docstring under its member."""
    docs = member_docs(Precision)
    parts = [f"{p.value}: {docs.get(p.value, '')}".rstrip(": ") for p in Precision]
    return "storage layout (default bf16). " + " | ".join(parts)


WHAT = "model and method"
ZERO_BUFFERS = "DeepSpeed ZeRO's buffers, in elements (unset: DeepSpeed's default)"
SAVERS = "framework and memory savers (unset: the framework's default, catalog/frameworks.toml)"
RL = "RL (ppo, grpo)"
DATA = "data size, time and flavors"
#: The ``--help`` sections of the Plan fields' flags, in the order ``--help`` shows them. SERVING
#: comes after the parser's "catalog and output" section (where it was before its flags were
#: Plan fields): ``add_field_flags`` adds it on its own.
FLAG_GROUPS = (WHAT, SHAPE, ZERO_BUFFERS, SHARDING, SAVERS, RL, DATA, SERVING)

_RL_ROW = "-rl-only"
_TRAINING_ROW = "-training-only"

#: Every Plan field with a flag, in ``--help`` order.
PLAN_FIELDS: tuple[PlanField, ...] = (
    PlanField(
        "model", "--model", WHAT,
        "catalog id, Hugging Face id, config.json path or model folder, or a count (7B)",
        also=(("--params", "a bare parameter count (7B, 500M) instead of --model"),),
        always_written=True,
        form=FormRow("model", "text", placeholder="↓ lists models; or config.json, 7B"),
    ),
    PlanField(
        "method", "--method", WHAT,
        "inference, full fine-tune, lora, qlora (NF4), lora-8bit, dora, ppo or grpo (default lora)",
        choices=_values(Method), always_written=True, form=FormRow("method", "select"),
    ),
    PlanField(
        "precision", "--precision", WHAT, _precision_help, choices=_values(Precision),
        form=FormRow("precision", "select"),
    ),
    PlanField(
        "optimizer", "--optimizer", WHAT,
        "default adamw; adamw-8bit-paged / adamw-32bit-paged: bitsandbytes' paged 8-bit or "
        "fp32 states (CUDA managed memory, which the driver may move to host RAM)",
        choices=_values(Optimizer), form=FormRow("optimizer", "select", _TRAINING_ROW),
    ),
    PlanField(
        "optimizer_impl", "--optimizer-impl", WHAT,
        "how AdamW runs: foreach (torch.optim.AdamW's default: one state-sized temporary at "
        "the step), fused (the HF Trainer's default on torch >= 2.8: none) or for-loop "
        "(default foreach)",
        choices=_values(OptimizerImpl), form=FormRow("AdamW impl", "select", _TRAINING_ROW),
    ),
    PlanField(
        "lora_r", "--lora-r", WHAT, "LoRA/DoRA rank (default 16)", parse="whole", metavar="R",
        form=FormRow("LoRA rank", "integer", "-lora-only"),
        keys=FileKeys(axolotl=("lora_r",), llama_factory=("lora_rank",), peft=("r",)),
    ),
    PlanField(
        "lora_targets", "--lora-targets", WHAT,
        "comma-separated module names as PEFT takes them in the model's family (q_proj,"
        "v_proj; c_attn on GPT-2; embed_tokens, lm_head) or all-linear (default)",
        kind="list", metavar="NAMES",
    ),
    PlanField(
        "lora_modules_to_save", "--lora-modules-to-save", WHAT,
        "modules trained in full next to the adapters, PEFT's modules_to_save "
        "(embed_tokens,lm_head by the model's names; default none)",
        kind="list", metavar="NAMES",
    ),
    PlanField(
        "lora_dropout", "--lora-dropout", WHAT,
        "LoRA/DoRA dropout; above 0 its masks are kept for backward (default 0.05)",
        parse="number", metavar="P", form=FormRow("LoRA drop", "number", "-lora-only"),
        keys=FileKeys(
            axolotl=("lora_dropout",), llama_factory=("lora_dropout",), peft=("lora_dropout",)
        ),
    ),
    PlanField(
        "images", "--images", WHAT,
        "vision-language models: images per example; their tokens join each sequence and run "
        "through the vision tower (default 0: text only; the tower's weights count anyway)",
        parse="whole", metavar="N",
    ),
    PlanField(
        "image_tokens", "--image-tokens", WHAT,
        "language-model tokens per image (default: the config's, e.g. 576 for LLaVA-1.5, 256 "
        "for Gemma 3; Qwen2.5-VL's dynamic resolution needs it given)",
        parse="whole", metavar="T",
    ),
    PlanField(
        "quant", "--quant", WHAT,
        "inference only: quantize the block linears: nf4 (bitsandbytes 4-bit, double "
        "quantization), int8 (LLM.int8()), gptq-4 or awq-4 (group 128); embeddings, norms and the "
        "LM head stay 16-bit (default none)",
        choices=_values(Quant), form=FormRow("quantize", "select", "-inference-only"),
    ),
    PlanField(
        "batch", "--batch", SHAPE, "micro-batch per GPU (default 1)", parse="whole",
        form=FormRow("micro-batch", "integer"),
        keys=FileKeys(
            trainer=("per_device_train_batch_size",),
            deepspeed=("train_micro_batch_size_per_gpu",),
            axolotl=("micro_batch_size",),
            llama_factory=("per_device_train_batch_size",),
        ),
    ),
    PlanField(
        "seq", "--seq", SHAPE, "sequence length in tokens (default 2048)", parse="whole",
        form=FormRow("seq length", "integer"),
        keys=FileKeys(
            trainer=("max_length", "max_seq_length"),  # TRL renamed max_seq_length max_length
            axolotl=("sequence_len",),
            llama_factory=("cutoff_len",),
        ),
    ),
    PlanField(
        "grad_ckpt", "--grad-ckpt", SHAPE,
        "gradient checkpointing (recompute activations); --no-grad-ckpt turns off a "
        "--framework's default (default off)",
        kind="toggle", form=FormRow("grad ckpt", "switch", _TRAINING_ROW, box="recompute"),
        keys=FileKeys(trainer=("gradient_checkpointing",)),
    ),
    SELECTIVE_AC_FIELD,
    TILED_MLP_FIELD,
    LIGER_FIELD,
    PlanField(
        "grad_accum", "--grad-accum", SHAPE,
        "gradient accumulation steps per optimizer step; above 1 the gradients stay alive "
        "during every backward (default 1)",
        parse="whole", metavar="N", form=FormRow("grad accum", "integer", _TRAINING_ROW),
        keys=FileKeys(
            trainer=("gradient_accumulation_steps",),
            deepspeed=("gradient_accumulation_steps",),
            axolotl=("gradient_accumulation_steps",),
            llama_factory=("gradient_accumulation_steps",),
        ),
    ),
    PlanField(
        "attention", "--attn", SHAPE,
        "attention implementation: flash and sdpa keep no s^2 scores, eager does (default sdpa)",
        choices=_values(Attention), form=FormRow("attention", "select"),
    ),
    PlanField(
        "zero", "--zero", SHAPE, "DeepSpeed ZeRO stage 0-3 (default 0)", parse="whole",
        form=FormRow("ZeRO stage", "select"),
    ),
    PlanField(
        "offload", "--offload", SHAPE,
        "ZeRO CPU offload; with --tp/--pp and --zero 1, optimizer is Megatron's optimizer CPU "
        "offload (--optimizer-offload-fraction)",
        choices=_values(Offload),
        form=FormRow("offload", "select"),
    ),
    PlanField(
        "gpus", "--gpus", SHAPE, "data-parallel GPUs for the breakdown (default 1)",
        parse="whole", form=FormRow("GPUs", "integer"),
        keys=FileKeys(accelerate=("num_processes",)),
    ),
    PlanField(
        "ds_reduce_bucket", "--ds-reduce-bucket", ZERO_BUFFERS,
        "reduce_bucket_size: the gradient bucket reduced at once, in the gradients' 16-bit "
        "dtype, two with --ds-overlap-comm at stages 1-2 (DeepSpeed 5e8; auto: the Trainer's "
        "hidden^2)",
        parse="elements", metavar="N", unset_unless_given=True,
    ),
    PlanField(
        "ds_allgather_bucket", "--ds-allgather-bucket", ZERO_BUFFERS,
        "allgather_bucket_size (stages 1-2; DeepSpeed 5e8): torch's all_gather_into_tensor "
        "gathers the updated parameters in place, so it adds nothing",
        parse="elements", metavar="N", unset_unless_given=True,
    ),
    PlanField(
        "ds_overlap_comm", "--ds-overlap-comm", ZERO_BUFFERS,
        "overlap_comm: reduce while backward runs; stages 1-2 keep a second reduce bucket "
        "(DeepSpeed: on for stage 3 only)",
        kind="toggle", unset_unless_given=True,
    ),
    PlanField(
        "ds_contiguous_gradients", "--ds-contiguous-gradients", ZERO_BUFFERS,
        "contiguous_gradients: the reduce bucket is a preallocated buffer (DeepSpeed: on); "
        "off, the gradients wait in place (the same bytes at most)",
        kind="toggle", unset_unless_given=True,
    ),
    PlanField(
        "ds_prefetch_bucket", "--ds-prefetch-bucket", ZERO_BUFFERS,
        "stage3_prefetch_bucket_size: parameters gathered ahead of use (DeepSpeed 5e7; auto: "
        "0.9 hidden^2)",
        parse="elements", metavar="N", unset_unless_given=True,
    ),
    PlanField(
        "ds_max_live_params", "--ds-max-live-params", ZERO_BUFFERS,
        "stage3_max_live_parameters: no prefetch beyond this many gathered (DeepSpeed 1e9)",
        parse="elements", metavar="N", unset_unless_given=True,
    ),
    PlanField(
        "ds_max_reuse_distance", "--ds-max-reuse-distance", ZERO_BUFFERS,
        "stage3_max_reuse_distance: a parameter used again within this many is kept gathered: "
        "the last half of it stays gathered from forward into backward (DeepSpeed 1e9)",
        parse="elements", metavar="N", unset_unless_given=True,
    ),
    PlanField(
        "ds_persistence_threshold", "--ds-persistence-threshold", ZERO_BUFFERS,
        "stage3_param_persistence_threshold: tensors this small are never partitioned "
        "(DeepSpeed 1e5; auto: 10 hidden)",
        parse="elements", metavar="N", unset_unless_given=True,
    ),
    PlanField(
        "ds_sub_group_size", "--ds-sub-group-size", ZERO_BUFFERS,
        "sub_group_size: ZeRO-3 steps its partition one sub-group at a time; without offload "
        "the fp32 gradients of one sub-group are on the GPU at the step (DeepSpeed 1e9)",
        parse="elements", metavar="N", unset_unless_given=True,
    ),
    PlanField(
        "fsdp", "--fsdp", SHARDING,
        "PyTorch FSDP instead of DeepSpeed ZeRO: full (shard over every GPU) or hybrid "
        "(shard within a node of --gpus-per-node, replicate across); states stay in --precision "
        "(bf16: all bf16; mixed: fp32 shards, bf16 gathered copies) (default none)",
        choices=_values(FsdpMode), form=FormRow("FSDP", "select", "-fine-tuning-only"),
    ),
    PlanField(
        "fsdp_offload", "--fsdp-offload", SHARDING,
        "FSDP CPU offload: sharded parameters, gradients and optimizer states in host RAM",
        kind="switch",
        form=FormRow("FSDP offl.", "switch", "-fsdp-only", box="params, grads, optimizer"),
    ),
    PlanField(
        "sync_each_batch", "--sync-each-batch", SHARDING,
        "FSDP with --grad-accum: reduce-scatter the gradients after every micro-batch "
        "(accelerate's sync_each_batch); off, the Trainer's no_sync keeps the whole unsharded "
        "gradient until the last one (default: the framework's; hf off, torchtune on)",
        kind="toggle",
    ),
    PlanField(
        "ddp_bucket_view", "--ddp-bucket-view", SHARDING,
        "plain data parallelism with --gpus: the gradients are views into DDP's buckets "
        "(gradient_as_bucket_view=True), or the script all-reduces them itself: no second "
        "gradient copy (default: the framework's; every packaged one off, PyTorch's default)",
        kind="toggle",
    ),
    PlanField(
        "gpus_per_node", "--gpus-per-node", SHARDING,
        "GPUs per node for --fsdp hybrid (default: all --gpus are one node)",
        parse="whole", metavar="N",
    ),
    *FSDP_VERSION_FIELDS,
    PlanField(
        "nccl_buffsize", "--nccl-buffsize", SHARDING,
        "NCCL_BUFFSIZE the run sets, in bytes (default: NCCL's 4 MiB): the Simple protocol's "
        "buffer per connection of each NCCL communicator, counted on multi-GPU plans",
        parse="whole", metavar="BYTES",
    ),
    PlanField(
        "tp", "--tp", SHARDING, "Megatron-LM tensor-parallel size (default 1)", parse="whole",
        metavar="N", form=FormRow("tensor par.", "integer", "-full-only"),
    ),
    PlanField(
        "pp", "--pp", SHARDING,
        "Megatron-LM pipeline-parallel size, 1F1B (default 1); data parallelism is "
        "--gpus / (tp x pp), --zero 1 is the distributed optimizer",
        parse="whole", metavar="N", form=FormRow("pipeline", "integer", "-full-only"),
    ),
    PlanField(
        "cp", "--cp", SHARDING,
        "context parallelism (ring attention, Megatron's --context-parallel-size; with --fsdp, "
        "accelerate's cp_size): activations and K/V split along the sequence over N GPUs; --seq "
        "a multiple of 2N (default 1)",
        parse="whole", metavar="N", form=FormRow("context par", "integer", "-fine-tuning-only"),
    ),
    PlanField(
        "sp_ulysses", "--sp-ulysses", SHARDING,
        "DeepSpeed-Ulysses sequence parallelism over N GPUs (accelerate's sp_size): activations "
        "split along the sequence, attention by heads/N with all-to-all (default 1)",
        parse="whole", metavar="N", form=FormRow("Ulysses SP", "integer", "-fine-tuning-only"),
    ),
    PlanField(
        "ep", "--ep", SHARDING,
        "expert parallelism (Megatron's --expert-model-parallel-size): each GPU holds 1/N of "
        "every MoE layer's experts, tokens dispatched by all-to-all (default 1)",
        parse="whole", metavar="N", form=FormRow("expert par.", "integer", "-full-only"),
    ),
    PlanField(
        "sequence_parallel", "--no-sequence-parallel", SHARDING,
        "under --tp, keep the norm and dropout activations whole (sequence parallelism is "
        "on by default)",
        kind="negated",
    ),
    PlanField(
        "selective_recompute", "--selective-recompute", SHARDING,
        "Megatron selective recomputation: the attention core is recomputed in backward",
        kind="switch",
    ),
    PlanField(
        "hidden_dropout", "--hidden-dropout", SHARDING,
        "dropout in Megatron's layers; above 0 its masks are kept (default 0; Megatron's "
        "own default is 0.1)",
        parse="number", metavar="P",
    ),
    PlanField(
        "optimizer_offload_fraction", "--optimizer-offload-fraction", SHARDING,
        "Megatron with --zero 1 --offload optimizer (--optimizer-cpu-offload): the share of "
        "each GPU's fp32 master copy and Adam states stepped on the host, above 0 and at most 1 "
        "(default 1)",
        parse="number", metavar="F",
    ),
    PlanField(
        "framework", "--framework", SAVERS,
        "training stack whose defaults fill the savers below and, where their flags are not "
        "typed, --precision, --grad-ckpt, --optimizer and --optimizer-impl (default hf)",
        choices=_values(Framework), form=FormRow("framework", "select", _TRAINING_ROW),
    ),
    PlanField(
        "loss", "--loss", SAVERS,
        "standard (fp32 logits), chunked (torchtune), fused-linear (Liger, Cut Cross-Entropy: "
        "no logits) or legacy (older transformers: one more fp32 copy)",
        choices=_values(Loss),
        form=FormRow("loss", "select", _TRAINING_ROW, unset="framework default"),
    ),
    PlanField(
        "generation", "--generation", SAVERS,
        "inference and RL generating with the policy: current (transformers >= 4.42: one "
        "DynamicCache grown in place) or legacy (older transformers' tuple cache: the previous "
        "step's cache kept while torch.cat builds the next, two copies; default current)",
        choices=_values(Generation),
    ),
    PlanField(
        "compile", "--compile", SAVERS,
        "torch.compile: fused norms and loss keep fewer activations", kind="toggle",
    ),
    PlanField(
        "activation_offload", "--activation-offload", SAVERS,
        "saved activations go to host RAM (torchtune; Unsloth's offloaded checkpointing)",
        kind="toggle",
    ),
    PlanField(
        "optimizer_in_backward", "--optimizer-in-backward", SAVERS,
        "step and free each gradient as backward produces it (needs --grad-accum 1)",
        kind="toggle",
    ),
    PlanField(
        "qlora_frozen_dtype", "--qlora-frozen-dtype", SAVERS,
        "qlora/lora-8bit: embeddings, LM head and norms in fp32 (PEFT) or bf16 (torchtune, "
        "Unsloth)",
        choices=_values(StoreDtype),
    ),
    PlanField(
        "adapter_dtype", "--adapter-dtype", SAVERS,
        "LoRA adapters in fp32 (PEFT, Unsloth) or bf16 (torchtune)", choices=_values(StoreDtype),
    ),
    PlanField(
        "value_head", "--value-head", SAVERS,
        "ppo: a separate value backbone, or a head shared with the policy (TRL)",
        choices=_values(ValueHead),
    ),
    PlanField(
        "rl_method", "--rl-method", RL,
        "how the policy (and PPO's value model) train (default full)",
        choices=_values(RL_TRAINABLE_METHODS), form=FormRow("RL policy", "select", _RL_ROW),
    ),
    PlanField(
        "rl_reference", "--no-reference", RL, "no frozen reference model (KL beta=0)",
        kind="negated", form=FormRow("RL ref", "switch", _RL_ROW, box="frozen reference"),
    ),
    PlanField(
        "rl_reward_model", "--reward-model", RL, "count a frozen reward model (default for ppo)",
        kind="pair", off_help="no reward model (default for grpo: reward functions)",
        form=FormRow("RL reward", "switch", _RL_ROW, box="reward model"),
    ),
    PlanField(
        "vllm_memory_utilization", "--vllm-util", RL,
        "vLLM gpu_memory_utilization share (0: the policy generates; default 0.3)",
        parse="number", metavar="F",
        form=FormRow("vLLM share", "number", _RL_ROW, placeholder="0: no vLLM engine"),
    ),
    PlanField(
        "examples", "--examples", DATA,
        "training examples (with --epochs and --seq give the tokens)",
        parse="count", form=FormRow("examples", "count", _TRAINING_ROW, placeholder="e.g. 50k"),
    ),
    PlanField(
        "epochs", "--epochs", DATA, "passes over the examples (default 1)", parse="number",
        form=FormRow("epochs", "number", _TRAINING_ROW),
        keys=FileKeys(
            trainer=("num_train_epochs",),
            axolotl=("num_epochs",),
            llama_factory=("num_train_epochs",),
        ),
    ),
    PlanField(
        "tokens", "--tokens", DATA,
        "total training tokens (or tokens to generate for inference)",
        parse="count",
        form=FormRow(
            "tokens", "count", "-inference-only", placeholder="to generate, e.g. 10M"
        ),
    ),
    PlanField(
        "output_tokens", "--output-tokens", DATA,
        "serving plans (--engine vllm|sglang): tokens each of the --examples requests generates; "
        "its prompt is --seq minus these; gives the batch job's time and cost",
        parse="whole", metavar="M",
    ),
    PlanField(
        "mfu", "--mfu", DATA, "model FLOPs utilisation (default: the catalog's per GPU)",
        parse="number", form=FormRow("MFU", "number", placeholder="catalog default"),
    ),
    PlanField(
        "budget", "--budget", DATA,
        "dollars the whole run may cost: flavors and --fit options costing more are marked or "
        "dropped, the table shows each cost's budget band (needs --examples or --tokens)",
        parse="number", metavar="DOLLARS",
        form=FormRow("budget $", "number", placeholder="needs examples or tokens"),
    ),
    PlanField(
        "flavors", "--flavor", DATA, "only these flavors (repeatable or comma-separated)",
        kind="repeat", metavar="ID",
    ),
)  # fmt: skip

#: The serving fields, last in ``--help`` order (:mod:`hwdash.core.plan_fields_serving`).
PLAN_FIELDS += SERVING_PLAN_FIELDS

#: The fields ``hwdash plan`` leaves unset unless their flag was given
#: (:attr:`PlanField.unset_unless_given`).
UNSET_UNLESS_GIVEN = tuple(field.name for field in PLAN_FIELDS if field.unset_unless_given)

#: Plan fields without a flag, each with the reason (none today: every field has one).
NOT_FLAGS: dict[str, str] = {}

#: The order :func:`~hwdash.commands.plan_args.plan_arguments` writes the fields in, kept from
#: before this registry so that a copied command line reads as it did. A field not listed here
#: is written after these, in ``--help`` order.
ARGV_ORDER = (
    "model",
    "method",
    "precision",
    "optimizer",
    "optimizer_impl",
    "lora_r",
    "batch",
    "seq",
    "grad_accum",
    "attention",
    "zero",
    "offload",
    "gpus",
    "rl_method",
    "fsdp",
    "gpus_per_node",
    "nccl_buffsize",
    "tp",
    "pp",
    "quant",
    "framework",
    "loss",
    "qlora_frozen_dtype",
    "adapter_dtype",
    "value_head",
    "lora_targets",
    "lora_modules_to_save",
    "lora_dropout",
    "grad_ckpt",
    "selective_ac",
    "tiled_mlp",
    "liger",
    "fsdp_offload",
    "sequence_parallel",
    "selective_recompute",
    "hidden_dropout",
    "optimizer_offload_fraction",
    "compile",
    "activation_offload",
    "optimizer_in_backward",
    "sync_each_batch",
    "ddp_bucket_view",
    "ds_reduce_bucket",
    "ds_allgather_bucket",
    "ds_overlap_comm",
    "ds_contiguous_gradients",
    "ds_prefetch_bucket",
    "ds_max_live_params",
    "ds_max_reuse_distance",
    "ds_persistence_threshold",
    "ds_sub_group_size",
    "fsdp_version",
    "fsdp_limit_all_gathers",
    "fsdp_reduce_fp32",
    "fsdp_state_dict",
    "fsdp_wrap",
    "rl_reference",
    "rl_reward_model",
    "vllm_memory_utilization",
    "examples",
    "epochs",
    "tokens",
    "mfu",
    "flavors",
)

#: The planner form's rows, top to bottom (:func:`form_fields`; a row not listed goes last). Not the
#: ``--help`` order: the first sixteen are the form's first layout and later rows were added at
#: the end, so that a row never moved on screen.
FORM_ORDER = (
    "model",
    "method",
    "precision",
    "batch",
    "seq",
    "grad_ckpt",
    "attention",
    "optimizer",
    "lora_r",
    "zero",
    "offload",
    "gpus",
    "examples",
    "epochs",
    "tokens",
    "mfu",
    "grad_accum",
    "lora_dropout",
    "optimizer_impl",
    "rl_method",
    "rl_reference",
    "rl_reward_model",
    "vllm_memory_utilization",
    "quant",
    "framework",
    "loss",
    "fsdp",
    "fsdp_offload",
    "tp",
    "pp",
    "budget",
    "cp",
    "sp_ulysses",
    "ep",
    "engine",
    "gpu_memory_utilization",
    "max_model_len",
    "max_num_seqs",
    "kv_dtype",
    "max_num_batched_tokens",
)

#: The Plan fields that are one-to-one keys of DeepSpeed's ``zero_optimization`` table (DeepSpeed's
#: names, deepspeed/runtime/zero/config.py): ``--from`` reads them (``"auto"``: the Hugging Face
#: Trainer's value, transformers/integrations/deepspeed.py), ``--export deepspeed`` writes them.
ZERO_KEYS: dict[str, str] = {
    "ds_reduce_bucket": "reduce_bucket_size",
    "ds_allgather_bucket": "allgather_bucket_size",
    "ds_overlap_comm": "overlap_comm",
    "ds_contiguous_gradients": "contiguous_gradients",
    "ds_prefetch_bucket": "stage3_prefetch_bucket_size",
    "ds_max_live_params": "stage3_max_live_parameters",
    "ds_max_reuse_distance": "stage3_max_reuse_distance",
    "ds_persistence_threshold": "stage3_param_persistence_threshold",
    "ds_sub_group_size": "sub_group_size",
}

#: Plan field -> its registry entry.
BY_NAME: dict[str, PlanField] = {field.name: field for field in PLAN_FIELDS}


def fields_in_argv_order() -> list[PlanField]:
    """Every entry in the order a written command line lists them (:data:`ARGV_ORDER`)."""
    listed = [BY_NAME[name] for name in ARGV_ORDER]
    return listed + [field for field in PLAN_FIELDS if field.name not in ARGV_ORDER]


def flag_spellings() -> dict[str, str]:
    """Plan field -> how messages name its flag (``--compile/--no-compile``), in ``--help`` order."""
    return {field.name: field.spelling for field in PLAN_FIELDS}


def form_fields() -> list[tuple[PlanField, FormRow]]:
    """Every entry with a planner form row, with its row: those :data:`FORM_ORDER` lists in its
    order, then any other (a new row goes at the bottom), in ``--help`` order."""
    listed = [BY_NAME[name] for name in FORM_ORDER]
    others = [field for field in PLAN_FIELDS if field.name not in FORM_ORDER]
    return [(field, field.form) for field in listed + others if field.form is not None]


def fields_with_keys(file_format: FileFormat) -> list[tuple[PlanField, tuple[str, ...]]]:
    """Every entry with keys in ``file_format``, with them, in ``--help`` order."""
    found = [(field, field.keys.of(file_format)) for field in PLAN_FIELDS]
    return [(field, keys) for field, keys in found if keys]


def file_key(name: str, file_format: FileFormat) -> str:
    """The key the exports write Plan field ``name`` under in ``file_format`` (its first);
    ``KeyError`` when the registry declares none."""
    keys = BY_NAME[name].keys.of(file_format)
    if not keys:
        raise KeyError(f"{name} has no {file_format} key in the plan field registry")
    return keys[0]
