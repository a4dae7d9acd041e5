"""How long ``hwdash runs`` and ``hwdash report`` take on a large runs ledger (issue 26: < 1 s).

    .venv/bin/python bench/ledger_bench.py [--megabytes 100] [--repeat 5]

Writes a ledger of realistic version-1 records (every key of the design, a two-GPU run in five, a
command line of a few hundred characters: about 1.2 KB a record) to a temporary folder, the runs
spread over the past years with the newest few in the last 12 hours, and an alert log of 20,000
events. Then times, in this process, median of ``--repeat`` runs each (the file in the page cache
after the first):

* ``hwdash runs --json``: ``ledger.read(last=50)`` and the JSON text of the records;
* ``hwdash runs``: the same read and the text table;
* ``hwdash report --since 12h``: the ledger read for the window, the alert log read, the report
  built and written as text;
* ``hwdash runs show ID`` of the oldest run (the whole file is read: the slow case, for the record);
* ``ledger.read()`` of the whole file (no limit; nothing in hwdash does this on every call);
* ``ledger.read(last=50)`` again once the last line is cut short (its warning names its line
  number, which counts the newlines before it);

and then the three commands whole, ``python -m hwdash ...`` in a new process each time.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from hwdash.commands.report import read_alerts
from hwdash.core import strict_json
from hwdash.runs import ledger
from hwdash.runs.report import build_report, report_text
from hwdash.runs.table import runs_table

GPU_NAME = "NVIDIA H100 80GB HBM3"
MODELS = ("llama-3.1-8b", "qwen2.5-7b", "mistral-7b", None)
METHODS = ("lora", "qlora", "full")


def record(rng: random.Random, pid: int, ended: float) -> dict[str, object]:
    """One realistic record (every key of issue 26's design)."""
    seconds = rng.uniform(600, 8 * 3600)
    started = ended - seconds
    gpus = 2 if pid % 5 == 0 else 1
    tokens_per_s = rng.uniform(800, 9000)
    planned = rng.randrange(20, 75) * 10**9
    measured = int(planned * rng.uniform(0.9, 1.1))
    flags = " ".join(f"--opt{n}={rng.random():.6f}" for n in range(12))
    return {
        "version": 1,
        "id": ledger.make_id("trainbox", pid, started),
        "host": "trainbox",
        "user": "ada",
        "pid": pid,
        "command": f"python -m trl.scripts.sft --model_name_or_path org/model {flags}",
        "started": started,
        "ended": ended,
        "duration_s": seconds,
        "exit": rng.choice(("normal", "normal", "normal", "oom", "killed", "error")),
        "gpus": [
            {
                "uuid": f"GPU-{index:08x}-1111-2222-3333-444455556666",
                "name": GPU_NAME,
                "index": index,
            }
            for index in range(gpus)
        ],
        "plan": rng.choice(("sft-8b", None, "/home/ada/plans/run.json")),
        "model": rng.choice(MODELS),
        "method": rng.choice(METHODS),
        "steps": rng.randrange(100, 20000),
        "tokens": int(tokens_per_s * seconds),
        "tokens_estimated": rng.random() < 0.3,
        "samples": rng.randrange(1000, 100000),
        "tokens_per_s": tokens_per_s,
        "mfu": rng.uniform(0.2, 0.55),
        "flops_per_token": 4.8e10,
        "peak_tflops": 989.0,
        "energy_kwh": seconds / 3600 * 0.6 * gpus,
        "price_per_hour": 4.5 * gpus,
        "cost_usd": seconds / 3600 * 4.5 * gpus,
        "measured_peak_bytes": measured,
        "measured_peak_allocated_bytes": int(measured * 0.95),
        "planned_peak_bytes": planned,
        "peak_error": measured / planned - 1,
    }


def write_files(folder: Path, megabytes: float, now: float) -> tuple[Path, Path, str, int]:
    """The ledger and the alert log; the oldest run's id and the number of records."""
    rng = random.Random(26)
    path = folder / "hwdash" / "runs.jsonl"
    path.parent.mkdir(parents=True, mode=0o700)
    sample = random.Random(0)
    average = statistics.mean(len(ledger.encode(record(sample, n, now))) for n in range(500))
    count = int(megabytes * 1e6 / average)
    # End times spread evenly up to now, one every 36 minutes: the newest 20 in the last 12 hours.
    step = 0.6 * 3600
    first_id = ""
    with path.open("wb") as file:
        for n in range(count):
            data = record(rng, 1000 + n, now - (count - n) * step)
            first_id = first_id or str(data["id"])
            file.write(ledger.encode(data))
    path.chmod(0o600)
    alerts = folder / "hwdash" / "alerts.jsonl"
    with alerts.open("w") as file:
        for n in range(20000):
            stamp = now - (20000 - n) * 900.0
            event = {
                "kind": "raised",
                "gpu_index": n % 2,
                "gpu_name": GPU_NAME,
                "host": "trainbox",
                "pid": 7,
                "message": f"GPU {n % 2} at 95%",
                "timestamp": stamp,
                "mig_index": None,
            }
            file.write(json.dumps(event) + "\n")
    return path, alerts, first_id, count


def median_s(action: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megabytes", type=float, default=100.0)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    now = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        path, alerts, oldest, count = write_files(Path(tmp), args.megabytes, now)
        print(
            f"ledger: {path.stat().st_size / 1e6:.1f} MB, {count} records "
            f"(written in {time.perf_counter() - started:.1f} s); alert log 20000 events"
        )

        def runs_json() -> str:
            result = ledger.read(path, last=50)
            return strict_json.dumps([ledger.complete(r) for r in result.records], indent=2)

        def runs_text() -> str:
            return runs_table(ledger.read(path, last=50).records)

        def report() -> str:
            since = now - 12 * 3600
            result = ledger.read(path, since=since)
            events, _warnings = read_alerts(alerts, since)
            return report_text(build_report(result.records, events, since, now))

        assert len(ledger.read(path, last=50).records) == 50
        assert ledger.find(oldest, path)[0]["id"] == oldest
        rows = [
            ("hwdash runs --json (newest 50)", runs_json),
            ("hwdash runs (newest 50)", runs_text),
            ("hwdash report --since 12h", report),
            ("hwdash runs show ID (oldest run)", lambda: ledger.find(oldest, path)),
            ("ledger.read() of the whole file", lambda: ledger.read(path)),
        ]
        for name, action in rows:
            print(
                f"{name:36s} median of {args.repeat}: {median_s(action, args.repeat) * 1000:8.1f} ms"
            )
        with path.open("ab") as file:
            file.write(b'{"version": 1, "id": "cut sh')  # a writer killed mid-line
        torn = median_s(lambda: ledger.read(path, last=50), args.repeat)
        print(
            f"{'the same, last line cut short':36s} median of {args.repeat}: {torn * 1000:8.1f} ms"
        )
        env = {**os.environ, "XDG_STATE_HOME": tmp, "COLUMNS": "200"}
        env.pop("HWDASH_RUNS", None)
        print(
            "the whole command, `python -m hwdash ...` in a new process (interpreter start included):"
        )
        for words in (["runs", "--json"], ["runs"], ["report", "--since", "12h"]):
            command = [sys.executable, "-m", "hwdash", *words]

            def once(command: list[str] = command) -> None:
                subprocess.run(
                    command,
                    env=env,
                    check=True,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )

            name = "hwdash " + " ".join(words)
            print(
                f"{name:36s} median of {args.repeat}: {median_s(once, args.repeat) * 1000:8.1f} ms"
            )
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
