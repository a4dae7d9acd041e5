"""Serving plans: an inference server's GPU memory as vLLM or SGLang allocates it at start-up.

The engine loads the weights (split over the tensor-parallel GPUs), measures what else it needs,
and gives the rest of its share of the GPU to a pool of KV-cache blocks. What this module models,
each step from the engine's own code (file names; the numbers are data in ``catalog/engines.toml``):

* the budget: ``memory_fraction x`` the total CUDA reports for the GPU (vLLM's
  ``gpu_memory_utilization``, ``vllm/v1/worker/gpu_worker.py`` ``determine_available_memory``;
  SGLang's ``mem_fraction_static``, ``model_runner.py`` ``profile_max_num_token``). CUDA's total is
  below NVML's by the driver's reserve: the accelerator's ``cuda_total_mib`` where the catalog has
  it, else its ``nvml_total_mib``;
* the weights, sharded over ``tp`` GPUs and quantized as the checkpoint or ``--quant`` says
  (:func:`~hwdash.core.estimator.states.checkpoint_weight_bytes`);
* the profile run's activation peak: one forward over the profiled tokens with nothing saved,
  one layer's intermediates at a time plus the residual stream
  (:func:`~hwdash.core.estimator.inference.inference_activation_bytes` with SDPA-like attention:
  the engines' flash kernels hold no score matrix), and the sampler's dummy run over
  ``max_num_seqs`` rows of logits. vLLM V1 profiles ``max_num_batched_tokens`` (chunked prefill),
  V0 the whole ``max_model_len`` (``vllm/worker/worker.py``); SGLang has no profile run;
* non-torch memory: V0 counts the CUDA context (the row of ``catalog/software.toml``, as the
  whole-GPU estimate does); V1 only what grows after its baseline (``non_torch_mib``). V1's
  context is outside its budget (``context_outside_budget``): ``gpu_worker.py`` ``init_device``
  calls ``set_device`` and ``init_worker_distributed_environment`` before it takes
  ``self.init_snapshot = MemorySnapshot()``; ``vllm/utils/mem_utils.py`` ``memory_profiling``
  counts ``non_torch_increase`` = non-torch memory after the profile minus the baseline's, and
  ``determine_available_memory`` gives the KV cache ``requested_memory`` (total x
  ``gpu_memory_utilization``) minus weights, torch peak increase and that increase. So the
  context comes on top of the budget, like the CUDA graphs;
* tensor parallelism's non-torch buffers per rank (:func:`tp_buffer_bytes`): the TP group's NCCL
  communicator (vLLM's ``pynccl.py`` creates it and runs a warm-up all-reduce at distributed
  init, so its ring connections exist then; sized by
  :func:`~hwdash.core.estimator.collectives.group_buffer_bytes`) and the custom all-reduce's two IPC
  buffers (``custom_all_reduce.py``: ``meta_size() + max_size`` and ``max_size``, max_size 8 MiB,
  allocated with ``cudaMalloc`` outside torch; used at TP 2, 4, 6 or 8 with peer access, above 2 GPUs only
  when fully NVLink-connected). Whether they count depends on when the engine's baseline is
  taken relative to ``init_worker_distributed_environment`` (``tp_buffers``): V0
  (``vllm/worker/worker.py`` ``init_device``, baseline snapshot first) and V1 up to vllm PR 25359
  count them as non-torch memory inside the budget; V1 since that PR (``gpu_worker.py``
  ``init_device``: distributed init "BEFORE taking memory snapshot") leaves them outside; SGLang
  (``model_runner.py`` ``init_torch_distributed``) measures the free memory after distributed
  init and takes its fraction of that, so the pool loses the fraction of them;
* the pool = budget - (weights + activation peak + non-torch), per GPU (the engine takes the
  minimum over ranks; hwdash's ranks are alike);
* per-token KV bytes per GPU: layers x (K and V: ``2 x kv_heads x head_dim``, or MLA's latent,
  :attr:`~hwdash.core.estimator.layout.Architecture.latent_kv_width`) x dtype bytes, with the key
  and value heads split over ``tp`` (replicated when ``tp`` exceeds them:
  ``vllm/model_executor/models/llama.py``, ``num_kv_heads = max(1, total // tp)``; MLA's latent
  is replicated);
* blocks = pool // (block tokens x per-token bytes) (``vllm/v1/core/kv_cache_utils.py``), KV
  tokens = blocks x block tokens, maximum concurrency = KV tokens / ``max_model_len``;
* the CUDA-graph pool, captured after the KV cache is sized, comes on top of the budget
  (``cuda_graph_mib``; reported, not subtracted);
* sliding-window and chunked layers (:attr:`~hwdash.core.estimator.layout.Architecture.layer_attention`)
  under an engine with ``hybrid_kv_cache`` (vLLM V1's hybrid KV cache manager), as
  ``vllm/v1/core/kv_cache_utils.py`` and ``vllm/v1/kv_cache_interface.py`` do it
  (:func:`kv_groups`, :class:`KvGroups`): the layers of each kind are split into groups of
  ``group_size`` layers (the fewest layers of any kind, or the most when that is under 1.5 times the
  fewest; the last group of a kind padded), one page is ``block x`` one layer's per-token bytes,
  ``num_blocks = pool // page // group_size``, the logged "GPU KV cache size" is
  ``num_blocks // groups x block`` tokens, and "Maximum concurrency" is ``num_blocks`` over the
  blocks one ``max_model_len`` request needs in all groups: ``cdiv(max_model_len, block)`` in a
  full group, ``cdiv(min(window - 1 + max_num_batched_tokens, max_model_len), block) + 1`` in a
  sliding one, ``cdiv(min(chunk + max_num_batched_tokens, max_model_len), block)`` in a chunked
  one. A model whose layers are all of one kind (Mistral-7B-v0.1: all sliding) is one group. An
  engine without it (vLLM V0, SGLang for these families, vLLM under
  ``--disable-hybrid-kv-cache-manager``: ``unify_hybrid_kv_cache_specs``) caches every token in
  every layer.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

from pydantic import ValidationError

from hwdash.core.data_files import packaged_catalog_dir, read_catalog_toml
from hwdash.core.estimator.architecture import Architecture
from hwdash.core.estimator.collectives import CommGroup, group_buffer_bytes
from hwdash.core.estimator.inference import inference_activation_bytes
from hwdash.core.estimator.software import Software, packaged_software
from hwdash.core.estimator.states import checkpoint_weight_bytes
from hwdash.core.plan import Attention, KvDtype
from hwdash.core.specs import Accelerator, EngineDefaults, _entry_label, _validation_error
from hwdash.errors import CatalogError

ENGINES_FILE = "engines.toml"
MIB = 2**20


#: Bytes per cached element of each ``--kv-dtype`` (auto: the activations' dtype, passed in).
KV_DTYPE_BYTES = {KvDtype.FP8: 1, KvDtype.INT8: 1}


@functools.cache
def packaged_engines() -> dict[str, EngineDefaults]:
    """The built-in ``engines.toml`` rows by id, read once."""
    path = packaged_catalog_dir() / ENGINES_FILE
    rows: dict[str, EngineDefaults] = {}
    for index, raw in enumerate(read_catalog_toml(path).get("engine", [])):
        try:
            row = EngineDefaults.model_validate(raw)
        except ValidationError as exc:
            raise _validation_error(path, _entry_label("engine", index, raw), exc) from None
        if row.id in rows:
            raise CatalogError(path, f"engine '{row.id}' is in two rows")
        rows[row.id] = row
    return rows


@dataclass(frozen=True)
class ServingSettings:
    """The engine's settings for one serving plan (the flags; None: the engine's default)."""

    engine: str
    """An ``engines.toml`` id: ``vllm``, ``vllm-v0`` or ``sglang``."""
    max_model_len: int
    gpu_memory_utilization: float | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    kv_dtype: KvDtype = KvDtype.AUTO
    tp: int = 1
    quant_bits: int | None = None
    """4 or 8 for a quantized load (``--quant``); None: as the checkpoint stores it."""
    hybrid_kv_cache: bool | None = None
    """Whether windowed layers get block groups of their own (vLLM's hybrid KV cache manager);
    None: the engine row's ``hybrid_kv_cache``; False: ``--disable-hybrid-kv-cache-manager``."""


@dataclass(frozen=True)
class KvGroups:
    """vLLM's KV cache groups for a model with sliding-window or chunked layers (module
    docstring): the layers of one kind split into groups of ``group_size``, each group one block
    table, one block of a group ``block_bytes``."""

    group_size: int
    """Layers per group (``_get_kv_cache_groups_uniform_page_size``)."""
    kinds: tuple[tuple[str, int, int, int], ...]
    """(kind, span, layers, groups) per kind of layer: ``full`` (span 0), ``sliding`` (span: the
    window) or ``chunked`` (the chunk), its layers and the groups they make."""
    block_bytes: int
    """Bytes of one block over a group: the page (block x one layer's per-token bytes) x group
    size (``get_kv_cache_config_from_groups``: group_size tensors, each shared by one layer of
    every group)."""
    request_blocks: int
    """Blocks one ``max_model_len`` request needs over all groups."""
    block_tokens: int = 16
    """Tokens per block."""
    batched_tokens: int = 2048
    """The scheduler's ``max_num_batched_tokens`` (a windowed layer keeps them beside its window)."""

    def blocks_for(self, length: int) -> int:
        """Blocks one request of ``length`` tokens needs over all groups."""
        return sum(
            groups * _blocks_per_request(kind, span, self.block_tokens, length, self.batched_tokens)
            for kind, span, _, groups in self.kinds
        )

    @property
    def count(self) -> int:
        """Groups in all."""
        return sum(groups for _, _, _, groups in self.kinds)

    @property
    def padding_layers(self) -> int:
        """Empty places in the last group of each kind (vLLM warns "Add N padding layers")."""
        return self.count * self.group_size - sum(layers for _, _, layers, _ in self.kinds)


def _blocks_per_request(
    kind: str, span: int, block_tokens: int, max_model_len: int, batched_tokens: int
) -> int:
    """Blocks one group of ``kind`` needs for a ``max_model_len`` request
    (``vllm/v1/kv_cache_interface.py`` ``max_memory_usage_bytes`` over the page size)."""
    if kind == "sliding":
        # SlidingWindowSpec: the last window - 1 tokens and the scheduled ones, + 1 block for a
        # window that starts inside a block
        tokens = min(span - 1 + batched_tokens, max_model_len)
        return math.ceil(tokens / block_tokens) + 1
    if kind == "chunked":
        # ChunkedLocalAttentionSpec: the chunk and the scheduled tokens
        return math.ceil(min(span + batched_tokens, max_model_len) / block_tokens)
    # FullAttentionSpec
    return math.ceil(max_model_len / block_tokens)


def kv_groups(
    arch: Architecture,
    layer_bytes_per_token: int,
    block_tokens: int,
    max_model_len: int,
    batched_tokens: int,
) -> KvGroups | None:
    """vLLM's block groups for ``arch``'s windowed layers (module docstring); None for a model
    whose layers all attend fully (one pool: the formula without windows).

    ``layer_bytes_per_token``: one layer's cached bytes per token on one GPU;
    ``batched_tokens``: the scheduler's ``max_num_batched_tokens``."""
    if not arch.layer_attention:
        return None
    kinds = arch.attention_groups
    counts = [layers for _, _, layers in kinds]
    if len(kinds) == 1:
        # every layer of one kind: one group of them all (_get_kv_cache_groups_uniform_spec)
        group_size = counts[0]
    else:
        group_size = min(counts)
        if max(counts) < group_size * 1.5:
            group_size = max(counts)
    grouped = tuple(
        (kind, span, layers, math.ceil(layers / group_size)) for kind, span, layers in kinds
    )
    groups = KvGroups(
        group_size=group_size,
        kinds=grouped,
        block_bytes=block_tokens * layer_bytes_per_token * group_size,
        request_blocks=0,
        block_tokens=block_tokens,
        batched_tokens=batched_tokens,
    )
    return dataclasses.replace(groups, request_blocks=groups.blocks_for(max_model_len))


@dataclass(frozen=True)
class ServingMemory:
    """Where one GPU's memory goes when the engine starts, and the KV pool it leaves."""

    engine: EngineDefaults
    settings: ServingSettings
    fraction: float
    """The share of the GPU the engine used (the flag's, or its own default)."""
    total_bytes: int
    budget_bytes: int
    weight_bytes: int
    activation_bytes: int
    non_torch_bytes: int
    cuda_graph_bytes: int
    profile_tokens: int
    kv_bytes_per_token: int
    block_tokens: int
    kv_cache_bytes: int
    kv_blocks: int
    groups: KvGroups | None = None
    """The hybrid KV cache manager's block groups; None: one pool for every layer alike."""
    tp_buffer_bytes: int = 0
    """One rank's tensor-parallel communicator buffers (:func:`tp_buffer_bytes`), whether or not
    the engine counts them; the counted part is in ``non_torch_bytes``."""
    context_bytes: int = 0
    """The CUDA context the engine holds outside its budget (``context_outside_budget``: vLLM
    V1); 0 where the budget counts it (in ``non_torch_bytes``)."""

    @property
    def kv_tokens(self) -> int:
        """Tokens of cache: ``blocks x block tokens`` (vLLM's "GPU KV cache size"); with block
        groups, ``blocks // groups x block tokens`` (``_report_kv_cache_config``)."""
        if self.groups is not None:
            return self.kv_blocks // self.groups.count * self.block_tokens
        return self.kv_blocks * self.block_tokens

    @property
    def request_blocks(self) -> int:
        """Blocks one ``max_model_len`` request needs (with block groups: over all of them)."""
        if self.groups is not None:
            return self.groups.request_blocks
        return math.ceil(self.settings.max_model_len / self.block_tokens)

    @property
    def request_bytes(self) -> int:
        """Pool bytes one ``max_model_len`` request takes."""
        if self.groups is not None:
            return self.groups.request_blocks * self.groups.block_bytes
        return self.settings.max_model_len * self.kv_bytes_per_token

    @property
    def max_concurrency(self) -> float:
        """Sequences of ``max_model_len`` tokens the pool holds at once ("Maximum concurrency");
        with block groups, blocks over the blocks a request needs
        (``get_max_concurrency_for_kv_cache_config``)."""
        if self.groups is not None:
            return self.kv_blocks / self.groups.request_blocks
        return self.kv_tokens / self.settings.max_model_len

    def requests_at(self, length: int) -> int:
        """Whole requests of ``length`` tokens the pool holds at once (each takes whole blocks;
        with block groups, its blocks in every group)."""
        if self.groups is not None:
            return self.kv_blocks // self.groups.blocks_for(length)
        return self.kv_blocks // math.ceil(length / self.block_tokens)

    @property
    def whole_requests(self) -> int:
        """Whole ``max_model_len`` requests the pool holds at once."""
        if self.groups is not None:
            return self.kv_blocks // self.groups.request_blocks
        return self.kv_tokens // self.settings.max_model_len

    @property
    def fits(self) -> bool:
        """Whether the pool holds one ``max_model_len`` sequence (the engine refuses to start
        otherwise: "max seq len ... is larger than the maximum number of tokens ..."; with block
        groups, ``_check_enough_kv_cache_memory``: a request's blocks in every group)."""
        if self.groups is not None:
            return self.kv_blocks >= self.groups.request_blocks
        return self.kv_tokens >= self.settings.max_model_len

    def group_lines(self) -> list[str]:
        """The text report's line on the block groups of a model with windows (none without)."""
        groups = self.groups
        if groups is None:
            return []
        parts = ", ".join(
            f"{count} {kind}"
            + (f" of a {span:,}-token {'window' if kind == 'sliding' else 'chunk'}" if span else "")
            for kind, span, _, count in groups.kinds
        )
        padding = f", {groups.padding_layers} padding layers" if groups.padding_layers else ""
        return [
            f"  hybrid KV cache: {groups.count} groups of {groups.group_size} layers ({parts}"
            f"{padding}): {self.kv_blocks:,} blocks // {groups.count} x {self.block_tokens} = "
            f"{self.kv_tokens:,} tokens; a {self.settings.max_model_len:,}-token request needs "
            f"{groups.request_blocks:,} blocks"
        ]

    def to_json(self) -> dict[str, int | float]:
        """The JSON ``serving`` object (issue 30's fixed keys)."""
        return {
            "kv_cache_bytes": self.kv_cache_bytes,
            "kv_blocks": self.kv_blocks,
            "block_tokens": self.block_tokens,
            "kv_tokens": self.kv_tokens,
            "max_concurrency": round(self.max_concurrency, 2),
        }


def cuda_total_bytes(accelerator: Accelerator) -> int:
    """What CUDA reports as the GPU's total (``torch.cuda.mem_get_info``): the catalog's
    ``cuda_total_mib`` where known, else NVML's total (``nvml_total_mib``), else the datasheet."""
    if accelerator.cuda_total_mib is not None:
        # a local GPU's NVML total (or the free memory, local-free) may be below the catalog's
        return min(accelerator.cuda_total_mib, accelerator.nvml_total_mib or 2**62) * MIB
    if accelerator.nvml_total_mib is not None:
        return accelerator.nvml_total_mib * MIB
    return int(accelerator.memory_gb * 1e9)


def engine_on(engine: EngineDefaults, accelerator: Accelerator) -> EngineDefaults:
    """``engine`` with its scheduler defaults on ``accelerator``: ``batch_defaults_by_gpu``'s
    ``max_num_batched_tokens`` and ``max_num_seqs`` where the GPU's CUDA total is at least its
    ``min_total_gib`` and its name holds none of ``excluded_names`` (vLLM's
    ``vllm/engine/arg_utils.py``: ``get_device_total_memory() >= 70 * GiB_bytes and "a100" not
    in device_name``), else the row's flat defaults."""
    rule = engine.batch_defaults_by_gpu
    if rule is None or accelerator.kind != "gpu":
        return engine
    if cuda_total_bytes(accelerator) < rule.min_total_gib * 2**30:
        return engine
    names = (accelerator.name, *accelerator.nvml_names)
    if any(part in name.lower() for part in rule.excluded_names for name in names):
        return engine
    update = {
        "max_num_batched_tokens": rule.max_num_batched_tokens,
        "max_num_seqs": rule.max_num_seqs,
    }
    return engine.model_copy(update=update)


def default_fraction(engine: EngineDefaults, tp: int) -> float:
    """The engine's own memory fraction at ``tp`` GPUs: the ``fraction_by_tp`` row of the largest
    TP size not above ``tp`` (SGLang lowers ``mem_fraction_static`` as TP grows), else
    ``memory_fraction``."""
    rows = [(size, fraction) for size, fraction in engine.fraction_by_tp if size <= tp]
    return max(rows)[1] if rows else engine.memory_fraction


def kv_bytes_per_token(arch: Architecture, element_bytes: int, tp: int) -> int:
    """Per-token KV bytes on one GPU: ``layers x width x bytes``, the key/value heads split over
    ``tp`` (at least one head per rank); MLA's latent is not split (module docstring)."""
    heads_per_rank = max(1, arch.kv_heads // tp)
    width = arch.latent_kv_width if arch.mla else 2 * arch.head_dim * heads_per_rank
    return arch.kv_cache_layers * width * element_bytes


def tp_buffer_bytes(
    engine: EngineDefaults, tp: int, accelerator: Accelerator | None, software: Software
) -> int:
    """Non-torch bytes one rank of a ``tp``-GPU tensor-parallel group holds for its
    communicators (module docstring): the NCCL ring of the TP group (channels x one connection's
    LL, LL128 and Simple buffers, ``collectives.group_buffer_bytes``) and, where the engine uses it
    at this size and link, the custom all-reduce's ``custom_allreduce_mib``. 0 on one GPU. The
    communicators' own memory (``[[nccl]] communicator_bytes``, measured for training) is not
    counted here yet: the engines' budgets were checked against their logs without it."""
    if tp <= 1:
        return 0
    link = software.interconnect_for(accelerator)
    ring = group_buffer_bytes(CommGroup("tensor-parallel", tp, "ring"), link, software.nccl, None)
    custom = 0
    if tp in engine.custom_allreduce_tp and link.id in engine.custom_allreduce_links:
        custom = math.ceil(engine.custom_allreduce_mib * MIB)
    return ring + custom


def counted_tp_buffers(engine: EngineDefaults, buffers: int, fraction: float) -> int:
    """The part of a rank's TP buffers that comes out of the KV pool (``tp_buffers``)."""
    if engine.tp_buffers == "in-budget":
        return buffers
    if engine.tp_buffers == "fraction":
        # SGLang: pool = fraction x (free after distributed init) - weights, so buffers made
        # before that reading cost the pool fraction x their size
        return math.ceil(fraction * buffers)
    return 0


def _non_torch(
    engine: EngineDefaults,
    accelerator: Accelerator,
    tp: int,
    fraction: float,
    software: Software,
) -> tuple[int, int]:
    """The non-torch bytes the engine subtracts from its budget (``non_torch_mib``, else the CUDA
    context row, plus the counted part of the TP buffers), and one rank's TP buffers."""
    if engine.non_torch_mib is not None:
        non_torch = math.ceil(engine.non_torch_mib * MIB)
    else:
        non_torch = software.context_for(accelerator)[0].bytes
    buffers = tp_buffer_bytes(engine, tp, accelerator, software)
    return non_torch + counted_tp_buffers(engine, buffers, fraction), buffers


def _outside_context(engine: EngineDefaults, accelerator: Accelerator, software: Software) -> int:
    """The CUDA context the engine holds outside its budget (``context_outside_budget``)."""
    return software.context_for(accelerator)[0].bytes if engine.context_outside_budget else 0


def profile_tokens(engine: EngineDefaults, settings: ServingSettings) -> int:
    """Tokens in the profile run's forward (0: no profile run)."""
    batched = settings.max_num_batched_tokens or engine.max_num_batched_tokens
    if engine.profile == "none":
        return 0
    if engine.profile == "batched-tokens":
        return batched
    chunked = engine.chunked_prefill_above and settings.max_model_len > engine.chunked_prefill_above
    return batched if chunked else settings.max_model_len


def profile_activation_bytes(
    arch: Architecture,
    tokens: int,
    max_num_seqs: int,
    element_bytes: int,
    engine: EngineDefaults,
    tp: int,
) -> int:
    """The profile run's activation peak on one GPU: one no-grad forward over ``tokens`` (the
    inference estimator's prefill transients; the per-head and MLP parts split over ``tp``) and
    the sampler's dummy run over ``max_num_seqs`` rows of the vocabulary."""
    if tokens == 0:
        return 0
    # the engines run MoE layers through their fused top-k kernels (vLLM's FusedMoE, which its
    # Llama 4 model uses too), not transformers' every-expert-on-every-token Llama4TextMoe
    engine_arch = dataclasses.replace(arch, experts_every_token=False)
    forward = inference_activation_bytes(engine_arch, 1, tokens, element_bytes, Attention.SDPA)
    sampler = engine.sampler_bytes_per_logit * max_num_seqs * arch.vocab
    return math.ceil(forward / tp + sampler)


def serving_memory(
    arch: Architecture,
    accelerator: Accelerator,
    settings: ServingSettings,
    element_bytes: int = 2,
    software: Software | None = None,
    engines: dict[str, EngineDefaults] | None = None,
) -> ServingMemory:
    """The engine's start-up memory on one GPU of ``accelerator`` and the KV pool it leaves."""
    engines = packaged_engines() if engines is None else engines
    engine = engine_on(engines[settings.engine], accelerator)
    fraction = settings.gpu_memory_utilization or default_fraction(engine, settings.tp)
    total = cuda_total_bytes(accelerator)
    budget = math.floor(fraction * total)
    if settings.quant_bits is not None:
        arch = dataclasses.replace(arch, checkpoint_bits=settings.quant_bits)
    weights = math.ceil(checkpoint_weight_bytes(arch, element_bytes) / settings.tp)
    tokens = profile_tokens(engine, settings)
    seqs = settings.max_num_seqs or engine.max_num_seqs
    activations = profile_activation_bytes(arch, tokens, seqs, element_bytes, engine, settings.tp)
    software = packaged_software() if software is None else software
    non_torch, tp_buffers = _non_torch(engine, accelerator, settings.tp, fraction, software)
    kv_element = KV_DTYPE_BYTES.get(settings.kv_dtype, element_bytes)
    per_token = kv_bytes_per_token(arch, kv_element, settings.tp)
    pool = max(0, budget - weights - activations - non_torch)
    blocks = pool // (engine.block_tokens * per_token)
    hybrid = (
        engine.hybrid_kv_cache if settings.hybrid_kv_cache is None else settings.hybrid_kv_cache
    )
    groups = None
    if hybrid and arch.layer_attention:
        groups = kv_groups(
            arch,
            per_token // arch.kv_cache_layers,
            engine.block_tokens,
            settings.max_model_len,
            settings.max_num_batched_tokens or engine.max_num_batched_tokens,
        )
        # get_num_blocks: available // page // group size
        blocks = pool // groups.block_bytes if groups is not None else blocks
    return ServingMemory(
        engine=engine,
        settings=settings,
        fraction=fraction,
        total_bytes=total,
        budget_bytes=budget,
        weight_bytes=weights,
        activation_bytes=activations,
        non_torch_bytes=non_torch,
        cuda_graph_bytes=math.ceil(engine.cuda_graph_mib * MIB),
        profile_tokens=tokens,
        kv_bytes_per_token=per_token,
        block_tokens=engine.block_tokens,
        kv_cache_bytes=pool,
        kv_blocks=blocks,
        groups=groups,
        tp_buffer_bytes=tp_buffers,
        context_bytes=_outside_context(engine, accelerator, software),
    )


def blocks_from_pool(pool_bytes: int, per_token: int, block_tokens: int) -> int:
    """KV blocks a pool of ``pool_bytes`` holds (``kv_cache_utils.py``: available // page bytes)."""
    return pool_bytes // (block_tokens * per_token)
