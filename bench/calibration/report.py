"""The committed calibration table (CSV) and the generated blocks of ``docs/accuracy.md``.

Two halves. :func:`csv_row` turns a trace record (``bench/out/calibration.jsonl``, torch needed to make
it) into the measured columns of ``bench/data/calibration.csv``. Everything after that needs only the
CSV and hwdash: :func:`score_rows` fills the estimate and anchor columns (through
``bench/estimator_errors.py``, the scorer the unit tests use) and :func:`update_accuracy_doc` rewrites
the generated blocks of the doc. ``python bench/report_accuracy.py`` runs the second half alone.
"""

from __future__ import annotations

import csv
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import estimator_errors
import tomllib

from calibration.anchors import ANCHORS
from hwdash.core.catalog import Catalog
from hwdash.core.estimator import estimate_memory
from hwdash.core.plan import Plan

GIB = 1024**3

CSV_COLUMNS = (
    "case_id",
    "model",
    "method",
    "precision",
    "batch",
    "seq",
    "grad_ckpt",
    "attention",
    "optimizer",
    "optimizer_impl",
    "lora_r",
    "lora_targets",
    "lora_dropout",
    "sdpa_backend",
    "held_out",
    "kernel_matches_cuda",
    "layers",
    "traced_depths",
    "total_params",
    "trainable_params",
    "peak_bytes",
    "peak_step",
    "peak_phase",
    "peak_parameter",
    "peak_gradient",
    "peak_optimizer",
    "peak_activation",
    "peak_temp",
    "peak_buffer",
    "peak_other",
    "first_step_peak_bytes",
    "later_step_peak_bytes",
    "attention_ops",
    "trace_seconds",
    "autocast",
    "depth_note",
    "step_peak_bytes",
    "versions",
    "cuda_peak_bytes",
    "est_peak_phase",
    "est_total",
    "est_without_overhead",
    "est_weights",
    "est_gradients",
    "est_optimizer",
    "est_activations",
    "est_kv_cache",
    "est_overhead",
    "error",
    "error_with_overhead",
    "estimate_pending",
    "accelerate_bytes",
    "accelerate_error",
    "deepspeed_bytes",
    "deepspeed_error",
    "seed_bytes",
    "seed_error",
)


def _fmt_error(value: float | None) -> str:
    return "" if value is None else f"{value:.4f}"


def csv_row(record: dict[str, Any]) -> dict[str, Any]:
    """One CSV row (bytes as integers, errors as fractions) from a compared record."""
    plan = record["plan"]
    row: dict[str, Any] = {
        "case_id": record["case_id"],
        "model": plan["model"],
        "method": plan["method"],
        "precision": plan["precision"],
        "batch": plan["batch"],
        "seq": plan["seq"],
        "grad_ckpt": plan["grad_ckpt"],
        "attention": plan["attention"],
        "optimizer": plan["optimizer"],
        "optimizer_impl": record["optimizer_impl"],
        "lora_r": plan["lora_r"],
        "lora_targets": "+".join(plan["lora_targets"]),
        "lora_dropout": record["lora_dropout"],
        "sdpa_backend": record.get("sdpa_backend", "auto"),
        "kernel_matches_cuda": record["kernel_matches_cuda"],
        "layers": record["layers"],
        "traced_depths": "+".join(str(d) for d in record["traced_depths"]),
        "total_params": record["total_params"],
        "trainable_params": record["trainable_params"],
        "peak_bytes": record["peak_bytes"],
        "peak_step": record["peak_step"],
        "peak_phase": record["peak_phase"],
        "first_step_peak_bytes": record["first_step_peak_bytes"],
        "later_step_peak_bytes": record["later_step_peak_bytes"] or "",
        "attention_ops": "+".join(record["attention_ops"]),
        "trace_seconds": record["trace_seconds"],
        "autocast": record.get("autocast", plan["precision"] == "amp"),
        "depth_note": record.get("depth_note", ""),
        "step_peak_bytes": record.get("step_peak_bytes") or "",
        "versions": ", ".join(f"{k} {v}" for k, v in record["versions"].items()),
    }
    for name, value in record["peak_components"].items():
        row[f"peak_{name}"] = value
    return {name: row.get(name, "") for name in CSV_COLUMNS}


