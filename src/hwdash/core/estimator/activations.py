"""Activations a training step keeps for backward: per layer, over all layers, the logits and loss.

:func:`layer_activation_bytes` counts, tensor by tensor, what autograd keeps for one decoder layer;
:func:`training_activation_bytes` adds the layers up (with or without recomputation);
:func:`logits_bytes` sizes the logits and the loss at their peak; the adapters' own tensors (LoRA,
DoRA, dropout masks, merged MoE expert weights) are counted here too.

Sources:

* Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
  arXiv:2205.05198, section 4.1 (``s*b*h*(34 + 5*a*s/h)`` bytes per layer in 16-bit, and
  ``2*s*b*h`` per layer with full recomputation). We recount the same saved tensors for today's
  Hugging Face decoder layers (RMSNorm with an fp32 upcast, SwiGLU MLP, GQA, no dropout), checked
  against the tensors autograd keeps for a small Llama layer traced on CPU (transformers 5, PEFT
  0.21; ``bench/trace_layer_activations.py``) and the fake-tensor traces of
  ``bench/data/calibration.csv``.
* FlashAttention: Dao et al. 2022, arXiv:2205.14135 (no s^2 scores kept, a log-sum-exp per row).
* transformers' ``ForCausalLMLoss`` (``transformers/loss/loss_utils.py``): the fp32 upcast of the
  logits before cross-entropy.
* PyTorch's fused dropout (``aten/src/ATen/native/Dropout.cpp``): the bool mask on CUDA.
* PEFT 0.21's LoRA, DoRA (``DoraLinearLayer``) and ``lora.ParamWrapper`` (fused MoE experts);
  LoRA: Hu et al. 2021, arXiv:2106.09685; DoRA: Liu et al. 2024, arXiv:2402.09353.
* Other block layouts (LayerNorm keeping its input, encoder-decoder cross-attention):
  :mod:`hwdash.core.estimator.block_activations`; the savers (compile, chunked or fused losses):
  :mod:`hwdash.core.estimator.savers`.
"""

from __future__ import annotations

import functools
import math
from typing import Any

from hwdash.core.estimator import block_activations
from hwdash.core.estimator import selective_ac as selective
from hwdash.core.estimator.architecture import (
    Architecture,
    LinearShape,
    dense_block_adapted,
)
from hwdash.core.estimator.savers import compiled_norm_saving
from hwdash.core.plan import Attention

#: Bytes per logit at the loss's peak. transformers' ``ForCausalLMLoss`` upcasts the logits to fp32
#: before cross-entropy (``logits = logits.float()`` in ``transformers/loss/loss_utils.py``);
#: log-softmax saves its fp32 output for backward. In forward the 16-bit logits, the fp32 copy and
#: the fp32 log-softmax output coexist (e + 4 + 4 bytes); at the start of backward the saved output,
#: the fp32 gradient out of NLL and the fp32 gradient log-softmax produces coexist (12 bytes), while
#: the 16-bit logits are gone (the Trainer drops the model outputs before ``backward``).
LOSS_FP32_BYTES_PER_LOGIT = 12

#: Bytes per element of the mask a LoRA dropout keeps for backward on CUDA: ``torch.nn.Dropout``
#: runs the fused ``native_dropout`` there, which returns a bool mask (``aten/src/ATen/native/
#: Dropout.cpp``, ``is_fused_kernel_acceptable``: CUDA, XPU, lazy and private-use devices). On CPU the
#: composite path keeps a mask in the input's dtype instead (fp32 inside PEFT's adapters: 4 bytes),
#: which is what the CPU traces of ``bench/data/calibration.csv`` hold
#: (:func:`lora_dropout_mask_elements` gives the count to convert them).
DROPOUT_MASK_BYTES = 1


def _score_bytes_per_element(attention: Attention, element_bytes: int, gqa: bool) -> int:
    """Bytes stored per attention-score element (b x heads x s x s) for backward.

    * flash / SDPA's flash or memory-efficient kernels: none, they recompute the scores in backward
      and keep only a log-sum-exp per row (Dao et al. 2022, arXiv:2205.14135). Korthikanti's
      ``5as/h`` term disappears.
    * SDPA in fp32 on a GQA model: we assume PyTorch's math fallback (the fused kernels want 16-bit
      inputs or matching head counts), which saves the probabilities in the compute dtype.
    * eager: transformers computes ``softmax(..., dtype=torch.float32)`` and casts back, so the fp32
      softmax output (saved by softmax) and the 16-bit probabilities (saved by the matmul with V)
      are both kept. Korthikanti counts 2 + 1 (dropout mask) + 2 (dropout output) bytes; modern LLMs
      train without attention dropout, so there is no mask and no separate dropout output.
    """
    if attention is Attention.EAGER:
        return 4 + (element_bytes if element_bytes != 4 else 0)
    if attention is Attention.SDPA and element_bytes == 4 and gqa:
        return element_bytes
    return 0


#: Linear layers that read the same input tensor (a norm's output), for counting LoRA's input copies.
#: ``qkv_proj`` and ``gate_up_proj``: the families that fuse them into one matrix (GPT-2's
#: ``c_attn``, GPT-NeoX's ``query_key_value``, Phi-3's ``qkv_proj`` and ``gate_up_proj``).
#: MLA (DeepSeek): q_proj or q_a_proj and kv_a_proj_with_mqa read the block's norm output; q_b_proj
#: and kv_b_proj each read a latent norm's output (``modeling_deepseek_v2.py``).
_SHARED_INPUT_GROUPS = (
    ("q_proj", "k_proj", "v_proj", "q_a_proj", "kv_a_proj_with_mqa"),
    ("qkv_proj",),
    ("gate_proj", "up_proj"),
    ("gate_up_proj",),
    ("fc1",),
    ("q_b_proj",),
    ("kv_b_proj",),
)
#: A MoE's shared expert (its input is the router's, kept once, see layer_activation_bytes).
_SHARED_EXPERT_GROUP = ("shared_expert.gate_proj", "shared_expert.up_proj", "shared_expert_gate")
#: Linear layers whose input only the layer itself keeps (the MLP's product or activation): with a
#: frozen, unadapted layer nobody keeps it.
_INPUT_SAVED_ONLY_FOR_WEIGHT_GRAD = ("down_proj", "fc2", "shared_expert.down_proj")


