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


def start_exporter(host: str, scenario: str, port: int) -> subprocess.Popen[bytes]:
    """``hwdash exporter`` for one fake node, sampling every half second."""
    return subprocess.Popen(
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
            scenario,
            "--interval",
            "0.5",
        ],
        env=dict(os.environ, PYTHONPATH=SRC),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def start_prometheus(tmp_path: Path, targets: list[str]) -> tuple[subprocess.Popen[bytes], str]:
    """A Prometheus server scraping ``targets`` every second; (the process, its URL)."""
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
    return server, f"http://127.0.0.1:{port}"


def stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        process.terminate()
    for process in processes:
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[dict[str, object]]:
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
        exporters[host] = start_exporter(host, str(path), port)
    server, url = start_prometheus(tmp_path, targets)
    try:
        yield {"url": url, "server": server, "exporters": exporters}
    finally:
        stop([server, *exporters.values()])


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


def test_a_remote_hosts_health_readings_and_diagnoses_reach_the_cluster_view(
    tmp_path: Path,
) -> None:
    # The packaged health scenario in real time: GPU 2 is power-capped and braked from the start
    # (throttled after 10 s of a minute), GPU 0 carries a stray context (after 5 s), GPU 1's
    # link stays at its maximum until 60 s.
    port = free_port()
    exporter = start_exporter("node-h", "health", port)
    server, url = start_prometheus(tmp_path, [f"127.0.0.1:{port}"])
    try:
        sampler = PrometheusSampler(url)

        def diagnosed() -> bool:
            kinds = {(g.host_gpu, d.kind) for g in sampler.sample().gpus for d in g.diagnoses}
            return {(0, "stray-context"), (2, "throttled")} <= kinds

        wait_until(diagnosed, timeout_s=60)
        gpus = {gpu.host_gpu: gpu for gpu in sampler.sample().gpus}
    finally:
        stop([server, exporter])
    throttled = next(d for d in gpus[2].diagnoses if d.kind == "throttled")
    assert throttled.message.startswith("clocks throttled")  # the remote host's own words
    assert "power" in throttled.hint
    stray = next(d for d in gpus[0].diagnoses if d.kind == "stray-context")
    assert stray.pid == 7101 and "set_device" in stray.hint
    assert gpus[2].clocks_event_reasons == ("sw_power_cap", "hw_power_brake_slowdown")
    assert gpus[5].clocks_event_reasons == ("gpu_idle",)
    assert gpus[1].pcie is not None and (gpus[1].pcie.gen_max, gpus[1].pcie.width_max) == (5, 16)
    assert gpus[3].remapped_rows is not None and gpus[3].ecc_uncorrected_aggregate is not None
    assert gpus[0].energy_mj is not None and gpus[0].energy_mj > 0
