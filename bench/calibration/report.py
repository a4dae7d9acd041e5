"""Write the committed calibration table (CSV) and the generated block of ``docs/accuracy.md``."""

from __future__ import annotations

import csv
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

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
        "kernel_matches_cuda": record.get("kernel_matches_cuda", True),
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
    }
    for name, value in record["peak_components"].items():
        row[f"peak_{name}"] = value
    estimate = record.get("estimate") or {}
    components = estimate.get("components", {})
    row["est_total"] = estimate.get("total", "")
    row["est_without_overhead"] = estimate.get("without_overhead", "")
    for name in ("weights", "gradients", "optimizer", "activations", "kv_cache", "overhead"):
        row[f"est_{name}"] = components.get(name, "")
    row["error"] = _fmt_error(record.get("error"))
    row["error_with_overhead"] = _fmt_error(record.get("error_with_overhead"))
    row["estimate_pending"] = record.get("estimate_pending", True)
    for name, anchor in (record.get("anchors") or {}).items():
        row[f"{name}_bytes"] = "" if anchor["bytes"] is None else anchor["bytes"]
        row[f"{name}_error"] = _fmt_error(anchor["error"])
    return row


def write_csv(records: Iterable[dict[str, Any]], path: Path) -> None:
    """The committed ground-truth table, sorted by case id."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = sorted((csv_row(r) for r in records), key=lambda r: r["case_id"])
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def _error_stats(errors: list[float]) -> str:
    if not errors:
        return "| n/a | n/a | n/a |"
    absolute = [abs(e) for e in errors]
    worst = max(errors, key=abs)
    return f"| {len(errors)} | {statistics.median(absolute) * 100:.1f}% | {worst * 100:+.1f}% |"


def error_table(records: list[dict[str, Any]]) -> str:
    """Markdown: median |error| and worst signed error per method, for hwdash and each anchor.

    Rows whose attention kernel differs from what CUDA would run (``kernel_matches_cuda`` false) are
    left out.
    """
    records = [r for r in records if r.get("kernel_matches_cuda", True)]
    methods = sorted({r["plan"]["method"] for r in records})
    lines = [
        "| method | rule | rows | median abs. error | worst error |",
        "| --- | --- | --- | --- | --- |",
    ]
    for method in methods:
        rows = [r for r in records if r["plan"]["method"] == method]
        hwdash = [r["error"] for r in rows if r.get("error") is not None]
        lines.append(f"| {method} | hwdash {_error_stats(hwdash)}")
        for anchor in ("accelerate", "deepspeed", "seed"):
            errors = [
                r["anchors"][anchor]["error"]
                for r in rows
                if r.get("anchors") and r["anchors"][anchor]["error"] is not None
            ]
            if errors:
                lines.append(f"| {method} | {anchor} {_error_stats(errors)}")
    return "\n".join(lines)


def worst_rows(records: list[dict[str, Any]], count: int = 12) -> str:
    """Markdown: the rows where hwdash is furthest off."""
    rows = [r for r in records if r.get("error") is not None and r.get("kernel_matches_cuda", True)]
    rows.sort(key=lambda r: abs(r["error"]), reverse=True)
    lines = [
        "| case | measured GiB | hwdash GiB (no overhead) | error | peak at |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in rows[:count]:
        lines.append(
            f"| `{r['case_id']}` | {r['peak_bytes'] / GIB:.2f} | "
            f"{r['estimate']['without_overhead'] / GIB:.2f} | {r['error'] * 100:+.1f}% | "
            f"step {r['peak_step']} {r['peak_phase']} |"
        )
    return "\n".join(lines)


def peak_location_table(records: list[dict[str, Any]]) -> str:
    """Markdown: in how many rows of each method the peak falls in which step and phase."""
    counts: dict[tuple[str, str], int] = {}
    for r in records:
        where = f"step {r['peak_step']} {r['peak_phase']}"
        key = (r["plan"]["method"], where)
        counts[key] = counts.get(key, 0) + 1
    lines = ["| method | peak at | rows |", "| --- | --- | --- |"]
    for (method, where), count in sorted(counts.items()):
        lines.append(f"| {method} | {where} | {count} |")
    return "\n".join(lines)


def step_peak_table(records: list[dict[str, Any]]) -> str:
    """Markdown: bytes per parameter at the optimizer-step peak of full fine-tuning rows."""
    lines = [
        "| layout | optimizer | rows | bytes/param at the step peak (min-max) |",
        "| --- | --- | --- | --- |",
    ]
    groups: dict[tuple[str, str], list[float]] = {}
    for r in records:
        plan = r["plan"]
        if plan["method"] != "full":
            continue
        step_peaks = [p for p in r["phases"] if p["phase"] == "optimizer"]
        if not step_peaks:
            continue
        worst = max(step_peaks, key=lambda p: p["total"])
        key = (plan["precision"], f"{plan['optimizer']} ({r['optimizer_impl']})")
        groups.setdefault(key, []).append(worst["total"] / r["total_params"])
    for (precision, optimizer), values in sorted(groups.items()):
        lines.append(
            f"| {precision} | {optimizer} | {len(values)} | {min(values):.2f}-{max(values):.2f} |"
        )
    return "\n".join(lines)


BEGIN_MARK = "<!-- calibration:begin (generated by bench/calibrate.py; do not edit by hand) -->"
END_MARK = "<!-- calibration:end -->"


def generated_block(records: list[dict[str, Any]]) -> str:
    """The part of ``docs/accuracy.md`` that ``bench/calibrate.py`` rewrites."""
    pending = sum(1 for r in records if r.get("estimate_pending", True))
    versions = records[0]["versions"] if records else {}
    seconds = sum(float(r["trace_seconds"]) for r in records)
    parts = [
        BEGIN_MARK,
        "",
        f"Rows: {len(records)} traced cases ({pending} without an hwdash estimate). "
        f"torch {versions.get('torch', '?')}, transformers {versions.get('transformers', '?')}, "
        f"peft {versions.get('peft', '?')}; {seconds:.0f} s of tracing in all.",
        "",
        "### Error per method",
        "",
        "Error = (estimate - traced peak) / traced peak. hwdash is scored without its `overhead`",
        "component (CUDA context, allocator slack), which a fake-tensor trace cannot see. Rows whose",
        "attention kernel differs from the one CUDA would run (`kernel_matches_cuda = False` in the",
        f"CSV: {sum(1 for r in records if not r.get('kernel_matches_cuda', True))} rows) are left out.",
        "",
        error_table(records),
        "",
        "### Where hwdash is furthest off",
        "",
        worst_rows(records),
        "",
        "### Where the peak falls",
        "",
        "Step 1 is the first step (no optimizer states until its `optimizer.step()`); step 2 is every",
        "later one. `forward` includes the loss; `backward` starts with the loss gradient.",
        "",
        peak_location_table(records),
        "",
        "### The optimizer step, full fine-tuning",
        "",
        "Bytes per parameter at the highest optimizer-step peak (weights, gradients, states and the",
        "step's temporaries; the activations are gone by then).",
        "",
        step_peak_table(records),
        "",
        END_MARK,
    ]
    return "\n".join(parts)


def update_accuracy_doc(records: list[dict[str, Any]], path: Path) -> bool:
    """Replace the generated block of ``docs/accuracy.md``; False when the markers are missing."""
    if not path.exists():
        return False
    text = path.read_text(encoding="utf-8")
    start = text.find(BEGIN_MARK)
    end = text.find(END_MARK)
    if start < 0 or end < 0:
        return False
    new = text[:start] + generated_block(records) + text[end + len(END_MARK) :]
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
