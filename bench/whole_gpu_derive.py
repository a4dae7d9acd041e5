"""hwdash's per-GPU plan against the public readings of the *derive* half (issue 29).

Plans only the rows whose split is "derive" (bench/whole_gpu_split.py decides it from the id); held-out rows are
never planned here, so their errors stay unseen until the end of the issue.

    python bench/whole_gpu_derive.py            # markdown table: reading, hwdash total, signed error, parts

Columns: `total` is hwdash's per-GPU total (JSON memory.total, which includes its flat CUDA context and
allocator-fragmentation guesses); `tensors` is the total less that overhead, the figure an allocated reading
compares with. Signed error = (hwdash - reading) / reading; negative is optimistic (an OOM risk).
"""

from __future__ import annotations

import json
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from whole_gpu_split import DERIVE, READINGS, ROOT, load_rows, split_for

GIB = 1024**3


def plan(args: str) -> dict:
    cmd = [sys.executable, "-m", "hwdash", "plan", *shlex.split(args), "--json"]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(res.stdout)


def main() -> int:
    rows = [row for row in load_rows(READINGS) if split_for(row["id"]) == DERIVE]
    print(
        "| id | parallel | offload | measure | reading GiB | hwdash total GiB | signed err | tensors GiB | err vs tensors |"
    )
    print("| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: |")
    errs: dict[str, list[float]] = {"nvml": [], "allocated": [], "reserved": []}
    for row in rows:
        mem = plan(row["hwdash_args"])["memory"]
        total = mem["total"] / GIB
        tensors = (mem["total"] - mem["overhead"]) / GIB
        reading = float(row["per_gpu_gib"])
        err = (total - reading) / reading
        err_t = (tensors - reading) / reading
        errs[row["measure"]].append(err_t if row["measure"] == "allocated" else err)
        print(
            f"| {row['id']} | {row['parallel']} | {row['offload']} | {row['measure']} | {reading:.2f} | "
            f"{total:.2f} | {err:+.1%} | {tensors:.2f} | {err_t:+.1%} |"
        )
    print()
    for measure, values in errs.items():
        if values:
            print(
                f"{measure}: {len(values)} rows, median signed error {statistics.median(values):+.1%} "
                f"({'tensors' if measure == 'allocated' else 'total'}), "
                f"median |err| {statistics.median(abs(v) for v in values):.1%}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
