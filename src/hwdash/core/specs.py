"""The catalog's entry schemas (pydantic): accelerators, flavors, models, slowdowns, frameworks.

The foundation every layer reads: the estimator takes a :class:`ModelSpec` and an
:class:`Accelerator`, the config.json readers build a :class:`ModelSpec`, the catalog
(:mod:`hwdash.core.catalog`) loads them from TOML. Imports nothing of hwdash but the units, the plan
model and the errors, so none of those layers import each other for the schemas.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from hwdash.core.units import GB, MIB
from hwdash.errors import CatalogError

if TYPE_CHECKING:
    pass


class _Strict(BaseModel):
    # Strict types (TOML's "80" is not 80, "false" is not a boolean) and finite numbers: a catalog
    # overlay is loaded by every command, so a bad value must be refused, never coerced.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


#: Catalog ids hold no capital letters, so that lookups can ignore case (``Catalog.find_model``).
ID_PATTERN = r"^[^A-Z]+$"

#: A CUDA compute capability as NVIDIA writes it: major.minor (``7.5``, ``9.0``, ``12.0``).
COMPUTE_CAPABILITY_PATTERN = r"^[0-9]{1,2}\.[0-9]$"


class _FieldProblem(ValueError):
    """A cross-field check failed; ``field`` is the field the message is about."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


class Accelerator(_Strict):
    """One kind of accelerator (a GPU model, a TPU chip, an Apple SoC, or a plain CPU)."""

    id: str = Field(pattern=ID_PATTERN)
    """Catalog id, lowercase, e.g. ``a100-80gb``."""
    name: str
    """Display name, e.g. ``NVIDIA A100 80GB``."""
    vendor: Literal["nvidia", "google", "apple", "cpu"]
    """Who makes it; decides which runtime (CUDA, XLA, MPS, none) runs the plan."""
    kind: Literal["gpu", "tpu", "unified", "cpu"]
    """``gpu``: discrete CUDA GPU; ``tpu``: Google TPU; ``unified``: Apple SoC sharing RAM; ``cpu``."""
    memory_gb: float = Field(ge=0, le=100_000)
    """Memory per device as the datasheet names it (decimal GB as marketed; 0 for a CPU)."""
    nvml_total_mib: int | None = Field(default=None, gt=0, le=100_000_000)
    """Total memory NVML reports for this GPU, in MiB (a "16 GB" T4 shows 15360). Usable VRAM."""
    cuda_total_mib: int | None = Field(default=None, gt=0, le=100_000_000)
    """Total memory CUDA reports (``cudaMemGetInfo``, ``torch.cuda.mem_get_info``), in MiB: NVML's
    total less the driver's reserve; what vLLM's ``gpu_memory_utilization`` is a fraction of.
    None: unknown (serving plans use ``nvml_total_mib``)."""
    # Rates have a floor as well as a ceiling: hours are tokens / rate, and a rate such as 5e-324
    # (positive, so "gt=0" let it through) made them infinite. 1 GB/s and 1 GFLOPS are far below any
    # device anyone plans a training run on (the slowest entry in the catalog: 272 GB/s, 6 TFLOPS).
    memory_bandwidth_gbps: float | None = Field(default=None, ge=1, le=1_000_000)
    """Peak memory bandwidth in GB/s."""
    bf16_tflops: float | None = Field(default=None, ge=0.001, le=1_000_000)
    """Dense bf16 tensor TFLOPS (GeForce: the FP32-accumulate rate PyTorch gets). None without bf16."""
    fp16_tflops: float | None = Field(default=None, ge=0.001, le=1_000_000)
    """Dense fp16 tensor TFLOPS with FP32 accumulate (the rate a T4 runs mixed precision at)."""
    fp32_tflops: float | None = Field(default=None, ge=0.001, le=1_000_000)
    """Non-tensor fp32 TFLOPS."""
    bf16: bool
    """Whether the hardware runs bf16 natively (Turing T4 does not: its plans run in fp16)."""
    power_w: float | None = Field(default=None, gt=0, le=100_000)
    """Board power (TDP/TGP) in watts."""
    default_mfu: float = Field(default=0.35, ge=0.001, le=1)
    """Model FLOPs utilisation assumed for time estimates on this accelerator (the user can override)."""
    usable_memory_fraction: float = Field(default=1.0, gt=0, le=1)
    """Share of ``memory_gb`` a training process can use (Apple unified memory: about 0.75)."""
    nvml_names: tuple[str, ...] = Field(default=(), strict=False)  # TOML gives a list
    """Names NVML reports for this GPU (``nvmlDeviceGetName``), to match live GPUs to the catalog."""
    source: str = Field(min_length=1)
    """Where every number above comes from (datasheet, public page), with confidence notes."""
    notes: str = ""
    """Anything a reader should know (seed values that differ, unverified figures)."""
    compute_capability: str | None = Field(default=None, pattern=COMPUTE_CAPABILITY_PATTERN)
    """CUDA compute capability (``"9.0"``) from NVIDIA's CUDA GPUs page; picks the software
    footprint's row (``[[cuda_context]]``). None for a device without CUDA."""
    interconnect: str | None = Field(default=None, pattern=ID_PATTERN)
    """The GPU-to-GPU link of the machines that carry several of these (an ``[[interconnect]]``
    id: ``nvlink``, ``pcie``); picks NCCL's channel counts. None: the default interconnect."""

    @property
    def usable_bytes(self) -> int:
        """Memory a process can allocate on one device, in bytes.

        NVML's reported total when known; else the decimal-GB datasheet figure (which lands within a
        few percent of what NVML reports: a 24 GB A10G reports 23028 MiB = 24.1e9 bytes).
        """
        if self.nvml_total_mib is not None:
            return self.nvml_total_mib * MIB
        return int(self.memory_gb * GB * self.usable_memory_fraction)

    def matmul_tflops(self) -> tuple[float | None, str]:
        """The dense half-precision tensor rate training runs at, and the dtype it runs in."""
        if self.bf16 and self.bf16_tflops is not None:
            return self.bf16_tflops, "bf16"
        if self.fp16_tflops is not None:
            return self.fp16_tflops, "fp16"
        return self.fp32_tflops, "fp32"


