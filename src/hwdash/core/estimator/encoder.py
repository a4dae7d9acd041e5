"""Encoder-only models (BERT, RoBERTa, DeBERTa-v2, ModernBERT): parameters, activations, heads.

The layouts come from :mod:`hwdash.core.models.family_encoders` (config.json); what each block keeps for
backward is counted tensor by tensor from transformers 5.24's implementations:

* ``models/bert/modeling_bert.py`` (``BertSelfAttention``, ``eager_attention_forward``,
  ``BertSelfOutput``, ``BertIntermediate``, ``BertOutput``, ``BertLMPredictionHead``,
  ``BertForMaskedLM``: ``CrossEntropyLoss`` on every position's logits, no fp32 upcast);
  ``models/roberta/modeling_roberta.py`` (the same blocks; ``RobertaClassificationHead``);
* ``models/deberta_v2/modeling_deberta_v2.py`` (``DisentangledSelfAttention``: per-head copies of
  q, k, v (``transpose_for_scores``), the relative-position projections repeated per sequence
  (``pos_key_layer``/``pos_query_layer``), the c2p and p2c scores gathered to s x s and added to
  the content scores; eager only);
* ``models/modernbert/modeling_modernbert.py`` (pre-norm blocks, fused ``Wqkv`` split into q, k,
  v views, rotary q and k, ``Wi`` split into input and gate for GeGLU; the masked-LM loss is
  ``ForMaskedLMLoss`` in ``loss/loss_utils.py``, which upcasts the logits to fp32).

Dropout (BERT-style families keep ``hidden_dropout_prob`` and ``attention_probs_dropout_prob`` at
0.1 by default): each dropout in training keeps its mask for backward, one byte per element on CUDA
(``native_dropout``'s bool mask; ``aten/src/ATen/native/Dropout.cpp``). On the attention
probabilities eager attention keeps, per score, the softmax output, the mask and the dropped-out
probabilities (read by the matmul with V); SDPA on CUDA takes the flash or memory-efficient kernel
with ``dropout_p``, which draws the mask inside the kernel from a Philox seed and keeps no s^2
tensor (Dao et al. 2022, arXiv:2205.14135, section 3.1; ``_scaled_dot_product_efficient_attention``
returns the seed and offset). On CPU, SDPA with dropout runs the math kernel (in fp32) and keeps
the s^2 tensors: :func:`cpu_trace_extra_bytes` says how much a CPU trace holds beyond CUDA.

Constants marked "fitted" were measured on the tuning configs of ``bench/data/
encoder_tuning_configs`` (never on the held-out rows of ``bench/data/encoder_heldout.csv``).
"""

from __future__ import annotations

from dataclasses import dataclass

from hwdash.core.estimator.layout import Architecture, LinearShape
from hwdash.core.plan import Attention, Method, Plan
from hwdash.core.specs import ModelSpec
from hwdash.errors import UsageError

#: ``native_layer_norm``'s fp32 mean and reciprocal deviation per row (8 bytes; block_activations).
LAYER_NORM_STATS_BYTES = 8
#: Bytes per dropout-mask element on CUDA (bool, ``native_dropout``).
CUDA_MASK_BYTES = 1
#: The memory-efficient / flash kernels' log-sum-exp: fp32 per head and row.
LSE_BYTES = 4


@dataclass(frozen=True)
class EncoderLayout:
    """What an encoder's estimate needs beyond :class:`~hwdash.core.estimator.Architecture`."""

    family: str
    """``bert`` (also RoBERTa), ``deberta`` or ``modernbert``."""
    head: str
    """``mlm`` or ``classification``."""
    num_labels: int
    attention_dropout: float
    hidden_dropout: float
    embedding_dropout: float
    classifier_dropout: float
    relative_rows: int
    """DeBERTa's relative-position table rows (2 x buckets); 0 otherwise."""
    local_window: int
    """ModernBERT's sliding window on its local layers; 0: every layer global. Its local layers
    keep as much as its global ones: eager computes every s x s score and masks them, SDPA keeps
    none either way; only the mask itself is extra (:func:`embedding_activation_bytes`)."""
    global_every: int
    head_linears: tuple[tuple[str, int, int], ...]
    """The head's own linear layers (name, in, out) that ``all-linear`` LoRA adapts."""
    head_trained_copy: int
    """Parameters PEFT trains in full under LoRA (``task_type=SEQ_CLS``: the classifier,
    ``modules_to_save``), kept next to the frozen original."""


