"""A cluster's GPUs read back from a Prometheus server: one more sampler behind the same protocol.

Each round is one instant query over the HTTP API (``/api/v1/query``, Prometheus' documented query
API) for every series hwdash understands, selected by name:

* dcgm-exporter's (``DCGM_FI_DEV_FB_USED``/``FREE``/``RESERVED`` in MiB, ``DCGM_FI_DEV_GPU_UTIL``,
  ``DCGM_FI_DEV_GPU_TEMP``, ``DCGM_FI_DEV_POWER_USAGE``; labels ``gpu``, ``UUID``, ``modelName`` and
  ``Hostname``, which dcgm-exporter renamed ``hostname`` in 2026: both are read);
* the health readings under DCGM's field names, each under both spellings where DCGM renamed the
  field (go-dcgm ``pkg/dcgm/dcgm_fields.h``): the PCIe link (``DCGM_FI_DEV_PCIE_LINK_GEN``/``_WIDTH``
  and their ``_MAX_`` forms), uncorrectable ECC (``DCGM_FI_DEV_ECC_DBE_VOL_TOTAL``/``_AGG_TOTAL``),
  energy (``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION``, mJ), remapped rows
  (``DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS``..., dcgm-exporter's ``etc/default-counters.csv``), the
  clock-event reasons bitmask (``DCGM_FI_DEV_CLOCK_THROTTLE_REASONS`` or
  ``DCGM_FI_DEV_CLOCKS_EVENT_REASONS``, NVML's bits: named with the installed bindings' constants),
  P-state and fan;
* ``hwdash exporter``'s (the same DCGM series plus ``hwdash_*``: total bytes, the forecast, the
  diagnoses, per-process memory and the PyTorch probe's numbers). A diagnosis comes back with the
  remote host's own words from ``hwdash_gpu_diagnosis_info``; one that only
  ``hwdash_gpu_diagnosis{kind}`` reports (the info series dropped by a relabelling rule, say) is
  shown as "<kind> (reported by HOST)", its start the round it was first seen;
* nvitop-exporter's, whose names carry the unit (``gpu_memory_used_MiB``, ``gpu_utilization_Percentage``;
  labels ``hostname``, ``index``, ``devicename``, ``uuid``).

GPUs are numbered across the cluster in the order first seen (host, then the host's GPU number), so
history and alerts stay with their GPU; ``host`` and ``host_gpu`` say where each is. A host whose series
stop (Prometheus drops a failed target's series) keeps its last values, marked stale with how long ago
they were read; an unreachable server or a failed query is said in words and the last values are shown
as stale. Credentials come from the environment, never the command line:
``HWDASH_PROMETHEUS_TOKEN`` (a bearer token) or ``HWDASH_PROMETHEUS_USER`` and
``HWDASH_PROMETHEUS_PASSWORD`` (basic auth). They are sent to the URL's origin only (its scheme,
host and port): a redirect elsewhere, https to http included, is followed without them.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import time
import urllib.parse
from collections.abc import Callable, Mapping
from typing import IO, TYPE_CHECKING, Any

from hwdash.core.live.diagnoses import (
    DIAGNOSIS_KINDS,
    Diagnosis,
    DiagnosisEvent,
    DiagnosisKind,
    EventKind,
)
from hwdash.core.numbers import is_ascii_whole
from hwdash.core.units import MIB
from hwdash.errors import UsageError
from hwdash.telemetry.types import (
    GpuActivity,
    GpuSample,
    NvLinkState,
    NvmlStatus,
    PcieLink,
    ProcessSample,
    RemappedRows,
    Snapshot,
    TorchSample,
)

if TYPE_CHECKING:  # urllib.request (http.client, email) loads only when a query is made
    import urllib.request
    from http.client import HTTPMessage

#: Series name -> (field, scale to hwdash's units).
SERIES: dict[str, tuple[str, float]] = {
    "DCGM_FI_DEV_FB_USED": ("used_bytes", MIB),
    "DCGM_FI_DEV_FB_FREE": ("free_bytes", MIB),
    "DCGM_FI_DEV_FB_RESERVED": ("reserved_bytes", MIB),
    "DCGM_FI_DEV_GPU_UTIL": ("utilization_gpu", 1.0),
    "DCGM_FI_DEV_GPU_TEMP": ("temperature_c", 1.0),
    "DCGM_FI_DEV_POWER_USAGE": ("power_w", 1.0),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("energy_mj", 1.0),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("ecc_uncorrected", 1.0),
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": ("ecc_uncorrected_aggregate", 1.0),
    "DCGM_FI_DEV_PSTATE": ("pstate", 1.0),
    "DCGM_FI_DEV_GPU_PSTATE": ("pstate", 1.0),  # the field's name since DCGM's rename (190)
    "DCGM_FI_DEV_FAN_SPEED": ("fan_percent", 1.0),  # percent
    "DCGM_FI_DEV_FAN_SPEED_RATIO": ("fan_percent", 100.0),  # its successor: a ratio (1612)
    "hwdash_gpu_memory_total_bytes": ("total_bytes", 1.0),
    "hwdash_gpu_forecast_full_seconds": ("forecast_full_s", 1.0),
    # nvitop-exporter: the unit is part of the name.
    "gpu_memory_used_MiB": ("used_bytes", MIB),
    "gpu_memory_free_MiB": ("free_bytes", MIB),
    "gpu_memory_total_MiB": ("total_bytes", MIB),
    "gpu_utilization_Percentage": ("utilization_gpu", 1.0),
    "gpu_temperature_C": ("temperature_c", 1.0),
    "gpu_power_usage_W": ("power_w", 1.0),
    "gpu_power_limit_W": ("power_limit_w", 1.0),
}
PROCESS_SERIES = {
    "hwdash_process_memory_used_bytes": "used_bytes",
    "hwdash_process_sm_percent": "sm_percent",
    "hwdash_process_memory_bandwidth_percent": "memory_bandwidth_percent",
    "hwdash_process_torch_allocated_bytes": "allocated_bytes",
    "hwdash_process_torch_reserved_bytes": "reserved_bytes",
    "hwdash_process_torch_alloc_retries": "alloc_retries",
}
#: Series that fill one part of a composite reading: name -> (reading, part). The PCIe link
#: (:class:`PcieLink`), the remapped rows (:class:`RemappedRows`) and the clock-event bitmask.
PART_SERIES: dict[str, tuple[str, str]] = {
    "DCGM_FI_DEV_PCIE_LINK_GEN": ("pcie", "gen"),
    "DCGM_FI_DEV_PCIE_LINK_WIDTH": ("pcie", "width"),
    "DCGM_FI_DEV_PCIE_MAX_LINK_GEN": ("pcie", "gen_max"),
    "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH": ("pcie", "width_max"),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("remapped", "uncorrected"),
    "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL": ("remapped", "uncorrected"),  # renamed (393)
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("remapped", "corrected"),
    "DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL": ("remapped", "corrected"),  # renamed (394)
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("remapped", "failure"),
    "DCGM_FI_DEV_ROW_REMAP_FAILED": ("remapped", "failure"),  # renamed (395)
    "DCGM_FI_DEV_ROW_REMAP_PENDING": ("remapped", "pending"),
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": ("clocks", "mask"),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": ("clocks", "mask"),  # renamed (112)
    # The profiling fields are ratios (0..1); GpuActivity keeps percents.
    "DCGM_FI_PROF_SM_ACTIVE": ("activity", "sm_active"),
    "DCGM_FI_PROF_SM_OCCUPANCY": ("activity", "sm_occupancy"),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("activity", "tensor_active"),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("activity", "dram_active"),
    "hwdash_gpu_nvlinks": ("nvlink", "links"),
    "hwdash_gpu_nvlinks_active": ("nvlink", "active"),
}
DIAGNOSIS_SERIES = "hwdash_gpu_diagnosis"
"""1/0 per GPU and ``kind`` (``hwdash exporter``)."""
DIAGNOSIS_INFO_SERIES = "hwdash_gpu_diagnosis_info"
"""One per diagnosis in force, its words as labels (``hwdash exporter``)."""
INTEGER_FIELDS = {
    "used_bytes",
    "free_bytes",
    "reserved_bytes",
    "total_bytes",
    "energy_mj",
    "ecc_uncorrected",
    "ecc_uncorrected_aggregate",
    "pstate",
}
QUERY = "{__name__=~%s}" % json.dumps(  # noqa: UP031
    "|".join([*SERIES, *PART_SERIES, DIAGNOSIS_SERIES, DIAGNOSIS_INFO_SERIES, *PROCESS_SERIES])
)
STALE_AFTER_S = 30.0
"""A host whose series have not been seen for this long is shown as stale."""

TOKEN_ENV = "HWDASH_PROMETHEUS_TOKEN"
USER_ENV = "HWDASH_PROMETHEUS_USER"
PASSWORD_ENV = "HWDASH_PROMETHEUS_PASSWORD"


class PrometheusError(Exception):
    """The server could not be asked, or answered with an error; the message says which."""


def _label(labels: Mapping[str, str], *names: str) -> str | None:
    for name in names:
        value = labels.get(name)
        if value:
            return value
    return None


def auth_header(environ: Mapping[str, str]) -> str | None:
    """The Authorization header from the environment (a token wins over user and password)."""
    token = environ.get(TOKEN_ENV, "").strip()
    if token:
        return f"Bearer {token}"
    user = environ.get(USER_ENV, "")
    if user:
        secret = f"{user}:{environ.get(PASSWORD_ENV, '')}".encode()
        return "Basic " + base64.b64encode(secret).decode("ascii")
    return None


def check_url(url: str) -> str:
    """An http(s) URL without credentials in it (they belong in the environment)."""
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise UsageError(f"{url!r} is not an http:// or https:// URL", flag="--prometheus")
    if parsed.username or parsed.password:
        raise UsageError(
            f"put credentials in {TOKEN_ENV} or {USER_ENV}/{PASSWORD_ENV}, not in the URL "
            "(command lines are visible to every user of the machine)",
            flag="--prometheus",
        )
    return url.rstrip("/")


class PrometheusSampler:
    """Implements :class:`~hwdash.telemetry.types.Sampler` over a Prometheus server."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 3.0,
        environ: Mapping[str, str] | None = None,
        wall_clock: Callable[[], float] = time.time,
        fetch: Callable[[urllib.request.Request, float], bytes] | None = None,
    ) -> None:
        import os

        self.url = check_url(url)
        self.timeout_s = timeout_s
        self._auth = auth_header(os.environ if environ is None else environ)
        self._clock = wall_clock
        self._fetch = fetch or _fetch
        self._indices: dict[tuple[str, str], int] = {}
        self._last: dict[int, GpuSample] = {}
        self._seen_at: dict[str, float] = {}
        self._held: dict[int, dict[tuple[DiagnosisKind, int | None, float], Diagnosis]] = {}
        """GPU index -> its diagnoses of the last round (for the raised/cleared events)."""
        self._diagnosis_seen: dict[tuple[str, str, str], float] = {}
        """(host, GPU, kind) -> when a diagnosis without its words was first seen (its ``since``)."""

    @property
    def source(self) -> str:
        """Where the readings come from, in words (the status line and JSON's ``nvml.source``)."""
        return f"Prometheus {self.url}"

    # -- the query ----------------------------------------------------------------------------

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query's result vector. Raises :class:`PrometheusError`."""
        import urllib.error
        import urllib.request

        address = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        request = urllib.request.Request(address, headers={"Accept": "application/json"})
        if self._auth:
            # An "unredirected" header: urllib's HTTPRedirectHandler.redirect_request builds the
            # next request from ``req.headers`` (every header but the content ones, Authorization
            # included when set with add_header) and leaves ``req.unredirected_hdrs`` behind
            # (CPython Lib/urllib/request.py). So a redirect to another host, port or scheme
            # (https -> http too) never carries the credentials; _OriginRedirects puts them back
            # only on a redirect to the same origin.
            request.add_unredirected_header("Authorization", self._auth)
        try:
            body = self._fetch(request, self.timeout_s)
        except urllib.error.HTTPError as exc:
            detail = _error_detail(exc)
            moved = ""
            final = origin(exc.url or "")
            if self._auth and final is not None and final != origin(self.url):
                moved = (
                    f" (redirected to {format_origin(final)}, where hwdash does not send "
                    f"credentials: they go only to {format_origin(origin(self.url))})"
                )
            raise PrometheusError(
                f"Prometheus at {self.url} answered HTTP {exc.code}{detail}{moved}"
            ) from None
        except (urllib.error.URLError, OSError, TimeoutError) as exc:
            reason = getattr(exc, "reason", exc)
            raise PrometheusError(f"Prometheus at {self.url} cannot be reached: {reason}") from None
        try:
            data = json.loads(body)
        except ValueError:
            raise PrometheusError(f"{self.url} did not answer with Prometheus' JSON") from None
        if not isinstance(data, dict) or data.get("status") != "success":
            error = data.get("error") if isinstance(data, dict) else None
            raise PrometheusError(f"the query failed: {error or 'no reason given'}")
        result = data.get("data", {}).get("result")
        if not isinstance(result, list):
            raise PrometheusError("the query did not return an instant vector")
        return [item for item in result if isinstance(item, dict)]

    # -- the sampler ----------------------------------------------------------------------------

    def sample(self) -> Snapshot:
        started = time.perf_counter()
        now = self._clock()
        try:
            result = self.query(QUERY)
        except PrometheusError as exc:
            return self._unreachable(now, str(exc), started)
        gpus = self._gpus(result, now)
        status = NvmlStatus(available=True, source=self.source)
        errors = tuple(self._stale_hosts(now))
        if not gpus:
            status = NvmlStatus(
                available=False,
                source=self.source,
                error=f"Prometheus at {self.url} has no GPU series (dcgm-exporter, hwdash exporter "
                "or nvitop-exporter)",
            )
        return Snapshot(
            timestamp=now,
            nvml=status,
            gpus=gpus,
            errors=errors,
            sample_seconds=time.perf_counter() - started,
            diagnosis_events=tuple(self._diagnosis_events(gpus, now)),
        )

    def _diagnosis_events(self, gpus: tuple[GpuSample, ...], now: float) -> list[DiagnosisEvent]:
        """A remote diagnosis that appeared since the last round is ``raised``, one that went is
        ``cleared`` (so the alert log and ``--on-alert`` hear of each host's diagnoses as of this
        machine's own); one diagnosis is its kind, process and start."""
        events: list[DiagnosisEvent] = []
        for gpu in gpus:
            before = self._held.get(gpu.index, {})
            now_held = {(d.kind, d.pid, d.since): d for d in gpu.diagnoses}
            for key, diagnosis in now_held.items():
                if key not in before:
                    events.append(_event("raised", gpu, diagnosis, diagnosis.message, now))
            for key, gone in before.items():
                if key not in now_held:
                    words = f"{gone.kind} no longer reported by {gpu.host}"
                    events.append(_event("cleared", gpu, gone, words, now))
            self._held[gpu.index] = now_held
        return events

    def close(self) -> None:
        """Nothing to release."""

    def _unreachable(self, now: float, message: str, started: float) -> Snapshot:
        last = tuple(self._mark_stale(gpu, now) for _index, gpu in sorted(self._last.items()))
        return Snapshot(
            timestamp=now,
            nvml=NvmlStatus(available=bool(last), error=message, source=self.source),
            gpus=last,
            errors=(message,),
            stale=bool(last),
            sample_seconds=time.perf_counter() - started,
        )

    def _mark_stale(self, gpu: GpuSample, now: float) -> GpuSample:
        seen = self._seen_at.get(gpu.host or "", now)
        note = f"stale: no data from {gpu.host} for {now - seen:.0f} s (last values shown)"
        errors = (*(item for item in gpu.errors if item[0] != "host"), ("host", note))
        # A forecast read from frozen data is not a forecast: the host's last climb may be long over.
        return dataclasses.replace(gpu, errors=errors, forecast_full_s=None)

    def _stale_hosts(self, now: float) -> list[str]:
        return [
            f"{host}: no data for {now - seen:.0f} s (its last values are shown, marked stale)"
            for host, seen in sorted(self._seen_at.items())
            if now - seen >= STALE_AFTER_S
        ]

    def _gpus(self, result: list[dict[str, Any]], now: float) -> tuple[GpuSample, ...]:
        fields: dict[tuple[str, str], dict[str, Any]] = {}
        parts: dict[tuple[str, str], dict[str, dict[str, float]]] = {}
        flagged: dict[tuple[str, str], set[str]] = {}
        """The kinds ``hwdash_gpu_diagnosis`` says are in force, per GPU."""
        told: dict[tuple[str, str], list[Mapping[str, str]]] = {}
        """The labels of each GPU's ``hwdash_gpu_diagnosis_info`` series."""
        processes: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
        for item in result:
            labels = item.get("metric") or {}
            value = _value(item.get("value"))
            name = labels.get("__name__", "")
            host = _label(labels, "Hostname", "hostname", "instance")
            gpu = _label(labels, "gpu", "index")
            if host is None or gpu is None or value is None:
                continue
            key = (host, gpu)
            entry = fields.setdefault(key, {})
            entry.setdefault("name", _label(labels, "modelName", "devicename"))
            entry.setdefault("uuid", _label(labels, "UUID", "uuid"))
            if name in SERIES:
                field, scale = SERIES[name]
                entry[field] = value * scale
            elif name in PART_SERIES:
                reading, part = PART_SERIES[name]
                parts.setdefault(key, {}).setdefault(reading, {})[part] = value
            elif name == DIAGNOSIS_SERIES:
                if value == 1:
                    flagged.setdefault(key, set()).add(labels.get("kind", ""))
            elif name == DIAGNOSIS_INFO_SERIES:
                told.setdefault(key, []).append(labels)
            elif name in PROCESS_SERIES:
                pid = labels.get("pid", "")
                row = processes.setdefault(key, {}).setdefault(pid, {"labels": labels})
                row[PROCESS_SERIES[name]] = value
        present: set[int] = set()
        seen_diagnoses: set[tuple[str, str, str]] = set()
        for (host, gpu), entry in fields.items():
            index = self._indices.setdefault((host, gpu), len(self._indices))
            present.add(index)
            self._seen_at[host] = now
            sample = self._sample(index, host, gpu, entry, processes.get((host, gpu), {}))
            diagnoses = self._diagnoses(
                host, gpu, flagged.get((host, gpu), set()), told.get((host, gpu), []), now
            )
            seen_diagnoses.update((host, gpu, d.kind) for d in diagnoses)
            self._last[index] = dataclasses.replace(
                sample, diagnoses=diagnoses, **_health(parts.get((host, gpu), {}))
            )
        for seen in [seen for seen in self._diagnosis_seen if seen[:2] in fields]:
            if seen not in seen_diagnoses:  # cleared on a host that still reports
                del self._diagnosis_seen[seen]
        shown: list[GpuSample] = []
        for index, last in sorted(self._last.items()):
            shown.append(last if index in present else self._mark_stale(last, now))
        return tuple(shown)

    def _sample(
        self,
        index: int,
        host: str,
        gpu: str,
        entry: dict[str, Any],
        processes: dict[str, dict[str, Any]],
    ) -> GpuSample:
        values = {
            field: (round(value) if field in INTEGER_FIELDS else value)
            for field, value in entry.items()
            if field not in ("name", "uuid")
        }
        used, free, reserved = (
            values.get(f) for f in ("used_bytes", "free_bytes", "reserved_bytes")
        )
        if "total_bytes" not in values and used is not None and free is not None:
            # dcgm-exporter has no total: framebuffer total = used + free + reserved.
            values["total_bytes"] = used + free + (reserved or 0)
        return GpuSample(
            index=index,
            name=entry.get("name"),
            uuid=entry.get("uuid"),
            host=host,
            host_gpu=int(gpu) if is_ascii_whole(gpu) else None,
            processes=tuple(
                _process(index, host, gpu, pid, row)
                for pid, row in sorted(processes.items())
                if is_ascii_whole(pid)
            ),
            **values,
        )

    def _diagnoses(
        self,
        host: str,
        gpu: str,
        flagged: set[str],
        told: list[Mapping[str, str]],
        now: float,
    ) -> tuple[Diagnosis, ...]:
        """The GPU's diagnoses: one per info series (the remote host's words), then one per kind
        flagged 1 without any (generic words; its start the round it was first seen here)."""
        found: list[Diagnosis] = []
        for labels in told:
            kind = _kind(labels.get("kind", ""))
            if kind is None:  # a kind this hwdash does not know (a newer exporter's)
                continue
            pid = labels.get("pid", "")
            found.append(
                Diagnosis(
                    kind,
                    labels.get("message") or f"{kind} (reported by {host})",
                    _since(labels.get("since"), now),
                    labels.get("hint", ""),
                    int(pid) if is_ascii_whole(pid) else None,
                )
            )
        described = {diagnosis.kind for diagnosis in found}
        for name in sorted(flagged - described, key=_kind_order):
            kind = _kind(name)
            if kind is None:
                continue
            since = self._diagnosis_seen.setdefault((host, gpu, kind), now)
            found.append(
                Diagnosis(
                    kind,
                    f"{kind} (reported by {host})",
                    since,
                    f"see hwdash monitor or the alert log on {host} for details",
                )
            )
        return tuple(found)