class Flavor(_Strict):
    """A machine you can rent or own: a number of accelerators plus CPU and RAM, and a price."""

    id: str = Field(pattern=ID_PATTERN)
    """Catalog id, lowercase; for Hugging Face Jobs the flavor name itself (``a10g-large``)."""
    name: str
    """Display name."""
    provider: Literal["hf-jobs", "hf-tpu", "local"]
    """``hf-jobs``: Hugging Face Jobs; ``hf-tpu``: the seeds' TPU flavors; ``local``: your own machine."""
    accelerator: str | None = None
    """Accelerator id; None for a CPU-only flavor."""
    gpu_count: int = Field(default=0, ge=0, le=100_000)
    """Number of accelerators (0 for CPU-only)."""
    vcpu: int | None = Field(default=None, gt=0, le=100_000)
    """Virtual CPUs."""
    ram_gb: float | None = Field(default=None, gt=0, le=100_000_000)
    """Host RAM in GB (decimal, as the provider lists it)."""
    price_per_hour: float | None = Field(default=None, ge=0, le=1_000_000)
    """US dollars per hour; None for a local machine (no hourly price)."""
    price_date: str | None = None
    """Date of the price table the price comes from (YYYY-MM-DD)."""
    price_source: str | None = None
    """Where the price comes from."""
    source: str = Field(min_length=1)
    """Where the flavor's hardware description comes from."""
    notes: str = ""
    """Seed values that differ from the current figures, caveats."""

    @model_validator(mode="after")
    def _gpu_count_matches_accelerator(self) -> Flavor:
        if self.accelerator is None and self.gpu_count:
            raise _FieldProblem("accelerator", "gpu_count is set but accelerator is missing")
        if self.accelerator is not None and self.gpu_count == 0:
            raise _FieldProblem("gpu_count", "accelerator is set but gpu_count is 0")
        if self.price_per_hour is not None and not self.price_date:
            raise _FieldProblem("price_date", "price_per_hour needs price_date (prices change)")
        return self


class VisionSpec(_Strict):
    """A vision-language model's vision tower and projector, counted from its config
    (:mod:`hwdash.core.models.family_vision`, which cites each family's modeling file)."""

    family: str = Field(min_length=1, max_length=40)
    """The VLM's ``model_type`` (``qwen2_5_vl``, ``gemma3``, ``llava``, ``llava_next``)."""
    params: int = Field(gt=0, le=10**13)
    """Parameters of the vision encoder and the projector (loaded with the model)."""
    image_tokens: int = Field(ge=0, le=10_000_000)
    """Language-model tokens per image by default (0: the family's resolution is dynamic, and
    ``--image-tokens`` must say it)."""
    tower_tokens_per_image_token: float = Field(gt=0, le=1_000_000)
    """Tokens the vision encoder runs per image token the language model gets (patches merged or
    pooled into one image token; a CLS token)."""
    saved_elements_per_image_token: int = Field(gt=0, le=10**12)
    """Elements the tower and projector keep for backward per image token, all blocks together."""
    working_elements_per_image_token: int = Field(gt=0, le=10**12)
    """Elements alive per image token in one block's forward without grad (inference)."""
    summary: str = ""
    """What was read, for the model's notes."""