def _head_layout(model: ModelSpec) -> tuple[int, tuple[tuple[str, int, int], ...], int]:
    """(head parameters besides the tied decoder weight, linears LoRA adapts, trained copy)."""
    h, v, labels = model.hidden_size, model.vocab_size, model.num_labels
    family = model.encoder_family
    bias = family != "modernbert"  # ModernBertPredictionHead: classifier_bias (default False)
    norm = 2 * h if model.norm_bias is not False else h
    transform = h * h + (h if bias else 0)
    classifier = h * labels + labels
    if model.encoder_head == "mlm":
        # transform dense + LayerNorm, and the decoder's bias (BertLMPredictionHead.bias,
        # ModernBERT's decoder_bias); the decoder weight is the word embedding (tied)
        return transform + norm + v, (("head.dense", h, h),), 0
    if family == "modernbert":
        # ModernBertForSequenceClassification: head (dense + norm), drop, classifier
        return transform + norm + classifier, (("head.dense", h, h),), classifier
    if family == "deberta":
        # ContextPooler (dense) + classifier
        return transform + classifier, (("pooler.dense", h, h),), classifier
    # BERT: pooler.dense + classifier; RoBERTa: classifier.dense + classifier.out_proj. PEFT's
    # SEQ_CLS trains "classifier" in full: BERT's Linear, RoBERTa's whole classification head.
    roberta_head = model.type_vocab_size <= 1  # RoBERTa's configs carry type_vocab_size 1
    trained = transform + classifier if roberta_head else classifier
    linears = () if roberta_head else (("pooler.dense", h, h),)
    return transform + classifier, linears, trained


def encoder_layout(model: ModelSpec) -> EncoderLayout:
    """The encoder facts of ``model`` (``model.encoder_only``)."""
    _, linears, trained = _head_layout(model)
    return EncoderLayout(
        family=model.encoder_family or "bert",
        head=model.encoder_head,
        num_labels=model.num_labels,
        attention_dropout=model.attention_dropout,
        hidden_dropout=model.hidden_dropout,
        embedding_dropout=model.embedding_dropout,
        classifier_dropout=model.classifier_dropout,
        relative_rows=model.relative_position_buckets,
        local_window=model.local_attention_window,
        global_every=model.global_attention_every,
        head_linears=linears,
        head_trained_copy=trained,
    )


def head_params(model: ModelSpec) -> int:
    """The task head's parameters besides the tied decoder weight."""
    return _head_layout(model)[0]


def extra_embedding_params(model: ModelSpec) -> int:
    """Lookups besides the word embedding: token types, DeBERTa's relative-position table and its
    LayerNorm (``norm_rel_ebd``), on top of the learned positions and embedding norm the
    Architecture counts already."""
    h = model.hidden_size
    relative = (
        (model.relative_position_buckets * h + 2 * h) if model.relative_position_buckets else 0
    )
    return model.type_vocab_size * h + relative


def block_linear_names(model: ModelSpec) -> tuple[tuple[str, int, int, bool], ...]:
    """One block's linear layers by their module names (name, in, out, bias), as PEFT targets them."""
    h, inter = model.hidden_size, model.intermediate_size
    if model.encoder_family == "modernbert":
        attention_bias, mlp_bias = model.attention_bias, bool(model.mlp_bias)
        return (
            ("Wqkv", h, 3 * h, attention_bias),
            ("attn.Wo", h, h, attention_bias),
            ("Wi", h, 2 * inter, mlp_bias),
            ("mlp.Wo", inter, h, mlp_bias),
        )
    q, k, v = (
        ("query_proj", "key_proj", "value_proj")
        if model.encoder_family == "deberta"
        else ("query", "key", "value")
    )
    return (
        (q, h, h, True),
        (k, h, h, True),
        (v, h, h, True),
        ("attention.output.dense", h, h, True),
        ("intermediate.dense", h, inter, True),
        ("output.dense", inter, h, True),
    )