def _input_copies_kept(
    arch: Architecture,
    tokens: int,
    element_bytes: int,
    attention: Attention,
    targets: tuple[LinearShape, ...],
    autocast_from_fp32: bool,
    adapter_casts: bool | None = None,
    dropout: bool = False,
) -> int:
    """The 16-bit inputs the linear layers keep, as they depend on freezing and casting.

    From how autograd, autocast and PEFT work, and checked by tracing the tensors autograd keeps
    for a small Llama layer (transformers 5, PEFT 0.21, CPU; see :func:`layer_activation_bytes`):

    * full training keeps each shared input once (q, k and v read one norm output) unless autocast
      casts an fp32 input: then every linear keeps its own 16-bit cast (``amp``: three copies for
      q/k/v, two for gate/up);
    * autograd keeps an op's input only when a gradient needs it, so a frozen, unadapted linear
      keeps nothing: an unadapted q/k/v (gate/up) group drops the norm output, an unadapted
      down_proj (fc2) the MLP product, an unadapted eager o_proj its input copy;
    * PEFT casts an adapted module's input to the adapter's dtype (fp32) and autocast casts it back
      for lora_A, so every adapted module keeps its own 16-bit copy (q, k and v keep three). In
      plain fp32 there is no cast: lora_A keeps the shared tensor itself. An adapted o_proj keeps
      a copy next to the attention kernel's output (flash and SDPA keep that output themselves).
    * LoRA dropout (``dropout``, p > 0) gives every adapted module its own input as well, cast or
      not: PEFT's ``Linear.forward`` (``peft/tuners/lora/layer.py``, and ``Linear8bitLt`` /
      ``Linear4bit`` in ``peft/tuners/lora/bnb.py``) runs ``lora_B(lora_A(dropout(x)))`` with one
      ``nn.Dropout`` per adapted module (``update_layer``: ``self.lora_dropout[adapter_name]``),
      so q, k and v each drop out their own copy of the norm output and lora_A keeps that copy
      (``e`` bytes: the activations' dtype, which is the adapter's where nothing casts). Where the
      input is cast anyway (16-bit compute under an fp32 adapter) lora_A keeps its own 16-bit cast
      of the dropped copy instead of the cast of the input, the same bytes: dropout adds only its
      mask there (:func:`_adapter_extras`). Without a cast the shared tensor is replaced by one
      copy per adapted module: (n - 1) more copies in a group of n adapted linears, one more for
      an adapted o_proj next to the attention kernel's output (an adapted down_proj keeps its
      dropped input instead of the MLP product: no change). Checked per tensor on a PEFT layer
      (saved-tensor hooks, fp32 and bf16-adapter LoRA) and on fake-tensor traces
      (``bench/lora_dropout_rows.py``). PEFT's ``lora.ParamWrapper`` (fused MoE experts) refuses
      dropout, so expert groups are left as they are.
    """
    lora = bool(targets)
    casts = _input_casts(lora, element_bytes, autocast_from_fp32, adapter_casts)
    names = {linear.name for linear in targets} if lora else {lin.name for lin in arch.linears}
    # every adapted module keeps an input of its own: a cast, or its dropped-out copy (not for
    # fused MoE expert weights, whose lora.ParamWrapper runs no dropout)
    own_dense = casts or (lora and dropout)
    by_name = {linear.name: linear for linear in arch.linears}
    e = element_bytes
    return (
        _group_input_bytes(arch, by_name, tokens, e, names, casts, own_dense)
        + _o_proj_input_bytes(arch, by_name, tokens, e, attention, names, casts, lora, dropout)
        + _weight_grad_input_bytes(arch, by_name, tokens, e, names)
    )


def _input_casts(
    lora: bool, element_bytes: int, autocast_from_fp32: bool, adapter_casts: bool | None
) -> bool:
    """Whether each linear (LoRA: each adapted module) keeps its own 16-bit cast of its input."""
    if lora and adapter_casts is not None:
        # 16-bit adapters (torchtune, --adapter-dtype bf16): no cast to the adapter dtype, so
        # lora_A keeps the shared tensor itself, as in plain fp32
        return adapter_casts
    return element_bytes != 4 if lora else autocast_from_fp32


def _routed_tokens(arch: Architecture, tokens: int, linear: LinearShape) -> int:
    """Tokens through ``linear``: every token, k times for a MoE expert's (every expert's for
    Llama 4: :attr:`~hwdash.core.estimator.layout.Architecture.routed_copies`)."""
    return tokens * (arch.routed_copies if linear.copies > 1 else 1)


def _group_input_bytes(
    arch: Architecture,
    by_name: dict[str, LinearShape],
    tokens: int,
    e: int,
    names: set[str],
    casts: bool,
    own_dense: bool,
) -> int:
    """The inputs of the :data:`_SHARED_INPUT_GROUPS` (once per group, or once per adapted member
    where each keeps its own), and of the shared expert's gate/up under a cast."""
    kept_bytes = 0
    # one norm feeding attention and MLP (Phi-2's, Falcon-7B's parallel block): without casts the
    # q/k/v group and the MLP's first linears keep the very same tensor
    one_norm_output = arch.parallel_block and arch.norms_per_layer == 1 and not own_dense
    shared_kept = False
    for group in _SHARED_INPUT_GROUPS:
        members = [by_name[name] for name in group if name in by_name]
        if not members:
            continue
        adapted = [linear for linear in members if linear.name in names]
        own = own_dense if members[0].copies == 1 else casts
        kept = (len(adapted) if own else 1) if adapted else 0
        if kept and one_norm_output and members[0].copies == 1:
            kept, shared_kept = (0 if shared_kept else kept), True
        kept_bytes += kept * e * _routed_tokens(arch, tokens, members[0]) * members[0].in_features
    shared = [by_name[name] for name in _SHARED_EXPERT_GROUP if name in by_name]
    if shared and casts:
        # the shared expert's gate/up (and Qwen's gate) read the router's input, counted once in
        # layer_activation_bytes; under a cast each adapted one keeps its own copy
        adapted_shared = [linear for linear in shared if linear.name in names]
        kept_bytes += len(adapted_shared) * e * tokens * arch.hidden
    return kept_bytes


