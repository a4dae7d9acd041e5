"""A plan: what the user wants to run. The estimator turns a plan into bytes, hours and dollars.

The plan holds inputs only, validated; results live in :mod:`hwdash.core.estimator` and
:mod:`hwdash.core.planning.fit`. Every field has a docstring because the CLI's ``--help``, the TUI form and the
saved-plans file are all built from the same model.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from hwdash.core.fsdp_modes import FsdpMode as FsdpMode
from hwdash.core.fsdp_modes import FsdpStateDict as FsdpStateDict
from hwdash.core.fsdp_modes import FsdpWrap as FsdpWrap
from hwdash.core.serving_kinds import Engine as Engine
from hwdash.core.serving_kinds import EngineVersion as EngineVersion
from hwdash.core.serving_kinds import KvDtype as KvDtype


class Method(str, Enum):
    """How the model is run or trained."""

    INFERENCE = "inference"
    FULL = "full"
    LORA = "lora"
    QLORA = "qlora"
    LORA_8BIT = "lora-8bit"
    DORA = "dora"
    PPO = "ppo"
    GRPO = "grpo"


#: Methods that train adapters on a frozen base (LoRA and its quantized and DoRA variants).
LORA_STYLE_METHODS = (Method.LORA, Method.DORA, Method.QLORA, Method.LORA_8BIT)

#: Methods that may train the policy of an RL plan (``--rl-method``).
RL_TRAINABLE_METHODS = (Method.FULL, Method.LORA, Method.QLORA, Method.LORA_8BIT, Method.DORA)


class Precision(str, Enum):
    """Storage layout of weights, gradients and optimizer states.

    On a GPU without bf16 (Turing T4), every layout that names bf16 runs in fp16 instead: the bytes are
    the same and the plan carries a warning.
    """

    FP32 = "fp32"
    """Everything fp32, no autocast: 4 bytes weight + 4 gradient (+ optimizer states)."""
    AMP = "amp"
    """fp32 weights, gradients and optimizer states; bf16/fp16 autocast for the matmuls (HF Trainer
    ``bf16=True`` on a model loaded in fp32): activations are mostly half precision."""
    BF16 = "bf16"
    """Weights, gradients and optimizer states all bf16 (how TRL and torchtune load models today)."""
    MIXED = "mixed"
    """bf16 weights and gradients plus an fp32 master copy and fp32 Adam states: DeepSpeed, Megatron,
    and the ZeRO paper's 16 bytes per parameter."""


class Optimizer(str, Enum):
    """Optimizer whose states are counted."""

    ADAMW = "adamw"
    ADAMW_8BIT = "adamw-8bit"
    ADAMW_8BIT_PAGED = "adamw-8bit-paged"
    """bitsandbytes' ``PagedAdamW8bit``: 8-bit states in CUDA managed memory, which the driver
    pages to host RAM when the GPU is full. NVML counts them; ``torch.cuda`` statistics do not."""
    ADAMW_32BIT_PAGED = "adamw-32bit-paged"
    """bitsandbytes' ``PagedAdamW32bit`` (the Trainer's ``paged_adamw_32bit``, the QLoRA paper's
    optimizer): both states in fp32, in CUDA managed memory like ``adamw-8bit-paged``."""
    SGD = "sgd"
    ADAFACTOR = "adafactor"


class OptimizerImpl(str, Enum):
    """How PyTorch runs AdamW's update: decides the temporaries of the optimizer step."""

    FUSED = "fused"
    """One fused kernel, no parameter-sized temporaries (``fused=True``; the Hugging Face Trainer's
    default ``adamw_torch_fused`` on torch >= 2.8, and DeepSpeed's FusedAdam)."""
    FOREACH = "foreach"
    """Multi-tensor ops (``torch.optim.AdamW()``'s default on CUDA, the Trainer's ``adamw_torch``):
    one state-sized temporary for every parameter at once."""
    FOR_LOOP = "for-loop"
    """One parameter at a time (``foreach=False``): temporaries of the largest parameter only."""


class Attention(str, Enum):
    """Attention implementation: decides whether the s^2 score matrix is stored."""

    FLASH = "flash"
    SDPA = "sdpa"
    EAGER = "eager"


class Framework(str, Enum):
    """The training stack whose defaults fill the memory-saver settings left unset
    (``catalog/frameworks.toml``, each default with its source)."""

    HF = "hf"
    """Hugging Face transformers + PEFT + Trainer/TRL: today's defaults, no savers."""
    TORCHTUNE = "torchtune"
    UNSLOTH = "unsloth"
    DEEPSPEED = "deepspeed"
    FSDP = "fsdp"
    MEGATRON = "megatron"
    LITGPT = "litgpt"
    """Lightning AI's LitGPT scripts (Fabric, FSDP1 wrapping whole blocks)."""
    TRL = "trl"
    """TRL's trainers (SFT from 1.7, GRPO in 1.16): the LM head runs in tiles, no full logits."""