# --------------------------------------------------------------------------------------------------
# Activations
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Dtypes:
    """Bytes per element: ``e`` for the matmuls' outputs, ``r`` for the residual stream and the
    LayerNorms (fp32 under ``amp``: autocast runs layer_norm in fp32), ``m`` per dropout-mask
    element (1 on CUDA; the input's dtype in a CPU trace's composite dropout)."""

    e: int
    r: int
    m: int
    autocast: bool
    softmax: int
    """The softmax output's bytes: fp32 under CUDA autocast (softmax is on its fp32 list); CPU
    autocast leaves softmax (and layer_norm) in the input's dtype."""
    embedding_mask: int
    """The embedding dropout's mask (its input is the embedding LayerNorm's output, dtype r)."""


def _dtypes(element_bytes: int, weight_bytes: int, cpu_trace: bool) -> _Dtypes:
    autocast = weight_bytes == 4 and element_bytes == 2
    r = 4 if autocast else element_bytes
    if cpu_trace:
        # CPU's composite dropout keeps a mask in its input's dtype: the matmuls' outputs (e)
        return _Dtypes(element_bytes, r, element_bytes, autocast, element_bytes, r)
    return _Dtypes(element_bytes, r, CUDA_MASK_BYTES, autocast, 4 if autocast else element_bytes, 1)


def _mask(p: float, elements: int, d: _Dtypes) -> int:
    return d.m * elements if p > 0 else 0


def _score_bytes(enc: EncoderLayout, attention: Attention, d: _Dtypes, cpu_trace: bool) -> float:
    """Bytes kept per attention score (b x heads x s x s) per layer.

    Eager: the softmax output (fp32 under autocast, which runs softmax in fp32), with dropout the
    mask and the dropped-out probabilities in the matmul's dtype (autocast casts them to 16 bits);
    without dropout the softmax output is what the matmul keeps. SDPA and flash on CUDA: none.
    A CPU trace's SDPA with dropout runs the math kernel in fp32: 4 (softmax) + 4 (mask) + 4.
    """
    if attention is not Attention.EAGER and enc.family != "deberta":
        if cpu_trace and enc.attention_dropout > 0:
            return 12
        return 0
    softmax = d.softmax
    if enc.family == "modernbert":
        # ModernBERT's eager_attention_forward: softmax(..., dtype=float32).to(query.dtype): the
        # fp32 output and its 16-bit copy (read by the matmul, or by the dropout)
        softmax = 4 + (d.e if d.e != 4 else 0)
        if enc.attention_dropout <= 0:
            return softmax
        return softmax + d.m + d.e
    if enc.attention_dropout <= 0:
        return softmax + (d.e if softmax != d.e else 0)
    return softmax + d.m + d.e


