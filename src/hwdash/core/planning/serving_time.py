"""A batch job's time on a serving engine: ``--examples`` requests of a prompt and
``--output-tokens`` generated tokens each, on the KV pool :mod:`hwdash.core.estimator.serving`
sizes.

The model (per GPU of a tensor-parallel group of ``tp``; every rate and efficiency is catalog data:
the accelerator's ``bf16_tflops``/``memory_bandwidth_gbps`` in ``accelerators.toml`` and the
engine's ``prefill_efficiency``, ``decode_efficiency``, ``allreduce_latency_us`` and
``allreduce_gbps`` in ``engines.toml``):

* Prefill is compute-bound. A prompt of ``P`` tokens costs ``2 N P`` FLOPs in its matmuls (``N``
  the parameters a token multiplies through: Kaplan et al. 2020, arXiv:2001.08361, section 2.1,
  forward pass ``2N`` per token; MoE counts the routed experts only) plus the attention's scores
  and weighted sum, ``2 x layers x d_attn`` per token per position it attends to (the same table's
  ``2 n_layer n_ctx d_attn``); under the causal mask token ``i`` attends to ``i`` positions, so a
  prompt adds ``layers x d_attn x P (P + 1)``. The FLOPs divide over ``tp`` and run at the peak
  dense rate x ``prefill_efficiency``.
* Decode: every step reads the GPU's shard of the weights once and each running sequence's KV
  cache (its length averaged over the generation, ``P + M / 2``), at the memory bandwidth x
  ``decode_efficiency``; the step also has its FLOPs (``2 N`` plus attention per sequence, at the
  prefill's rate): a step takes the longer of the two (the roofline of Williams et al. 2009,
  "Roofline", CACM 52(4)).
* Running sequences = min(``max_num_seqs``, the sequences of ``P + M`` tokens the KV pool holds
  (the serving model's maximum concurrency at this length, rounded down), the requests). The job
  runs in waves of that many until all are done; each wave decodes ``M`` steps.
* Tensor parallel is not free: Megatron-style layers (Shoeybi et al. 2019, arXiv:1909.08053,
  section 3; vLLM's ``RowParallelLinear`` in ``vllm/model_executor/layers/linear.py``) all-reduce
  the hidden state twice per layer (after attention and after the MLP). A ring all-reduce moves
  ``2 (tp - 1) / tp`` of the message per GPU (NCCL's ``nccl-tests`` ``doc/PERFORMANCE.md``, the
  bus bandwidth), so each all-reduce takes ``allreduce_latency_us + 2 (tp - 1) / tp x bytes /
  allreduce_gbps``, added to each step and to each prompt, not overlapped with compute.

Prefill and decode are added, not overlapped (vLLM's chunked prefill mixes them in one step,
which this leaves out: an upper bound on the time when prompts are long).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from hwdash.core.estimator.architecture import Architecture
from hwdash.core.estimator.serving import ServingMemory
from hwdash.core.specs import Accelerator, EngineDefaults
from hwdash.core.units import GB


@dataclass(frozen=True)
class BatchJob:
    """``requests`` prompts of ``prompt_tokens`` tokens, each generating ``output_tokens``."""

    requests: int
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class BatchTime:
    """How long a batch job takes on one serving engine (one tensor-parallel group)."""

    job: BatchJob
    running: int
    """Sequences decoded at once (the last wave may run fewer)."""
    waves: int
    prefill_seconds: float
    decode_seconds: float
    allreduce_seconds: float
    """Of the two above, the tensor-parallel all-reduces' share (0 at TP 1)."""
    memory_seconds: float
    """Decode steps' time on memory alone (for the bound)."""
    compute_seconds: float
    """Decode steps' time on compute alone, plus the prefill (for the bound)."""
    engines: int = 1
    """Engines (TP groups) running side by side, each with an equal share of ``job``'s requests:
    the times above are one engine's share (the wall clock), the rates all the engines'."""

    @property
    def seconds(self) -> float:
        """The whole job, prefill and decode."""
        return self.prefill_seconds + self.decode_seconds

    @property
    def hours(self) -> float:
        return self.seconds / 3600

    @property
    def output_tokens_per_second(self) -> float:
        return self.job.requests * self.job.output_tokens / self.seconds

    @property
    def total_tokens_per_second(self) -> float:
        """Prompt and generated tokens per second (``benchmark_throughput.py``'s "total")."""
        per_request = self.job.prompt_tokens + self.job.output_tokens
        return self.job.requests * per_request / self.seconds

    @property
    def bound(self) -> Literal["memory", "compute"]:
        """What limits the job: the memory reads or the FLOPs, whichever takes longer."""
        return "memory" if self.memory_seconds >= self.compute_seconds else "compute"

    def to_json(self) -> dict[str, int | float | str]:
        """JSON ``serving.batch``."""
        return {
            "requests": self.job.requests,
            "output_tokens": self.job.output_tokens,
            "seconds": round(self.seconds, 3),
            "output_tokens_per_second": round(self.output_tokens_per_second, 1),
            "bound": self.bound,
        }

    def sentence(self) -> str:
        """The text report's line."""
        job = self.job
        return (
            f"Batch job: {job.requests:,} requests x ({job.prompt_tokens:,} prompt + "
            f"{job.output_tokens:,} output tokens), {self.running:,} at once in {self.waves:,} "
            f"wave{'s' if self.waves != 1 else ''}{self._side_by_side()}: "
            f"{_duration(self.seconds)}, "
            f"{self.output_tokens_per_second:,.0f} output tokens/s "
            f"({self.total_tokens_per_second:,.0f} total), {self.bound}-bound"
        )

    def _side_by_side(self) -> str:
        return "" if self.engines == 1 else f" on each of {self.engines} engines side by side"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def attention_flops(arch: Architecture, positions: float) -> float:
    """Score and weighted-sum FLOPs of one token attending to ``positions`` cached positions:
    ``2 x layers x d_attn x positions`` (Kaplan et al. 2020, Table 1), ``d_attn`` the query width."""
    return 2.0 * arch.layers * arch.q_dim * positions


