"""``hwdash plan --fit TARGET``, ``--check`` and this machine as the ``local`` flavor.

* ``--fit TARGET``: ranked options that make the plan fit TARGET (a flavor id, ``local``,
  ``local-free`` or ``any``); see :mod:`hwdash.core.planning.fit_options`.
* ``--flavor ID --check``: one line, exit 0 when the plan fits ID, 1 when it is tight or does not fit
  (a job script can refuse to start a run that would OOM), 2 on bad input.
* When NVML (or a fake scenario) shows GPUs, the catalog gains ``local`` and ``local-free``
  (:mod:`hwdash.core.planning.local_flavor`).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hwdash.commands.plan_args import plan_arguments
from hwdash.core.catalog import Catalog
from hwdash.core.plan import Plan
from hwdash.core.planning.fit_options import FitOption, FitSearch
from hwdash.core.planning.local_flavor import (
    LOCAL_FREE_FLAVOR_ID,
    LOCAL_TARGETS,
    LocalGpu,
    LocalMachine,
    NoLocalGpu,
    local_machine,
    with_local_machine,
)
from hwdash.core.planning.serving_fit import fit_options_for
from hwdash.core.results import FitVerdict, PlanReport
from hwdash.core.specs import Flavor, Framework, ModelSpec
from hwdash.core.units import GIB
from hwdash.errors import UsageError

ANY_TARGET = "any"


@dataclass(frozen=True)
class LocalGpus:
    """What NVML showed when ``hwdash plan`` looked: the GPUs, or why there are none."""

    gpus: tuple[LocalGpu, ...] = ()
    problem: str | None = None
    """Why no local flavor exists (no driver, no GPUs), in words."""


def probe_local_gpus(fake_nvml: str | None, environ: Mapping[str, str] | None = None) -> LocalGpus:
    """One NVML snapshot of this machine (or of the fake scenario), at most about a second."""
    from hwdash.telemetry.source import make_sampler

    sampler = make_sampler(fake_nvml, environ=environ, round_timeout_s=1.0)
    try:
        snapshot = sampler.sample()
    finally:
        sampler.close()
    if not snapshot.nvml.available:
        return LocalGpus(problem=snapshot.nvml.error or "NVML is not available")
    gpus = tuple(
        LocalGpu(gpu.name, gpu.total_bytes, gpu.free_bytes)
        for gpu in snapshot.gpus
        if gpu.state.value in ("ok", "alert") and gpu.memory_source == "device"
    )
    if not gpus:
        return LocalGpus(problem="NVML lists no GPU whose memory can be read")
    return LocalGpus(gpus=gpus)


def add_local_flavors(
    catalog: Catalog, local: LocalGpus, *, with_free: bool = False
) -> tuple[Catalog, dict[str, LocalMachine]]:
    """The catalog with ``local`` when NVML showed GPUs, and ``local-free`` when asked for (it is a
    target for ``--fit``, not a machine for the flavor table)."""
    machines: dict[str, LocalMachine] = {}
    if not local.gpus:
        return catalog, machines
    for free_only in (False, True) if with_free else (False,):
        try:
            machine = local_machine(local.gpus, catalog, free_only=free_only)
        except NoLocalGpu:
            continue
        machines[machine.flavor.id] = machine
        catalog = with_local_machine(catalog, machine)
    return catalog, machines


def target_flavors(
    target: str, catalog: Catalog, local: LocalGpus, *, flag: str = "--fit"
) -> list[Flavor]:
    """The flavors ``--fit TARGET`` searches; a usage error with close matches when unknown."""
    if target == ANY_TARGET:
        return [
            flavor
            for flavor in catalog.flavors.values()
            if flavor.id != LOCAL_FREE_FLAVOR_ID  # "free now" is not a machine one could pick
        ]
    if target in LOCAL_TARGETS and target not in catalog.flavors:
        why = (local.problem or "NVML shows no GPU").removesuffix(": the planner still works")
        raise UsageError(f"{target!r} needs this machine's GPUs, but {why}", flag=flag)
    if target not in catalog.flavors:
        known = [*catalog.flavors, ANY_TARGET, *LOCAL_TARGETS]
        close = difflib.get_close_matches(target, known, n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise UsageError(
            f"unknown target {target!r}{hint} (a flavor id from `hwdash catalog list "
            "--kind flavors`, local, local-free or any)",
            flag=flag,
        )
    return [catalog.flavors[target]]


def search(
    plan: Plan, model: ModelSpec, catalog: Catalog, target: str, local: LocalGpus
) -> FitSearch:
    """``--fit TARGET`` on the (local-extended) catalog; a serving plan's options are the engine's
    (:mod:`hwdash.core.planning.serving_fit`)."""
    flavors = target_flavors(target, catalog, local)
    return fit_options_for(plan, model, catalog, target, flavors)


def fit_json(
    result: FitSearch, extra_args: Sequence[str] = (), framework: Framework | None = None
) -> dict[str, Any]:
    """The ``"fit"`` object of ``hwdash plan --json`` (``extra_args``, the catalog folders given,
    end every option's ``args``; ``framework``: the catalog's entry for the plan's framework, whose
    defaults the args need not repeat)."""
    return {
        "target": result.target,
        "fits_already": result.fits_already,
        "options": [
            option.to_json([*plan_arguments(option.plan, framework), *extra_args])
            for option in result.options
        ],
        "notes": list(result.notes),
        # when nothing fits the target: its options least over the memory (verdict "no")
        "closest": [
            option.to_json([*plan_arguments(option.plan, framework), *extra_args])
            for option in result.closest
        ],
    }


def render_options(
    result: FitSearch,
    console: Any,
    *,
    limit: int | None = None,
    extra_args: Sequence[str] = (),
    framework: Framework | None = None,
    why: str = "",
) -> None:
    """The options as a table: changes in words, memory per GPU, headroom, time, cost, slowdown;
    then the first option as a command (``extra_args`` appended: the catalog folders given).
    When nothing fits the target, the options that come closest to it, said as such. ``why``:
    why this target, after its name (``the flavor asked``)."""
    from rich.text import Text

    options = result.options[:limit] if limit else result.options
    if result.fits_already and not options:
        console.print(Text(f"fits {result.target} as it is: nothing to change"))
        return
    title = f"to fit {result.target}" + (f" ({why})" if why else "")
    if result.fits_already:
        title += " (it already fits some flavors)"
    console.print(Text(title + ":", style="bold"))
    if not options:
        for note in result.notes or ("nothing tried fits",):
            console.print(Text(note))
        if result.closest:
            count = len(result.closest)
            console.print(
                Text(
                    f"the {count} option{'s' if count > 1 else ''} that come closest to fitting "
                    f"{result.target} (least over its memory; none fits):",
                    style="bold",
                )
            )
            _print_table(result.closest, console)
        return
    _print_table(options, console)
    first = options[0]
    # One unbroken line, so it can be copied.
    arguments = [*plan_arguments(first.plan, framework), *extra_args]
    command = "try: hwdash plan " + " ".join(_quoted(arguments))
    console.print(Text(command), soft_wrap=True)
    for note in result.notes:
        console.print(Text(f"note: {note}"))


def _print_table(options: Sequence[FitOption], console: Any) -> None:
    """The options' table and the words under it."""
    from rich.table import Table
    from rich.text import Text

    from hwdash.core.units import format_hours, format_money

    several_flavors = len({option.fit.flavor.id for option in options}) > 1
    timed = any(option.fit.hours is not None for option in options)
    table = Table()
    table.add_column("#", justify="right", no_wrap=True)
    # "what changes" lists the plan's settings that move; "experiment" says whether what is trained
    # stays the same ("kept") or not ("changed"): one word, one sense (issue 23).
    table.add_column("what changes", overflow="fold", ratio=1, min_width=20)
    table.add_column("experiment", no_wrap=True)
    if several_flavors:
        table.add_column("flavor", no_wrap=True)
    table.add_column("GiB/GPU", justify="right", no_wrap=True)
    table.add_column("free", justify="right", no_wrap=True)
    if timed:
        table.add_column("hours", justify="right", no_wrap=True)
        table.add_column("cost", justify="right", no_wrap=True)
    table.add_column("slower", justify="right", no_wrap=True)
    for number, option in enumerate(options, 1):
        fit = option.fit
        kind = "kept" if option.keeps_experiment else "changed"
        free = f"{fit.headroom_bytes / GIB:+.1f}"
        if fit.verdict is FitVerdict.TIGHT:
            free += " tight"  # a memory verdict: beside the headroom, not the experiment
        slower = "?" if option.slowdown is None else f"x{option.slowdown:.2f}"
        cells = [Text(str(number)), Text("; ".join(option.words))]
        cells.append(Text(kind, style="green" if option.keeps_experiment else "yellow"))
        if several_flavors:
            cells.append(Text(fit.flavor.id))
        cells += [Text(f"{fit.need_bytes / GIB:.1f}"), Text(free)]
        if timed:
            cells += [Text(format_hours(fit.hours)), Text(format_money(fit.cost))]
        cells.append(Text(slower))
        table.add_row(*cells)
    console.print(table)
    legend = (
        _SERVING_LEGEND
        if any(option.plan.is_serving for option in options)
        else "experiment kept: same model, method, data, numerics and global batch; changed: "
        "what is trained changes. tight: under 10% headroom. slower: step time against the plan "
        "as given (FLOPs, times the catalog's slowdowns)"
    )
    console.print(Text(legend, style="dim"))