def _layer_bytes(
    model: ModelSpec,
    enc: EncoderLayout,
    batch: int,
    seq: int,
    attention: Attention,
    d: _Dtypes,
    cpu_trace: bool,
) -> float:
    """What one encoder block keeps for backward (full training, no adapters)."""
    t = batch * seq
    h, inter, heads = model.hidden_size, model.intermediate_size, model.heads
    e, r = d.e, d.r
    stats = LAYER_NORM_STATS_BYTES * t
    sdpa = attention is not Attention.EAGER and enc.family != "deberta"
    if enc.family == "modernbert":
        # attn_norm (not in the first block; averaged in by the caller) and mlp_norm: input +
        # stats; Wqkv's input (the norm output, 16-bit copy under autocast), the fused qkv output
        # (v is a view of it), rotary q and k, the attention output and its contiguous copy read
        # by Wo; Wi's input, Wi's output (input and gate are views of it), GELU(input) and the
        # product read by Wo.
        # SDPA keeps rotary q and k and v (a view of the fused qkv output, which it keeps whole);
        # eager keeps the matmuls' per-head copies of q, k and v instead. Both keep every s x s
        # score in eager (the sliding window is a mask on the full scores), none in SDPA.
        norms = 2 * (r * t * h + stats)
        kept_scores = 0.0
        if sdpa:
            attention_part = e * t * h * (1 + 3 + 2 + 1 + 1) + LSE_BYTES * batch * heads * seq
        else:
            attention_part = e * t * h * (1 + 3 + 1)
            kept_scores = _score_bytes(enc, attention, d, cpu_trace) * batch * heads * seq * seq
        mlp = e * t * h + e * t * (2 * inter + 2 * inter)
        masks = _mask(enc.attention_dropout, t * h, d) + _mask(enc.hidden_dropout, t * inter, d)
        return norms + attention_part + kept_scores + mlp + masks
    # BERT / RoBERTa / DeBERTa: post-LayerNorm blocks
    # q/k/v's input (the block input), per-head q, k, v (eager reshapes them into copies; SDPA
    # keeps the views), the context (contiguous copy, read by attention.output.dense) and, for
    # SDPA, the kernel's output and log-sum-exp
    attention_part = e * t * h * (1 + 3 + 1)
    if sdpa:
        attention_part += e * t * h + LSE_BYTES * batch * heads * seq
    scores = _score_bytes(enc, attention, d, cpu_trace) * batch * heads * seq * seq
    if enc.family == "deberta" and enc.relative_rows:
        # k / scale (read by the content bmm); the relative-position q and k projections
        # repeated per sequence (batch x 2R x h each, read by the c2p and p2c bmm) and their
        # input; the c2p and p2c scores against every relative position (batch x heads x s x 2R
        # each, kept by the gathers that pick the s x s ones) and the clamped c2p and p2c index
        # tensors (int64, s x s, expanded over the batch without a copy)
        rows = enc.relative_rows
        attention_part += e * t * h + 2 * e * batch * rows * h + 2 * e * rows * h
        attention_part += 2 * e * batch * heads * seq * rows + 16 * seq * seq
    # LayerNorm inputs and stats (post-norm: after each residual add), the first norm's output
    # read by intermediate.dense (a 16-bit copy under autocast; in fp32/bf16 the same tensor as
    # the residual, kept once), intermediate output (GELU's input) and GELU output
    norms = 2 * (r * t * h + stats) + e * t * h
    mlp = 2 * e * t * inter
    masks = 2 * _mask(enc.hidden_dropout, t * h, d)
    return attention_part + scores + norms + mlp + masks


def layer_activation_bytes(
    model: ModelSpec,
    batch: int,
    seq: int,
    element_bytes: int,
    weight_bytes: int,
    attention: Attention,
    *,
    cpu_trace: bool = False,
) -> int:
    """The average block's activations (ModernBERT: local and global blocks averaged)."""
    enc = encoder_layout(model)
    d = _dtypes(element_bytes, weight_bytes, cpu_trace)
    if enc.family != "modernbert":
        return round(_layer_bytes(model, enc, batch, seq, attention, d, cpu_trace))
    layers = model.layers
    total = layers * _layer_bytes(model, enc, batch, seq, attention, d, cpu_trace)
    # the first block has no attention norm (nn.Identity)
    total -= d.r * batch * seq * model.hidden_size + LAYER_NORM_STATS_BYTES * batch * seq
    return round(total / layers)


def embedding_activation_bytes(
    model: ModelSpec, batch: int, seq: int, element_bytes: int, weight_bytes: int, cpu_trace: bool
) -> int:
    """The embedding LayerNorm's input and stats and its dropout mask."""
    enc = encoder_layout(model)
    d = _dtypes(element_bytes, weight_bytes, cpu_trace)
    t = batch * seq
    sliding_mask = 0
    if enc.local_window and seq > enc.local_window // 2 and model.layers > 1:
        # ModernBERT's local layers read a b x 1 x s x s sliding-window mask, built once per
        # forward (create_bidirectional_sliding_window_mask): bool for SDPA, additive in the
        # activations' dtype for eager; it lives through the forward
        sliding_mask = batch * seq * seq
    return (
        d.r * t * model.hidden_size
        + LAYER_NORM_STATS_BYTES * t
        + (d.embedding_mask * t * model.hidden_size if enc.embedding_dropout > 0 else 0)
        + sliding_mask
    )