def _event(
    event: EventKind, gpu: GpuSample, diagnosis: Diagnosis, message: str, now: float
) -> DiagnosisEvent:
    return DiagnosisEvent(
        event,
        diagnosis.kind,
        gpu.index,
        message,
        diagnosis.hint,
        diagnosis.since,
        now,
        diagnosis.pid,
    )


def _kind(name: str) -> DiagnosisKind | None:
    for kind in DIAGNOSIS_KINDS:
        if kind == name:
            return kind
    return None


def _kind_order(name: str) -> int:
    kind = _kind(name)
    return len(DIAGNOSIS_KINDS) if kind is None else DIAGNOSIS_KINDS.index(kind)


def _since(text: str | None, default: float) -> float:
    try:
        since = float(text or "")
    except ValueError:
        return default
    return since if math.isfinite(since) else default


def _health(parts: dict[str, dict[str, float]]) -> dict[str, Any]:
    """The composite health readings of one GPU from their parts (absent: left as they are)."""
    found: dict[str, Any] = {}
    pcie = parts.get("pcie")
    if pcie:
        found["pcie"] = PcieLink(**{part: round(value) for part, value in pcie.items()})
    remapped = parts.get("remapped")
    if remapped:
        # dcgm-exporter's default counters carry no pending flag: absent reads as not pending.
        found["remapped_rows"] = RemappedRows(
            corrected=round(remapped.get("corrected", 0)),
            uncorrected=round(remapped.get("uncorrected", 0)),
            pending=bool(remapped.get("pending", 0)),
            failure=bool(remapped.get("failure", 0)),
        )
    mask = parts.get("clocks", {}).get("mask")
    if mask is not None and mask >= 0:
        from hwdash.telemetry.nvml_health import installed_reason_bits, reason_names

        found["clocks_event_reasons"] = reason_names(int(mask), installed_reason_bits())
    activity = parts.get("activity")
    if activity:
        found["activity"] = GpuActivity(
            source="gpm", **{metric: round(100.0 * value, 6) for metric, value in activity.items()}
        )
    nvlink = parts.get("nvlink")
    if nvlink and "links" in nvlink:
        found["nvlink"] = NvLinkState(
            links=round(nvlink["links"]), active=round(nvlink.get("active", 0))
        )
    return found


