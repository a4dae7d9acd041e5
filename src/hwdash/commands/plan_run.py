"""The flow of ``hwdash plan``: flags (and ``--from``) -> Plan -> estimate on the catalog -> output.

:func:`run` reads the plan, checks the output flags, adds this machine's GPUs to the catalog,
evaluates the plan, searches for options when asked (or when nothing fits), saves it, and prints
the export, the JSON document or the text report.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from typing import Any

from hwdash.commands.plan_export import exists_message, export
from hwdash.commands.plan_inputs import (
    apply_framework_defaults,
    apply_imported,
    blame_the_file,
    chosen_fields,
    plan_from_args,
    unused_flag_warnings,
)
from hwdash.commands.plan_report import output_width, render_report
from hwdash.core import strict_json
from hwdash.core.plan import Plan
from hwdash.core.planning.local_flavor import LOCAL_TARGETS
from hwdash.core.results import FitVerdict
from hwdash.errors import UsageError


@dataclasses.dataclass
class _Outcome:
    """What the run found, for its output: the plan on the catalog and what goes beside it."""

    plan: Plan
    model: Any
    catalog: Any
    report: Any
    machines: dict[str, Any]
    framework_defaults: dict[str, Any]
    #: --check's (exit status, line); None without --check
    check: tuple[int, str] | None
    fit_result: Any
    fit_why: str
    #: the catalog folders given: a suggested command repeats them
    catalog_args: list[str]
    #: (the saved plan's name, the line that says where) with --save
    saved: tuple[str, str] | None
    trace_skipped: str | None
    #: what the runs ledger holds for similar plans (None: nothing)
    measured: Any = None
    #: ``--max FIELD``'s answer (:class:`~hwdash.core.planning.max_fit.MaxFit`), or None
    max_fit: Any = None
    #: a serving plan's (flavor id, :class:`~hwdash.core.estimator.serving.ServingMemory`, the
    #: report with serving verdicts) for its first GPU flavor; None for ``--engine hf``
    serving: tuple[str, Any, Any] | None = None
    #: the serving plan's settings (None: ``--engine hf``)
    serving_settings: Any = None


def run(args: argparse.Namespace) -> int:
    """Run the subcommand."""
    from hwdash.commands import plan_fit, plan_measured
    from hwdash.core.models.config import resolve_model

    argv = getattr(args, "argv", [])
    imported = _read_from_file(args)
    plan = plan_from_args(args)
    if imported is not None:
        plan = apply_imported(plan, imported, argv, args.from_file)
    _check_output_flags(args, plan)
    plan, catalog, local, machines = _catalog_with_local_gpus(args, plan, imported)
    model = resolve_model(plan.model, catalog)
    trace_skipped = _trace_skipped(args, plan)
    measured = plan_measured.measured_for(plan, model)
    if getattr(args, "calibrated", False):
        plan = plan_measured.calibrated_plan(plan, measured)
    report, framework_defaults = _evaluate(args, plan, catalog, model, imported)
    if getattr(args, "calibrated", False):
        report = plan_measured.calibrated_report(report, measured)
    settings, report, serving = _serving(args, plan, report, catalog)
    # --check's (exit status, line): the status holds whatever else is asked.
    check = plan_fit.check_line(report, plan.flavors[0]) if args.check else None
    max_fit = _find_max(args, plan, model, catalog, measured, serving)
    fit_result, fit_why = _search_options(args, plan, model, catalog, local, report)
    outcome = _Outcome(
        plan=plan,
        model=model,
        catalog=catalog,
        report=report,
        machines=machines,
        framework_defaults=framework_defaults,
        check=check,
        fit_result=fit_result,
        fit_why=fit_why,
        catalog_args=[arg for folder in args.catalog for arg in ("--catalog", folder)],
        saved=_save(args, plan, report),
        trace_skipped=trace_skipped,
        measured=measured,
        max_fit=max_fit,
        serving=serving,
        serving_settings=settings,
    )
    return _print_outcome(args, outcome)


def _serving(
    args: argparse.Namespace, plan: Plan, report: Any, catalog: Any
) -> tuple[Any, Any, Any]:
    """A serving plan's settings, the report with the serving verdicts, and the shown flavor's
    memory (``shown_flavor``: the first --flavor, else the recommended one; all None-or-unchanged
    for ``--engine hf``)."""
    from hwdash.commands.plan_serving import serving_on_flavors, serving_settings
    from hwdash.core.planning.serving_plan import shown_flavor, with_engine_estimate

    settings = serving_settings(plan, report.model)
    if settings is None:
        from hwdash.commands.plan_batch import batch_job

        batch_job(plan, None)  # --output-tokens without a serving engine: refused
        if args.export == "vllm":
            raise UsageError(
                "--export vllm writes a server's command line: add --engine vllm or sglang",
                flag="--export",
            )
        return None, report, None
    report, memories = serving_on_flavors(report, settings, catalog)
    from hwdash.commands.plan_batch import with_batch_times

    report = with_batch_times(report, memories)  # --examples: each flavor's hours and cost
    shown = shown_flavor(plan, memories, report.recommended)
    # the memory shown (table, JSON memory, --check) is what the engine takes on that flavor
    report = with_engine_estimate(report, memories, shown)
    serving = None if shown is None else (shown, memories[shown], report)
    return settings, report, serving


def _max_field(args: argparse.Namespace, plan: Plan) -> Any:
    """``--max FIELD`` read and checked (None without it): one known field, one target flavor."""
    from hwdash.core.planning.max_fit import MAX_FIELDS, MaxField, check_max_request

    asked = getattr(args, "max", None)
    if not asked:
        return None
    if len(asked) > 1:
        raise UsageError(
            f"one field at a time (given: {', '.join(asked)}): run hwdash plan once per field",
            flag="--max",
        )
    name = asked[0].strip().lower()
    if name not in MAX_FIELDS:
        raise UsageError(
            f"unknown field {asked[0]!r}: choose one of {', '.join(MAX_FIELDS)}", flag="--max"
        )
    if len(plan.flavors) != 1:
        raise UsageError(
            "give exactly one --flavor ID (a flavor id, local or local-free) to find the "
            "largest that fits it",
            flag="--max",
        )
    field = MaxField(name)
    check_max_request(plan, field)
    return field


def _find_max(
    args: argparse.Namespace, plan: Plan, model: Any, catalog: Any, measured: Any, serving: Any
) -> Any:
    """``--max FIELD``'s answer on the one ``--flavor`` (None without ``--max``); with
    ``--calibrated``, every need scaled by the measured peak factor, as the flavor table's. A
    serving plan's ``concurrency``: the engine's, at ``--max-model-len``."""
    field = _max_field(args, plan)
    if field is None:
        return None
    if serving is not None and serving[0] == plan.flavors[0]:
        # a serving plan: the engine's answers (core/planning/serving_max.py)
        from hwdash.core.planning.serving_max import serving_max

        flavor, memory, report = serving
        return serving_max(report, memory.settings, flavor, field, catalog, memory)
    from hwdash.core.planning.max_fit import find_max

    adjust = None
    factor = None if measured is None else measured.peak_factor
    if getattr(args, "calibrated", False) and factor is not None:
        from hwdash.runs.calibration import scaled_fit

        def adjust(fit: Any) -> Any:
            return scaled_fit(fit, factor)

    return find_max(plan, model, catalog, plan.flavors[0], field, adjust=adjust)


def _read_from_file(args: argparse.Namespace) -> Any:
    """The ``--from`` file's settings (None without one); its model when no flag names one."""
    if args.from_file is None:
        return None
    from pathlib import Path

    from hwdash.core.plans.imports import read_plan_file

    imported = read_plan_file(Path(args.from_file))
    if not args.model and not args.params and "model" in imported.updates:
        args.model = imported.updates["model"]
    return imported