def head_and_loss_bytes(
    model: ModelSpec, batch: int, seq: int, element_bytes: int, weight_bytes: int, cpu_trace: bool
) -> int:
    """The head's kept tensors and the loss at the start of backward.

    Masked LM: the last hidden state (read by the transform dense), the dense output (GELU's
    input), GELU's output (the LayerNorm's input) and stats, the LayerNorm output (read by the
    decoder), then logits over every position: BERT's ``CrossEntropyLoss`` keeps the log-softmax
    output in the logits' dtype (an fp32 copy under autocast, which runs cross-entropy in fp32),
    and the backward's first gradients (of the log-softmax and of the logits) join it at the
    start of backward; ModernBERT's ``ForMaskedLMLoss`` upcasts to fp32 first (12 bytes per logit
    as the causal loss). Classification: a few vectors per sequence plus the last hidden state.
    """
    d = _dtypes(element_bytes, weight_bytes, cpu_trace)
    t = batch * seq
    h, v = model.hidden_size, model.vocab_size
    e, r = d.e, d.r
    last_hidden = r * t * h
    if model.encoder_head == "classification":
        return last_hidden + 4 * batch * (4 * h + model.num_labels)
    transform = e * t * h * 2 + r * t * h + LAYER_NORM_STATS_BYTES * t + e * t * h
    # fp32 loss (an upcast, or autocast's fp32 cross_entropy): the saved log-softmax output and
    # the two fp32 gradients at the start of backward; otherwise the same three in the logits' dtype
    per_logit = 12 if model.encoder_family == "modernbert" or d.autocast else 3 * e
    return last_hidden + transform + t * v * per_logit


def training_activation_bytes(
    plan: Plan,
    model: ModelSpec,
    element_bytes: int,
    weight_bytes: int,
    *,
    cpu_trace: bool = False,
) -> tuple[int, int, int]:
    """(every block and the embeddings at the start of backward, one block, head and loss)."""
    batch, seq = plan.batch, plan.seq
    one = layer_activation_bytes(
        model, batch, seq, element_bytes, weight_bytes, plan.attention, cpu_trace=cpu_trace
    )
    embeddings = embedding_activation_bytes(
        model, batch, seq, element_bytes, weight_bytes, cpu_trace
    )
    head = head_and_loss_bytes(model, batch, seq, element_bytes, weight_bytes, cpu_trace)
    transient = backward_transient_bytes(plan, model, element_bytes)
    if plan.grad_ckpt:
        # each block's input kept (in the residual's dtype); backward starts with the head and the
        # loss, and recomputes a block only once they are freed: the larger of the two is alive
        # (as for decoders, training._add_checkpointed), the recomputed block with its backward
        d = _dtypes(element_bytes, weight_bytes, cpu_trace)
        checkpoints = model.layers * d.r * batch * seq * model.hidden_size
        return checkpoints + embeddings, one, max(one + transient, head)
    # a masked LM's loss tensors are freed before the last block's backward starts; a small
    # classification head leaves that backward's transients as the peak
    return model.layers * one + embeddings, one, max(head, transient)


#: Fitted (tuning configs' classification rows, eager attention): bytes per attention score the
#: last block's backward holds besides the kept activations: DeBERTa's and ModernBERT's
#: (the gradients of the probabilities and of the scores, 3.3-3.9 measured on DeBERTa, 3.6 on
#: ModernBERT eager); BERT's eager backward holds none on top of its token-sized gradients (its
#: rows are within 2% without).
BACKWARD_SCORE_BYTES = {"bert": 0, "deberta": 4, "modernbert": 4}


