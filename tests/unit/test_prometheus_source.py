"""The Prometheus source on canned answers (the real server is in tests/integration)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import pytest

from hwdash.errors import UsageError
from hwdash.telemetry.prometheus_source import (
    PrometheusSampler,
    auth_header,
    check_url,
)

MIB = 2**20


def vector(*series: tuple[str, dict[str, str], float]) -> bytes:
    result = [
        {"metric": {"__name__": name, **labels}, "value": [1_800_000_000, str(value)]}
        for name, labels, value in series
    ]
    return json.dumps(
        {"status": "success", "data": {"resultType": "vector", "result": result}}
    ).encode()


class Server:
    """Serves the given bodies in turn (an exception is raised instead of answering)."""

    def __init__(self, *answers: bytes | Exception) -> None:
        self.answers = list(answers)
        self.requests: list[urllib.request.Request] = []

    def __call__(self, request: urllib.request.Request, timeout: float) -> bytes:
        self.requests.append(request)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


DCGM = {"gpu": "0", "UUID": "GPU-a", "modelName": "NVIDIA A100-SXM4-80GB", "Hostname": "node-a"}


def dcgm(
    labels: dict[str, str], used: float, free: float
) -> list[tuple[str, dict[str, str], float]]:
    return [
        ("DCGM_FI_DEV_FB_USED", labels, used),
        ("DCGM_FI_DEV_FB_FREE", labels, free),
        ("DCGM_FI_DEV_FB_RESERVED", labels, 512),
        ("DCGM_FI_DEV_GPU_UTIL", labels, 97),
    ]


def test_dcgm_series_become_gpus_with_their_host_and_a_total() -> None:
    new_spelling = {**DCGM, "gpu": "3", "UUID": "GPU-b"}
    new_spelling["hostname"] = new_spelling.pop("Hostname")  # dcgm-exporter's 2026 label
    server = Server(vector(*dcgm(DCGM, 70000, 11408), *dcgm(new_spelling, 1000, 80408)))
    snapshot = PrometheusSampler("http://prom:9090/", fetch=server).sample()
    a, b = snapshot.gpus
    assert (a.host, a.host_gpu, b.host, b.host_gpu) == ("node-a", 0, "node-a", 3)
    assert a.used_bytes == 70000 * MIB and a.total_bytes == (70000 + 11408 + 512) * MIB
    assert a.utilization_gpu == 97 and a.name == "NVIDIA A100-SXM4-80GB"
    assert a.pressure == pytest.approx(1 - 11408 / 81920)
    assert (a.index, b.index) == (0, 1)
    query = server.requests[0].full_url
    assert query.startswith("http://prom:9090/api/v1/query?query=")


def test_nvitop_exporter_names_carry_the_unit() -> None:
    labels = {"hostname": "box", "index": "1", "devicename": "NVIDIA H100", "uuid": "GPU-c"}
    server = Server(
        vector(
            ("gpu_memory_used_MiB", labels, 1024),
            ("gpu_memory_free_MiB", labels, 3072),
            ("gpu_memory_total_MiB", labels, 4096),
            ("gpu_temperature_C", labels, 55),
        )
    )
    (gpu,) = PrometheusSampler("http://prom", fetch=server).sample().gpus
    assert (gpu.host, gpu.host_gpu, gpu.name) == ("box", 1, "NVIDIA H100")
    assert gpu.total_bytes == 4096 * MIB and gpu.temperature_c == 55


def test_indices_stay_with_their_gpu_and_a_vanished_host_is_kept_stale() -> None:
    other = {**DCGM, "Hostname": "node-b"}
    server = Server(
        vector(*dcgm(DCGM, 1, 2), *dcgm(other, 3, 4)),
        vector(*dcgm(other, 5, 6)),  # node-a's exporter stopped
    )
    sampler = PrometheusSampler("http://prom", fetch=server)
    first = {gpu.host: gpu.index for gpu in sampler.sample().gpus}
    second = sampler.sample()
    assert {gpu.host: gpu.index for gpu in second.gpus} == first
    node_a = next(gpu for gpu in second.gpus if gpu.host == "node-a")
    assert node_a.used_bytes == 1 * MIB  # its last values...
    assert "stale: no data from node-a" in dict(node_a.errors)["host"]  # ...marked stale
    node_b = next(gpu for gpu in second.gpus if gpu.host == "node-b")
    assert "host" not in dict(node_b.errors) and node_b.used_bytes == 5 * MIB


def test_an_unreachable_server_or_a_failing_query_is_said_in_words() -> None:
    unreachable = urllib.error.URLError(ConnectionRefusedError(111, "Connection refused"))
    bad_query = urllib.error.HTTPError(
        "http://prom",
        400,
        "Bad Request",
        {},  # type: ignore[arg-type]
        fp=__import__("io").BytesIO(b'{"status":"error","error":"parse error at char 3"}'),
    )
    server = Server(vector(*dcgm(DCGM, 1, 2)), unreachable, bad_query, b"<html>proxy</html>")
    sampler = PrometheusSampler("http://prom", fetch=server)
    assert sampler.sample().gpus
    gone = sampler.sample()
    assert gone.stale and gone.gpus  # the last values, stale
    assert "cannot be reached: [Errno 111] Connection refused" in (gone.nvml.error or "")
    failed = sampler.sample()
    assert "answered HTTP 400: parse error at char 3" in (failed.nvml.error or "")
    garbled = sampler.sample()
    assert "did not answer with Prometheus' JSON" in (garbled.nvml.error or "")


def test_no_gpu_series_is_said_too() -> None:
    snapshot = PrometheusSampler("http://prom", fetch=Server(vector())).sample()
    assert not snapshot.nvml.available and "has no GPU series" in (snapshot.nvml.error or "")


def test_credentials_come_from_the_environment_only() -> None:
    assert auth_header({"HWDASH_PROMETHEUS_TOKEN": "t0k"}) == "Bearer t0k"
    assert auth_header({"HWDASH_PROMETHEUS_USER": "u", "HWDASH_PROMETHEUS_PASSWORD": "p"}) == (
        "Basic dTpw"
    )
    assert auth_header({}) is None
    server = Server(vector())
    PrometheusSampler(
        "http://prom", environ={"HWDASH_PROMETHEUS_TOKEN": "t0k"}, fetch=server
    ).sample()
    assert server.requests[0].get_header("Authorization") == "Bearer t0k"
    with pytest.raises(UsageError, match="not in the URL"):
        check_url("http://user:secret@prom:9090")
    with pytest.raises(UsageError, match="not an http"):
        check_url("prom:9090")


def test_process_series_become_processes_of_their_gpu() -> None:
    process: dict[str, Any] = {**DCGM, "pid": "4242", "user": "alice", "command": "python train.py"}
    server = Server(
        vector(
            *dcgm(DCGM, 1, 2),
            ("hwdash_process_memory_used_bytes", process, 5 * MIB),
            ("hwdash_process_torch_allocated_bytes", process, 3 * MIB),
            ("hwdash_process_torch_reserved_bytes", process, 4 * MIB),
        )
    )
    (gpu,) = PrometheusSampler("http://prom", fetch=server).sample().gpus
    (row,) = gpu.processes
    assert (row.pid, row.user, row.used_bytes) == (4242, "alice", 5 * MIB)
    assert row.torch is not None and row.torch.reserved_bytes == 4 * MIB
    assert not row.visible  # another machine's PID: never looked up here