class ModelSpec(_Strict):
    """A transformer's architecture: what the estimator needs to count parameters and activations."""

    id: str = Field(pattern=ID_PATTERN)
    """Catalog id, lowercase (``qwen2.5-7b``)."""
    name: str
    """Display name."""
    hf_id: str = ""
    """Hugging Face repository id, if any."""
    layers: int = Field(gt=0, le=10_000)
    """Number of transformer blocks (``num_hidden_layers``)."""
    hidden_size: int = Field(gt=0, le=1_000_000)
    """Model width (``hidden_size``)."""
    heads: int = Field(gt=0, le=100_000)
    """Attention heads (``num_attention_heads``)."""
    kv_heads: int = Field(gt=0, le=100_000)
    """Key/value heads (``num_key_value_heads``); equal to ``heads`` without GQA."""
    head_dim: int = Field(gt=0, le=100_000)
    """Per-head dimension (``head_dim``, else hidden_size / heads)."""
    intermediate_size: int = Field(gt=0, le=10_000_000)
    """MLP width (per expert for MoE)."""
    vocab_size: int = Field(gt=0, le=100_000_000)
    """Vocabulary size."""
    tied_embeddings: bool = False
    """Whether the LM head shares the input embedding matrix."""
    mlp: Literal["gated", "standard"] = "gated"
    """``gated``: SwiGLU/GeGLU with three matrices; ``standard``: two matrices (Phi-2, GPT-2)."""
    attention_bias: bool = False
    """Whether q/k/v projections have biases (Qwen2)."""
    norms_per_layer: int = Field(default=2, gt=0, le=100)
    """Normalisation layers per block on the residual stream: 2 for pre-norm (Llama), 4 for Gemma 2
    and 3 (a pre- and a post-norm around attention and around the MLP), 1 for Phi-2 (attention and
    MLP run in parallel on one LayerNorm). Each keeps its input for backward."""
    norm_type: Literal["rmsnorm", "rmsnorm_offset", "rmsnorm_fp32_scale", "layernorm"] = "rmsnorm"
    """``rmsnorm`` (Llama, Qwen: normalise in fp32, cast back, then scale by the weight),
    ``rmsnorm_offset`` (Gemma 2 and 3: scale by ``1 + weight`` in fp32, cast back at the end; this
    applies to their Q/K norms too), ``rmsnorm_fp32_scale`` (OLMo 2: scale by the weight in fp32,
    then cast back; its Q/K norms too) or ``layernorm`` (Phi-2: mean and variance, weight and bias)."""
    qk_norm: bool = False
    """Per-head RMSNorm on the queries and keys before RoPE (Qwen3's and Gemma 3's ``q_norm`` and
    ``k_norm``): two more norms per layer, over Q and K."""
    mlp_activation: Literal["silu", "gelu", "gelu_pytorch_tanh", "gelu_new", "relu"] = "silu"
    """The MLP's activation, by its transformers ``ACT2FN`` name (``hidden_act``): ``silu``
    (SwiGLU), ``gelu_pytorch_tanh`` (one fused torch op; Gemma), ``gelu_new`` (the tanh
    approximation written as several elementwise ops, each keeping a tensor; Phi-2), ``relu`` (T5 v1)."""
    attn_logit_softcap: float | None = Field(default=None, gt=0, le=1_000_000)
    """Attention-score soft cap, ``cap * tanh(scores / cap)`` (Gemma 2's ``attn_logit_softcapping``);
    SDPA refuses it, so such a model trains with eager attention."""
    final_logit_softcap: float | None = Field(default=None, gt=0, le=1_000_000)
    """Soft cap on the output logits (Gemma 2's ``final_logit_softcapping``)."""
    experts: int = Field(default=1, gt=0, le=100_000)
    """MoE experts per layer (1 for a dense model). All experts are held in memory."""
    experts_per_token: int = Field(default=1, gt=0, le=100_000)
    """Experts each token is routed to (top-k)."""
    max_context: int = Field(gt=0, le=1_000_000_000)
    """Longest context the model was trained for (``max_position_embeddings``)."""
    checkpoint_bits: Literal[4, 8] | None = None
    """The checkpoint's block linear layers are stored quantized at this many bits
    (``quantization_config``: bitsandbytes 4/8-bit, GPTQ, AWQ); None: 16-bit weights."""
    mlp_bias: bool | None = None
    """Biases on the attention output and the MLP matrices; None: as ``mlp`` implies (a standard
    MLP has them, as Phi-2 and GPT-2; a gated one has none). Falcon and T5 have none."""
    norm_bias: bool | None = None
    """Whether each norm has a bias (LayerNorm) besides its weight; None: as ``mlp`` implies
    (standard: LayerNorm with bias; gated: RMSNorm, weight only)."""
    norm_weights_per_layer: int = Field(default=2, ge=0, le=100)
    """Norms with parameters per block (counted in the parameters; ``norms_per_layer`` counts their
    activations): 2 for most, 1 for Falcon-7B's single shared LayerNorm, 0 for OLMo 1's
    parameter-free LayerNorm."""
    learned_positions: int = Field(default=0, ge=0, le=1_000_000_000)
    """Rows of a learned absolute position embedding (GPT-2's and GPT-BigCode's ``wpe``,
    ``n_positions``); 0 for rotary, ALiBi or relative positions."""
    embedding_norm: bool = False
    """A LayerNorm right after the token embedding (BLOOM's ``word_embeddings_layernorm``)."""
    parallel_block: bool = False
    """Attention and MLP read the same block input and their outputs are added together
    (GPT-NeoX's ``use_parallel_residual``, Falcon's ``parallel_attn``)."""
    norm_saves_input: bool = False
    """The norms are torch's native LayerNorm in the activations' dtype, which keeps its input
    tensor itself plus an fp32 mean and reciprocal deviation per row for backward (GPT-2,
    GPT-NeoX, BLOOM, Falcon, GPT-BigCode), instead of an fp32 upcast copy (Llama's RMSNorm)."""
    position_encoding: Literal["rope", "alibi", "learned", "relative"] = "rope"
    """How positions enter: rotary (Llama, GPT-NeoX, Falcon), ALiBi biases on the scores (BLOOM),
    a learned table (GPT-2), or T5's bucketed relative attention bias."""
    eager_attention_only: bool = False
    """transformers has no SDPA or flash path for this architecture (BLOOM adds ALiBi with
    ``baddbmm``, T5 its position bias to the scores): it keeps the s^2 scores whatever --attn says."""
    decoder_layers: int = Field(default=0, ge=0, le=10_000)
    """Encoder-decoder (T5): the decoder's blocks, each with a cross-attention over the encoder
    output; ``layers`` is then the encoder's block count. 0 for a decoder-only model."""
    relative_attention_buckets: int = Field(default=0, ge=0, le=100_000)
    """T5's ``relative_attention_num_buckets``: an embedding of buckets x heads in the first
    block of each stack."""
    params: int | None = Field(default=None, gt=0, le=10**16)
    """Published total parameter count, if known; otherwise counted from the architecture."""
    source: str = Field(min_length=1)
    """Where the architecture comes from (the model's config.json, paper)."""
    notes: str = ""
    """Caveats."""
    model_type: str = ""
    """The transformers ``model_type`` of the config this spec was read from (``qwen3``,
    ``gemma3_text``: a multimodal config's text model); empty for a spec written out field by field
    (the advanced catalog form) or a bare parameter count."""
    hf_config: dict[str, Any] | None = None
    """The config.json fields this spec was read from (a multimodal config's ``text_config``), for
    the tracer to build the same model with transformers; None for a spec written field by field."""
    module_names: str = Field(default="", max_length=40)
    """How transformers names this family's modules (a table of ``catalog/shapes/module_names.toml``:
    ``gpt2``, ``gpt_neox``, ``bloom``, ``t5``, ``phi``, ``phi3``, ``mixtral``); "" is Llama's
    (``q_proj`` ... ``down_proj``). LoRA targets and ``modules_to_save`` are matched against
    these names as PEFT matches them; fused projections (GPT-2's ``c_attn``, Phi-3's
    ``gate_up_proj``) are counted as the one matrix they are."""
    shared_expert_intermediate_size: int = Field(default=0, ge=0, le=10_000_000)
    """MoE: width of the gated MLP every token goes through besides its routed experts (Qwen MoE's
    ``shared_expert_intermediate_size``; DeepSeek's ``n_shared_experts x moe_intermediate_size``,
    one MLP in transformers). 0: no shared expert."""
    shared_expert_gate: bool = False
    """A one-output linear whose sigmoid scales the shared expert's output (Qwen MoE's
    ``shared_expert_gate``)."""
    dense_mlp_layers: int = Field(default=0, ge=0, le=10_000)
    """MoE: blocks whose MLP is one dense gated MLP of ``dense_intermediate_size`` instead of the
    experts (DeepSeek's ``first_k_dense_replace``)."""
    dense_intermediate_size: int = Field(default=0, ge=0, le=10_000_000)
    """Width of those dense MLPs (DeepSeek's ``intermediate_size``)."""
    router_fp32: bool = False
    """The router multiplies an fp32 copy of its input by an fp32 weight (DeepSeek's
    ``DeepseekV2TopkRouter``, whose ``gate.weight`` is in ``_keep_in_fp32_modules_strict``)."""
    router_sigmoid: bool = False
    """Sigmoid router scores with a per-expert correction bias buffer (DeepSeek-V3)."""
    kv_lora_rank: int = Field(default=0, ge=0, le=1_000_000)
    """Multi-head latent attention (DeepSeek-V2/V3): width of the compressed key/value latent. 0:
    ordinary attention. With MLA, ``head_dim`` is the query/key head width
    (``qk_nope_head_dim + qk_rope_head_dim``)."""
    q_lora_rank: int = Field(default=0, ge=0, le=1_000_000)
    """MLA: width of the compressed query (``q_a_proj``, ``q_a_layernorm``, ``q_b_proj``); 0: one
    plain ``q_proj`` (DeepSeek-V2-Lite's ``q_lora_rank: null``)."""
    qk_rope_head_dim: int = Field(default=0, ge=0, le=100_000)
    """MLA: the rotary part of each query/key head, one shared key part for all heads."""
    v_head_dim: int = Field(default=0, ge=0, le=100_000)
    """MLA: per-head value width."""
    peft_fused_experts: bool = True
    """MoE under LoRA: PEFT maps the MLP projection names (and ``all-linear``) onto the routed
    experts' fused 3-D weights, so a shared expert's or a dense block's MLP is not adapted
    (``peft/utils/transformers_weight_conversion.py``: Mixtral, Qwen3 MoE, DeepSeek-V2/V3).
    False: PEFT has no such mapping for the model type (``qwen2_moe`` in PEFT 0.21), the routed
    experts cannot be adapted and the names reach the shared expert's linears."""
    encoder_only: bool = False
    """A bidirectional encoder without a decoder (BERT, RoBERTa, DeBERTa-v2, ModernBERT; read by
    :mod:`hwdash.core.models.family_encoders`): no KV cache, inference is one forward pass, and the head
    is :attr:`encoder_head` instead of a causal LM head."""
    encoder_head: Literal["mlm", "classification"] = "mlm"
    """An encoder's task head: masked-LM (``*ForMaskedLM``: transform + vocabulary decoder with
    logits on every position) or sequence classification (``*ForSequenceClassification``)."""
    num_labels: int = Field(default=2, gt=0, le=1_000_000)
    """Classes of a classification head (``id2label``/``num_labels``; transformers' default 2)."""
    encoder_family: Literal["", "bert", "deberta", "modernbert"] = ""
    """Which encoder block layout (post-LayerNorm BERT/RoBERTa, DeBERTa's disentangled attention,
    ModernBERT's pre-norm GeGLU blocks); empty for every other model."""
    type_vocab_size: int = Field(default=0, ge=0, le=1_000_000)
    """Rows of the token-type (segment) embedding (BERT 2, RoBERTa 1, DeBERTa-v3 0)."""
    attention_dropout: float = Field(default=0.0, ge=0, lt=1)
    """Dropout on the attention probabilities in training (``attention_probs_dropout_prob``,
    ModernBERT's ``attention_dropout``)."""
    hidden_dropout: float = Field(default=0.0, ge=0, lt=1)
    """Dropout on the hidden states (``hidden_dropout_prob``; ModernBERT's ``mlp_dropout``)."""
    embedding_dropout: float = Field(default=0.0, ge=0, lt=1)
    """Dropout after the embeddings (BERT's ``hidden_dropout_prob``, ModernBERT's
    ``embedding_dropout``)."""
    classifier_dropout: float = Field(default=0.0, ge=0, lt=1)
    """Dropout before the classification head's output layer(s)."""
    relative_position_buckets: int = Field(default=0, ge=0, le=1_000_000)
    """DeBERTa-v2's relative-position embedding rows (``2 * position_buckets``, else
    ``2 * max_relative_positions``); 0 without relative attention."""
    local_attention_window: int = Field(default=0, ge=0, le=1_000_000_000)
    """ModernBERT's sliding window (``local_attention``, tokens) on its local layers; 0: none."""
    global_attention_every: int = Field(default=1, gt=0, le=10_000)
    """ModernBERT: every n-th layer (from the first) attends globally (``global_attn_every_n_layers``)."""
    vision: VisionSpec | None = None
    """A vision-language model's vision tower and projector (their weights are always counted;
    image activations with ``--images``); None for a text-only model."""
    kv_expanded: bool = False
    """The family copies its key/value heads out to all query heads before attention and the
    cache (Falcon's new decoder architecture: ``FalconAttention._split_heads`` broadcasts them and
    ``reshape`` materialises the copy, ``modeling_falcon.py``): the KV cache and the kept K, V hold
    ``heads`` heads, the weights ``kv_heads``."""
    layer_attention: tuple[Literal["full", "sliding", "chunked"], ...] = Field(
        default=(), strict=False, max_length=10_000
    )
    """Each decoder layer's attention (:mod:`hwdash.core.models.windows`, from ``layer_types`` and
    the family's keys): ``full`` over the whole sequence, ``sliding`` over the last
    ``sliding_window`` tokens (Gemma 2/3, Mistral), ``chunked`` within chunks of
    ``attention_chunk_size`` (Llama 4). Empty: every layer full."""
    sliding_window: int = Field(default=0, ge=0, le=1_000_000_000)
    """Tokens a sliding layer attends to (``sliding_window``); 0 without sliding layers."""
    attention_chunk_size: int = Field(default=0, ge=0, le=1_000_000_000)
    """Tokens of a chunked layer's chunk (``attention_chunk_size``); 0 without chunked layers."""
    experts_every_token: bool = False
    """MoE: every expert runs on every token, each copy scaled by its router score (0 outside the
    top-k): Llama 4's ``Llama4TextMoe`` repeats the tokens once per expert and multiplies them
    through all experts with ``torch.bmm`` (``modeling_llama4.py``), so training keeps every
    expert's intermediate tensors for every token. The active parameters stay the top-k's."""
    nope_layers: tuple[int, ...] = ()
    """Llama 4: the layers without RoPE (``no_rope_layers`` 0): no Q/K norm, and (by default) full
    attention where the others attend in chunks (:attr:`layer_attention`)."""
    moe_layer_indices: tuple[int, ...] = ()
    """MoE: the blocks with experts where they are not the last ``layers - dense_mlp_layers``
    (Llama 4's ``moe_layers``: every ``interleave_moe_layer_step``-th); empty: those last ones."""
    qk_norm_weight: bool = True
    """The Q/K norms scale by a weight (Qwen3, Gemma 3); False: a plain RMS normalisation
    (Llama 4's ``Llama4TextL2Norm``), which keeps no normalised copy for a weight gradient."""

    @model_validator(mode="after")
    def _consistent(self) -> ModelSpec:
        if self.module_names:
            from hwdash.core.module_names import naming_schemes

            if self.module_names not in naming_schemes():
                known = ", ".join(sorted(naming_schemes()))
                raise _FieldProblem(
                    "module_names", f"unknown module naming '{self.module_names}' (known: {known})"
                )
        if self.heads % self.kv_heads:
            raise _FieldProblem(
                "kv_heads", f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})"
            )
        if self.kv_lora_rank and not (
            0 < self.qk_rope_head_dim < self.head_dim and self.v_head_dim
        ):
            raise _FieldProblem(
                "qk_rope_head_dim",
                "latent attention (kv_lora_rank) needs v_head_dim and a qk_rope_head_dim smaller "
                f"than head_dim ({self.head_dim})",
            )
        if self.layer_attention:
            self._check_windows()
        if self.experts_per_token > self.experts:
            raise _FieldProblem(
                "experts_per_token",
                f"experts_per_token ({self.experts_per_token}) is larger than experts ({self.experts})",
            )
        for name in ("nope_layers", "moe_layer_indices"):
            if any(not 0 <= index < self.layers for index in getattr(self, name)):
                raise _FieldProblem(name, f"layer indices must be below layers ({self.layers})")
        moe_blocks = self.layers - self.dense_mlp_layers
        if self.moe_layer_indices and len(set(self.moe_layer_indices)) != moe_blocks:
            raise _FieldProblem(
                "moe_layer_indices",
                f"{len(set(self.moe_layer_indices))} MoE blocks listed, but layers - "
                f"dense_mlp_layers is {moe_blocks}",
            )
        return self

    def _check_windows(self) -> None:
        """``layer_attention`` names every decoder layer, and each kind it uses has its width."""
        if len(self.layer_attention) != self.layers:
            raise _FieldProblem(
                "layer_attention",
                f"{len(self.layer_attention)} layer kinds for {self.layers} layers",
            )
        if "sliding" in self.layer_attention and not self.sliding_window:
            raise _FieldProblem("sliding_window", "sliding layers need a sliding_window")
        if "chunked" in self.layer_attention and not self.attention_chunk_size:
            raise _FieldProblem(
                "attention_chunk_size", "chunked layers need an attention_chunk_size"
            )