def backward_transient_bytes(plan: Plan, model: ModelSpec, element_bytes: int) -> int:
    """What the last block's backward holds at its peak besides the saved activations: the
    gradients of its output and of the MLP's intermediate (e t (h + i)), and with eager attention
    (DeBERTa always) the gradients of the probabilities and scores (BACKWARD_SCORE_BYTES per
    score); SDPA's kernels on CUDA recompute the scores block by block."""
    enc = encoder_layout(model)
    batch, seq = plan.batch, plan.seq
    t = batch * seq
    inner = (2 if enc.family == "modernbert" else 1) * model.intermediate_size
    tokens = element_bytes * t * (model.hidden_size + inner)
    scores = batch * model.heads * seq * seq
    if plan.attention is Attention.EAGER or enc.family == "deberta":
        return tokens + BACKWARD_SCORE_BYTES[enc.family] * scores
    return tokens


#: Fitted: hidden-size tensors per token alive in ModernBERT's no-grad attention (see below).
MODERNBERT_INFERENCE_ATTENTION_WIDTHS = 15


def inference_activation_bytes(
    model: ModelSpec, batch: int, seq: int, element_bytes: int, attention: Attention
) -> int:
    """One no-grad forward: the largest block's transients, the hidden state and the head's output
    (masked LM: every position's logits; classification: a vector per sequence)."""
    t = batch * seq
    h, e = model.hidden_size, element_bytes
    enc = encoder_layout(model)
    # the MLP's intermediates alive together: BERT's dense output and GELU output (2 i);
    # ModernBERT's Wi output (2 i: input and gate are views of it), GELU(input) and the product
    inner = (4 if enc.family == "modernbert" else 2) * model.intermediate_size
    block = e * t * (2 * h + inner)
    scores = batch * model.heads * seq * seq
    if enc.family == "modernbert":
        # the residual, the norm output, the fused qkv (3 h), rotary q and k with rotate_half's
        # temporaries, the kernel's contiguous q, k, v, its output and the contiguous copy read by
        # Wo: fitted at 15 h per token (tiny-modernbert-cls inference, traced at seq 512 and 1024:
        # 7,809 bytes per token at h = 256 in bf16, linear in the sequence)
        attention_part = e * t * MODERNBERT_INFERENCE_ATTENTION_WIDTHS * h
        if attention is Attention.EAGER:
            attention_part += (e + 4 + e) * scores  # scores, fp32 softmax, its 16-bit copy
        block = max(block, attention_part)
    elif enc.family == "deberta":
        # the content scores, the gathered c2p and p2c scores, their sum, the masked scores and
        # the probabilities (6 s x s tensors in the activations' dtype), the c2p/p2c scores against
        # every relative position, and q, k, v with their per-head copies
        rows = enc.relative_rows
        block = max(
            block, e * t * 6 * h + 6 * e * scores + 2 * e * batch * model.heads * seq * rows
        )
    elif attention is Attention.EAGER:
        block = max(block, e * t * 3 * h + 2 * e * scores)
    head = e * t * model.vocab_size if model.encoder_head == "mlm" else 0
    # the block's transients are freed before the head runs
    return max(block, head) + e * t * h


# --------------------------------------------------------------------------------------------------
# What an encoder plan cannot be
# --------------------------------------------------------------------------------------------------


class EncoderPlanError(UsageError, ValueError):
    """A plan an encoder cannot run (a UsageError for the command line, exit 2; a ValueError for
    callers that try many plans and skip the impossible ones, as the make-it-fit search does)."""


def check_encoder_plan(plan: Plan, model: ModelSpec) -> None:
    """Refuse, naming why, the plans that make no sense for an encoder or are not counted."""
    if plan.is_rl:
        raise EncoderPlanError(
            f"{model.name} is an encoder-only model ({model.encoder_head} head): "
            f"{plan.method.value} trains a generating policy, which an encoder cannot be; use "
            "--method full, lora, qlora or dora",
            flag="--method",
        )
    if plan.tp > 1 or plan.pp > 1:
        raise EncoderPlanError(
            "Megatron tensor/pipeline parallelism is not modelled for encoder-only models",
            flag="--tp" if plan.tp > 1 else "--pp",
        )
    if plan.selective_ac is not None:
        raise EncoderPlanError(
            "torchtitan's selective checkpointing is counted for decoder blocks, not an "
            "encoder's: use --grad-ckpt",
            flag="--selective-ac",
        )