def read_csv(path: Path) -> list[dict[str, Any]]:
    """The rows of the committed table, as strings."""
    with path.open(encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def write_csv(rows: Iterable[dict[str, Any]], path: Path) -> None:
    """The committed ground-truth table, sorted by case id."""
    path.parent.mkdir(parents=True, exist_ok=True)
    ordered = sorted(rows, key=lambda r: r["case_id"])
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows({name: row.get(name, "") for name in CSV_COLUMNS} for row in ordered)


def score_row(row: dict[str, Any], catalog: Catalog) -> dict[str, Any]:
    """A copy of a CSV row with the estimate and anchor columns filled in.

    Every rule is scored against ``cuda_peak_bytes``: the traced peak with the CPU-only storage (LoRA
    dropout masks kept as fp32 instead of CUDA's bool) converted by
    :func:`estimator_errors.cuda_equivalent_peak`. hwdash's ``error`` is on its total without the
    ``overhead`` component (a trace sees tensor bytes only); ``error_with_overhead`` keeps it.
    """
    out = dict(row)
    plan = estimator_errors.plan_of(row)
    spec = catalog.models[plan.model]
    measured = estimator_errors.cuda_equivalent_peak(row, plan, catalog)
    out["cuda_peak_bytes"] = measured
    estimate = estimate_memory(plan, spec, gpus=1)
    parts = estimate.per_gpu.as_dict()
    out["est_peak_phase"] = estimate.peak_phase
    out["est_total"] = parts["total"]
    out["est_without_overhead"] = parts["total"] - parts["overhead"]
    for name in ("weights", "gradients", "optimizer", "activations", "kv_cache", "overhead"):
        out[f"est_{name}"] = parts[name]
    out["error"] = _fmt_error((out["est_without_overhead"] - measured) / measured)
    out["error_with_overhead"] = _fmt_error((parts["total"] - measured) / measured)
    out["estimate_pending"] = False
    anchor_input = {
        "plan": {
            "method": row["method"],
            "precision": row["precision"],
            "optimizer": row["optimizer"],
        },
        "total_params": row["total_params"],
        "trainable_params": row["trainable_params"],
    }
    for name, rule in ANCHORS.items():
        predicted = rule(anchor_input)
        out[f"{name}_bytes"] = "" if predicted is None else predicted
        out[f"{name}_error"] = (
            "" if predicted is None else _fmt_error((predicted - measured) / measured)
        )
    return out


def score_rows(rows: list[dict[str, Any]], catalog: Catalog) -> list[dict[str, Any]]:
    """:func:`score_row` for every row."""
    return [score_row(row, catalog) for row in rows]


def _floats(rows: list[dict[str, Any]], column: str) -> list[float]:
    return [float(r[column]) for r in rows if r.get(column, "") != ""]


def _error_stats(errors: list[float]) -> str:
    if not errors:
        return "| 0 | n/a | n/a |"
    absolute = [abs(e) for e in errors]
    worst = max(errors, key=abs)
    return f"| {len(errors)} | {statistics.median(absolute) * 100:.1f}% | {worst * 100:+.1f}% |"


def _comparable(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r["kernel_matches_cuda"] == "True"]


def is_held_out(row: dict[str, Any]) -> bool:
    """A held-out case of issue 14 (new architecture or untried setting; ``held_out`` column)."""
    return str(row.get("held_out", "")) == "True"


def _grid(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if not is_held_out(r)]


def _under_stats(errors: list[float]) -> str:
    under = [e for e in errors if e < 0]
    return f"{min(under) * 100:+.1f}%" if under else "none"


def held_out_summary(rows: list[dict[str, Any]]) -> str:
    """Markdown: hwdash's error per method on the held-out cases, then on the tuning grid."""
    rows = [r for r in _comparable(rows) if r.get("error", "") != ""]
    lines = [
        "| method | held-out rows | held-out median abs. error | held-out worst | held-out worst "
        "underestimate | grid rows | grid median abs. error | grid worst |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    methods = sorted({r["method"] for r in rows if is_held_out(r)})
    blind = "all, not seen while fixing"
    for method in [*methods, "all", blind]:
        group = [r for r in rows if method in ("all", blind, r["method"])]
        if method == blind:
            group = [r for r in group if not estimator_errors.seen_while_fixing(r["case_id"])]
        held = _floats([r for r in group if is_held_out(r)], "error")
        grid = _floats(_grid(group), "error")
        held_stats = _error_stats(held).strip("|").strip()
        grid_stats = _error_stats(grid).strip("|").strip()
        lines.append(
            f"| {method} | {held_stats} | {_under_stats(held)} | {grid_stats} |".replace(
                " |  | ", " | "
            )
        )
    return "\n".join(lines)


def held_out_rows(rows: list[dict[str, Any]]) -> str:
    """Markdown: every held-out case with its traced peak, hwdash's estimate and the error."""
    rows = sorted(
        (r for r in rows if is_held_out(r) and r.get("error", "") != ""),
        key=lambda r: float(r["error"]),
    )
    lines = [
        "| case | traced peak GiB (CUDA masks) | hwdash GiB (no overhead) | error | traced peak at "
        "| hwdash peak at | seen while fixing (gap) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        note = "" if r["kernel_matches_cuda"] == "True" else " (kernel differs from CUDA's)"
        seen = estimator_errors.seen_while_fixing(r["case_id"])
        lines.append(
            f"| `{r['case_id']}`{note} | {int(r['cuda_peak_bytes']) / GIB:.2f} | "
            f"{int(r['est_without_overhead']) / GIB:.2f} | {float(r['error']) * 100:+.1f}% | "
            f"step {r['peak_step']} {r['peak_phase']} | {r['est_peak_phase']} | {seen} |"
        )
    return "\n".join(lines)


def not_expressible_table() -> str:
    """Markdown: the architectures issue 14 asked for that hwdash cannot express, and why."""
    from calibration.cases import NOT_EXPRESSIBLE

    lines = ["| architecture | why hwdash cannot express it |", "| --- | --- |"]
    for name, why in NOT_EXPRESSIBLE.items():
        lines.append(f"| {name} | {why} |")
    return "\n".join(lines)


def known_gap(row: dict[str, Any]) -> str:
    """Why the estimator is known to miss this row's mechanism, or ''."""
    if row["model"] in estimator_errors.KNOWN_GAP_MODELS:
        return estimator_errors.KNOWN_GAP_MODELS[row["model"]]
    if (row["model"], row["method"]) in estimator_errors.KNOWN_GAP_MODEL_METHODS:
        return estimator_errors.KNOWN_GAP_MODEL_METHODS[(row["model"], row["method"])]
    if row["method"] == "dora" and float(row["lora_dropout"]) > 0 and row["grad_ckpt"] != "True":
        return estimator_errors.KNOWN_GAP_DORA_DROPOUT
    return ""


def error_table(rows: list[dict[str, Any]]) -> str:
    """Markdown: median |error| and worst signed error per method: hwdash on tuned and held-out
    models (and held out without the known gaps), then each anchor on all rows. Tuning-grid rows
    only: the held-out cases of issue 14 have their own table (:func:`held_out_summary`)."""
    rows = _comparable(_grid(rows))
    tuned_models = estimator_errors.TUNED_MODELS
    lines = [
        "| method | rule | models | rows | median abs. error | worst error |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for method in sorted({r["method"] for r in rows}):
        group = [r for r in rows if r["method"] == method]
        tuned = [r for r in group if r["model"] in tuned_models]
        held = [r for r in group if r["model"] not in tuned_models]
        held_clean = [r for r in held if not known_gap(r)]
        for label, subset in (
            ("tuned", tuned),
            ("held out", held),
            ("held out, known gaps aside", held_clean),
            ("all", group),
        ):
            if subset:
                lines.append(
                    f"| {method} | hwdash | {label} {_error_stats(_floats(subset, 'error'))}"
                )
        for anchor in ANCHORS:
            errors = _floats(group, f"{anchor}_error")
            if errors:
                lines.append(f"| {method} | {anchor} | all {_error_stats(errors)}")
    return "\n".join(lines)


def gap_table(rows: list[dict[str, Any]]) -> str:
    """Markdown: hwdash's error on the rows of each known gap (tuning grid)."""
    rows = _comparable(_grid(rows))
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        why = known_gap(r)
        if why:
            key = "DoRA + dropout" if r["method"] == "dora" else f"{r['model']} {r['method']}"
            groups.setdefault(key, []).append(r)
    lines = [
        "| gap | what the estimator misses | rows | median abs. error | worst error |",
        "| --- | --- | --- | --- | --- |",
    ]
    for key, group in sorted(groups.items()):
        lines.append(f"| {key} | {known_gap(group[0])} {_error_stats(_floats(group, 'error'))}")
    return "\n".join(lines)


def worst_rows(rows: list[dict[str, Any]], count: int = 12) -> str:
    """Markdown: the rows of the tuning grid where hwdash is furthest off."""
    rows = [r for r in _comparable(_grid(rows)) if r.get("error", "") != ""]
    rows.sort(key=lambda r: abs(float(r["error"])), reverse=True)
    lines = [
        "| case | measured GiB (CUDA masks) | hwdash GiB (no overhead) | error | traced peak | hwdash peak | known gap |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows[:count]:
        lines.append(
            f"| `{r['case_id']}` | {int(r['cuda_peak_bytes']) / GIB:.2f} | "
            f"{int(r['est_without_overhead']) / GIB:.2f} | {float(r['error']) * 100:+.1f}% | "
            f"step {r['peak_step']} {r['peak_phase']} | {r['est_peak_phase']} | "
            f"{'yes' if known_gap(r) else ''} |"
        )
    return "\n".join(lines)


def peak_location_table(rows: list[dict[str, Any]]) -> str:
    """Markdown: in how many rows of each method the peak falls in which step and phase."""
    counts: dict[tuple[str, str], int] = {}
    for r in rows:
        key = (r["method"], f"step {r['peak_step']} {r['peak_phase']}")
        counts[key] = counts.get(key, 0) + 1
    lines = ["| method | peak at | rows |", "| --- | --- | --- |"]
    for (method, where), count in sorted(counts.items()):
        lines.append(f"| {method} | {where} | {count} |")
    return "\n".join(lines)


def step_peak_table(rows: list[dict[str, Any]]) -> str:
    """Markdown: bytes per parameter at the optimizer-step peak of full fine-tuning rows."""
    lines = [
        "| layout | optimizer | rows | bytes/param at the step peak (min-max) |",
        "| --- | --- | --- | --- |",
    ]
    groups: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        if r["method"] != "full" or r.get("step_peak_bytes", "") == "":
            continue
        key = (r["precision"], f"{r['optimizer']} ({r['optimizer_impl']})")
        groups.setdefault(key, []).append(int(r["step_peak_bytes"]) / int(r["total_params"]))
    for (precision, optimizer), values in sorted(groups.items()):
        lines.append(
            f"| {precision} | {optimizer} | {len(values)} | {min(values):.2f}-{max(values):.2f} |"
        )
    return "\n".join(lines)


#: The memory-saving value of each Plan field a published source may leave open (the same reading
#: as ``tests/unit/test_published_peaks.py``: a bound must hold for the cheapest reading).
CHEAPEST_READING = {"grad_ckpt": True, "optimizer": "adamw-8bit"}
PUBLISHED_TOLERANCE = 0.15


def published_table(path: Path, catalog: Catalog) -> str:
    """Markdown: hwdash's estimate (overhead included) against each published peak."""
    entries = tomllib.loads(path.read_text(encoding="utf-8"))["peak"]
    lines = [
        "| source id | kind | published | hwdash (with overhead) | ratio | verdict |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for entry in entries:
        published = float(entry["measured_gb"])
        unit = entry.get("unit", "GB")
        why = ""
        if not entry["expressible"]:
            why = "not expressible"
        elif entry["plan"]["model"] not in catalog.models:
            why = "model not in the catalog"
        elif set(entry.get("unknown", [])) - set(CHEAPEST_READING):
            why = "source leaves settings open"
        if why:
            lines.append(
                f"| {entry['id']} | {entry['kind']} | {published:g} {unit} | | | skipped: {why} |"
            )
            continue
        fields = dict(entry["plan"])
        if "lora_targets" in fields:
            fields["lora_targets"] = tuple(fields["lora_targets"])
        for name in entry.get("unknown", []):
            fields[name] = CHEAPEST_READING[name]
        plan = Plan(**fields)
        estimate = estimate_memory(plan, catalog.models[plan.model]).per_gpu.total
        # GPU sizes and tool printouts in "GB" are read as GiB, the generous reading for a bound
        ratio = estimate / (published * 2**30)
        if entry["kind"] == "peak":
            verdict = "within 15%" if abs(ratio - 1) <= PUBLISHED_TOLERANCE else "OFF by > 15%"
        else:
            verdict = (
                "under the bound (+15%)" if ratio <= 1 + PUBLISHED_TOLERANCE else "ABOVE the bound"
            )
        lines.append(
            f"| {entry['id']} | {entry['kind']} | {published:g} {unit} | "
            f"{estimate / GIB:.1f} GiB | {ratio:.2f} | {verdict} |"
        )
    return "\n".join(lines)


BEGIN_MARK = (
    "<!-- calibration:begin (generated by bench/report_accuracy.py; do not edit by hand) -->"
)
END_MARK = "<!-- calibration:end -->"
PUBLISHED_BEGIN = "<!-- published:begin (generated by bench/report_accuracy.py) -->"
PUBLISHED_END = "<!-- published:end -->"


def generated_block(rows: list[dict[str, Any]]) -> str:
    """The results block of ``docs/accuracy.md``, from scored CSV rows."""
    versions = sorted({r.get("versions", "") for r in rows} - {""})
    seconds = sum(float(r["trace_seconds"]) for r in rows)
    left_out = sum(1 for r in rows if r["kernel_matches_cuda"] != "True")
    autocast_rows = sum(1 for r in rows if r.get("autocast") == "True" and r["precision"] != "amp")
    full_depth = sum(1 for r in rows if r.get("depth_note"))
    tuned = ", ".join(sorted(estimator_errors.TUNED_MODELS))
    grid_models = {r["model"] for r in _grid(rows)}
    held = ", ".join(sorted(grid_models - estimator_errors.TUNED_MODELS))
    held_cases = [r for r in rows if is_held_out(r)]
    new_models = ", ".join(sorted({r["model"] for r in held_cases} - grid_models))
    parts = [
        BEGIN_MARK,
        "",
        "### Held-out cases (issue 14): scored first",
        "",
        f"{len(held_cases)} cases no formula was derived from or checked on before they were traced:",
        f"new architectures ({new_models or 'none'}) and settings the grid had not traced on",
        "known models. hwdash without its `overhead` component against the traced peak with CUDA's",
        "dropout masks; the grid's columns repeat the tuning grid's scores for comparison.",
        f"{sum(1 for r in held_cases if estimator_errors.seen_while_fixing(r['case_id']))} of them",
        "had their errors looked at while a gap was closed afterwards (last column of the case",
        "table; `SEEN_WHILE_FIXING` in `bench/estimator_errors.py`): they are no longer blind, and",
        "the summary's last row scores the held-out cases without them.",
        "",
        held_out_summary(rows),
        "",
        held_out_rows(rows),
        "",
        "Asked for but not expressible in hwdash's model spec, so not traced or scored:",
        "",
        not_expressible_table(),
        "",
        "### The tuning grid",
        "",
        f"Rows: {len(rows)} traced cases; {left_out} left out of the scores because their attention",
        f"kernel differs from CUDA's; {autocast_rows} bf16 LoRA/DoRA rows traced under autocast;",
        f"{full_depth} rows traced at full depth because the two-depth line went negative.",
        f"Traced with {'; '.join(versions) or '?'}: {seconds:.0f} s of tracing in all.",
        "",
        f"Tuned models: {tuned}. Held out: {held}.",
        "",
        "### Error per method",
        "",
        "Error = (estimate - measured) / measured, measured = the traced peak with CPU dropout masks",
        "converted to CUDA's (`cuda_peak_bytes`). hwdash without its `overhead` component.",
        "",
        error_table(rows),
        "",
        "### The known gaps",
        "",
        gap_table(rows),
        "",
        "### Where hwdash is furthest off",
        "",
        worst_rows(rows),
        "",
        "### Where the peak falls",
        "",
        peak_location_table(rows),
        "",
        "### The optimizer step, full fine-tuning",
        "",
        step_peak_table(rows),
        "",
        END_MARK,
    ]
    return "\n".join(parts)


def _replace_block(text: str, begin: str, end: str, block: str) -> str | None:
    start = text.find(begin)
    stop = text.find(end)
    if start < 0 or stop < 0:
        return None
    return text[:start] + block + text[stop + len(end) :]


def update_accuracy_doc(
    rows: list[dict[str, Any]], path: Path, published: Path, catalog: Catalog
) -> bool:
    """Rewrite the results and published-peaks blocks of ``docs/accuracy.md``.

    False (and nothing written) when a block's markers are missing.
    """
    if not path.exists():
        return False
    text = path.read_text(encoding="utf-8")
    new = _replace_block(text, BEGIN_MARK, END_MARK, generated_block(rows))
    if new is None:
        return False
    table = f"{PUBLISHED_BEGIN}\n\n{published_table(published, catalog)}\n\n{PUBLISHED_END}"
    new = _replace_block(new, PUBLISHED_BEGIN, PUBLISHED_END, table)
    if new is None:
        return False
    path.write_text(new, encoding="utf-8")
    return True


FINDINGS_BEGIN = "<!-- findings:begin (generated by bench/calibrate.py --findings) -->"
FINDINGS_END = "<!-- findings:end -->"


def update_findings_doc(table: str, path: Path) -> bool:
    """Replace the findings table of ``docs/accuracy.md``; False when the markers are missing."""
    if not path.exists():
        return False
    text = path.read_text(encoding="utf-8")
    start = text.find(FINDINGS_BEGIN)
    end = text.find(FINDINGS_END)
    if start < 0 or end < 0:
        return False
    block = f"{FINDINGS_BEGIN}\n\n{table}\n\n{FINDINGS_END}"
    path.write_text(text[:start] + block + text[end + len(FINDINGS_END) :], encoding="utf-8")
    return True
