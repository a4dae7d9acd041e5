"""bench/whole_gpu_device.py, the script that measured sets E and F on a lent GPU, runs on a machine
without one (``--device cpu --tiny``: two layers, 64 tokens, gloo; numbers meaningless) through the same
DeepSpeed and FSDP2 code paths, and ``--quiet`` prints no reading."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SETTINGS = ["ds-z3-qwen3-0.6b-b4-s2048-ckpt", "fsdp2-offload-llama-3.2-1b-b4-s2048-ckpt"]


@pytest.mark.validate
def test_the_device_script_runs_deepspeed_and_fsdp2_on_the_cpu(tmp_path: Path) -> None:
    pytest.importorskip("torch", reason="torch is in the validate extra")
    pytest.importorskip("deepspeed", reason="DeepSpeed is in the validate extra")
    command = [sys.executable, str(REPO / "bench" / "whole_gpu_device.py"), "--out", str(tmp_path)]
    command += [
        "--device",
        "cpu",
        "--tiny",
        "--steps",
        "2",
        "--quiet",
        "--only",
        ",".join(SETTINGS),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    printed = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [row["name"] for row in printed] == SETTINGS
    assert all(set(row) == {"name", "returncode", "seconds"} for row in printed)
    rows = json.loads((tmp_path / "whole_gpu_device.json").read_text())
    assert [row["returncode"] for row in rows] == [0, 0], [row.get("stderr_tail") for row in rows]
    # each row names the hwdash plan of its setting, and a CPU run has no GPU reading
    assert all(
        "--gpus 1" in row["flags"] and row["nvml_peak_over_baseline"] is None for row in rows
    )
    assert all(len(row["step_s"]) == 2 for row in rows)