class Loss(str, Enum):
    """How the cross-entropy loss meets the logits (see :mod:`hwdash.core.estimator.savers`)."""

    STANDARD = "standard"
    """Full logits, upcast to fp32 before the loss (transformers' ``ForCausalLMLoss``)."""
    CHUNKED = "chunked"
    """torchtune's ``CEWithChunkedOutputLoss``: the logits in chunks, each upcast on its own."""
    FUSED_LINEAR = "fused-linear"
    """Liger's fused linear cross-entropy, Apple's Cut Cross-Entropy: logits never materialised."""
    LEGACY = "legacy"
    """Older transformers (before the loss refactor of 4.46): one more fp32 copy of the logits."""


class Generation(str, Enum):
    """How ``generate`` keeps the KV cache between decoding steps (inference, RL generation)."""

    CURRENT = "current"
    """transformers 4.42 and later: ``generate`` keeps one ``DynamicCache`` object whose layers
    grow in place, so the previous step's cache is not kept beside the next."""
    LEGACY = "legacy"
    """Older transformers: the legacy tuple cache, rebuilt by ``torch.cat`` every step while
    ``generate`` still holds the previous one: two copies of the cache at the peak."""


class ValueHead(str, Enum):
    """PPO's value model."""

    SEPARATE = "separate"
    """A second backbone with a scalar head (TRL's ``PPOTrainer`` value model)."""
    SHARED = "shared"
    """A scalar head on the policy's own backbone (TRL's ``AutoModelForCausalLMWithValueHead``)."""


class StoreDtype(str, Enum):
    """Storage dtype of adapters or of a quantized base's unquantized parts."""

    FP32 = "fp32"
    BF16 = "bf16"


class Offload(str, Enum):
    """DeepSpeed ZeRO CPU offload."""

    NONE = "none"
    OPTIMIZER = "optimizer"
    """Optimizer states (and the fp32 master copy) live in host RAM (ZeRO-Offload)."""
    PARAMS = "params"
    """Optimizer states and parameters live in host RAM (ZeRO-Infinity to CPU; needs ZeRO-3)."""


#: A DeepSpeed setting the Hugging Face Trainer fills from the model (``"auto"`` in its config).
Auto = Literal["auto"]
#: A DeepSpeed element count (a bucket, a threshold), bounded far above any real config.
Elements = Annotated[int, Field(ge=0, le=10**13)]


class Quant(str, Enum):
    """Weight quantization of an inference plan (``--quant``); training has qlora and lora-8bit."""

    NONE = "none"
    """Weights as the checkpoint stores them (16-bit, or its own ``quantization_config``)."""
    NF4 = "nf4"
    """bitsandbytes 4-bit NormalFloat with double quantization (``load_in_4bit``, QLoRA's NF4)."""
    INT8 = "int8"
    """bitsandbytes LLM.int8() (``load_in_8bit``): int8 weights with one fp32 scale per row."""
    GPTQ_4 = "gptq-4"
    """A GPTQ 4-bit checkpoint, group size 128 (fp16 scales, 4-bit zeros, int32 ``g_idx``)."""
    AWQ_4 = "awq-4"
    """An AWQ 4-bit checkpoint, group size 128 (fp16 scales, 4-bit zeros)."""


def _check_layer_policy(value: str) -> None:
    """``--selective-ac N`` (every N-th block) or ``K/N`` (K of every N blocks, fms-fsdp's ratio):
    whole numbers, N at least 1, K from 1 to N."""
    parts = value.split("/")
    if len(parts) > 2 or not all(part.isascii() and part.isdigit() for part in parts):
        raise ValueError(
            f"--selective-ac: {value!r} is neither op, a whole number N (checkpoint every N-th "
            "block) nor K/N (K of every N blocks)"
        )
    numbers = [int(part) for part in parts]
    if numbers[-1] < 1 or (len(numbers) == 2 and not 1 <= numbers[0] <= numbers[1]):
        raise ValueError(
            f"--selective-ac: {value}: give N of at least 1 and K from 1 to N (N: every N-th block "
            "checkpointed, 1 is --grad-ckpt; K/N: K of every N blocks)"
        )


