"""The cluster as the command line shows it: a real HTTP server answering Prometheus' query API
with canned series, read by `hwdash monitor --prometheus` end to end."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest

from hwdash.cli import main
from hwdash.telemetry.history import History
from hwdash.telemetry.prometheus_source import PrometheusSampler

MIB = 2**20
TOTAL_MIB = 81920


def series(host: str, gpu: int, used_mib: float, **extra: float) -> list[dict[str, Any]]:
    labels = {"Hostname": host, "gpu": str(gpu), "modelName": "NVIDIA A100-SXM4-80GB"}
    values = {
        "DCGM_FI_DEV_FB_USED": used_mib,
        "DCGM_FI_DEV_FB_FREE": TOTAL_MIB - 512 - used_mib,
        "DCGM_FI_DEV_FB_RESERVED": 512,
        **extra,
    }
    return [
        {"metric": {"__name__": name, **labels}, "value": [1_800_000_000, str(value)]}
        for name, value in values.items()
    ]


def process(host: str, gpu: int, pid: int, allocated: int) -> list[dict[str, Any]]:
    labels = {"Hostname": host, "gpu": str(gpu), "pid": str(pid), "command": "python train.py"}
    return [
        {
            "metric": {"__name__": "hwdash_process_memory_used_bytes", **labels},
            "value": [1_800_000_000, str(allocated + 2 * 2**30)],
        },
        {
            "metric": {"__name__": "hwdash_process_torch_allocated_bytes", **labels},
            "value": [1_800_000_000, str(allocated)],
        },
    ]


class Answers:
    """What the canned server says next (the last answer repeats)."""

    def __init__(self, *results: list[dict[str, Any]]) -> None:
        self.results = list(results)

    def next(self) -> bytes:
        result = self.results.pop(0) if len(self.results) > 1 else self.results[0]
        body = {"status": "success", "data": {"resultType": "vector", "result": result}}
        return json.dumps(body).encode()


@pytest.fixture
def server() -> Iterator[tuple[str, Answers]]:
    answers = Answers([])

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = answers.next()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", answers
    finally:
        httpd.shutdown()
        httpd.server_close()


def three_hosts() -> list[dict[str, Any]]:
    # node-b holds the fullest GPU (its GPU 1), node-c the next, node-a the emptiest.
    return [
        *series("node-a", 0, 10_000),
        *series("node-a", 1, 12_000),
        *series("node-b", 0, 20_000),
        *series("node-b", 1, 78_000),
        *series("node-c", 0, 60_000),
        *process("node-b", 1, 4242, 70 * 2**30),
    ]


def test_once_names_the_server_orders_hosts_fullest_first_and_numbers_gpus_by_host(
    server: tuple[str, Answers], capsys: pytest.CaptureFixture[str]
) -> None:
    url, answers = server
    answers.results = [three_hosts()]
    assert main(["monitor", "--once", "--prometheus", url]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith(f"Prometheus {url}, 5 GPUs on 3 hosts")
    assert "NVIDIA driver" not in out
    rows = [line.split()[0] for line in lines if line.startswith("node-")]
    # The GPU table: hosts fullest first, each host's GPUs fullest first; the process row says
    # where its GPU is (host:number), not the cluster-wide index.
    assert rows[:5] == ["node-b:1", "node-b:0", "node-c:0", "node-a:1", "node-a:0"]
    (process_row,) = [line for line in lines if "4242" in line and "python" in line]
    assert process_row.split()[0] == "node-b:1"
    # Another machine's PID is not "a host PID seen from a container", and no peak is invented.
    assert "host PID" not in out and "not visible" not in out
    assert "peak allocated" not in out
    assert "PID 4242 on GPU node-b:1 (PyTorch): allocated 70.0 GiB" in out
    assert "host n/a" not in out  # this machine's host line is not the cluster's


def test_json_says_where_the_readings_come_from_and_where_each_process_runs(
    server: tuple[str, Answers], capsys: pytest.CaptureFixture[str]
) -> None:
    url, answers = server
    answers.results = [three_hosts()]
    assert main(["monitor", "--once", "--json", "--prometheus", url]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["nvml"]["driver_version"] is None
    assert data["nvml"]["source"] == f"Prometheus {url}"
    (row,) = [p for gpu in data["gpus"] for p in gpu["processes"]]
    assert (row["host"], row["host_gpu"], row["pid"]) == ("node-b", 1, 4242)
    assert row["torch"]["max_allocated_bytes"] is None  # unknown, not 0


def diagnosis_series(host: str, gpu: int, name: str, value: float, **labels: str) -> dict[str, Any]:
    metric = {"__name__": name, "Hostname": host, "gpu": str(gpu), **labels}
    return {"metric": metric, "value": [1_800_000_000, str(value)]}


def test_once_shows_each_hosts_diagnoses_in_its_own_words(
    server: tuple[str, Answers], capsys: pytest.CaptureFixture[str]
) -> None:
    # node-c's exporter says why in words (hwdash_gpu_diagnosis_info); node-a's only flags it.
    url, answers = server
    throttled = {
        "kind": "throttled",
        "message": "clocks throttled 42% of the last 60 s (power cap 42%)",
        "hint": "the board is at its power limit",
        "since": "1799999000",
    }
    answers.results = [
        [
            *three_hosts(),
            diagnosis_series("node-c", 0, "hwdash_gpu_diagnosis", 1, kind="throttled"),
            diagnosis_series("node-c", 0, "hwdash_gpu_diagnosis_info", 1, **throttled),
            diagnosis_series("node-a", 1, "hwdash_gpu_diagnosis", 1, kind="ecc"),
            diagnosis_series("node-a", 1, "hwdash_gpu_diagnosis", 0, kind="link"),
        ]
    ]
    assert main(["monitor", "--once", "--prometheus", url]) == 0
    # Each GPU's health block: its line, and the lines wrapped under its text (80 columns).
    blocks: list[str] = []
    for line in capsys.readouterr().out.splitlines():
        if line.startswith("GPU node-"):
            blocks.append(" ".join(line.split()))
        elif blocks and line.startswith(" ") and line.strip() and not set("│┃━") & set(line):
            blocks[-1] += " " + " ".join(line.split())
    assert blocks == [
        "GPU node-c:0 throttled: clocks throttled 42% of the last 60 s (power cap 42%); the board "
        "is at its power limit",
        "GPU node-a:1 ecc: ecc (reported by node-a); see hwdash monitor or the alert log on "
        "node-a for details",
    ]
    assert main(["monitor", "--once", "--json", "--prometheus", url]) == 0
    data = json.loads(capsys.readouterr().out)
    said = {
        (gpu["host"], gpu["host_gpu"]): [(d["kind"], d["since"]) for d in gpu["diagnoses"]]
        for gpu in data["gpus"]
    }
    assert said[("node-c", 0)] == [("throttled", 1799999000.0)]
    assert [kind for kind, _since in said[("node-a", 1)]] == ["ecc"]
    assert said[("node-b", 1)] == []


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_an_unreachable_server_exits_1_and_says_so_once(
    json_flag: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed when the block ends: nothing listens there
    url = f"http://127.0.0.1:{port}"
    assert main(["monitor", "--once", "--prometheus", url, *json_flag]) == 1
    out = capsys.readouterr().out
    if json_flag:
        data = json.loads(out)
        assert data["gpus"] == [] and "cannot be reached" in data["nvml"]["error"]
    else:
        assert out.count("cannot be reached") == 1, out


def test_a_server_without_gpu_series_exits_1(
    server: tuple[str, Answers], capsys: pytest.CaptureFixture[str]
) -> None:
    url, answers = server
    answers.results = [[]]
    assert main(["monitor", "--once", "--prometheus", url]) == 1
    assert "has no GPU series" in capsys.readouterr().out


def test_a_stale_host_forecasts_nothing_from_its_frozen_data(
    server: tuple[str, Answers],
) -> None:
    url, answers = server
    climbing = [
        [*series("node-a", 0, 40_000 + 1000 * step), *series("node-b", 0, 30_000 + 900 * step)]
        for step in range(12)
    ]
    # node-a stops reporting; node-b goes on climbing.
    after = [[*series("node-b", 0, 42_000 + 900 * step)] for step in range(4)]
    answers.results = [*climbing, *after]
    sampler = PrometheusSampler(url, wall_clock=iter(range(1000, 2000, 5)).__next__)
    history = History(interval_s=5.0)
    seen = []
    for _round in range(len(climbing) + len(after)):
        snapshot = sampler.sample()
        history.add(snapshot)
        seen.append(history.with_forecasts(snapshot))
    during = {gpu.host: gpu for gpu in seen[len(climbing) - 1].gpus}
    assert during["node-a"].forecast_full_s is not None  # climbing while it reported
    last = {gpu.host: gpu for gpu in seen[-1].gpus}
    assert last["node-a"].host_stale is not None
    assert last["node-a"].forecast_full_s is None
    assert last["node-b"].forecast_full_s is not None  # the live host still forecasts


def test_a_stale_host_does_not_pass_on_the_exporters_frozen_forecast(
    server: tuple[str, Answers],
) -> None:
    url, answers = server
    answers.results = [
        [*series("node-a", 0, 70_000, hwdash_gpu_forecast_full_seconds=120.0)],
        [*series("node-b", 0, 10_000)],
    ]
    sampler = PrometheusSampler(url, wall_clock=iter([1000.0, 1060.0]).__next__)
    (first,) = sampler.sample().gpus
    assert first.forecast_full_s == 120.0
    node_a = next(gpu for gpu in sampler.sample().gpus if gpu.host == "node-a")
    assert node_a.host_stale is not None and node_a.forecast_full_s is None
