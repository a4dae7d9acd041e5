"""Check (or assign) the derive / held-out split of bench/data/whole_gpu_readings.toml (issue 29).

The split is mechanical so that nobody chooses which public readings the whole-GPU formulas are fitted on:
a row is ``held_out`` when ``int(sha256(id).hexdigest(), 16) % 2 == 1`` and ``derive`` otherwise.

    python bench/whole_gpu_split.py                 # check: exit 1 and name every row whose split disagrees
    python bench/whole_gpu_split.py --assign        # rewrite each row's split line to the computed value
    python bench/whole_gpu_split.py --verify-args   # also run `hwdash plan ARGS --json` for every row and
                                                    # report exit codes only (no plan is printed or read)

The check also validates the fields the table promises (see the file's header comment), so a row that could
not be re-planned or compared is caught here rather than at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shlex
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
READINGS = ROOT / "bench" / "data" / "whole_gpu_readings.toml"
ACCELERATORS = ROOT / "catalog" / "accelerators.toml"

HELD_OUT = "held_out"
DERIVE = "derive"
PARALLEL = {"zero1", "zero2", "zero3", "fsdp1", "fsdp2", "ddp", "tp", "none"}
OFFLOAD = {"none", "optimizer", "optimizer+params"}
MEASURE = {"nvml", "allocated", "reserved"}
REQUIRED: dict[str, type | tuple[type, ...]] = {
    "id": str,
    "split": str,
    "source": str,
    "where": str,
    "model": str,
    "method": str,
    "precision": str,
    "gpus": int,
    "gpu": str,
    "parallel": str,
    "offload": str,
    "micro_batch": int,
    "seq_len": int,
    "grad_checkpointing": bool,
    "measure": str,
    "per_gpu_gib": (int, float),
    "notes": str,
    "hwdash_args": str,
}
ID_PATTERN = re.compile(r"^[a-z0-9][a-z0-9.-]*$")


def split_for(row_id: str) -> str:
    """The split the issue's rule gives a row id: odd sha256 -> held_out, even -> derive."""
    return (
        HELD_OUT if int(hashlib.sha256(row_id.encode("utf-8")).hexdigest(), 16) % 2 == 1 else DERIVE
    )


def load_rows(path: Path) -> list[dict]:
    with path.open("rb") as fh:
        data = tomllib.load(fh)
    rows = data.get("reading")
    if not isinstance(rows, list) or not rows:
        raise SystemExit(f"{path}: no [[reading]] rows")
    return rows


def accelerator_ids(path: Path = ACCELERATORS) -> set[str]:
    with path.open("rb") as fh:
        return {acc["id"] for acc in tomllib.load(fh).get("accelerator", [])}


def problems(rows: list[dict], accelerators: set[str]) -> list[str]:
    """Every disagreement with the split rule and every malformed field, one line each."""
    out: list[str] = []
    seen: set[str] = set()
    for n, row in enumerate(rows, 1):
        row_id = row.get("id", f"<row {n}>")
        for key, kind in REQUIRED.items():
            if key not in row:
                out.append(f"{row_id}: missing {key}")
            elif not isinstance(row[key], kind) or (kind is int and isinstance(row[key], bool)):
                out.append(
                    f"{row_id}: {key} = {row[key]!r} is not {getattr(kind, '__name__', kind)}"
                )
        if not isinstance(row.get("id"), str):
            continue
        if not ID_PATTERN.match(row_id):
            out.append(f"{row_id}: id is not a lower-case slug")
        if row_id in seen:
            out.append(f"{row_id}: duplicate id")
        seen.add(row_id)
        want = split_for(row_id)
        if row.get("split") != want:
            out.append(f"{row_id}: split is {row.get('split')!r}, the rule gives {want!r}")
        if row.get("parallel") not in PARALLEL:
            out.append(f"{row_id}: parallel {row.get('parallel')!r} not one of {sorted(PARALLEL)}")
        if row.get("offload") not in OFFLOAD:
            out.append(f"{row_id}: offload {row.get('offload')!r} not one of {sorted(OFFLOAD)}")
        if row.get("measure") not in MEASURE:
            out.append(f"{row_id}: measure {row.get('measure')!r} not one of {sorted(MEASURE)}")
        if row.get("gpu") not in accelerators:
            out.append(
                f"{row_id}: gpu {row.get('gpu')!r} is not an accelerator id of catalog/accelerators.toml"
            )
        value = row.get("per_gpu_gib")
        if isinstance(value, (int, float)) and not value > 0:
            out.append(f"{row_id}: per_gpu_gib must be positive")
        if not str(row.get("source", "")).startswith("https://"):
            out.append(f"{row_id}: source is not an https URL")
    return out


def assign(path: Path) -> int:
    """Rewrite the split line of every row to the rule's value; returns how many changed."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    changed = 0
    current: str | None = None
    for i, line in enumerate(lines):
        m = re.match(r'^id = "([^"]+)"', line)
        if m:
            current = m.group(1)
            continue
        if current is not None and line.startswith("split = "):
            new = f'split = "{split_for(current)}"\n'
            if line != new:
                lines[i] = new
                changed += 1
    path.write_text("".join(lines), encoding="utf-8")
    return changed


def verify_args(rows: list[dict], hwdash: list[str]) -> list[str]:
    """Run every row's hwdash_args; report only the rows that fail (exit code and stderr's last line)."""
    failed: list[str] = []
    for row in rows:
        cmd = [*hwdash, "plan", *shlex.split(row["hwdash_args"]), "--json"]
        res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            tail = (res.stderr.strip().splitlines() or ["(no stderr)"])[-1]
            failed.append(f"{row['id']}: exit {res.returncode}: {tail}")
    return failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--file", type=Path, default=READINGS, help="the readings TOML (default: %(default)s)"
    )
    parser.add_argument(
        "--assign", action="store_true", help="write each row's split instead of checking it"
    )
    parser.add_argument(
        "--verify-args",
        action="store_true",
        help="run every row's hwdash_args and report exit codes only",
    )
    parser.add_argument(
        "--hwdash",
        default=f"{sys.executable} -m hwdash",
        help="how to run hwdash for --verify-args (default: this interpreter's -m hwdash)",
    )
    args = parser.parse_args(argv)
    if args.assign:
        print(f"{args.file}: {assign(args.file)} split line(s) rewritten")
    rows = load_rows(args.file)
    found = problems(rows, accelerator_ids())
    for line in found:
        print(line, file=sys.stderr)
    if args.verify_args:
        failed = verify_args(rows, shlex.split(args.hwdash))
        for line in failed:
            print(line, file=sys.stderr)
        found += failed
        print(f"hwdash_args: {len(rows) - len(failed)} of {len(rows)} rows run without error")
    counts = {DERIVE: 0, HELD_OUT: 0}
    for row in rows:
        counts[split_for(row["id"])] += 1
    print(
        f"{len(rows)} readings: {counts[DERIVE]} derive, {counts[HELD_OUT]} held_out; {len(found)} problem(s)"
    )
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
