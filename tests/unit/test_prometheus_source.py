"""The Prometheus source on canned answers (the real server is in tests/integration)."""

from __future__ import annotations

import http.server
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pynvml
import pytest

from hwdash.core.live.alerts import AlertEngine, AlertRule
from hwdash.core.live.diagnoses import Diagnosis
from hwdash.errors import UsageError
from hwdash.telemetry.prometheus_source import (
    PrometheusSampler,
    auth_header,
    check_url,
    origin,
)
from hwdash.telemetry.types import PcieLink, RemappedRows

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


def test_dcgm_health_fields_are_read_under_their_old_and_renamed_names() -> None:
    # DCGM renamed these fields (go-dcgm pkg/dcgm/dcgm_fields.h); dcgm-exporter's metric is the
    # name in its CSV file, so a cluster may serve either spelling.
    renamed = {**DCGM, "gpu": "1", "UUID": "GPU-b"}
    braked = (
        pynvml.nvmlClocksEventReasonSwPowerCap | pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown
    )
    server = Server(
        vector(
            *dcgm(DCGM, 1, 2),
            ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", DCGM, braked),
            ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", DCGM, 2),
            ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", DCGM, 5),
            ("DCGM_FI_DEV_ROW_REMAP_FAILURE", DCGM, 1),
            ("DCGM_FI_DEV_PSTATE", DCGM, 2),
            ("DCGM_FI_DEV_FAN_SPEED", DCGM, 45),
            ("DCGM_FI_DEV_PCIE_LINK_GEN", DCGM, 3),
            ("DCGM_FI_DEV_PCIE_MAX_LINK_GEN", DCGM, 4),
            ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", DCGM, 7),
            ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", DCGM, 9),
            ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", DCGM, 123456789),
            *dcgm(renamed, 1, 2),
            ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", renamed, pynvml.nvmlClocksEventReasonGpuIdle),
            ("DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL", renamed, 1),
            ("DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL", renamed, 0),
            ("DCGM_FI_DEV_ROW_REMAP_FAILED", renamed, 0),
            ("DCGM_FI_DEV_ROW_REMAP_PENDING", renamed, 1),
            ("DCGM_FI_DEV_GPU_PSTATE", renamed, 8),
            ("DCGM_FI_DEV_FAN_SPEED_RATIO", renamed, 0.3),
        )
    )
    old, new = PrometheusSampler("http://prom", fetch=server).sample().gpus
    assert old.clocks_event_reasons == ("sw_power_cap", "hw_power_brake_slowdown")
    assert old.remapped_rows == RemappedRows(
        corrected=5, uncorrected=2, pending=False, failure=True
    )
    assert (old.pstate, old.fan_percent) == (2, 45)
    assert old.pcie == PcieLink(gen=3, gen_max=4)
    assert (old.ecc_uncorrected, old.ecc_uncorrected_aggregate) == (7, 9)
    assert old.energy_mj == 123456789
    assert new.clocks_event_reasons == ("gpu_idle",)
    assert new.remapped_rows == RemappedRows(
        corrected=0, uncorrected=1, pending=True, failure=False
    )
    assert (new.pstate, new.fan_percent) == (8, pytest.approx(30))
    # What no series carries stays unknown: no link, no ECC, no clock reasons on a bare GPU.
    bare = PrometheusSampler("http://prom", fetch=Server(vector(*dcgm(DCGM, 1, 2)))).sample()
    (gpu,) = bare.gpus
    assert (gpu.pcie, gpu.remapped_rows, gpu.clocks_event_reasons, gpu.ecc_uncorrected) == (
        None,
        None,
        None,
        None,
    )