class Slowdown(_Strict):
    """A step-time factor the FLOPs model cannot see (CPU offload, dequantisation), with its source.

    ``hwdash plan --fit`` multiplies an option's time by the factors it brings in.
    """

    id: str = Field(pattern=ID_PATTERN)
    """What slows down: ``offload-optimizer``, ``offload-params``, ``qlora`` or ``lora-8bit``."""
    factor: float = Field(ge=1, le=100, allow_inf_nan=False)
    """Step time with it divided by step time without it (1.66: 66% slower)."""
    compared_with: str = Field(min_length=1)
    """What the factor is relative to (e.g. 16-bit LoRA on the same GPU)."""
    source: str = Field(min_length=1)
    """Where the factor comes from, and how sure it is."""
    notes: str = ""
    """Caveats."""


class FrameworkSettings(_Strict):
    """Saver settings a training stack uses unless told otherwise (Plan field names and values).

    None leaves the setting to the next level: the framework's general defaults for the
    ``full`` overrides, hwdash's plain Hugging Face behaviour for the general ones.
    """

    loss: Literal["standard", "chunked", "fused-linear", "legacy"] | None = None
    """Cross-entropy path (``Plan.loss``)."""
    compile: bool | None = None
    """torch.compile on by default."""
    activation_offload: bool | None = None
    """Saved activations offloaded to host RAM by default."""
    optimizer_in_backward: bool | None = None
    """Optimizer step fused into backward by default."""
    sync_each_batch: bool | None = None
    """FSDP gradients reduce-scattered after every micro-batch by default (no ``no_sync``)."""
    ddp_bucket_view: bool | None = None
    """DDP's gradients are views into its reduce buckets by default (no second copy)."""
    qlora_frozen_dtype: Literal["fp32", "bf16"] | None = None
    """Dtype of a quantized base's unquantized parts."""
    adapter_dtype: Literal["fp32", "bf16"] | None = None
    """Dtype of LoRA adapters."""
    value_head: Literal["shared", "separate"] | None = None
    """PPO value model."""
    precision: Literal["fp32", "amp", "bf16", "mixed"] | None = None
    """Storage layout (``Plan.precision``); applied by the command line where ``--precision`` is not
    typed."""
    grad_ckpt: bool | None = None
    """Activation checkpointing on by default (command line, where ``--grad-ckpt`` is not typed)."""
    optimizer: (
        Literal["adamw", "adamw-8bit", "adamw-8bit-paged", "adamw-32bit-paged", "sgd", "adafactor"]
        | None
    ) = None
    """Default optimizer (command line, where ``--optimizer`` is not typed)."""
    optimizer_impl: Literal["fused", "foreach", "for-loop"] | None = None
    """Default AdamW implementation (command line, where ``--optimizer-impl`` is not typed)."""
    fsdp1_adapters_share_units: bool | None = None
    """Under FSDP1, the adapters sit in their transformer block's FSDP unit (a block wrap policy
    with ``use_orig_params``) instead of units of their own (PEFT's ``fsdp_auto_wrap_policy``):
    each block's flat parameter then takes a gradient as a whole. Not a plan field."""

    def given(self) -> dict[str, Any]:
        """The settings this entry states (None left out)."""
        return {name: value for name, value in self.model_dump().items() if value is not None}


