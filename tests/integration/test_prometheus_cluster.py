"""A real Prometheus server scraping three `hwdash exporter` processes, read back by the cluster view.

Debian's `prometheus` package provides the server (`.ci/run` installs it); where no `prometheus`
binary exists the test is skipped and says why. Everything runs on loopback with free ports.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hwdash.core.live.alerts import AlertEngine, AlertRule
from hwdash.telemetry.prometheus_source import PrometheusSampler

SRC = str(Path(__file__).resolve().parents[2] / "src")
PROMETHEUS = shutil.which("prometheus")

pytestmark = pytest.mark.skipif(
    PROMETHEUS is None,
    reason="no prometheus binary (Debian's `prometheus` package; .ci/run installs it)",
)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def scenario(path: Path, used_mib: tuple[float, float], uuid_seed: int) -> Path:
    """Two 80 GiB GPUs holding ``used_mib`` each, steady."""
    gpus = []
    for index, used in enumerate(used_mib):
        gpus.append(
            f"""
[[gpus]]
name = "NVIDIA A100-SXM4-80GB"
uuid = "GPU-00000000-0000-0000-0000-{uuid_seed:06d}{index:06d}"
memory_total_mib = 81920
memory_reserved_mib = 512
used_mib = {used}
utilization = 90
temperature_c = 60
power_w = 300
"""
        )
    path.write_text('description = "test node"\n' + "".join(gpus))
    return path


def wait_until(check: object, timeout_s: float = 40.0) -> None:
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            if check():  # type: ignore[operator]
                return
        except Exception as exc:  # the server is still starting
            last = exc
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting ({last})")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[dict[str, object]]:
    env = dict(os.environ, PYTHONPATH=SRC)
    nodes = {
        "node-a": scenario(tmp_path / "a.toml", (20000.0, 30000.0), 1),
        "node-b": scenario(tmp_path / "b.toml", (40000.0, 10000.0), 2),
        # GPU 1 of node-c is 95% full: the one alert of the cluster.
        "node-c": scenario(tmp_path / "c.toml", (50000.0, 0.95 * 81920 - 512), 3),
    }
    exporters: dict[str, subprocess.Popen[bytes]] = {}
    targets = []
    for host, path in nodes.items():
        port = free_port()
        targets.append(f"127.0.0.1:{port}")
        exporters[host] = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "hwdash",
                "exporter",
                "--listen",
                f"127.0.0.1:{port}",
                "--hostname",
                host,
                "--fake-nvml",
                str(path),
                "--interval",
                "0.5",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n"
        "scrape_configs:\n  - job_name: hwdash\n    static_configs:\n"
        f"      - targets: {json.dumps(targets)}\n"
    )
    port = free_port()
    server = subprocess.Popen(
        [
            PROMETHEUS or "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield {"url": f"http://127.0.0.1:{port}", "server": server, "exporters": exporters}
    finally:
        for process in [server, *exporters.values()]:
            process.terminate()
        for process in [server, *exporters.values()]:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()


def test_the_cluster_view_sees_every_gpu_alerts_on_the_right_one_and_says_when_it_is_gone(
    cluster: dict[str, object],
) -> None:
    url = str(cluster["url"])
    sampler = PrometheusSampler(url)
    wait_until(lambda: len(sampler.sample().gpus) == 6)
    snapshot = sampler.sample()
    assert snapshot.nvml.available and not snapshot.stale
    where = sorted((gpu.host, gpu.host_gpu) for gpu in snapshot.gpus)
    assert where == [(h, g) for h in ("node-a", "node-b", "node-c") for g in (0, 1)]
    node_b_0 = next(g for g in snapshot.gpus if (g.host, g.host_gpu) == ("node-b", 0))
    assert node_b_0.used_bytes == 40000 * 2**20  # MiB back to bytes
    assert node_b_0.total_bytes == 81920 * 2**20  # hwdash's total series
    engine = AlertEngine(AlertRule())
    raised = [event for event in engine.update(snapshot) if event.kind == "raised"]
    assert len(raised) == 1
    hot = next(gpu for gpu in snapshot.gpus if gpu.index == raised[0].gpu_index)
    assert (hot.host, hot.host_gpu) == ("node-c", 1)
    assert engine.update(sampler.sample()) == []  # one alert per crossing, across the cluster

    # The command line reads the same server.
    done = subprocess.run(
        [sys.executable, "-m", "hwdash", "monitor", "--prometheus", url, "--once", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PYTHONPATH=SRC),
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert sorted({gpu["host"] for gpu in data["gpus"]}) == ["node-a", "node-b", "node-c"]
    (alert,) = data["alerts"]
    alerted = next(gpu for gpu in data["gpus"] if gpu["index"] == alert["gpu_index"])
    assert (alerted["host"], alerted["host_gpu"]) == ("node-c", 1)

    # A host that stops reporting: its last values stay, marked stale.
    exporters = cluster["exporters"]
    assert isinstance(exporters, dict)
    exporters["node-b"].terminate()
    exporters["node-b"].wait(10)

    def node_b_stale() -> bool:
        gpus = sampler.sample().gpus
        stale = {(g.host, g.host_gpu) for g in gpus if any(f == "host" for f, _w in g.errors)}
        return stale == {("node-b", 0), ("node-b", 1)} and len(gpus) == 6

    wait_until(node_b_stale, timeout_s=30)

    # The server stops: the view says so, in words, with the last values.
    server = cluster["server"]
    assert isinstance(server, subprocess.Popen)
    server.terminate()
    server.wait(10)
    gone = sampler.sample()
    assert gone.stale and len(gone.gpus) == 6
    assert "cannot be reached" in (gone.nvml.error or "")
    done = subprocess.run(
        [sys.executable, "-m", "hwdash", "monitor", "--prometheus", url, "--once"],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PYTHONPATH=SRC),
    )
    assert "cannot be reached" in done.stdout and "Traceback" not in done.stderr