def prompt_flops(arch: Architecture, prompt: int) -> float:
    """A prompt's forward FLOPs: ``2 N P`` plus causal attention ``layers x d_attn x P (P + 1)``."""
    return 2.0 * arch.matmul_params_per_token * prompt + arch.layers * arch.q_dim * prompt * (
        prompt + 1
    )


def allreduce_seconds(engine: EngineDefaults, tp: int, message_bytes: float) -> float:
    """One all-reduce of ``message_bytes`` over ``tp`` GPUs (0 at TP 1 or without the engine's
    all-reduce bandwidth): latency plus the ring's ``2 (tp - 1) / tp`` share at the bus rate."""
    if tp <= 1 or engine.allreduce_gbps is None:
        return 0.0
    ring = 2 * (tp - 1) / tp * message_bytes / (engine.allreduce_gbps * GB)
    return engine.allreduce_latency_us * 1e-6 + ring


def batch_time(
    arch: Architecture,
    accelerator: Accelerator,
    memory: ServingMemory,
    job: BatchJob,
    element_bytes: int = 2,
) -> BatchTime | None:
    """The job's time on one engine sized by ``memory`` (None: the engine has no efficiencies,
    the accelerator no bandwidth or tensor rate, or the pool holds no whole sequence)."""
    engine = memory.engine
    tflops, _dtype = accelerator.matmul_tflops()
    bandwidth = accelerator.memory_bandwidth_gbps
    if (
        engine.prefill_efficiency is None
        or engine.decode_efficiency is None
        or tflops is None
        or bandwidth is None
    ):
        return None
    tp = memory.settings.tp
    length = job.prompt_tokens + job.output_tokens
    fits = memory.requests_at(length)
    seqs = memory.settings.max_num_seqs or engine.max_num_seqs
    running = min(seqs, fits, job.requests)
    if running < 1:
        return None
    flops_rate = tflops * 1e12 * engine.prefill_efficiency  # per GPU
    bytes_rate = bandwidth * GB * engine.decode_efficiency
    # two all-reduces of the hidden state per layer (module docstring)
    reduces_per_pass = 2 * arch.layers

    # prefill: every prompt once, its FLOPs split over the TP group
    prefill_compute = job.requests * prompt_flops(arch, job.prompt_tokens) / tp / flops_rate
    prefill_reduce = (
        job.requests
        * reduces_per_pass
        * allreduce_seconds(engine, tp, job.prompt_tokens * arch.hidden * element_bytes)
    )

    # decode: waves of `running` sequences, each wave `output_tokens` steps
    decode = _Decode()
    for batch, count in _wave_sizes(job.requests, running):
        steps = count * job.output_tokens
        decode.add(arch, memory, job, (batch, steps, element_bytes), (flops_rate, bytes_rate))
    return BatchTime(
        job=job,
        running=running,
        waves=math.ceil(job.requests / running),
        prefill_seconds=prefill_compute + prefill_reduce,
        decode_seconds=decode.seconds,
        allreduce_seconds=prefill_reduce + decode.reduce,
        memory_seconds=decode.memory,
        compute_seconds=decode.compute + prefill_compute,
    )


@dataclass
class _Decode:
    """The decode steps' time so far: in all, on memory alone, on FLOPs alone, in all-reduces."""

    seconds: float = 0.0
    memory: float = 0.0
    compute: float = 0.0
    reduce: float = 0.0

    def add(
        self,
        arch: Architecture,
        memory: ServingMemory,
        job: BatchJob,
        shape: tuple[int, int, int],
        rates: tuple[float, float],
    ) -> None:
        """``shape`` = (``batch``, ``steps``, activation bytes): ``steps`` decode steps of
        ``batch`` sequences at ``rates`` = (FLOP/s, bytes/s) per GPU: each reads
        the weights and every sequence's KV cache at its average length, and takes the longer of
        its reads and its FLOPs, plus two all-reduces per layer."""
        batch, steps, element_bytes = shape
        flops_rate, bytes_rate = rates
        tp = memory.settings.tp
        average_length = job.prompt_tokens + job.output_tokens / 2
        # a sliding or chunked layer reads at most its span of each sequence's cache
        cached = average_length
        if arch.layer_attention:
            cached = arch.kv_layer_tokens(math.ceil(average_length)) / arch.kv_cache_layers
        read = memory.weight_bytes + batch * memory.kv_bytes_per_token * cached
        step_memory = read / bytes_rate
        per_sequence = 2.0 * arch.matmul_params_per_token + attention_flops(arch, average_length)
        step_compute = batch * per_sequence / tp / flops_rate
        step_reduce = (
            2
            * arch.layers
            * allreduce_seconds(memory.engine, tp, batch * arch.hidden * element_bytes)
        )
        self.seconds += steps * (max(step_memory, step_compute) + step_reduce)
        self.memory += steps * step_memory
        self.compute += steps * step_compute
        self.reduce += steps * step_reduce


def _wave_sizes(requests: int, running: int) -> list[tuple[int, int]]:
    """(sequences in a wave, waves of that size): the full waves of ``running``, then the rest."""
    full, rest = divmod(requests, running)
    return [(running, full)] + ([(rest, 1)] if rest else [])