def _process(index: int, host: str, gpu: str, pid: str, row: dict[str, Any]) -> ProcessSample:
    labels = row["labels"]
    torch = None
    if "allocated_bytes" in row or "reserved_bytes" in row:
        torch = TorchSample(
            allocated_bytes=round(row.get("allocated_bytes", 0)),
            reserved_bytes=round(row.get("reserved_bytes", 0)),
            max_allocated_bytes=None,  # no series carries the peak: unknown, not zero
            max_reserved_bytes=None,
            alloc_retries=round(row.get("alloc_retries", 0)),
            ooms=0,
            step=None,
        )
    used = row.get("used_bytes")
    return ProcessSample(
        pid=int(pid),
        gpu_index=index,
        kind="compute",
        used_bytes=None if used is None else round(used),
        visible=False,  # another machine's PID: never looked up here
        verifiable=False,
        user=labels.get("user") or None,
        cmdline=labels.get("command") or None,
        torch=torch,
        host=host,
        host_gpu=int(gpu) if is_ascii_whole(gpu) else None,
        sm_percent=row.get("sm_percent"),
        memory_bandwidth_percent=row.get("memory_bandwidth_percent"),
    )


def _value(pair: Any) -> float | None:
    if not isinstance(pair, list) or len(pair) != 2:
        return None
    try:
        value = float(pair[1])
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _error_detail(exc: Any) -> str:
    try:
        data = json.loads(exc.read())
    except (ValueError, OSError):
        return ""
    error = data.get("error") if isinstance(data, dict) else None
    return f": {error}" if error else ""