class Plan(BaseModel):
    """Inputs of one estimate. Defaults are what a user gets when they pass nothing."""

    # Every number finite (an infinite epoch count would overflow the token count) and bounded
    # far above any real run, so no input can overflow the arithmetic or the JSON output.
    model_config = ConfigDict(
        extra="forbid", frozen=True, use_enum_values=False, allow_inf_nan=False
    )

    model: str = Field(min_length=1, max_length=4096)
    """Catalog id (``qwen2.5-7b``), a path to a Hugging Face ``config.json`` or a model folder, or a
    bare parameter count (``7B``)."""
    method: Method = Method.LORA
    """How the model is run or trained."""
    precision: Precision = Precision.BF16
    """Storage layout (see :class:`Precision`)."""
    batch: int = Field(default=1, ge=1, le=65536)
    """Micro-batch per GPU (sequences per forward pass)."""
    seq: int = Field(default=2048, ge=1, le=100_000_000)
    """Sequence length in tokens (for inference: prompt plus generated tokens)."""
    grad_ckpt: bool = False
    """Gradient (activation) checkpointing: keep only each layer's input, recompute the rest."""
    selective_ac: str | None = Field(default=None, max_length=12)
    """torchtitan's selective activation checkpointing outside Megatron (``--selective-ac``):
    ``op`` saves the outputs of a list of ops (every second matmul, SDPA) and recomputes the rest;
    a whole number N checkpoints every N-th block in full and nothing else. None: off."""
    grad_accum: int = Field(default=1, ge=1, le=4096)
    """Gradient accumulation steps per optimizer step. With more than 1 the gradients of the earlier
    micro-batches are alive during the next forward and backward, on top of its activations; the
    token count and the time do not change (they count micro-batches, not optimizer steps)."""
    attention: Attention = Attention.SDPA
    """Attention implementation."""
    optimizer: Optimizer = Optimizer.ADAMW
    """Optimizer."""
    optimizer_impl: OptimizerImpl = OptimizerImpl.FOREACH
    """How AdamW runs (see :class:`OptimizerImpl`); the other optimizers ignore it. The default is
    the larger of the two common ones: ``torch.optim.AdamW()``'s foreach; the Hugging Face
    Trainer's default (fused, on torch >= 2.8) needs one optimizer state less at the step."""
    lora_r: int = Field(default=16, ge=1, le=65536)
    """LoRA/DoRA rank."""
    lora_targets: tuple[str, ...] = ("all-linear",)
    """Module names LoRA adapts, as PEFT's ``target_modules`` names them in the model's family
    (``q_proj``, ``v_proj``; GPT-2's ``c_attn``; ``embed_tokens`` and ``lm_head`` too) or
    ``all-linear``."""
    lora_dropout: float = Field(default=0.05, ge=0, lt=1)
    """LoRA/DoRA dropout probability (PEFT's ``lora_dropout``). Any value above 0 keeps a mask of
    every adapted module's input for backward; 0.05 is what TRL's and PEFT's example recipes use."""
    lora_modules_to_save: tuple[str, ...] = ()
    """Modules trained in full next to the adapters (PEFT's ``modules_to_save``): the embedding
    and the LM head by the family's names (``embed_tokens``, ``lm_head``). PEFT keeps the frozen
    original and a trained copy of each (weights, gradients and optimizer states of the copy)."""
    zero: int = Field(default=0, ge=0, le=3)
    """DeepSpeed ZeRO stage 0-3."""
    offload: Offload = Offload.NONE
    """ZeRO CPU offload."""
    gpus: int = Field(default=1, ge=1, le=100_000)
    """Data-parallel GPUs the plan's own breakdown assumes (flavors are re-evaluated at their count)."""
    examples: int | None = Field(default=None, ge=1, le=10**13)
    """Training examples (with ``epochs`` and ``seq`` they give the token count)."""
    epochs: float = Field(default=1.0, gt=0, le=100_000)
    """Passes over the examples."""
    tokens: int | None = Field(default=None, ge=1, le=10**18)
    """Total training tokens (instead of examples x epochs x seq). For inference: tokens to generate."""
    output_tokens: int | None = Field(default=None, ge=1, le=10_000_000)
    """Serving plans' batch job (``--output-tokens``): tokens each of the ``examples`` requests
    generates; its prompt is the rest of ``seq`` (``seq - output_tokens``). None: no batch job."""
    mfu: float | None = Field(default=None, ge=0.001, le=1)
    """Model FLOPs utilisation to assume, 0.001 to 1 (a floor keeps hours finite: 1e-300 made them
    infinite; no real run is below 0.1%); None takes each accelerator's catalog value."""
    flavors: tuple[str, ...] = ()
    """Restrict the flavor table to these ids (empty: every flavor)."""
    budget: float | None = Field(default=None, gt=0, le=1e9)
    """Dollars the whole run may cost (``--budget``): a flavor whose estimated cost is over it is
    marked and never recommended (:mod:`hwdash.core.planning.budget`); None: no budget."""
    rl_method: Method = Method.FULL
    """PPO/GRPO: how the policy (and PPO's value model) are trained: full, lora, qlora, lora-8bit, dora."""
    rl_reference: bool = True
    """PPO/GRPO: keep a frozen reference model for the KL penalty (GRPO may drop it: beta=0)."""
    rl_reward_model: bool = True
    """PPO: a frozen reward model (GRPO usually scores with functions: off by default there)."""
    vllm_memory_utilization: float = Field(default=0.3, ge=0, lt=1)
    """PPO/GRPO: share of each GPU a colocated vLLM engine reserves (``gpu_memory_utilization``);
    0 generates with the policy itself."""
    fsdp: FsdpMode = FsdpMode.NONE
    """PyTorch FSDP sharding (see :class:`FsdpMode`): the states stay in the plan's dtype."""
    fsdp_offload: bool = False
    """FSDP CPU offload: sharded parameters, gradients and optimizer states live in host RAM and
    the optimizer steps there; the GPU holds the layers being gathered."""
    gpus_per_node: int | None = Field(default=None, ge=1, le=1024)
    """GPUs per node for hybrid sharding (None: all the plan's GPUs are one node)."""
    nccl_buffsize: int | None = Field(default=None, ge=1, le=2**34)
    """``NCCL_BUFFSIZE`` the run sets, in bytes: the Simple protocol's buffer per connection of
    every NCCL communicator (None: NCCL's default, 4 MiB; ``catalog/software.toml``)."""
    tp: int = Field(default=1, ge=1, le=1024)
    """Megatron-LM tensor-parallel size (``--tensor-model-parallel-size``)."""
    pp: int = Field(default=1, ge=1, le=1024)
    """Megatron-LM pipeline-parallel size (``--pipeline-model-parallel-size``), 1F1B schedule."""
    cp: int = Field(default=1, ge=1, le=1024)
    """Context parallelism (``--cp``; Megatron's ``--context-parallel-size``, accelerate's
    ``cp_size`` under FSDP2): ring attention (Liu et al. 2023, arXiv:2310.01889) splits every
    activation and the K/V along the sequence over ``cp`` ranks that hold the same weights."""
    sp_ulysses: int = Field(default=1, ge=1, le=1024)
    """DeepSpeed-Ulysses sequence parallelism (``--sp-ulysses``; accelerate's ``sp_size`` with the
    DeepSpeed backend): activations split along the sequence, attention over heads/``sp`` with the
    whole sequence (Jacobs et al. 2023, arXiv:2309.14509)."""
    ep: int = Field(default=1, ge=1, le=1024)
    """Expert parallelism (``--ep``; Megatron's ``--expert-model-parallel-size``): each rank holds
    ``experts/ep`` of every MoE layer's experts; tokens reach them by all-to-all."""
    sequence_parallel: bool = True
    """Megatron sequence parallelism under tensor parallelism (``--sequence-parallel``): the norm
    and dropout activations are split over the TP group as well."""
    selective_recompute: bool = False
    """Megatron selective activation recomputation (``--recompute-granularity selective``): the
    attention core (scores, softmax, dropout) is recomputed in backward."""
    images: int = Field(default=0, ge=0, le=100_000)
    """Vision-language models: images per example (``--images``); their image tokens join each
    sequence in the language model and run through the vision tower. 0: a text-only plan."""
    image_tokens: int | None = Field(default=None, ge=1, le=10_000_000)
    """Language-model tokens per image (``--image-tokens``); None: the model config's default
    (``VisionSpec.image_tokens``), which Qwen2.5-VL's dynamic resolution does not have."""
    hidden_dropout: float = Field(default=0.0, ge=0, lt=1)
    """Dropout in Megatron's transformer layers (``--hidden-dropout``, ``--attention-dropout``);
    above 0 the masks are kept (1 byte per element). Megatron's own default is 0.1; Llama-style
    recipes set 0. Only TP/PP plans read it."""
    optimizer_offload_fraction: float = Field(default=1.0, gt=0, le=1)
    """Megatron-LM with ``--offload optimizer`` (``--optimizer-cpu-offload``,
    ``--optimizer-offload-fraction``): the share of each GPU's distributed-optimizer shard (fp32
    master copy and Adam states) that Megatron's ``HybridDeviceOptimizer`` steps on the host; the
    rest stays on the GPU. Only Megatron plans with CPU offload read it."""

    quant: Quant = Quant.NONE
    """Inference only: quantize the block linear layers as bitsandbytes (nf4, int8) or a GPTQ/AWQ
    checkpoint (gptq-4, awq-4) does; embeddings, norms and the LM head stay 16-bit."""
    framework: Framework = Framework.HF
    """Training stack whose defaults fill the saver settings below left at None."""
    loss: Loss | None = None
    """Cross-entropy path (None: the framework's default)."""
    compile: bool | None = None
    """torch.compile: fused norms and loss keep fewer activations (None: the framework's)."""
    activation_offload: bool | None = None
    """Saved activations go to host RAM (torchtune, Unsloth's offloaded checkpointing)."""
    tiled_mlp: bool | None = None
    """DeepSpeed's TiledMLP (ALST): each MLP runs in sequence tiles, recomputed in backward."""
    liger: bool | None = None
    """Liger-Kernel's fused RMSNorm and gated activation (and its fused loss unless --loss says)."""
    optimizer_in_backward: bool | None = None
    """Each gradient is stepped and freed as backward produces it (torchtune's
    ``optimizer_in_bwd``): no full gradient set. Needs ``grad_accum`` 1."""
    sync_each_batch: bool | None = None
    """FSDP with gradient accumulation: reduce-scatter the gradients after every micro-batch
    (accelerate's ``GradientAccumulationPlugin(sync_each_batch=True)``). Off, the Hugging Face
    Trainer runs every micro-batch but the last under ``no_sync``, and FSDP keeps the whole
    unsharded gradient until the last one (None: the framework's default)."""
    ddp_bucket_view: bool | None = None
    """Plain data parallelism: the gradients are views into DDP's reduce buckets
    (``DistributedDataParallel(gradient_as_bucket_view=True)``), or the script all-reduces the
    gradients itself without DDP: no second copy of them. Off, PyTorch's default, DDP's buckets
    hold a copy of every trained gradient (None: the framework's default)."""
    qlora_frozen_dtype: StoreDtype | None = None
    """QLoRA / 8-bit LoRA: dtype of the unquantized base parts (embeddings, LM head, norms):
    fp32 as PEFT's ``prepare_model_for_kbit_training`` upcasts them, bf16 as torchtune, torchao
    and Unsloth keep them."""
    adapter_dtype: StoreDtype | None = None
    """LoRA/DoRA adapters' dtype: fp32 (PEFT, Unsloth) or bf16 (torchtune)."""
    value_head: ValueHead | None = None
    """PPO: the value model as a second backbone or a head on the policy's."""
    generation: Generation = Generation.CURRENT
    """Inference and RL generation with the policy: the KV cache as today's ``generate`` keeps it,
    or the legacy tuple cache of older transformers (two copies at the peak)."""

    # -- DeepSpeed ZeRO's runtime buffers and PyTorch FSDP's version (issue 29). None: DeepSpeed's
    # own default (deepspeed/runtime/zero/config.py), read by hwdash.core.estimator.zero_buffers.
    ds_reduce_bucket: Elements | Auto | None = None
    """DeepSpeed ``reduce_bucket_size`` (elements; None: 5e8; ``auto``: the Trainer's hidden^2)."""
    ds_allgather_bucket: int | None = Field(default=None, ge=0, le=10**13)
    """DeepSpeed ``allgather_bucket_size`` (stages 1-2, elements; None: 5e8)."""
    ds_overlap_comm: bool | None = None
    """DeepSpeed ``overlap_comm`` (None: DeepSpeed's, on for stage 3 only); stages 1-2 keep a second
    reduce bucket with it."""
    ds_contiguous_gradients: bool | None = None
    """DeepSpeed ``contiguous_gradients`` (None: on): the reduce bucket is a preallocated buffer."""
    ds_prefetch_bucket: Elements | Auto | None = None
    """DeepSpeed ``stage3_prefetch_bucket_size`` (elements; None: 5e7; ``auto``: 0.9 hidden^2)."""
    ds_max_live_params: int | None = Field(default=None, ge=0, le=10**13)
    """DeepSpeed ``stage3_max_live_parameters`` (elements; None: 1e9)."""
    ds_max_reuse_distance: int | None = Field(default=None, ge=0, le=10**13)
    """DeepSpeed ``stage3_max_reuse_distance`` (elements; None: 1e9)."""
    ds_persistence_threshold: Elements | Auto | None = None
    """DeepSpeed ``stage3_param_persistence_threshold`` (elements; None: 1e5; ``auto``: 10 hidden)."""
    ds_sub_group_size: int | None = Field(default=None, ge=1, le=10**13)
    """DeepSpeed ``sub_group_size`` (elements; None: 1e9): ZeRO-3 steps its partition sub-group by
    sub-group."""
    fsdp_version: int = Field(default=2, ge=1, le=2)
    """PyTorch FSDP1 (``FullyShardedDataParallel``, flat parameters) or FSDP2 (``fully_shard``,
    per-parameter DTensor shards). 2: transformers' Trainer default (``fsdp_config`` version 2),
    torchtune and torchtitan; accelerate's own config still defaults to 1."""
    fsdp_limit_all_gathers: bool | None = None
    """FSDP1 ``limit_all_gathers`` (None: on, PyTorch's and accelerate's default): at most two
    all-gathers in flight; off, the CPU can issue more ahead of the GPU."""
    fsdp_reduce_fp32: bool | None = None
    """FSDP mixed precision ``reduce_dtype=float32`` (torchtitan's default): gradients reduce-scattered
    in fp32 (None: off, reduce in ``param_dtype`` as accelerate's policy does)."""
    fsdp_state_dict: FsdpStateDict | None = None
    """How FSDP saves (None: accelerate's default by version, full for FSDP1, sharded for FSDP2)."""
    fsdp_wrap: FsdpWrap | None = None
    """How FSDP splits the model into units (None: each decoder block, the Trainer's default)."""

    # -- Serving plans (issue 30): ``--method inference`` with a server's engine. None: the
    # engine's own default (catalog/engines.toml); read by hwdash.core.planning.serving_plan.
    engine: Engine = Engine.HF
    """What serves the inference plan: hf (one ``generate`` call), vllm or sglang (the server's
    memory as the engine allocates it at start-up)."""
    engine_version: EngineVersion = EngineVersion.V1
    """vLLM's engine: v1 profiles ``max_num_batched_tokens``, v0 the whole ``max_model_len``."""
    gpu_memory_utilization: float | None = None
    """Share of the GPU the engine may use, above 0 and at most 1 (vLLM's
    ``gpu_memory_utilization``, SGLang's ``mem_fraction_static``; None: the engine's default)."""
    max_model_len: int | None = Field(default=None, ge=1, le=10_000_000)
    """Longest sequence (prompt + output) the server accepts (None: ``seq``)."""
    max_num_seqs: int | None = Field(default=None, ge=1, le=10**6)
    """Sequences the server runs at once (None: the engine's default)."""
    max_num_batched_tokens: int | None = Field(default=None, ge=1, le=10**8)
    """Tokens the scheduler runs in one step (vLLM's ``max_num_batched_tokens``, SGLang's
    ``chunked_prefill_size``; None: the engine's default)."""
    kv_dtype: KvDtype = KvDtype.AUTO
    """The KV cache's element type: the model's (auto), fp8 or int8 (one byte)."""

    @model_validator(mode="after")
    def _check(self) -> Plan:
        if self.offload is Offload.PARAMS and self.zero != 3:
            raise ValueError("offload=params needs ZeRO stage 3")
        if self.offload is Offload.OPTIMIZER and self.zero == 0:
            raise ValueError("offload=optimizer needs ZeRO stage 1, 2 or 3")
        if self.method in (Method.PPO, Method.GRPO) and self.rl_method not in RL_TRAINABLE_METHODS:
            raise ValueError(f"rl_method must be one of {[m.value for m in RL_TRAINABLE_METHODS]}")
        if self.method is Method.INFERENCE and self.zero:
            raise ValueError("ZeRO applies to training; inference plans use zero=0")
        self._check_parallelism()
        if self.quant is not Quant.NONE and self.method is not Method.INFERENCE:
            raise ValueError(
                f"quant {self.quant.value} quantizes an inference plan; to train over quantized "
                "weights use --method qlora (NF4) or lora-8bit (int8)"
            )
        if self.output_tokens is not None and self.output_tokens >= self.seq:
            raise ValueError(
                f"--output-tokens {self.output_tokens:,} leaves no prompt in a --seq "
                f"{self.seq:,} sequence: the prompt is --seq minus --output-tokens, give fewer"
            )
        if self.optimizer_in_backward and self.grad_accum > 1:
            raise ValueError(
                "optimizer_in_backward steps each gradient as it is produced: it needs grad_accum 1"
            )
        self._check_serving()
        self._check_selective_ac()
        return self

    def _check_selective_ac(self) -> None:
        """``--selective-ac op|N|K/N`` (torchtitan's ``activation_checkpoint.mode = "selective"``,
        ``torchtitan/distributed/activation_checkpoint.py``): what it combines with."""
        value = self.selective_ac
        if value is None:
            return
        if value != "op":
            _check_layer_policy(value)
        if self.megatron:
            raise ValueError(
                f"--selective-ac with {self.megatron_flags}: on the Megatron path selective "
                "recomputation is --selective-recompute"
            )
        if self.method is Method.INFERENCE:
            raise ValueError("--selective-ac: inference does not train, nothing is checkpointed")
        if self.grad_ckpt:
            raise ValueError(
                "--selective-ac and --grad-ckpt exclude each other (--grad-ckpt is torchtitan's "
                "mode full): pick one"
            )
        if self.activation_offload:
            raise ValueError(
                "--selective-ac with --activation-offload is not modelled: offloading is counted "
                "for --grad-ckpt's checkpoints"
            )
        trained = self.rl_method if self.is_rl else self.method
        if value == "op" and trained is not Method.FULL:
            raise ValueError(
                f"--selective-ac op is counted for full training (torchtitan's), not "
                f"{trained.value}: the adapters' matmuls shift which ones are saved; use "
                "--selective-ac N"
            )

    def _check_serving(self) -> None:
        """A serving engine's settings (issue 30): they need ``--engine vllm|sglang``, which needs
        ``--method inference``. Each message starts ``--flag:``, the flag it is about."""
        given = [
            flag for name, flag in _SERVING_FLAGS if getattr(self, name) not in (None, KvDtype.AUTO)
        ]
        if self.engine is Engine.HF:
            if given:
                raise ValueError(f"{given[0]}: needs --engine vllm or sglang (a serving plan)")
            return
        if self.method is not Method.INFERENCE:
            raise ValueError(
                f"--engine: a serving engine runs inference, not {self.method.value}: "
                "add --method inference"
            )
        fraction = self.gpu_memory_utilization
        if fraction is not None and not 0 < fraction <= 1:
            raise ValueError(
                f"--gpu-memory-utilization: {fraction:g} is not a share of the GPU: give a "
                "number above 0 and at most 1"
            )

    @property
    def is_serving(self) -> bool:
        """Whether the plan is a serving plan (inference on a vLLM or SGLang server)."""
        return self.method is Method.INFERENCE and self.engine is not Engine.HF

    def _check_parallelism(self) -> None:
        """FSDP and Megatron TP/PP: what combines with what (messages name the flag first)."""
        if self.fsdp is not FsdpMode.NONE:
            if self.zero or self.offload is not Offload.NONE:
                raise ValueError(
                    "--fsdp and --zero/--offload are two ways to shard (PyTorch FSDP vs DeepSpeed "
                    "ZeRO): pick one"
                )
            if self.method is Method.INFERENCE or self.is_rl:
                raise ValueError(
                    "--fsdp is modelled for fine-tuning (full, lora, ...), not RL or inference"
                )
        elif self.fsdp_offload:
            raise ValueError("--fsdp-offload needs --fsdp full or hybrid")
        self._check_long_context()
        if not self.megatron:
            return
        flags = self.megatron_flags
        if self.method is not Method.FULL:
            raise ValueError(
                f"{flags} are modelled for full training (Megatron-LM), not {self.method.value}"
            )
        if self.fsdp is not FsdpMode.NONE:
            raise ValueError(f"--fsdp with {flags} (2-D parallelism) is not modelled: pick one")
        if self.zero > 1:
            # --offload params needs --zero 3, so it is refused here too
            raise ValueError(
                f"--zero with {flags}: Megatron's distributed optimizer is ZeRO stage 1 (--zero 1); "
                "stages 2-3 and parameter offload are not modelled (--zero 1 --offload optimizer "
                "is Megatron's optimizer CPU offload)"
            )
        if self.offload is Offload.OPTIMIZER and self.optimizer not in (
            Optimizer.ADAMW,
            Optimizer.SGD,
        ):
            # megatron/core/optimizer/__init__.py builds its hybrid optimizer for adam or sgd
            raise ValueError(
                f"--offload optimizer with {flags}: Megatron's optimizer CPU offload steps adamw "
                f"or sgd on the host, not {self.optimizer.value}"
            )
        if self.grad_ckpt and self.selective_recompute:
            raise ValueError(
                "--selective-recompute and --grad-ckpt (full recomputation) exclude each other"
            )
        if self.gpus % (self.tp * self.pp * self.cp):
            raise ValueError(
                f"--gpus {self.gpus} is not a multiple of --tp x --pp x --cp = "
                f"{self.tp * self.pp * self.cp}"
            )
        # megatron/core/parallel_state.py: the expert groups are tp x ep x pp of the world
        if self.gpus % (self.tp * self.ep * self.pp):
            raise ValueError(
                f"--gpus {self.gpus} is not a multiple of --tp x --ep x --pp = "
                f"{self.tp * self.ep * self.pp}"
            )

    def _check_long_context(self) -> None:
        """``--cp``, ``--sp-ulysses`` and ``--ep``: where each runs and the sequence divisions
        (``megatron/training/arguments.py``: seq-length a multiple of 2 x cp, for the
        load-balanced ring; accelerate's ``ParallelismConfig``: CP and SP exclude each other)."""
        if self.cp == 1 and self.sp_ulysses == 1 and self.ep == 1:
            return
        flag = "--cp" if self.cp > 1 else "--sp-ulysses" if self.sp_ulysses > 1 else "--ep"
        if not self.is_training or self.is_rl:
            raise ValueError(f"{flag} is modelled for training, not {self.method.value}")
        if self.cp > 1 and self.sp_ulysses > 1:
            raise ValueError("--cp and --sp-ulysses exclude each other (accelerate refuses both)")
        if self.sequence_shards > 1 and self.attention is Attention.EAGER:
            raise ValueError(
                f"{flag} splits attention with a fused kernel (ring attention, Ulysses): "
                "--attn eager is not modelled"
            )
        if self.cp > 1 and self.seq % (2 * self.cp):
            raise ValueError(
                f"--cp {self.cp}: --seq {self.seq} is not a multiple of 2 x cp = {2 * self.cp} "
                "(load-balanced ring attention gives each rank two chunks)"
            )
        if self.gpus % self.sequence_shards:
            raise ValueError(
                f"--gpus {self.gpus} is not a multiple of {flag} {self.sequence_shards}"
            )
        if self.cp > 1 and self.fsdp is not FsdpMode.NONE and self.fsdp_version != 2:
            raise ValueError(
                "--cp with --fsdp needs FSDP2 (accelerate's cp_size): --fsdp-version 2"
            )
        if self.sp_ulysses > 1:
            self._check_ulysses()

    def _check_ulysses(self) -> None:
        """Ulysses runs under DeepSpeed (accelerate's ``sp_backend="deepspeed"``, ALST)."""
        if self.seq % self.sp_ulysses:
            raise ValueError(
                f"--sp-ulysses {self.sp_ulysses}: --seq {self.seq} is not a multiple of it"
            )
        if self.tp > 1 or self.pp > 1 or self.ep > 1 or self.fsdp is not FsdpMode.NONE:
            raise ValueError(
                "--sp-ulysses runs under DeepSpeed ZeRO (accelerate's sp_backend deepspeed): "
                "not with --tp/--pp/--ep/--fsdp"
            )
        if self.zero == 0:
            raise ValueError(
                "--sp-ulysses runs under DeepSpeed ZeRO (accelerate's sp_backend deepspeed): "
                "give --zero 1, 2 or 3"
            )

    @property
    def megatron(self) -> bool:
        """Whether the plan runs on the Megatron-LM path: tensor, pipeline, expert parallelism, or
        context parallelism without FSDP; or ``--framework megatron`` full training with data
        parallelism alone (Megatron-LM's own layers, DDP and distributed optimizer; with ZeRO-2/3
        or FSDP, which Megatron-LM does not run, the plan stays on the generic path)."""
        return (
            self.tp > 1
            or self.pp > 1
            or self.ep > 1
            or (self.cp > 1 and self.fsdp is FsdpMode.NONE)
            or (
                self.framework is Framework.MEGATRON
                and self.method is Method.FULL
                and self.fsdp is FsdpMode.NONE
                and self.zero <= 1
            )
        )

    @property
    def megatron_offload(self) -> bool:
        """Whether the plan runs Megatron's optimizer CPU offload (``--optimizer-cpu-offload``):
        the Megatron path with ``--offload optimizer`` (which needs the distributed optimizer,
        ``--zero 1``)."""
        return self.megatron and self.offload is Offload.OPTIMIZER

    @property
    def megatron_flags(self) -> str:
        """The Megatron flags the plan sets, for messages (``--framework megatron`` where that alone
        puts it on the Megatron path, ``--tp/--pp`` when none is)."""
        flags = [f"--{name}" for name in ("tp", "pp", "cp", "ep") if getattr(self, name) > 1]
        if not flags and self.megatron:
            return "--framework megatron"
        return "/".join(flags) if flags else "--tp/--pp"

    @property
    def sequence_shards(self) -> int:
        """Ranks one sequence is split over: ``cp`` x ``sp_ulysses`` (one of them is 1)."""
        return self.cp * self.sp_ulysses

    def with_changes(self, updates: dict[str, Any]) -> Plan:
        """A validated copy with ``updates``. Fields the plan left at their defaults stay unset, so
        defaults that depend on other fields (GRPO has no reward model unless asked for) follow
        the changed plan. Raises ``pydantic.ValidationError``."""
        kept = self.model_dump(include=set(self.model_fields_set))
        return Plan.model_validate({**kept, **updates})

    @property
    def is_training(self) -> bool:
        """Whether the plan trains (everything but inference)."""
        return self.method is not Method.INFERENCE

    @property
    def is_rl(self) -> bool:
        """Whether the plan is an RL plan (PPO or GRPO)."""
        return self.method in (Method.PPO, Method.GRPO)

    @model_serializer(mode="wrap")
    def _without_unset_budget(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """The plan's fields, ``budget`` left out when there is none, ``cp``, ``sp_ulysses``,
        ``ep`` when they are 1, ``images`` / ``image_tokens`` without images and ``output_tokens`` unset: such a plan writes
        (JSON, saved plans) what it wrote before those flags existed."""
        data: dict[str, Any] = handler(self)
        if data.get("budget", 0) is None:
            del data["budget"]
        # likewise the sequence and expert splits at 1 (issue 30): written only when they split
        # and Megatron's offload fraction at its default (all of the shard)
        for name in ("cp", "sp_ulysses", "ep", "optimizer_offload_fraction"):
            if data.get(name) == 1:
                del data[name]
        # and a serving batch job's output tokens, selective checkpointing: written only when given
        for name in ("output_tokens", "selective_ac"):
            if data.get(name, 0) is None:
                del data[name]
        # and a serving engine's settings (issue 30): written only when they are set
        for name, unset in _SERVING_UNSET.items():
            if data.get(name, unset) == unset:
                data.pop(name, None)
        # and a text-only plan's images (issue 30): written only when a plan has images
        if data.get("images") == 0:
            data.pop("images")
            if data.get("image_tokens") is None:
                data.pop("image_tokens", None)
        return data

    def default_name(self, model_name: str) -> str:
        """A name for saving: model and method, e.g. ``Qwen2.5-7B lora``."""
        return f"{model_name} {self.method.value}"


#: The serving settings only ``--engine vllm|sglang`` reads, and their flags (for messages).
_SERVING_FLAGS = (
    ("gpu_memory_utilization", "--gpu-memory-utilization"),
    ("max_model_len", "--max-model-len"),
    ("max_num_seqs", "--max-num-seqs"),
    ("max_num_batched_tokens", "--max-num-batched-tokens"),
    ("kv_dtype", "--kv-dtype"),
)
#: The serving fields' unset values, as a plan's JSON holds them (such a field is left out).
_SERVING_UNSET: dict[str, Any] = {
    "engine": Engine.HF.value,
    "engine_version": EngineVersion.V1.value,
    "gpu_memory_utilization": None,
    "max_model_len": None,
    "max_num_seqs": None,
    "max_num_batched_tokens": None,
    "kv_dtype": KvDtype.AUTO.value,
}
#: Plan fields only a serving plan (``--engine vllm|sglang``) reads.
SERVING_FIELDS = tuple(name for name, _flag in _SERVING_FLAGS)