def _check_output_flags(args: argparse.Namespace, plan: Plan) -> None:
    """Refuse the output flags that contradict each other (``-o`` without ``--export``...)."""
    if args.output is not None and args.export is None:
        raise UsageError("-o names the file --export writes: add --export FORMAT", flag="-o")
    if args.force and args.output is None:
        raise UsageError("--force overwrites the -o FILE of --export: add -o FILE", flag="--force")
    if args.output is not None and not args.force and os.path.lexists(args.output):
        raise UsageError(exists_message(args.output), flag="-o")
    if args.export is not None and args.json and args.output is None:
        raise UsageError(
            "--export and --json would both write to stdout: add -o FILE for the export",
            flag="--export",
        )
    if args.check and len(plan.flavors) != 1:
        raise UsageError("give exactly one --flavor ID to check against", flag="--check")
    _max_field(args, plan)  # a bad --max: exit 2 before any work


def _catalog_with_local_gpus(
    args: argparse.Namespace, plan: Plan, imported: Any
) -> tuple[Plan, Any, Any, dict[str, Any]]:
    """(the plan with its framework's defaults, the catalog with this machine's GPUs as the
    ``local`` flavors, the GPUs found, the local machines by flavor id); an unknown ``--fit``
    target or a local flavor without GPUs is refused here, before any output."""
    from hwdash.commands import plan_fit
    from hwdash.core.catalog import load_catalog

    catalog = load_catalog(args.catalog)
    plan = apply_framework_defaults(plan, catalog, getattr(args, "argv", []), imported)
    # This machine's GPUs become the `local` flavor (NVML, or the fake scenario).
    local = plan_fit.probe_local_gpus(args.fake_nvml)
    catalog, machines = plan_fit.add_local_flavors(
        catalog, local, with_free=args.fit == "local-free" or "local-free" in plan.flavors
    )
    for flavor_id in plan.flavors:
        if flavor_id in LOCAL_TARGETS and flavor_id not in catalog.flavors:
            # "unknown flavor 'local'" would send the user to the catalog; the GPUs are missing.
            plan_fit.target_flavors(flavor_id, catalog, local, flag="--flavor")
    if args.fit is not None:
        plan_fit.target_flavors(args.fit, catalog, local)  # an unknown target: exit 2 now
    return plan, catalog, local, machines