class Framework(FrameworkSettings):
    """A training stack's defaults (``catalog/frameworks.toml``), each with its source."""

    id: Literal["hf", "torchtune", "unsloth", "deepspeed", "fsdp", "megatron", "litgpt", "trl"]
    """The ``--framework`` value."""
    name: str = Field(min_length=1)
    """Display name."""
    full: FrameworkSettings = FrameworkSettings()
    """Overrides for full fine-tuning (torchtune's full recipes fuse the step into backward)."""
    sources: dict[str, str]
    """Where each stated default comes from, by setting name (``full.<name>`` for overrides)."""
    notes: str = ""
    """Caveats."""

    @model_validator(mode="after")
    def _every_default_cited(self) -> Framework:
        stated = list(self.given()) + [f"full.{name}" for name in self.full.given()]
        for name in stated:
            if not self.sources.get(name, "").strip():
                raise _FieldProblem("sources", f"the default '{name}' has no source")
        for name in self.sources:
            if name not in stated:
                raise _FieldProblem("sources", f"a source for '{name}', which is not set")
        return self

    def given(self) -> dict[str, Any]:
        """The general defaults this framework states (not ``full``, ids and sources)."""
        out = FrameworkSettings.given(self)
        for name in ("id", "name", "full", "sources", "notes"):
            out.pop(name, None)
        return out