def test_a_diagnosis_flagged_without_its_words_is_shown_generically_from_when_first_seen() -> None:
    flags = [
        ("hwdash_gpu_diagnosis", {**DCGM, "kind": "throttled"}, 1),
        ("hwdash_gpu_diagnosis", {**DCGM, "kind": "ecc"}, 0),
        ("hwdash_gpu_diagnosis", {**DCGM, "kind": "from-a-newer-hwdash"}, 1),
    ]
    now = [1_800_000_000.0]
    server = Server(
        vector(*dcgm(DCGM, 1, 2), *flags),
        vector(*dcgm(DCGM, 1, 2), *flags),
        vector(*dcgm(DCGM, 1, 2), ("hwdash_gpu_diagnosis", {**DCGM, "kind": "throttled"}, 0)),
    )
    sampler = PrometheusSampler("http://prom", fetch=server, wall_clock=lambda: now[0])
    (gpu,) = sampler.sample().gpus
    (diagnosis,) = gpu.diagnoses  # ecc is 0; a kind this hwdash does not know is left out
    assert diagnosis.kind == "throttled"
    assert diagnosis.message == "throttled (reported by node-a)"
    assert diagnosis.since == now[0]
    now[0] += 10
    (gpu,) = sampler.sample().gpus
    assert [d.since for d in gpu.diagnoses] == [now[0] - 10]  # still since it was first seen
    (gpu,) = sampler.sample().gpus
    assert gpu.diagnoses == ()  # cleared on the host


def test_a_diagnosis_info_series_carries_the_remote_words() -> None:
    info = {
        **DCGM,
        "kind": "idle-holding",
        "message": "PID 7300 holding 2.0 GiB, idle 10 min",
        "hint": "free it",
        "pid": "7300",
        "since": "1799999400.000",
    }
    server = Server(
        vector(
            *dcgm(DCGM, 1, 2),
            ("hwdash_gpu_diagnosis", {**DCGM, "kind": "idle-holding"}, 1),
            ("hwdash_gpu_diagnosis_info", info, 1),
        )
    )
    (gpu,) = PrometheusSampler("http://prom", fetch=server).sample().gpus
    assert gpu.diagnoses == (
        Diagnosis(
            "idle-holding", "PID 7300 holding 2.0 GiB, idle 10 min", 1799999400.0, "free it", 7300
        ),
    )


def test_a_remote_diagnosis_reaches_the_alert_log_once_raised_and_once_cleared() -> None:
    info = {**DCGM, "kind": "ecc", "message": "uncorrected ECC errors rose 0 -> 2"}
    info.update(hint="drain and reset the GPU", pid="", since="1799999000")
    diagnosed = vector(*dcgm(DCGM, 1000, 80000), ("hwdash_gpu_diagnosis_info", info, 1))
    server = Server(diagnosed, diagnosed, vector(*dcgm(DCGM, 1000, 80000)))
    sampler = PrometheusSampler("http://prom", fetch=server)
    engine = AlertEngine(AlertRule())
    said = [[(e.kind, e.diagnosis, e.message) for e in engine.update(sampler.sample())]]
    said += [[(e.kind, e.diagnosis, e.message) for e in engine.update(sampler.sample())]]
    said += [[(e.kind, e.diagnosis, e.message) for e in engine.update(sampler.sample())]]
    assert said == [
        [
            (
                "raised",
                "ecc",
                "node-a GPU 0 ecc: uncorrected ECC errors rose 0 -> 2; drain and reset the GPU",
            )
        ],
        [],  # still in force: nothing new
        [("cleared", "ecc", "node-a GPU 0 ecc: ecc no longer reported by node-a")],
    ]


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


def test_labels_with_unicode_digits_are_read_as_text_not_numbers() -> None:
    # str.isdigit takes "²", int() refuses it: a GPU so labelled has no number on its host, a
    # process so labelled is left out, and nothing raises
    odd = {**DCGM, "gpu": "²"}
    process: dict[str, Any] = {**DCGM, "pid": "٣"}
    server = Server(
        vector(*dcgm(odd, 1, 2), ("hwdash_process_memory_used_bytes", process, 5 * MIB))
    )
    gpus = PrometheusSampler("http://prom", fetch=server).sample().gpus
    assert [(gpu.host, gpu.host_gpu) for gpu in gpus if gpu.host_gpu is None] == [("node-a", None)]
    assert all(not gpu.processes for gpu in gpus)