def _o_proj_input_bytes(
    arch: Architecture,
    by_name: dict[str, LinearShape],
    tokens: int,
    e: int,
    attention: Attention,
    names: set[str],
    casts: bool,
    lora: bool,
    dropout: bool,
) -> int:
    """The attention output o_proj reads, as eager or the fused kernels keep it, and an adapted
    o_proj's own copy."""
    o_input = e * tokens * by_name["o_proj"].in_features
    if attention is Attention.EAGER:
        # eager's o_proj input is its own tensor (the transposed attention output)
        return o_input if "o_proj" in names else 0
    # flash and SDPA keep their output, which is o_proj's input (already 16-bit); PEFT's cast
    # to the adapter dtype makes an adapted o_proj keep a copy of its own, and so does its
    # dropout where the kernel keeps its output (SDPA's math fallback keeps the probabilities,
    # not the output: there lora_A's dropped copy replaces the input it kept)
    keeps_output = _score_bytes_per_element(attention, e, arch.kv_heads != arch.heads) == 0
    own_o = casts or (lora and dropout and keeps_output)
    return o_input + (o_input if lora and "o_proj" in names and own_o else 0)


def _weight_grad_input_bytes(
    arch: Architecture, by_name: dict[str, LinearShape], tokens: int, e: int, names: set[str]
) -> int:
    """The inputs of :data:`_INPUT_SAVED_ONLY_FOR_WEIGHT_GRAD` linears, kept only when trained."""
    kept_bytes = 0
    for name in _INPUT_SAVED_ONLY_FOR_WEIGHT_GRAD:
        linear = by_name.get(name)
        if linear is not None and name in names:
            kept_bytes += e * _routed_tokens(arch, tokens, linear) * linear.in_features
    return kept_bytes


def _adapter_extras(
    arch: Architecture,
    tokens: int,
    element_bytes: int,
    targets: tuple[LinearShape, ...],
    rank: int,
    dora: bool,
    dropout: bool = False,
    adapter_casts: bool | None = None,
) -> int:
    """What adapters keep besides their inputs (see :func:`_input_copies_kept` for those).

    * lora_A's output (e t r), kept by lora_B;
    * autocast's 16-bit copies of the fp32 adapter weights (e bytes per adapter parameter);
    * DoRA: the base output and the LoRA output of each adapted module, kept for the magnitude
      scaling (2 e t out), plus three fp32 vectors of ``out`` (magnitude / norm scale). PEFT's
      weight-norm path (an ``in x in`` identity through the adapter, then detached) is freed module
      by module: a transient, not a kept activation.
    * DoRA with dropout (p > 0): PEFT 0.21's ``DoraLinearLayer.forward`` gets no base output then
      and recomputes it on the dropped-out input, ``F.linear(x, weight.to(x.dtype))`` with ``x`` in
      the adapter's fp32; under autocast that linear casts the frozen weight to 16 bits and keeps
      the copy for the input gradient: one ``e`` byte copy of every adapted base weight per layer
      (without autocast, in fp32, the weight itself is kept: nothing new). Traced (issue 14,
      ``bench/probe_gaps.py``, llama-3.2-1b DoRA r16 bf16 at b1/s512): dropout 0 is counted to the
      byte; dropout 0.05 keeps 237,568 bytes per token per layer more than the masks, which is 2
      bytes x the layer's 60.8M linear parameters / 512 tokens, and the inventory holds 16-bit
      ``_to_copy`` tensors of every projection's weight shape.
    * LoRA dropout (p > 0): its mask over each adapted module's input, :data:`DROPOUT_MASK_BYTES`
      per element (one ``nn.Dropout`` per adapted module: ``peft/tuners/lora/layer.py``). The
      dropped-out tensor is what lora_A keeps (its own input, in the adapter's dtype, or autocast's
      16-bit cast of it), counted with the inputs (:func:`_input_copies_kept`). Checked on the
      calibration traces: the ``-d0.05`` rows hold 4 bytes (CPU's mask dtype) per adapted input
      element more than the ``-d0`` rows, to within 1%; ``hwdash plan --trace`` on CPU runs the
      dropout through CUDA's fused kernel and holds 1 byte (``hwdash.tracing._cuda_fused_dropout``).
    """
    e = element_bytes
    casts = element_bytes != 4 if adapter_casts is None else adapter_casts
    extras = 0
    if dropout:
        extras += DROPOUT_MASK_BYTES * lora_dropout_mask_elements(arch, tokens, targets)
    extras += _merged_expert_weight_bytes(targets, element_bytes)
    for linear in targets:
        routed = tokens * (arch.routed_copies if linear.copies > 1 else 1)
        extras += e * routed * rank
        if casts:
            extras += e * rank * (linear.in_features + linear.out_features) * linear.copies
        if dora:
            extras += (
                2 * e * routed * linear.out_features + 3 * 4 * linear.out_features * linear.copies
            )
        if dora and dropout and casts and linear.copies == 1:
            extras += e * linear.in_features * linear.out_features
    return extras


def _merged_expert_weight_bytes(targets: tuple[LinearShape, ...], element_bytes: int) -> int:
    """Adapted MoE expert weights PEFT merges per layer and autograd keeps (transformers 5).

    transformers 5 stores a layer's experts as one 3-D weight per projection, which PEFT adapts with
    ``lora.ParamWrapper``: the forward builds ``W + scale * B A`` for all experts at once in the
    compute dtype and the grouped matmul keeps it for the input gradient. Traced:
    mixtral-8x7b LoRA bf16 without checkpointing holds 2.02 bytes per expert parameter per layer
    more than the per-expert-linear count (bench/data/calibration.csv).
    """
    return sum(
        element_bytes * linear.in_features * linear.out_features * linear.copies
        for linear in targets
        if linear.copies > 1
    )