def _trace_skipped(args: argparse.Namespace, plan: Plan) -> str | None:
    """With ``--trace``: why the trace will be skipped (torch, transformers or peft missing), or
    None; a setting that cannot be traced is refused (exit 2) before any output."""
    if not args.trace:
        return None
    from hwdash.tracing import TraceUnavailable, check_trace_dependencies, trace_settings

    trace_settings(plan)  # a setting that cannot be traced: exit 2, before any output
    try:
        check_trace_dependencies(plan)
    except TraceUnavailable as exc:
        # The estimate needs none of torch/transformers/peft: print it, skip the trace.
        return str(exc).removeprefix("--trace: ")
    return None


def _evaluate(
    args: argparse.Namespace, plan: Plan, catalog: Any, model: Any, imported: Any
) -> tuple[Any, dict[str, Any]]:
    """(the report on the catalog's flavors, with warnings for the typed flags the plan ignores;
    the defaults the framework applied that the user did not choose)."""
    from hwdash.core.estimator.savers import applied_framework_defaults
    from hwdash.core.planning.fit import evaluate_plan

    argv = getattr(args, "argv", [])
    try:
        report = evaluate_plan(plan, catalog, model)
    except UsageError as exc:
        raise blame_the_file(exc, imported, argv, args.from_file) from None
    # What the framework set that the user did not: the text's "framework" line and --json say it.
    framework_defaults = applied_framework_defaults(
        plan, catalog.framework_for(plan), chosen_fields(argv, imported)
    )
    unused = unused_flag_warnings(plan, argv)
    if unused:
        report = dataclasses.replace(report, warnings=(*unused, *report.warnings))
    return report, framework_defaults


