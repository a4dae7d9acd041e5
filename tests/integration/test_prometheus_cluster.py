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
import urllib.request
from collections.abc import Callable, Iterator
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


def wait_until(
    check: Callable[[], object], timeout_s: float = 40.0, explain: Callable[[], str] | None = None
) -> None:
    """Poll ``check`` until it is true; on a timeout, ``explain`` says what the processes saw."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except Exception as exc:  # the server is still starting
            last = exc
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting ({last}){explain() if explain else ''}")


def answers(url: str) -> bool:
    """True once ``url`` answers 200 (a server that is up and serving)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status) == 200
    except OSError:
        return False


def log_tail(path: Path, lines: int = 15) -> str:
    text = path.read_text(errors="replace") if path.exists() else "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def start_serving(
    command: Callable[[int], list[str]],
    ready_path: str,
    log: Path,
    env: dict[str, str] | None = None,
) -> tuple[subprocess.Popen[bytes], int]:
    """Start ``command(port)`` on a free loopback port and wait until ``ready_path`` answers.

    The port is probed free, then bound by the child a moment later; on a shared machine another
    process can take it in between, and the child exits. Such a start is retried on a new port
    (three tries), and a child that never serves fails the test with its own log, not a timeout
    further on.
    """
    for attempt in range(3):
        port = free_port()
        with log.open("ab") as sink:
            sink.write(f"--- try {attempt + 1} on port {port}\n".encode())
            process = subprocess.Popen(
                command(port), env=env, stdout=subprocess.DEVNULL, stderr=sink
            )
        deadline = time.monotonic() + 60
        while process.poll() is None and time.monotonic() < deadline:
            if answers(f"http://127.0.0.1:{port}{ready_path}"):
                return process, port
            time.sleep(0.2)
        stop([process])
    raise AssertionError(f"{command(0)[0]} did not serve after three tries:\n{log_tail(log)}")


def start_exporter(host: str, scenario: str, log_dir: Path) -> tuple[subprocess.Popen[bytes], int]:
    """``hwdash exporter`` for one fake node, sampling every half second, serving; (process, port)."""

    def command(port: int) -> list[str]:
        return [
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
        ]

    env = dict(os.environ, PYTHONPATH=SRC)
    return start_serving(command, "/metrics", log_dir / f"exporter-{host}.log", env)


def start_prometheus(tmp_path: Path, targets: list[str]) -> tuple[subprocess.Popen[bytes], str]:
    """A Prometheus server scraping ``targets`` every second, ready; (the process, its URL)."""
    config = tmp_path / "prometheus.yml"
    config.write_text(
        # The timeout is the whole interval: a 2-core CI machine can be slow to answer a scrape.
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
        "scrape_configs:\n  - job_name: hwdash\n    static_configs:\n"
        f"      - targets: {json.dumps(targets)}\n"
    )

    def command(port: int) -> list[str]:
        return [
            PROMETHEUS or "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ]

    server, port = start_serving(command, "/-/ready", tmp_path / "prometheus.log")
    return server, f"http://127.0.0.1:{port}"


def targets_report(url: str, logs: Path) -> str:
    """What the server says of each target, and the tail of every log: a timeout's explanation."""
    lines = ["", "targets:"]
    try:
        with urllib.request.urlopen(f"{url}/api/v1/targets", timeout=5) as response:
            body = json.loads(response.read())
        active = body["data"]["activeTargets"]
        if not active:  # the server adds its static targets some seconds after it starts
            lines.append("  (none active yet)")
        for target in active:
            lines.append(
                f"  {target['scrapeUrl']}: {target['health']} {target.get('lastError', '')!r}"
                f" ({target.get('lastScrapeDuration')} s)"
            )
    except (OSError, ValueError, KeyError) as exc:
        lines.append(f"  (not read: {exc})")
    for log in sorted(logs.glob("*.log")):
        lines += [f"{log.name}:", log_tail(log)]
    return "\n".join(lines)


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
    try:
        for host, path in nodes.items():
            exporters[host], port = start_exporter(host, str(path), tmp_path)
            targets.append(f"127.0.0.1:{port}")
        server, url = start_prometheus(tmp_path, targets)
    except BaseException:
        stop(list(exporters.values()))
        raise
    try:
        yield {"url": url, "server": server, "exporters": exporters, "logs": tmp_path}
    finally:
        stop([server, *exporters.values()])


def test_the_cluster_view_sees_every_gpu_alerts_on_the_right_one_and_says_when_it_is_gone(
    cluster: dict[str, object],
) -> None:
    url = str(cluster["url"])
    sampler = PrometheusSampler(url)
    logs = cluster["logs"]
    assert isinstance(logs, Path)
    wait_until(
        lambda: len(sampler.sample().gpus) == 6,
        timeout_s=90,
        explain=lambda: targets_report(url, logs),
    )
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

    wait_until(node_b_stale, timeout_s=30, explain=lambda: targets_report(url, logs))

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
    exporter, port = start_exporter("node-h", "health", tmp_path)
    try:
        server, url = start_prometheus(tmp_path, [f"127.0.0.1:{port}"])
    except BaseException:
        stop([exporter])
        raise
    try:
        sampler = PrometheusSampler(url)

        def diagnosed() -> bool:
            kinds = {(g.host_gpu, d.kind) for g in sampler.sample().gpus for d in g.diagnoses}
            return {(0, "stray-context"), (2, "throttled")} <= kinds

        wait_until(diagnosed, timeout_s=60, explain=lambda: targets_report(url, tmp_path))
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