def _merged_expert_gradient_bytes(targets: tuple[LinearShape, ...], weight_bytes: int) -> int:
    """The gradient of one merged expert weight (all experts of the largest adapted projection),
    alive while its layer is differentiated: the LoRA delta needs it. A transient of the backward.
    """
    expert_targets = [linear for linear in targets if linear.copies > 1]
    if not expert_targets:
        return 0
    largest = max(expert_targets, key=lambda linear: linear.in_features * linear.out_features)
    return weight_bytes * largest.in_features * largest.out_features * largest.copies


def lora_dropout_mask_elements(
    arch: Architecture, tokens: int, targets: tuple[LinearShape, ...]
) -> int:
    """Elements LoRA dropout masks in one layer: every adapted module's input.

    MoE expert weights are left out: PEFT adapts transformers 5's fused 3-D expert weights with
    ``lora.ParamWrapper``, which refuses dropout (the plan warns).
    """
    return sum(tokens * linear.in_features for linear in targets if linear.copies == 1)


def _latent_attention_bytes(
    arch: Architecture,
    tokens: int,
    e: int,
    w: int,
    frozen: bool,
    attention: Attention,
) -> int:
    """What multi-head latent attention keeps besides the inputs of q_proj / q_a_proj /
    kv_a_proj_with_mqa / q_b_proj / kv_b_proj / o_proj (:func:`_input_copies_kept`), read from
    ``DeepseekV2Attention.forward`` and ``expand_kv`` (``modeling_deepseek_v2.py``;
    ``modeling_deepseek_v3.py`` differs only in its real-valued RoPE) and checked against
    fake-tensor traces of small configs (``hwdash plan --trace``, eager attention):

    * the RMSNorms over the latents (``kv_a_layernorm``; ``q_a_layernorm`` with a query latent),
      each as a block norm (:func:`_rms_norm_bytes`);
    * the attention's query (a ``torch.cat`` of its nope and rope parts) and key (``expand_kv``'s
      new tensor), one head width each per head;
    * the value: eager's matmul keeps a contiguous copy (``v_head_dim`` per head); SDPA's fused
      kernels keep the view ``expand_kv`` hands them, so all of ``kv_b_proj``'s output stays
      alive (nope + v per head). CUDA runs the memory-efficient kernel here (flash wants equal
      head widths); a CPU trace takes the math kernel instead and keeps the scores.
    """
    nope = arch.head_dim - arch.qk_rope_head_dim
    kept = _rms_norm_bytes(arch, tokens, arch.kv_lora_rank, 1, w, frozen)
    if arch.q_lora_rank:
        kept += _rms_norm_bytes(arch, tokens, arch.q_lora_rank, 1, w, frozen)
    value = arch.v_head_dim if attention is Attention.EAGER else nope + arch.v_head_dim
    return kept + e * tokens * (2 * arch.q_dim + arch.heads * value)


def _shared_expert_bytes(arch: Architecture, tokens: int, e: int, frozen: bool) -> int:
    """A MoE block's shared expert and router extras, every token (``modeling_qwen2_moe.py``'s
    ``Qwen2MoeSparseMoeBlock``; ``modeling_deepseek_v2.py``'s ``DeepseekV2Moe``):

    * the shared gated MLP's gate and up outputs and SiLU(gate) (3 e t i; the product, kept by
      its down_proj, is counted with the projections' inputs); its input is the router's, counted
      once with the routed experts;
    * Qwen's ``sigmoid(shared_expert_gate(x)) * shared_output``: the multiply keeps the shared
      expert's output (e t h) and the sigmoid output (e t);
    * DeepSeek's router multiplies an fp32 copy of its input by its fp32 weight: the copy is kept
      for the weight's gradient (4 t h) when the router trains;
    * under LoRA nothing keeps the block input itself (see below).
    """
    kept = 3 * e * tokens * arch.shared_intermediate
    if frozen and arch.shared_intermediate:
        # the block input (the router's, counted with the routed experts) is kept by the router's
        # weight gradient or by a linear reading it uncast; under LoRA the router is frozen and
        # the shared expert's adapted linears keep their own casts: nothing keeps it. Traced on
        # small qwen2_moe and deepseek_v2/v3 configs (LoRA, bf16): the layer holds no tensor of it.
        # (Mixtral, without a shared expert, keeps the count its calibration was made with.)
        kept -= e * tokens * arch.hidden
    if arch.shared_expert_gate:
        kept += e * tokens * arch.hidden + e * tokens
    if arch.router_fp32 and not frozen:
        kept += 4 * tokens * arch.hidden
    return kept