def _search_options(
    args: argparse.Namespace, plan: Plan, model: Any, catalog: Any, local: Any, report: Any
) -> tuple[Any, str]:
    """(the make-it-fit options, why they are shown): for ``--fit``, or when nothing fits."""
    from hwdash.commands import plan_fit

    if args.export is None and args.fit is not None:
        return plan_fit.search(plan, model, catalog, args.fit, local), ""
    if args.export is None and not args.json and not args.check and not report.recommended:
        # Nothing fits and no --fit: the top three options for the flavor asked (--flavor; of
        # several, the cheapest that comes close), else for the cheapest flavor that comes close.
        from hwdash.core.planning.fit_options import closest_flavor

        closest = closest_flavor(report)
        if closest is not None and closest.verdict is not FitVerdict.TIGHT:
            fit_result = plan_fit.search(plan, model, catalog, closest.flavor.id, local)
            if len(plan.flavors) == 1:
                return fit_result, "the flavor asked"
            if plan.flavors:
                return fit_result, "of the flavors asked, the cheapest that comes close"
            return fit_result, "nothing fits: the cheapest flavor that comes close"
    return None, ""


def _save(args: argparse.Namespace, plan: Plan, report: Any) -> tuple[str, str] | None:
    """With ``--save NAME``: the plan saved in the plans file, as (its name, where it went)."""
    if args.save is None:
        return None
    from hwdash.core.plans.store import PlanStore, PlanSummary

    store = PlanStore()
    saved = store.save(args.save, plan, summary=PlanSummary.from_report(report))
    return saved.name, f"saved plan '{saved.name}' to {store.path}"


def _print_outcome(args: argparse.Namespace, outcome: _Outcome) -> int:
    """Print the export, the JSON document, ``--check``'s line alone or the text report; the
    exit status (``--check``'s, or the export's)."""
    status = 0 if outcome.check is None else outcome.check[0]
    if outcome.max_fit is not None and outcome.max_fit.value is None:
        status = max(status, 1)  # --check's convention: 1 when nothing fits
    saved_message = None if outcome.saved is None else outcome.saved[1]
    if args.export == "vllm":
        _export_server(args, outcome)
        if not args.json:
            return status
    elif args.export is not None:
        status = export(
            args.export,
            outcome.report,
            outcome.catalog,
            args.output,
            check=outcome.check,
            force=args.force,
        )
        if not args.json:
            if saved_message is not None:
                print(saved_message, file=sys.stderr)
            return status
    if args.json:
        _print_json(args, outcome)
        return status
    if outcome.check is not None and args.fit is None and not args.trace:
        print(outcome.check[1])  # the guard's line alone
        if outcome.max_fit is not None:
            print(outcome.max_fit.sentence())
        if saved_message is not None:
            print(saved_message)
        return status
    _print_text(args, outcome)
    return status


def _print_json(args: argparse.Namespace, outcome: _Outcome) -> None:
    """The ``--json`` document on stdout (the check's line, the save and a skipped trace said on
    stderr)."""
    from hwdash.commands import plan_fit
    from hwdash.core.planning.budget import budget_json

    plan, report, check = outcome.plan, outcome.report, outcome.check
    document = report.to_json()
    budget = budget_json(report, document["flavors"])  # with --budget: each flavor's over_budget
    if budget is not None:
        document["budget"] = budget
    measured = outcome.measured
    document["measured_here"] = None if measured is None else measured.to_json()
    document["calibrated"] = bool(getattr(args, "calibrated", False)) and measured is not None
    if outcome.fit_result is not None:
        document["fit"] = plan_fit.fit_json(
            outcome.fit_result, outcome.catalog_args, outcome.catalog.framework_for(plan)
        )
    if outcome.machines:
        document["local"] = {
            ident: {"name": machine.flavor.name, "notes": list(machine.notes)}
            for ident, machine in outcome.machines.items()
        }
    document["details"] = [[label, value] for label, value in report.estimate.details]
    document["framework_defaults"] = outcome.framework_defaults
    if outcome.max_fit is not None:
        document["max"] = outcome.max_fit.to_json()
    if outcome.serving_settings is not None:
        document["serving"] = None if outcome.serving is None else outcome.serving[1].to_json()
        if outcome.serving is not None:
            from hwdash.commands.plan_batch import serving_batch
            from hwdash.core.planning.serving_plan import engine_json

            document["serving"]["flavor"] = outcome.serving[0]
            document["serving"].update(engine_json(outcome.serving[1]))
            batch = serving_batch(outcome.serving)  # None without --examples
            if batch is not None:
                document["serving"]["batch"] = batch.to_json()
    if check is not None:
        document["check"] = {"flavor": plan.flavors[0], "status": check[0], "message": check[1]}
        if args.export is None:  # (an export printed it)
            print(check[1], file=sys.stderr)
    if outcome.saved is not None:
        document["saved_as"] = outcome.saved[0]
        print(outcome.saved[1], file=sys.stderr)
    if outcome.trace_skipped is not None:
        document["trace"] = {"skipped": outcome.trace_skipped}
        print(f"hwdash: trace skipped: {outcome.trace_skipped}", file=sys.stderr)
    elif args.trace:
        from hwdash.commands.plan_trace import trace_json

        document["trace"] = trace_json(plan, outcome.model)
    sys.stdout.write(strict_json.dumps(document, indent=2) + "\n")