class Recorder(http.server.BaseHTTPRequestHandler):
    """A Prometheus stand-in on loopback: answers the query only with the right credentials,
    redirects where the server's ``redirects`` says, and remembers every Authorization it saw."""

    server: LoopbackServer

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        self.server.seen.append((path, self.headers.get("Authorization")))
        target = self.server.redirects.get(path)
        if target is not None:
            query = self.path.partition("?")[2]
            self.send_response(302)
            self.send_header("Location", f"{target}?{query}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.headers.get("Authorization") != "Bearer t0k":
            body = b'{"status":"error","error":"unauthorized"}'
            self.send_response(401)
        else:
            body = vector(*dcgm(DCGM, 1, 2))
            self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        return


class LoopbackServer(http.server.ThreadingHTTPServer):
    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__((host, port), Recorder)
        self.seen: list[tuple[str, str | None]] = []
        self.redirects: dict[str, str] = {}

    @property
    def origin(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"


@pytest.fixture
def servers() -> Iterator[Callable[..., LoopbackServer]]:
    started: list[LoopbackServer] = []

    def start(host: str = "127.0.0.1", port: int = 0) -> LoopbackServer:
        server = LoopbackServer(host, port)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.shutdown()
        server.server_close()


TOKEN = {"HWDASH_PROMETHEUS_TOKEN": "t0k"}


def test_credentials_are_not_sent_to_another_port_after_a_redirect(
    servers: Callable[..., LoopbackServer],
) -> None:
    prometheus, elsewhere = servers(), servers()
    prometheus.redirects["/api/v1/query"] = f"{elsewhere.origin}/api/v1/query"
    snapshot = PrometheusSampler(prometheus.origin, environ=TOKEN).sample()
    assert prometheus.seen == [("/api/v1/query", "Bearer t0k")]  # the origin given gets them
    assert elsewhere.seen == [("/api/v1/query", None)]  # the other port never does
    assert not snapshot.gpus
    error = snapshot.nvml.error or ""
    assert "answered HTTP 401: unauthorized" in error
    assert f"redirected to {elsewhere.origin}" in error and "credentials" in error


def test_credentials_are_not_sent_to_another_host_even_after_a_same_origin_hop(
    servers: Callable[..., LoopbackServer],
) -> None:
    prometheus = servers()
    try:  # the same port on another loopback address: only the host differs
        elsewhere = servers("127.0.0.2", prometheus.server_address[1])
    except OSError:
        pytest.skip("127.0.0.2 is not a loopback address here")
    prometheus.redirects["/api/v1/query"] = "/prometheus/api/v1/query"
    prometheus.redirects["/prometheus/api/v1/query"] = f"{elsewhere.origin}/api/v1/query"
    PrometheusSampler(prometheus.origin, environ=TOKEN).sample()
    assert [auth for _path, auth in prometheus.seen] == ["Bearer t0k", "Bearer t0k"]
    assert elsewhere.seen == [("/api/v1/query", None)]


def test_a_redirect_on_the_same_origin_keeps_the_credentials(
    servers: Callable[..., LoopbackServer],
) -> None:
    prometheus = servers()
    # A relative Location and an absolute one naming the same scheme, host and port.
    prometheus.redirects["/api/v1/query"] = "/prometheus/api/v1/query"
    prometheus.redirects["/prometheus/api/v1/query"] = f"{prometheus.origin}/p/api/v1/query"
    snapshot = PrometheusSampler(prometheus.origin, environ=TOKEN).sample()
    assert [auth for _path, auth in prometheus.seen] == ["Bearer t0k"] * 3
    assert snapshot.gpus and snapshot.nvml.error is None


def test_an_origin_is_scheme_host_and_port() -> None:
    assert origin("https://Prom.example/api") == ("https", "prom.example", 443)
    assert origin("http://prom:80/") == origin("http://prom")
    assert origin("https://prom") != origin("http://prom:443")  # https -> http is another origin
    assert origin("http://prom:9090") != origin("http://prom:9091")
    assert origin("http://prom:notaport") is None