Origin = tuple[str, str, int]
"""(scheme, host, port): what a browser calls an origin (RFC 6454, section 4)."""

DEFAULT_PORTS = {"http": 80, "https": 443}


def origin(url: str) -> Origin | None:
    """The scheme, host (lower case) and port of ``url``, the port filled in from the scheme;
    None for a URL that has no host or whose port cannot be read."""
    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    try:
        port = parts.port or DEFAULT_PORTS.get(scheme)
    except ValueError:  # a port that is not a number, or out of range
        return None
    if not parts.hostname or port is None:
        return None
    return (scheme, parts.hostname.lower(), port)


def format_origin(where: Origin | None) -> str:
    """``scheme://host:port`` (IPv6 hosts in brackets)."""
    if where is None:
        return "an unknown address"
    scheme, host, port = where
    return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}"


def _origin_redirects() -> urllib.request.HTTPRedirectHandler:
    """A redirect handler that carries the credentials only while every hop stays on the same
    scheme, host and port (as curl does without --location-trusted)."""
    import urllib.request

    class _OriginRedirects(urllib.request.HTTPRedirectHandler):
        def redirect_request(
            self,
            req: urllib.request.Request,
            fp: IO[bytes],
            code: int,
            msg: str,
            headers: HTTPMessage,
            newurl: str,
        ) -> urllib.request.Request | None:
            new = super().redirect_request(req, fp, code, msg, headers, newurl)
            credentials = req.unredirected_hdrs.get("Authorization")
            # ``newurl`` is already absolute (http_error_302 joins it with the request's URL).
            here = origin(req.full_url)
            if (
                new is not None
                and credentials
                and here is not None
                and origin(new.full_url) == here
            ):
                new.add_unredirected_header("Authorization", credentials)
            return new

    return _OriginRedirects()


def _fetch(request: urllib.request.Request, timeout: float) -> bytes:
    import urllib.request

    opener = urllib.request.build_opener(_origin_redirects())  # replaces the default handler
    with opener.open(request, timeout=timeout) as response:  # check_url: http(s) only
        body: bytes = response.read()
    return body
