"""The planner's serving lines: a serving plan's (``--engine vllm|sglang``) KV cache, blocks,
tokens and maximum concurrency at ``max_model_len`` on one flavor, in the words of the engine's
start-up log (``hwdash plan``'s serving lines, :mod:`hwdash.commands.plan_serving`, short enough
for the pane's narrow column at 80 columns).

The memory is :mod:`hwdash.core.planning.serving_plan`'s; the flavor is its
:func:`~hwdash.core.planning.serving_plan.serving_flavor`: the plan's first ``--flavor`` the engine
runs on, else the recommended one (the headline's star), else the first GPU flavor of the table.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text

from hwdash.core.estimator.serving import ServingMemory
from hwdash.core.planning.serving_plan import memory_on, serving_flavor, serving_settings
from hwdash.core.results import PlanReport
from hwdash.core.units import format_bytes


def serving_memory_shown(report: PlanReport, catalog: Any) -> tuple[str, ServingMemory] | None:
    """The shown flavor's id and the engine's memory on it (None: not a serving plan, or no
    GPU flavor to serve on)."""
    settings = serving_settings(report.plan, report.model)
    if settings is None:
        return None
    fit = serving_flavor(report, settings.tp)
    if fit is None:
        return None
    return fit.flavor.id, memory_on(report, settings, fit.accelerator, catalog)


def serving_text(flavor_id: str, memory: ServingMemory) -> Text:
    """The serving lines: engine and flavor, the KV pool, its blocks and tokens, and the maximum
    concurrency at ``max_model_len`` (red when one sequence does not fit)."""
    s = memory.settings
    text = Text()
    text.append(f"{memory.engine.name}, TP {s.tp} on {flavor_id}\n", style="bold")
    text.append(
        f"budget {memory.fraction:g} × {format_bytes(memory.total_bytes)}: "
        f"KV cache {format_bytes(memory.kv_cache_bytes)}\n"
    )
    text.append(
        f"{memory.kv_blocks:,} blocks of {memory.block_tokens} = {memory.kv_tokens:,} tokens\n"
    )
    text.append(f"max concurrency at {s.max_model_len:,} tokens: ")
    text.append(
        f"{memory.max_concurrency:.2f}x",
        style="bold green" if memory.fits else "bold red",
    )
    if not memory.fits:
        text.append("\nthe engine would not start: lower max len or raise mem. util.", "red")
    return text
