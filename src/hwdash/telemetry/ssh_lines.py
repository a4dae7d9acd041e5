"""What an SSH host's remote command prints, read as data (:mod:`hwdash.telemetry.ssh_source`): one
``nvidia-smi --query-gpu`` CSV line, one ``--query-compute-apps`` line, or one ``hwdash monitor
--json`` snapshot, each parsed defensively (a line that does not parse raises :class:`LineError`
and is counted and skipped by the caller; names lose their control characters and are cut to
:data:`MAX_TEXT` characters). Nothing read here is ever evaluated or run.
"""

from __future__ import annotations

import dataclasses
import math

from hwdash.core.numbers import is_ascii_whole
from hwdash.core.units import MIB
from hwdash.telemetry.types import GpuSample

GPU_FIELDS = (
    "index",
    "uuid",
    "name",
    "memory.used",
    "memory.total",
    "utilization.gpu",
    "temperature.gpu",
    "power.draw",
)
"""``nvidia-smi --query-gpu`` fields, in the order the parser reads them (MiB, %, C, W with
``nounits``)."""
APP_FIELDS = ("gpu_uuid", "pid", "used_memory", "process_name")
"""``nvidia-smi --query-compute-apps`` fields (``used_memory`` in MiB)."""

MAX_TEXT = 256
"""Names, commands and error words from a remote are cut to this many characters."""
MAX_GPU_INDEX = 1023
JSON_DEPTH = 16
"""The replay's nesting limit (:data:`hwdash.telemetry.replay.MAX_LINE_DEPTH`)."""


def clean_text(value: str | None, limit: int = MAX_TEXT) -> str | None:
    """Remote words as text: control characters (escape sequences, carriage returns) replaced,
    cut to ``limit`` characters."""
    if value is None:
        return None
    cleaned = "".join(ch if ch.isprintable() else "\ufffd" for ch in value[:limit])
    return cleaned


def _number(text: str) -> float | None:
    """A reading, or None for nvidia-smi's ``[N/A]``/``[Not Supported]`` (anything not a finite
    number)."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _whole(text: str) -> int | None:
    """A whole number of ASCII digits (``str.isdigit`` also takes ``²``, which ``int`` refuses),
    at most 10 of them; else None."""
    if len(text) > 10 or not is_ascii_whole(text):
        return None
    return int(text)


class LineError(ValueError):
    """A remote line that is not what the parser reads (counted and skipped)."""


@dataclasses.dataclass(frozen=True)
class GpuLine:
    """One ``--query-gpu`` line."""

    index: int
    uuid: str | None
    name: str | None
    used_bytes: int | None
    total_bytes: int | None
    utilization_gpu: float | None
    temperature_c: float | None
    power_w: float | None


def parse_gpu_line(line: str) -> GpuLine:
    """One ``--query-gpu`` CSV line (:data:`GPU_FIELDS`); raises :class:`LineError`."""
    cells = [cell.strip() for cell in line.split(",")]
    if len(cells) != len(GPU_FIELDS):
        raise LineError(f"{len(cells)} fields, not {len(GPU_FIELDS)}")
    index_text, uuid, name, used, total, util, temp, power = cells
    index = _whole(index_text)
    if index is None or index > MAX_GPU_INDEX:
        raise LineError("the GPU index is not a number")
    used_mib, total_mib = _number(used), _number(total)
    if (used_mib is not None and used_mib < 0) or (total_mib is not None and total_mib <= 0):
        raise LineError("negative memory")
    if used_mib is not None and total_mib is not None and used_mib > total_mib:
        raise LineError("more memory used than the GPU has")
    utilization = _number(util)
    if utilization is not None and not 0 <= utilization <= 100:
        utilization = None
    return GpuLine(
        index=index,
        uuid=clean_text(uuid) or None,
        name=clean_text(name) or None,
        used_bytes=None if used_mib is None else round(used_mib * MIB),
        total_bytes=None if total_mib is None else round(total_mib * MIB),
        utilization_gpu=utilization,
        temperature_c=_number(temp),
        power_w=_number(power),
    )


@dataclasses.dataclass(frozen=True)
class AppLine:
    """One ``--query-compute-apps`` line."""

    gpu_uuid: str
    pid: int
    used_bytes: int | None
    name: str | None


def parse_app_line(line: str) -> AppLine:
    """One ``--query-compute-apps`` CSV line (:data:`APP_FIELDS`; the process name, last, may hold
    commas); raises :class:`LineError`."""
    cells = line.split(",", len(APP_FIELDS) - 1)
    if len(cells) != len(APP_FIELDS):
        raise LineError(f"{len(cells)} fields, not {len(APP_FIELDS)}")
    uuid, pid_text, used, name = (cell.strip() for cell in cells)
    pid = _whole(pid_text)
    if pid is None or not 0 < pid < 2**32:
        raise LineError("the PID is not a number")
    used_mib = _number(used)
    if used_mib is not None and used_mib < 0:
        raise LineError("negative memory")
    return AppLine(
        gpu_uuid=clean_text(uuid) or "",
        pid=pid,
        used_bytes=None if used_mib is None else round(used_mib * MIB),
        name=clean_text(name) or None,
    )


def parse_snapshot_line(line: str) -> tuple[tuple[GpuSample, ...], str | None]:
    """The GPUs of one ``hwdash monitor --json`` line, each numbered by its index on the remote
    (``host`` and cluster indices are set by the caller), and the remote's NVML error (no driver
    there, say) or None; raises :class:`LineError`."""
    from hwdash.core.strict_json import loads
    from hwdash.telemetry.replay import snapshot_from_dict

    try:
        snapshot = snapshot_from_dict(loads(line, max_depth=JSON_DEPTH))
    except (ValueError, TypeError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        raise LineError(f"not a hwdash snapshot ({str(exc)[:80]})") from None
    gpus = []
    for gpu in snapshot.gpus:
        if not 0 <= gpu.index <= MAX_GPU_INDEX:
            raise LineError("a GPU index out of range")
        gpus.append(_clean_gpu(gpu))
    return tuple(gpus), clean_text(snapshot.nvml.error)


def _clean_gpu(gpu: GpuSample) -> GpuSample:
    return dataclasses.replace(
        gpu,
        name=clean_text(gpu.name),
        uuid=clean_text(gpu.uuid),
        errors=tuple(
            (clean_text(field) or "", clean_text(why) or "")
            for field, why in gpu.errors
            if field != "host"
        ),
        processes=tuple(
            dataclasses.replace(
                process,
                name=clean_text(process.name),
                user=clean_text(process.user),
                cmdline=clean_text(process.cmdline, 4 * MAX_TEXT),
                container=clean_text(process.container),
            )
            for process in gpu.processes
        ),
    )


# -- one host -------------------------------------------------------------------------------------


def gpu_of(reading: GpuLine) -> GpuSample:
    """An nvidia-smi ``--query-gpu`` reading as a GpuSample (the query has no memory.reserved:
    free is what the used count leaves)."""
    free = None
    if reading.total_bytes is not None and reading.used_bytes is not None:
        free = reading.total_bytes - reading.used_bytes
    return GpuSample(
        index=reading.index,
        name=reading.name,
        uuid=reading.uuid,
        total_bytes=reading.total_bytes,
        used_bytes=reading.used_bytes,
        free_bytes=free,
        utilization_gpu=reading.utilization_gpu,
        temperature_c=reading.temperature_c,
        power_w=reading.power_w,
    )