def encoder_warnings(plan: Plan, model: ModelSpec) -> list[str]:
    """What the plan should know about an encoder (inference is one forward; dropout)."""
    notes: list[str] = []
    if plan.fsdp.value != "none":
        notes.append(
            "FSDP sharding is not modelled for encoder-only models: counted unsharded, as on one "
            "GPU (an upper bound)"
        )
    if plan.liger and plan.method is not Method.INFERENCE:
        notes.append(
            "--liger counts Liger-Kernel's decoder kernels (RMSNorm, gated activation, fused "
            "loss): an encoder is planned without them"
        )
    if plan.method is Method.INFERENCE:
        notes.append(
            f"{model.name} is an encoder: inference is one forward pass over --batch sequences of "
            "--seq tokens (no generation, no KV cache)"
        )
    elif model.attention_dropout > 0 or model.hidden_dropout > 0:
        scores = (
            "kept per attention score (eager attention)"
            if plan.attention is Attention.EAGER or model.encoder_family == "deberta"
            else "drawn inside the SDPA kernel on CUDA (no s^2 tensors)"
        )
        notes.append(
            f"counted with the config's dropout (hidden {model.hidden_dropout:g}, attention "
            f"{model.attention_dropout:g}): one-byte masks per hidden state, and the attention "
            f"dropout {scores}"
        )
    return notes


def cpu_trace_extra_bytes(
    plan: Plan, model: ModelSpec, element_bytes: int, weight_bytes: int
) -> int:
    """What a fake-tensor trace on CPU holds beyond CUDA for this plan (dropout masks in the
    input's dtype instead of bool; SDPA with dropout in the fp32 math kernel). For comparing the
    estimate with a CPU trace (bench/encoder_rows.py)."""
    if plan.method is Method.INFERENCE:
        return 0
    cpu = training_activation_bytes(plan, model, element_bytes, weight_bytes, cpu_trace=True)
    cuda = training_activation_bytes(plan, model, element_bytes, weight_bytes, cpu_trace=False)
    extra = (cpu[0] + cpu[2]) - (cuda[0] + cuda[2])
    if plan.method is not Method.FULL and plan.lora_dropout > 0 and not plan.grad_ckpt:
        # LoRA dropout's masks: fp32 inside PEFT's adapters on CPU (activations.DROPOUT_MASK_BYTES)
        inputs = sum(fan_in for _, fan_in, _, _ in block_linear_names(model))
        extra += (4 - CUDA_MASK_BYTES) * model.layers * plan.batch * plan.seq * inputs
    return extra


def encoder_architecture(model: ModelSpec) -> Architecture:
    """The parameter layout of an encoder: its blocks' linears by their module names, the norms,
    the embeddings (word, positions, token types, DeBERTa's relative table) and the head
    (:func:`head_params`; the masked-LM decoder is tied to the word embedding)."""
    h = model.hidden_size
    norm = 2 * h if model.norm_bias is not False else h
    linears = tuple(
        LinearShape(name, fan_in, fan_out, bias=bias)
        for name, fan_in, fan_out, bias in block_linear_names(model)
    )
    modern = model.encoder_family == "modernbert"
    embedding = (
        model.vocab_size * h
        + model.learned_positions * h
        + (norm if model.embedding_norm else 0)
        + extra_embedding_params(model)
    )
    return Architecture(
        layers=model.layers,
        hidden=h,
        heads=model.heads,
        kv_heads=model.kv_heads,
        head_dim=model.head_dim,
        intermediate=model.intermediate_size,
        vocab=model.vocab_size,
        experts=1,
        experts_per_token=1,
        gated_mlp=modern,
        linears=linears,
        norm_params_per_layer=2 * norm,
        router_params_per_layer=0,
        embedding_params=embedding,
        lm_head_params=head_params(model),
        # ModernBERT: a final norm, and no attention norm in the first block (nn.Identity)
        final_norm_params=0,
        norms_per_layer=2,
        mlp_activation=model.mlp_activation,
        norm_saves_input=True,
    )