def _rms_norm_bytes(
    arch: Architecture, tokens: int, width: int, rows: int, out_bytes: int, frozen: bool
) -> int:
    """What one RMSNorm over ``width`` features (``rows`` normalised rows per token) keeps.

    The fp32 upcast input (4 t width; ``LlamaRMSNorm`` computes in fp32) and the fp32 reciprocal
    RMS per row (4 t rows); when the weight trains, the normalised tensor that the weight multiply
    keeps: in ``out_bytes`` for Llama's norm (cast back before the scale), in fp32 for Gemma's
    (``(1 + weight)`` scale in fp32), which also keeps that fp32 ``1 + weight`` (4 bytes per weight
    element, width / rows of them) whether the weight trains or not. Traced per layer to the byte
    (gemma-2-2b and qwen3-0.6b, b1/s512). OLMo 2's norm (transformers' ``Olmo2RMSNorm``:
    ``(self.weight * hidden_states).to(input_dtype)`` on the fp32 normalised tensor) scales in fp32
    by the 16-bit weight itself: the same fp32 normalised tensor when the weight trains, no
    ``1 + weight`` vector (the weight is a parameter). Traced per layer to the byte (issue 14,
    ``bench/probe_gaps.py``: olmo-2-7b full bf16 at b1/s512, four such norms per layer, each
    keeping 8 bytes per element, the per-head count of its q/k norms aside).
    """
    kept = 4 * tokens * width + 4 * tokens * rows
    if arch.norm_scale_in_fp32:
        offset = 4 * (width // rows) if arch.norm_offset else 0
        kept += offset + (0 if frozen else 4 * tokens * width)
    elif not frozen:
        kept += out_bytes * tokens * width
    return kept


# A pure function of its (hashable, immutable) arguments, asked the same question thousands of times
# by the make-it-fit search (every knob but batch, sequence and the adapters leaves it alone).
@functools.lru_cache(maxsize=4096)
def layer_activation_bytes(
    arch: Architecture,
    batch: int,
    seq: int,
    element_bytes: int,
    attention: Attention,
    *,
    weight_bytes: int | None = None,
    lora_targets: tuple[LinearShape, ...] = (),
    lora_rank: int = 0,
    dora: bool = False,
    lora_dropout: bool = False,
    compiled: bool = False,
    adapter_casts: bool | None = None,
    tiled_mlp: bool = False,
    liger: bool = False,
) -> int:
    """Bytes one decoder layer keeps for backward, without recomputation.

    Korthikanti et al. 2022 (section 4.1) count ``34 s b h + 5 a s^2 b`` bytes for a GPT layer in
    16-bit with dropout. We count the same way, tensor by tensor, for a Hugging Face Llama-style layer
    (``e`` = bytes per activation element, ``w`` = bytes per weight, ``t`` = b * s tokens). The
    count matches, to the byte, the tensors autograd keeps for a small Llama layer traced on CPU
    with transformers 5 and PEFT 0.21 (full, LoRA and DoRA; bf16 with sdpa and eager; amp):
    the norms (:func:`_layer_norm_bytes`), attention (:func:`_attention_kept_bytes`), the MLP
    (:func:`_mlp_kept_bytes`), the inputs the projections keep (:func:`_input_copies_kept`: the
    norm outputs, the attention output, the MLP product), and:

    * ``amp`` (fp32 weights under autocast): autocast's 16-bit copy of every weight matrix, kept for
      the input gradient (2 bytes per linear parameter, frozen or not);
    * LoRA-style methods: the adapters' own tensors (:func:`_adapter_extras`);
    * ``tiled_mlp`` (DeepSpeed's TiledMLP): the MLP's intermediates of one tile instead of the
      whole sequence's (:func:`tiled_mlp_bytes`);
    * ``liger`` (Liger-Kernel): fused norms as compiled ones, and the fused gated activation
      (:func:`_mlp_kept_bytes`; under TiledMLP the tile recomputes the MLP, Liger or not).
    """
    tokens, e = batch * seq, element_bytes
    w = element_bytes if weight_bytes is None else weight_bytes
    autocast_from_fp32 = w == 4 and e == 2
    frozen = bool(lora_targets)
    norms = _layer_norm_bytes(arch, tokens, e, w, frozen, compiled or liger)
    attention_bytes = _attention_kept_bytes(arch, batch, seq, e, w, frozen, attention)
    mlp = _mlp_kept_bytes(arch, tokens, e, frozen, fused_glu=liger)
    inputs = _input_copies_kept(
        arch, tokens, e, attention, lora_targets, autocast_from_fp32, adapter_casts, lora_dropout
    )
    if tiled_mlp and arch.experts <= 1:
        mlp = tiled_mlp_bytes(arch, batch, seq, e, frozen)
        inputs -= _down_proj_input_bytes(arch, tokens, e, lora_targets)
    weight_copies = 2 * arch.linear_params_per_layer if autocast_from_fp32 else 0
    adapters = _adapter_extras(
        arch, tokens, e, lora_targets, lora_rank, dora, lora_dropout, adapter_casts
    )
    # GPT-2-style residual dropout: one mask per block output (attention's c_proj, the MLP's
    # c_proj), kept for backward as the bool mask CUDA's fused native_dropout saves (1 byte per
    # element); the dropped tensor goes into the residual add, which keeps nothing. Found by the
    # held-out gpt2-medium rows (-5.3% LoRA: issue 24), which trace it so.
    masks = 2 * tokens * arch.hidden if arch.residual_dropout else 0
    return norms + attention_bytes + mlp + inputs + weight_copies + adapters + masks


#: Bytes per attention score that eager attention's backward holds on top of the layer's saved
#: tensors: the probabilities' 16-bit gradient (the P @ V matmul's backward) and its fp32 copy
#: (the backward of ``.to(query.dtype)`` after transformers' fp32 softmax, ``eager_attention_forward``
#: in ``modeling_llama.py``), alive together while the softmax's backward runs. Fitted on two
#: fake-tensor traces (``hwdash plan --trace``: Llama-2-7B LoRA, bf16, eager, checkpointing, batch
#: 4 x 2048 and 2 x 4096 tokens: 2.05 and 5.08 GiB of backward temporaries beyond the recomputed
#: layer's saved tensors, 4.1 and 5.1 bytes per score, i.e. 6 per score less the MLP's tensors
#: already freed by then).
EAGER_BACKWARD_SCORE_BYTES = 6


def eager_backward_transient_bytes(
    arch: Architecture, batch: int, seq: int, e: int, attention: Attention
) -> int:
    """What one layer's backward holds beyond its saved tensors with eager attention: the
    score-sized gradients (:data:`EAGER_BACKWARD_SCORE_BYTES` per score), less the MLP's saved
    tensors and down_proj's input, which the MLP's backward (before attention's, in the layer's
    backward) has freed by then. SDPA and flash kernels recompute the scores block by block: 0."""
    if attention is not Attention.EAGER:
        return 0
    tokens = batch * seq
    scores = EAGER_BACKWARD_SCORE_BYTES * batch * arch.heads * seq * seq
    freed = _mlp_kept_bytes(arch, tokens, e, frozen=False) + e * tokens * arch.intermediate
    return max(0, scores - freed)


def _layer_norm_bytes(
    arch: Architecture, tokens: int, e: int, w: int, frozen: bool, compiled: bool
) -> int:
    """What one layer's norms keep.

    * two RMSNorms, each keeping its fp32 upcast input (4 t h; ``LlamaRMSNorm`` computes in fp32),
      the fp32 reciprocal RMS (4 t) and, when its weight trains, the normalised tensor in the model's
      dtype (w t h);
    * ``norms_per_layer`` norms (2; Gemma 4), Gemma's keeping more (:func:`_rms_norm_bytes`); with
      ``qk_norm``, the same for the per-head norms of Q and K (in the activations' dtype).
    """
    h = arch.hidden
    norms = arch.norms_per_layer * _rms_norm_bytes(arch, tokens, h, 1, w, frozen)
    if arch.norm_saves_input:
        # GPT-2, GPT-NeoX, BLOOM, Falcon, GPT-BigCode: torch's own LayerNorm (block_activations)
        norms = block_activations.layer_norm_bytes(arch, tokens, w)
    elif compiled and not arch.norm_scale_in_fp32:
        # torch.compile fuses each norm: it keeps its 16-bit input, not the fp32 upcast (savers)
        norms -= compiled_norm_saving(tokens, h, arch.norms_per_layer, e, w, frozen)
    if arch.qk_norm:
        # q_norm and k_norm (Qwen3, Gemma 3): the same norm over each head's head_dim, applied to the
        # projections' outputs (model dtype, or bf16 under autocast: e). Traced per layer, to the
        # byte: qwen3-0.6b at b1/s512, full bf16, amp and fp32 and LoRA bf16 and amp (18528, 18528,
        # 24672, 12384, 12384 bytes per token; end-of-forward slope between two and four layers).
        # Llama 4's Llama4TextL2Norm has no weight: nothing keeps its normalised output
        unscaled = frozen or not arch.qk_norm_weight
        for heads in (arch.heads, arch.kv_heads):
            norms += _rms_norm_bytes(arch, tokens, heads * arch.head_dim, heads, e, unscaled)
    return norms


def _attention_kept_bytes(
    arch: Architecture,
    batch: int,
    seq: int,
    e: int,
    w: int,
    frozen: bool,
    attention: Attention,
) -> int:
    """What attention keeps besides the projections' inputs.

    * Q (e t q_dim) and K, V: flash and SDPA keep them at ``kv_heads`` (both handle GQA natively in
      current transformers), eager keeps them expanded to all heads by ``repeat_kv`` (e t q_dim each);
      plus the kernel's fp32 log-sum-exp (4 b a s; not for eager); multi-head latent attention
      instead: :func:`_latent_attention_bytes`;
    * the scores where the kernel keeps them (:func:`_score_bytes_per_element`), and Gemma 2's
      soft-capped scores (tanh output) in eager attention.
    """
    tokens = batch * seq
    masked = _masked_sdpa(arch, seq, attention)
    # eager's repeat_kv, or a family that copies K and V out to all heads itself (Falcon's new
    # decoder architecture), keeps them at every query head; so does SDPA given a mask, where
    # repeat_kv copies
    expanded = (
        attention is Attention.EAGER or arch.kv_expanded or (masked and _masked_kv_expanded(arch))
    )
    kv_saved = arch.q_dim if expanded else arch.kv_dim
    attention_bytes = e * tokens * (arch.q_dim + 2 * kv_saved)
    if masked:
        # the boolean mask converted to an additive one in the activations' dtype, per layer
        attention_bytes += e * batch * seq * seq
    if arch.mla:
        attention_bytes = _latent_attention_bytes(arch, tokens, e, w, frozen, attention)
    if attention is not Attention.EAGER:
        attention_bytes += 4 * batch * arch.heads * seq  # the kernel's log-sum-exp per row
    gqa = arch.kv_heads != arch.heads
    scores = _score_bytes_per_element(attention, e, gqa) * batch * arch.heads * seq * seq
    if arch.attn_logit_softcap and attention is Attention.EAGER:
        # Gemma 2: tanh keeps its output (scores / cap -> tanh -> * cap, in the scores' dtype).
        # Traced per layer: gemma-2-2b at b1/s512 eager (with the norms above, to the byte).
        scores += e * batch * arch.heads * seq * seq
    return attention_bytes + scores


def _masked_sdpa(arch: Architecture, seq: int, attention: Attention) -> bool:
    """Whether SDPA runs this block kind with a mask: a sliding-window layer (Gemma 2/3, Mistral,
    Phi-3, Qwen with ``use_sliding_window``) from ``sliding_window`` tokens on, a chunked one
    (Llama 4) from ``attention_chunk_size`` on (:attr:`~Architecture.local_span`). Shorter
    sequences, and full-attention layers, get ``is_causal`` and no mask:
    ``_ignore_causal_mask_sdpa`` (masking_utils.py) gives up the skip once ``kv_length >=
    local_attention_size``, the ``local_size`` that ``create_sliding_window_causal_mask`` and
    ``create_chunked_causal_mask`` pass to ``sdpa_mask``. transformers then repeats K and V to
    every query head (``use_gqa_in_sdpa`` wants no mask, integrations/sdpa_attention.py) and
    torch's SDPA converts the boolean mask to an additive one in the query's dtype, which the
    kernel keeps for backward, per layer. Flash attention gets no mask (``flash_attention_mask``
    returns None for an unpadded batch; the window goes to the kernel as ``window_size``) and
    eager adds one mask, made once per forward, that backward does not keep.

    Traced per layer (bench/window_mask_trace.py, bench/data/window_mask_trace.csv; the tiny
    Llama 4 in bench/llama4_trace_rows.py): a b x 1 x s x s 16-bit tensor, and K, V at all heads
    where ``repeat_kv`` copies them (more than one KV head: :func:`_masked_kv_expanded`)."""
    if attention is not Attention.SDPA or not arch.local_span:
        return False
    return seq >= arch.local_span


def _masked_kv_expanded(arch: Architecture) -> bool:
    """Whether a masked SDPA layer keeps K and V at every query head: ``repeat_kv``
    (integrations/sdpa_attention.py) expands ``kv_heads`` to ``heads`` and reshapes, which copies
    unless there is one KV head (multi-query attention: the reshape of a stride-0 expansion is a
    view). Traced: gemma-3-1b (one KV head) keeps only the mask past its window, Mistral-7B (8 of
    32) the mask and K, V at all 32 heads (bench/data/window_mask_trace.csv)."""
    return arch.kv_heads > 1


def _mlp_kept_bytes(
    arch: Architecture, tokens: int, e: int, frozen: bool, *, fused_glu: bool = False
) -> int:
    """What the MLP keeps besides its projections' inputs.

    * gated MLP (SwiGLU): gate and up outputs and SiLU(gate), 3 e t i (+ the product, kept by
      down_proj); a plain MLP (fc1, GELU, fc2) keeps the fc1 output (+ the GELU output, kept by fc2).
      Korthikanti's 8 s b h + 8 s b h for i = 4h. No dropout masks (Korthikanti counts 2 s b h of
      masks; modern LLMs train without dropout) except GPT-2-style residual dropout, 2 t h (1 byte,
      counted in :func:`layer_activation_bytes`);
    * MoE: every token goes through k experts, so the MLP terms count k times, plus the gathered
      expert inputs and the expert outputs weighted by the router (2 e t h per expert), plus the
      router logits (4 t experts);
    * ``fused_glu`` (Liger-Kernel): ``LigerSiLUMulFunction`` (``LigerGELUMulFunction`` for GeGLU)
      keeps only its two inputs, the gate and up outputs, and recomputes the activation in backward
      (Liger-Kernel ``src/liger_kernel/ops/swiglu.py``, ``ctx.save_for_backward(a, b)``): a gated
      MLP keeps 2 e t i, in every routed copy too (Liger patches Mixtral's and Qwen3-MoE's expert
      MLPs). A plain MLP has no such kernel. Liger's RMSNorm keeps its input and reciprocal RMS
      (``rms_norm.py``, ``ctx.save_for_backward(X, W, RSTD)``), what a compiled norm keeps
      (:func:`~hwdash.core.estimator.savers.compiled_norm_saving`).
    """
    h = arch.hidden
    gated = 2 if fused_glu else 3
    mlp = (gated if arch.gated_mlp else 1) * e * tokens * arch.intermediate
    if arch.mlp_activation == "gelu_new":
        # the tanh-approximated GELU written out elementwise (transformers' NewGELUActivation,
        # ``activations.py``: 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))): besides
        # its input (pow keeps it, counted above) autograd keeps tanh's output, 0.5 * x and
        # 1 + tanh for the final product, 3 e t i more. Traced (issue 14, bench/probe_gaps.py,
        # phi-2 b1/s512 full and LoRA bf16): one tanh, one mul and one add of the MLP's width
        # per layer besides fc1's output and the GELU output.
        mlp += 3 * e * tokens * arch.intermediate
    if arch.experts > 1:
        # k routed copies; the expert outputs kept by the routing-weight multiply (k e t h); the
        # router's input (e t h) and its fp32 logits (4 t experts). The gathered expert inputs are
        # counted with the other projection inputs.
        k = arch.routed_copies
        mlp = k * (mlp + e * tokens * h) + e * tokens * h + 4 * tokens * arch.experts
        mlp += _shared_expert_bytes(arch, tokens, e, frozen)
    return mlp


def dora_weight_norm_transient_bytes(
    targets: tuple[LinearShape, ...], adapter_bytes: int, element_bytes: int
) -> int:
    """The largest transient of DoRA's weight norm, module by module (then freed).

    PEFT's ``DoraLinearLayer`` (0.21) builds ``B @ A`` by pushing an ``in x in`` identity in the
    adapter's dtype through lora_A and lora_B (an FSDP-friendly trick), giving an ``in x out``
    matrix in the adapter's dtype; casts it to the compute dtype, scales it and adds the base weight
    (three 16-bit ``in x out`` tensors). Read from the PEFT source, sized for the adapted module
    where this is largest (usually down_proj, whose ``in`` is the MLP width).
    """
    largest = 0
    for linear in targets:
        size = adapter_bytes * linear.in_features**2
        size += (adapter_bytes + 3 * element_bytes) * linear.in_features * linear.out_features
        largest = max(largest, size)
    return largest


def logits_bytes(arch: Architecture, batch: int, seq: int, element_bytes: int) -> int:
    """Logits and the loss at their peak: ``b * s * vocab * max(e + 8, 12)`` bytes.

    See :data:`LOSS_FP32_BYTES_PER_LOGIT`. For large vocabularies (Qwen's 152k, Gemma's 262k) this is
    often the peak of a short training step. Recent transformers shift the labels instead of slicing
    the logits, so no extra shifted copy is counted.
    """
    per_logit = max(element_bytes + 8, LOSS_FP32_BYTES_PER_LOGIT)
    if arch.final_logit_softcap:
        # Gemma 2 soft-caps the 16-bit logits before the loss upcasts them; tanh keeps its output
        # for backward. Traced: gemma-2-2b's training rows were short by 2.0-2.1 bytes per logit.
        per_logit += element_bytes
    return batch * seq * arch.vocab * per_logit


def training_activation_bytes(
    arch: Architecture,
    batch: int,
    seq: int,
    element_bytes: int,
    attention: Attention,
    grad_ckpt: bool,
    *,
    selective_ac: str | None = None,
    weight_bytes: int | None = None,
    lora_targets: tuple[LinearShape, ...] = (),
    lora_rank: int = 0,
    dora: bool = False,
    lora_dropout: bool = False,
    compiled: bool = False,
    adapter_casts: bool | None = None,
    tiled_mlp: bool = False,
    liger: bool = False,
) -> int:
    """Activations of all layers at the start of backward (logits excluded).

    Without recomputation every layer's :func:`layer_activation_bytes`. With full recomputation
    (gradient checkpointing) Korthikanti's ``2 s b h`` per layer: each layer's input (in the model's
    dtype: fp32 under ``amp``), plus one layer's full activations while it is recomputed.
    Under ``amp``, autocast's 16-bit copy of the LM head is kept for backward as well.
    With ``selective_ac`` (torchtitan's op or layer policy) the kept blocks of
    :func:`~hwdash.core.estimator.selective_ac.kept_bytes`, plus one recomputed layer where
    backward recomputes one on top (:func:`~hwdash.core.estimator.selective_ac.recomputes_last_block`).
    ``tiled_mlp``: one MLP tile at a time (:func:`tiled_mlp_bytes`), counted once.
    """
    w = element_bytes if weight_bytes is None else weight_bytes
    names = {linear.name for linear in lora_targets}
    settings: dict[str, Any] = {"weight_bytes": w, "lora_rank": lora_rank, "dora": dora}
    settings.update(lora_dropout=lora_dropout, compiled=compiled, adapter_casts=adapter_casts)
    settings.update(tiled_mlp=tiled_mlp, liger=liger)
    kinds = []
    for count, kind in arch.block_kinds:
        dense = kind.experts != arch.experts
        targets = _dense_block_targets(arch, kind, names) if dense else lora_targets
        one = layer_activation_bytes(
            kind, batch, seq, element_bytes, attention, lora_targets=targets, **settings
        )
        kinds.append((count, one))
    one_layer = max(one for _, one in kinds)
    lm_head_copy = 2 * arch.vocab * arch.hidden if (w == 4 and element_bytes == 2) else 0
    # An encoder-decoder's cross-attentions and the encoder output they read (0 otherwise); with
    # checkpointing the decoder blocks recompute them, and we keep them whole (on the safe side).
    cross = block_activations.cross_attention_total_bytes(arch, batch, seq, element_bytes)
    if selective_ac is not None:
        shape = (batch, seq, element_bytes, w)
        blocks = selective.activation_bytes(selective_ac, arch, kinds, shape, attention)
        return blocks + lm_head_copy + cross
    if not grad_ckpt:
        tiles = _tiles_counted_twice(arch, batch, seq, element_bytes, lora_targets, tiled_mlp)
        return sum(count * one for count, one in kinds) + lm_head_copy + cross - tiles
    return arch.layers * w * batch * seq * arch.hidden + one_layer + lm_head_copy + cross


def _tiles_counted_twice(
    arch: Architecture,
    batch: int,
    seq: int,
    element_bytes: int,
    lora_targets: tuple[LinearShape, ...],
    tiled_mlp: bool,
) -> int:
    """Every dense layer's count holds the running MLP tile (:func:`tiled_mlp_bytes`), which exists
    once: the bytes of the other layers' copies (a mixture of experts' expert layers are untiled)."""
    dense = [(count, kind) for count, kind in arch.block_kinds if kind.experts <= 1]
    if not tiled_mlp or not dense:
        return 0
    kind = dense[0][1]
    one_tile = tiled_mlp_bytes(kind, batch, seq, element_bytes, bool(lora_targets))
    return (sum(count for count, _ in dense) - 1) * one_tile


def mlp_tiles(arch: Architecture, seq: int) -> int:
    """DeepSpeed TiledMLP's tile count for a sequence of ``seq`` tokens on one GPU:
    ``ceil(seqlen / hidden)`` (deepspeed/runtime/sequence_parallel/ulysses_sp.py, the
    ``tiled_mlp_forward`` example of ``TiledMLP``'s docstring, which ArcticTraining and axolotl
    apply), at least one."""
    return max(1, math.ceil(seq / max(1, arch.hidden)))


def tiled_mlp_bytes(arch: Architecture, batch: int, seq: int, e: int, frozen: bool) -> int:
    """DeepSpeed's TiledMLP (ALST, Bekman et al. 2025, arXiv:2506.13996; ``TiledMLP`` in
    deepspeed/runtime/sequence_parallel/ulysses_sp.py): ``forward`` runs the MLP tile by tile under
    ``no_grad`` and saves only its input (the norm output the gate/up group keeps anyway);
    ``backward`` recomputes one tile at a time with grad and backpropagates it. So a layer keeps
    none of the MLP's intermediates nor down_proj's input, and the layer being computed holds one
    tile's: gate, up, the activation and their product, ``4 e t_tile i`` (:func:`_mlp_kept_bytes`
    plus the product down_proj keeps), with ``t_tile = batch x ceil(seq / tiles)``: returned here;
    the down_proj input no longer kept is :func:`_down_proj_input_bytes`."""
    tile_tokens = batch * math.ceil(seq / mlp_tiles(arch, seq))
    return _mlp_kept_bytes(arch, tile_tokens, e, frozen) + e * tile_tokens * arch.intermediate


def _down_proj_input_bytes(
    arch: Architecture, tokens: int, e: int, lora_targets: tuple[LinearShape, ...]
) -> int:
    """The MLP product down_proj (fc2) keeps for its weight's gradient when it is trained
    (:func:`_weight_grad_input_bytes`), which a tiled MLP does not keep."""
    names = {linear.name for linear in lora_targets} or {lin.name for lin in arch.linears}
    by_name = {linear.name: linear for linear in arch.linears}
    return _weight_grad_input_bytes(arch, by_name, tokens, e, names & {"down_proj", "fc2"})


def _dense_block_targets(
    arch: Architecture, kind: Architecture, names: set[str]
) -> tuple[LinearShape, ...]:
    """The adapted linears of a dense block of a MoE model (DeepSeek's first_k_dense_replace,
    Llama 4's interleaved dense blocks): :func:`dense_block_adapted`."""
    return dense_block_adapted(arch, kind, names)