#: The words under a serving plan's options (:mod:`hwdash.core.planning.serving_fit`).
_SERVING_LEGEND = (
    "experiment kept: the same model, weights and KV numerics served at the same --max-model-len; "
    "changed: what is served changes. GiB/GPU: what the engine takes (its budget and what it "
    "holds outside it). slower: the catalog's factor where it has one (? where none)"
)


def _quoted(args: list[str]) -> list[str]:
    import shlex

    return [shlex.quote(arg) for arg in args]


def check_line(report: PlanReport, flavor_id: str) -> tuple[int, str]:
    """``--check``: (exit status, one line) for the plan on one flavor."""
    fit = next((fit for fit in report.flavors if fit.flavor.id == flavor_id), None)
    if fit is None:  # evaluate_plan already refuses unknown flavors; keep the guard honest
        return 2, f"unknown flavor {flavor_id!r}"
    need = f"{fit.need_bytes / GIB:.1f} GiB per GPU of {fit.usable_bytes / GIB:.1f} GiB"
    if fit.verdict is FitVerdict.FITS:
        return 0, f"fits {flavor_id}: {need} ({fit.headroom_bytes / GIB:.1f} GiB free)"
    if fit.verdict is FitVerdict.TIGHT:
        return 1, f"tight on {flavor_id}: {need}, under 10% headroom: may OOM"
    return 1, f"does not fit {flavor_id}: {fit.reason or need}"