def _entry_label(kind: str, index: int, raw: Any) -> str:
    ident = raw.get("id") if isinstance(raw, dict) else None
    return f"{kind} '{ident}'" if isinstance(ident, str) else f"{kind} #{index + 1}"


def _validation_error(path: Path, label: str, exc: ValidationError) -> CatalogError:
    """Turn pydantic's first error into a one-line message naming the file, entry and field."""
    first = exc.errors()[0]
    field_name = ".".join(str(part) for part in first["loc"]) or None
    message = first["msg"]
    cause = first.get("ctx", {}).get("error")
    if isinstance(cause, _FieldProblem):
        return CatalogError(path, str(cause), entry=label, field=cause.field)
    if first["type"] == "extra_forbidden":
        message = "unknown field"
    elif first["type"] == "string_pattern_mismatch" and field_name == "id":
        message = "ids are lowercase (lookups ignore case)"
    if field_name is not None and "input" in first and first["type"] != "missing":
        shown = repr(first["input"])
        message += f" (got {shown if len(shown) <= 60 else shown[:57] + '...'})"
    return CatalogError(path, message, entry=label, field=field_name)


def _pairs(value: Any) -> Any:
    """TOML's ``[[2, 0.87], ...]`` as a tuple of tuples (strict validation takes no lists)."""
    if isinstance(value, list):
        return tuple(tuple(row) if isinstance(row, list) else row for row in value)
    return value


