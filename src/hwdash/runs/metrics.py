"""A run's speed, MFU, time to finish, cost, energy and planned vs measured peak: pure arithmetic on
what the probe publishes (:class:`hwdash.telemetry.types.RunProgress`) and what the plan says
(:class:`hwdash.runs.plans.PlanFacts`).

The rules (each number is None when an input it needs is unknown):

* **tokens/s** is the probe's: the tokens of the steps in the last minute over the time they took,
  steps longer than 5x the median left out (a checkpoint save, an evaluation).
* **TFLOPS** = tokens/s x the plan's model FLOPs per token (6N for full training, 4N for LoRA-style
  methods, 2N for inference; recomputation not counted, as MFU is defined in PaLM, Chowdhery et al.
  2022, appendix B). Tokens are the whole job's (the Trainer's ``num_input_tokens_seen`` sums every
  rank), so **MFU** divides by the peak of all the job's GPUs: world size x the accelerator's dense
  half-precision TFLOPS from the catalog.
* **time to finish**: the tokens still to train (the probe's total, else the plan's) at the current
  rate; without a token total, the steps still to go (``max_steps``) at the median step time.
* **cost**: the hourly price (``--price``, else the plan's flavor's) x hours since the run started,
  times the run's share of the machine (its GPUs over the machine's GPUs; 1 for a run that uses them
  all). Cost to go: the same price over the time to finish.
* **energy**: NVML's total energy counter of the run's GPUs since the probe first saw them, in kWh.
* **peak error**: the allocator's reserved peak over the plan's peak without the CUDA context,
  minus 1 (+0.04: the run needed 4% more than planned).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hwdash.telemetry.types import RunProgress, RunView

if TYPE_CHECKING:
    from hwdash.runs.plans import PlanFacts  # the planner: loaded by the run watcher when needed

JOULES_PER_KWH = 3.6e6


@dataclass(frozen=True)
class Hardware:
    """What the run's machine brings to the arithmetic."""

    peak_tflops: float | None = None
    """One GPU's dense half-precision TFLOPS (the accelerator catalog), None when not in it."""
    price_per_hour: float | None = None
    """The machine's price (``--price``); None: take the plan's flavor's."""
    machine_gpus: int | None = None
    """GPUs of the machine the price is for (None: the run's share is 1)."""


def _share(run_gpus: int, machine_gpus: int | None) -> float:
    if not machine_gpus or machine_gpus <= 0:
        return 1.0
    return min(1.0, run_gpus / machine_gpus)


def _eta(progress: RunProgress, total_tokens: int | None) -> tuple[float | None, float | None]:
    """(seconds to finish, share done) from tokens when a total is known, else from steps."""
    rate = progress.tokens_per_s
    if total_tokens and progress.tokens is not None:
        done = min(1.0, progress.tokens / total_tokens)
        if rate:
            return max(0.0, total_tokens - progress.tokens) / rate, done
        return None, done
    if progress.max_steps and progress.step is not None:
        done = min(1.0, progress.step / progress.max_steps)
        if progress.step_time_s:
            return max(0, progress.max_steps - progress.step) * progress.step_time_s, done
        return None, done
    return None, None


def _peak(measured: int | None, planned: int | None) -> float | None:
    if measured is None or not planned:
        return None
    return measured / planned - 1.0


def run_view(
    progress: RunProgress,
    facts: PlanFacts | None,
    hardware: Hardware,
    *,
    measured_peak_bytes: int | None = None,
    measured_nvml_peak_bytes: int | None = None,
    plan_error: str | None = None,
) -> RunView:
    """The run against its plan (see the module for each rule)."""
    world = progress.world_size or 1
    rate = progress.tokens_per_s
    tflops = mfu = None
    if rate is not None and facts is not None:
        tflops = rate * facts.model_flops_per_token / 1e12
        if hardware.peak_tflops:
            mfu = tflops / (hardware.peak_tflops * world)
    total = progress.total_tokens or (facts.total_tokens if facts is not None else None)
    eta, done = _eta(progress, total)
    price = hardware.price_per_hour
    machine = hardware.machine_gpus
    if price is None and facts is not None and facts.price_per_hour is not None:
        price, machine = facts.price_per_hour, facts.flavor_gpus
    share = _share(world, machine)
    elapsed = None if progress.at is None else max(0.0, progress.at - progress.started_at)
    cost = None if price is None or elapsed is None else price * share * elapsed / 3600
    to_go = None if price is None or eta is None else price * share * eta / 3600
    planned = facts.planned_peak_bytes if facts is not None else None
    planned_total = facts.planned_total_bytes if facts is not None else None
    return RunView(
        step=progress.step,
        tokens=progress.tokens,
        tokens_per_s=rate,
        tokens_estimated=progress.tokens_estimated,
        tflops=tflops,
        mfu=mfu,
        eta_s=eta,
        progress=done,
        cost_usd=cost,
        cost_to_go_usd=to_go,
        price_per_hour=price,
        energy_kwh=None if progress.energy_j is None else progress.energy_j / JOULES_PER_KWH,
        plan=progress.plan,
        plan_error=plan_error,
        planned_peak_bytes=planned,
        measured_peak_bytes=measured_peak_bytes,
        peak_error=_peak(measured_peak_bytes, planned),
        planned_total_bytes=planned_total,
        measured_nvml_peak_bytes=measured_nvml_peak_bytes,
        started_at=progress.started_at,
        elapsed_s=elapsed,
    )