def _print_measured(args: argparse.Namespace, outcome: _Outcome) -> None:
    """What this box measured for similar plans, and whether ``--calibrated`` used it."""
    measured = outcome.measured
    calibrated = getattr(args, "calibrated", False)
    if measured is not None:
        used = " (used: --calibrated)" if calibrated else " (--calibrated uses it)"
        print(f"Measured here: {measured.sentence()}{used}")
    elif calibrated:
        print(
            "Measured here: no similar run in the runs ledger (same model and method): "
            "--calibrated changed nothing"
        )


def _print_text(args: argparse.Namespace, outcome: _Outcome) -> None:
    """The text report, then the options, the save, the trace and ``--check``'s line."""
    from hwdash.commands import plan_fit

    plan = outcome.plan
    render_report(
        outcome.report,
        local_notes=[n for m in outcome.machines.values() for n in m.notes],
        framework_defaults=outcome.framework_defaults,
        max_fit=outcome.max_fit,
    )
    if outcome.serving is not None:
        from hwdash.commands.plan_batch import serving_batch
        from hwdash.commands.plan_serving import serving_lines

        print("\n".join(serving_lines(outcome.serving[1], outcome.serving[0])))
        batch = serving_batch(outcome.serving)
        if batch is not None:
            print(f"  {batch.sentence()}")
    _print_measured(args, outcome)
    if outcome.fit_result is not None:
        from rich.console import Console

        auto = args.fit is None
        plan_fit.render_options(
            outcome.fit_result,
            Console(width=output_width()),
            limit=3 if auto else None,
            extra_args=outcome.catalog_args,
            framework=outcome.catalog.framework_for(plan),
            why=outcome.fit_why,
        )
    if outcome.saved is not None:
        print(outcome.saved[1])
    if outcome.trace_skipped is not None:
        print(f"hwdash: trace skipped: {outcome.trace_skipped}", file=sys.stderr)
    elif args.trace:
        from hwdash.commands.plan_trace import print_trace

        print_trace(plan, outcome.model)
    if outcome.check is not None:
        print(outcome.check[1])


def _export_server(args: argparse.Namespace, outcome: _Outcome) -> None:
    """``--export vllm``: the server's command line on stdout or in ``-o FILE``."""
    from hwdash.commands.plan_serving import server_command

    if outcome.serving is None:
        raise UsageError(
            "no GPU flavor to size the server for: give --flavor ID with a GPU", flag="--export"
        )
    model_id = outcome.model.hf_id or outcome.plan.model
    text = server_command(outcome.serving[1], model_id, outcome.plan.quant)
    if args.output is None:
        sys.stdout.write(text)
        return
    try:
        with open(args.output, "w" if args.force else "x", encoding="utf-8") as handle:
            handle.write(text)
    except FileExistsError:
        raise UsageError(exists_message(args.output), flag="-o") from None
    except OSError as exc:
        raise UsageError(
            f"cannot write '{args.output}': {exc.strerror or exc}", flag="-o"
        ) from None
    print(f"wrote {args.output}", file=sys.stderr)