class BatchDefaultsByGpu(_Strict):
    """An engine's larger scheduler defaults on large GPUs (vLLM's ``vllm/engine/arg_utils.py``:
    a device of at least ``min_total_gib`` whose name holds none of ``excluded_names``)."""

    min_total_gib: float = Field(gt=0, le=1_000_000)
    """The device's total memory (what CUDA reports), GiB, at and above which the rule holds."""
    excluded_names: tuple[str, ...] = Field(default=(), strict=False)  # TOML gives a list
    """Lower-case parts of the device name the rule never holds for."""
    max_num_batched_tokens: int = Field(ge=1, le=100_000_000)
    max_num_seqs: int = Field(ge=1, le=1_000_000)
    source: str = Field(min_length=1)


class EngineDefaults(_Strict):
    """One ``[[engine]]`` row of ``catalog/engines.toml``: a serving engine's memory defaults
    (read by :mod:`hwdash.core.estimator.serving`; each field is described in the file)."""

    id: str
    name: str
    memory_fraction: float = Field(gt=0, le=1)
    fraction_by_tp: Annotated[tuple[tuple[int, float], ...], BeforeValidator(_pairs)] = ()
    """(smallest TP size, fraction) pairs that replace ``memory_fraction`` at that TP and above
    (SGLang's ``server_args.py``); empty: one fraction."""
    block_tokens: int = Field(ge=1, le=1_000_000)
    max_num_seqs: int = Field(ge=1, le=1_000_000)
    profile: Literal["batched-tokens", "max-model-len", "none"]
    max_num_batched_tokens: int = Field(ge=1, le=100_000_000)
    chunked_prefill_above: int = Field(default=0, ge=0, le=1_000_000_000)
    non_torch_mib: float | None = Field(default=None, ge=0, le=1_000_000)
    sampler_bytes_per_logit: float = Field(ge=0, le=1_000)
    cuda_graph_mib: float = Field(ge=0, le=1_000_000)
    prefill_efficiency: float | None = Field(default=None, gt=0, le=1)
    """Share of the GPU's dense tensor rate the prompt pass reaches (None: no batch-job time;
    :mod:`hwdash.core.planning.serving_time`)."""
    decode_efficiency: float | None = Field(default=None, gt=0, le=1)
    """Share of the GPU's memory bandwidth a decode step reaches (None: no batch-job time)."""
    allreduce_latency_us: float = Field(default=0, ge=0, le=1_000_000)
    """Tensor parallel: the fixed time of one all-reduce, in microseconds."""
    allreduce_gbps: float | None = Field(default=None, gt=0, le=1_000_000)
    """Tensor parallel: the all-reduce's bus bandwidth per GPU, GB/s (None: not counted)."""
    throughput_source: str = ""
    """Where the four throughput numbers above come from."""
    hybrid_kv_cache: bool = False
    """Sliding-window and chunked layers get block groups of their own that hold only their window
    per request (vLLM V1's hybrid KV cache manager); False: every layer caches every token."""
    batch_defaults_by_gpu: BatchDefaultsByGpu | None = None
    """Larger ``max_num_batched_tokens`` and ``max_num_seqs`` defaults on large GPUs (None: the
    flat ones above on every GPU)."""
    context_outside_budget: bool = False
    """The CUDA context (``catalog/software.toml``'s row for the GPU) exists before the engine's
    baseline snapshot, so the budget does not count it and it comes on top (vLLM V1); False: it
    is in the non-torch memory the budget counts (``non_torch_mib`` or the row itself)."""
    context_source: str = ""
    """Where ``context_outside_budget`` comes from."""
    tp_buffers: Literal["in-budget", "outside", "fraction"] = "outside"
    """How a tensor-parallel rank's communicator buffers, made at distributed init, meet the
    budget: ``in-budget`` (the baseline is taken before them: counted as non-torch memory),
    ``outside`` (taken after them: not counted), ``fraction`` (the fraction applies to the free
    memory measured after them: the pool loses the fraction of them; SGLang)."""
    custom_allreduce_mib: float = Field(default=0, ge=0, le=1_000_000)
    """The custom all-reduce's IPC buffers per rank, outside torch (0: none)."""
    custom_allreduce_tp: tuple[int, ...] = Field(default=(), strict=False)  # TOML gives a list
    """TP sizes the custom all-reduce supports."""
    custom_allreduce_links: tuple[str, ...] = Field(default=(), strict=False)
    """``[[interconnect]]`` ids it is used on (it needs peer-to-peer access)."""
    tp_source: str = ""
    """Where ``tp_buffers`` and the custom all-reduce fields come from."""
    source: str = Field(min_length=1)
    notes: str = ""
