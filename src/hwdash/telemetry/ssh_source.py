"""Other boxes over SSH, without installing anything there: one more sampler behind the same protocol.

Each host gets one long-running remote command through the system ``ssh`` client (never a shell
string here: an argv list; the user's own ``~/.ssh/config``, keys and known hosts apply), which
streams lines until the connection ends:

* ``hwdash monitor --json --interval S`` when ``command -v hwdash`` finds hwdash on the remote: one
  snapshot per line, read back with the replay's parser (:func:`hwdash.telemetry.replay.snapshot_from_dict`);
* else ``nvidia-smi --query-gpu=... --format=csv,noheader,nounits -l S`` (a GPU per line, every S
  seconds; the field list is :data:`GPU_FIELDS`, the names nvidia-smi's ``--help-query-gpu`` documents),
  and beside it a loop asking ``--query-compute-apps=...`` every S seconds, its lines prefixed
  ``@app`` so the two streams can share the one connection.

Connections are multiplexed (``ControlMaster=auto``, the sockets in a private 0700 temporary
directory, ``ControlPersist``), so reconnecting after a drop does not pay a new handshake while the
master lives. ``BatchMode=yes`` (never a password prompt) and ``ConnectTimeout`` bound the start; a
read that stays silent past :attr:`SshSampler.silence_s` ends the connection, and a lost one is
retried with a doubling backoff.

A reader thread per host parses lines into :class:`~hwdash.telemetry.types.GpuSample` objects
(``host`` the name given, ``host_gpu`` the GPU's number there); :meth:`SshSampler.sample` returns the
newest of every host without waiting on any. A host whose newest reading is older than
:data:`STALE_INTERVALS` intervals (nvidia-smi's: whole seconds) is stale, and unreachable once its connection is gone or nothing
came for :data:`UNREACHABLE_INTERVALS` intervals; its last values stay on screen, marked (the
Prometheus source's wording, :mod:`hwdash.telemetry.prometheus_source`).

Remote output is data: it is never evaluated or run. A line longer than :data:`MAX_LINE_BYTES` is
cut and skipped, a line that does not parse is counted and skipped, and control characters in names
(terminal escape sequences) become ``\\ufffd``; the views draw names as plain text, never as markup.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import selectors
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from hwdash.core.units import MIB
from hwdash.errors import UsageError
from hwdash.telemetry.types import GpuSample, NvmlStatus, ProcessSample, Snapshot

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

STALE_INTERVALS = 1.5
"""A host whose newest reading is older than this many intervals is shown stale."""
UNREACHABLE_INTERVALS = 3.0
"""...and unreachable after this many (or at once when its connection is gone)."""
MAX_LINE_BYTES = 4 * 1024 * 1024
"""A longer line is cut and skipped (a snapshot of 8 GPUs with processes is a few tens of KiB)."""
MAX_TEXT = 256
"""Names, commands and error words from a remote are cut to this many characters."""
MAX_HOSTS = 256
BACKOFF_MAX_S = 30.0
CONTROL_PERSIST_S = 60
MAX_GPU_INDEX = 1023
JSON_DEPTH = 16
"""The replay's nesting limit (:data:`hwdash.telemetry.replay.MAX_LINE_DEPTH`)."""

APP_PREFIX = "@app "
APPS_BEGIN = "@apps"
APPS_END = "@apps-end"
ERROR_PREFIX = "@hwdash-error "


def remote_command(interval_s: float) -> str:
    """The one command each host runs (the remote's login shell reads it: ``ssh`` hands a remote
    command to the remote shell whatever the client does). Nothing in it comes from the user but
    the interval, a number formatted here."""
    seconds = f"{interval_s:g}"
    # nvidia-smi's -l takes whole seconds (its --help: "-l, --loop= Probe until Ctrl+C at
    # specified second interval"); below 1 s it would refuse the value.
    loop = max(1, math.ceil(interval_s))
    gpu = ",".join(GPU_FIELDS)
    apps = ",".join(APP_FIELDS)
    return (
        "if command -v hwdash >/dev/null 2>&1; then "
        f"exec hwdash monitor --json --interval {seconds}; fi; "
        "if ! command -v nvidia-smi >/dev/null 2>&1; then "
        f"echo '{ERROR_PREFIX}neither hwdash nor nvidia-smi is on the PATH'; exit 127; fi; "
        f"(while :; do echo {APPS_BEGIN} || exit; "
        f"nvidia-smi --query-compute-apps={apps} --format=csv,noheader,nounits "
        f"| sed 's/^/{APP_PREFIX}/'; echo {APPS_END} || exit; sleep {loop}; done) & "
        f"exec nvidia-smi --query-gpu={gpu} --format=csv,noheader,nounits -l {loop}"
    )


# -- the hosts ------------------------------------------------------------------------------------


def check_host(name: str, *, flag: str = "--ssh") -> str:
    """A host as ``ssh`` takes it (``node-a``, ``me@node-a``, an alias of ``~/.ssh/config``);
    refused: an empty name, one that starts with ``-`` (ssh would read it as an option:
    ``-oProxyCommand=...`` runs a command here), whitespace or control characters."""
    host = name.strip()
    if not host:
        raise UsageError("a host name is empty", flag=flag)
    if host.startswith("-"):
        raise UsageError(
            f"{host!r} is not a host name (it starts with '-', which ssh would read as an option)",
            flag=flag,
        )
    if len(host) > 255 or any(ch.isspace() or not ch.isprintable() for ch in host):
        raise UsageError(
            f"{host!r} is not a host name (spaces or control characters, or too long)", flag=flag
        )
    return host


def parse_hosts(text: str, *, read: Callable[[Path], str] | None = None) -> tuple[str, ...]:
    """``--ssh``: ``HOST[,HOST...]``, or ``@FILE`` (one host a line, ``#`` comments, blank lines
    skipped). Duplicates are kept once, in the order given."""
    if text.startswith("@"):
        path = Path(text[1:]).expanduser()
        try:
            content = (read or _read_text)(path)
        except OSError as exc:
            raise UsageError(f"cannot read {path}: {exc.strerror or exc}", flag="--ssh") from None
        names = [line.split("#", 1)[0].strip() for line in content.splitlines()]
        names = [name for name in names if name]
        if not names:
            raise UsageError(f"{path} names no host (one a line; # starts a comment)", flag="--ssh")
    else:
        names = text.split(",")
    hosts = tuple(dict.fromkeys(check_host(name) for name in names))
    if len(hosts) > MAX_HOSTS:
        raise UsageError(f"{len(hosts)} hosts; at most {MAX_HOSTS}", flag="--ssh")
    return hosts


def _read_text(path: Path) -> str:
    return path.read_text(encoding="utf-8", errors="replace")


# -- parsing remote output ------------------------------------------------------------------------


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
    if not 0 < len(text) <= 10 or not all("0" <= ch <= "9" for ch in text):
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


class HostStream:
    """What one host said last: its GPUs by their number there, their processes, when, and the
    state of its connection. Fed line by line (:meth:`feed`) by the reader thread; read by
    :meth:`SshSampler.sample` under :attr:`lock`."""

    def __init__(self, host: str, clock: Callable[[], float] = time.time) -> None:
        self.host = host
        self.clock = clock
        self.lock = threading.Lock()
        self.gpus: dict[int, tuple[GpuSample, float]] = {}
        """host GPU number -> (its newest reading, without processes, and when it came)."""
        self.apps: dict[str, list[ProcessSample]] = {}
        """GPU UUID -> its compute processes (nvidia-smi's last completed list)."""
        self._apps_pending: dict[str, list[ProcessSample]] | None = None
        self.from_hwdash: dict[int, tuple[ProcessSample, ...]] = {}
        self.last_data_at: float | None = None
        self.connected = False
        self.error: str | None = None
        """Why the last connection ended (ssh's last words)."""
        self.remote_error: str | None = None
        """What the remote said was wrong (no hwdash or nvidia-smi there)."""
        self.bad_lines = 0
        self.mode: str | None = None
        """``hwdash`` or ``nvidia-smi``: what the remote runs (known from its first line)."""

    def feed(self, line: str) -> None:
        """One remote line (without its newline); a line that does not parse is counted."""
        now = self.clock()
        try:
            self._feed(line.rstrip("\r"), now)
        except Exception:  # LineError, or anything else odd input provokes: the reader goes on
            with self.lock:
                self.bad_lines += 1

    def cut_line(self) -> None:
        """A line longer than :data:`MAX_LINE_BYTES` was skipped."""
        with self.lock:
            self.bad_lines += 1

    def _feed(self, line: str, now: float) -> None:
        if not line.strip():
            return
        if line.startswith("{"):
            gpus, nvml_error = parse_snapshot_line(line)
            with self.lock:
                self.mode = "hwdash"
                self.remote_error = nvml_error
                self.gpus = {gpu.index: (gpu, now) for gpu in gpus}
                self.from_hwdash = {gpu.index: gpu.processes for gpu in gpus}
                self.last_data_at = now
            return
        if line.startswith(ERROR_PREFIX):
            with self.lock:
                self.remote_error = clean_text(line.removeprefix(ERROR_PREFIX))
            return
        if line == APPS_BEGIN:
            with self.lock:
                self._apps_pending = {}
            return
        if line == APPS_END:
            with self.lock:
                if self._apps_pending is not None:
                    self.apps = self._apps_pending
                self._apps_pending = None
            return
        if line.startswith(APP_PREFIX):
            app = parse_app_line(line.removeprefix(APP_PREFIX))
            process = ProcessSample(
                pid=app.pid,
                gpu_index=0,  # set when the GPU is placed in the cluster
                kind="compute",
                used_bytes=app.used_bytes,
                visible=False,  # another machine's PID: never looked up here
                verifiable=False,
                name=app.name,
                cmdline=app.name,
                host=self.host,
            )
            with self.lock:
                if self._apps_pending is not None:
                    self._apps_pending.setdefault(app.gpu_uuid, []).append(process)
            return
        reading = parse_gpu_line(line)
        free = None
        if reading.total_bytes is not None and reading.used_bytes is not None:
            # The query has no memory.reserved: free is what the used count leaves.
            free = reading.total_bytes - reading.used_bytes
        gpu = GpuSample(
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
        with self.lock:
            self.mode = "nvidia-smi"
            self.gpus[reading.index] = (gpu, now)
            self.last_data_at = now

    def readings(self) -> list[tuple[GpuSample, float]]:
        """Each GPU's newest reading with its processes, by number on the host (under the lock)."""
        found = []
        for number, (gpu, at) in sorted(self.gpus.items()):
            if self.mode == "hwdash":
                processes = self.from_hwdash.get(number, ())
            else:
                processes = tuple(self.apps.get(gpu.uuid or "", ()))
            found.append((dataclasses.replace(gpu, processes=processes), at))
        return found


# -- the sampler ----------------------------------------------------------------------------------


class SshSampler:
    """Implements :class:`~hwdash.telemetry.types.Sampler` over hosts reached with ``ssh`` (see the
    module). ``ssh`` is the client's argv start (a test's stand-in); ``config`` a client config
    file passed as ``-F``."""

    def __init__(
        self,
        hosts: Sequence[str],
        *,
        interval_s: float = 1.0,
        connect_timeout_s: int = 10,
        config: Path | None = None,
        ssh: Sequence[str] | None = None,
        clock: Callable[[], float] = time.time,
        first_wait_s: float | None = None,
        start: bool = True,
    ) -> None:
        if not hosts:
            raise UsageError("no host given", flag="--ssh")
        self.hosts = tuple(check_host(host) for host in hosts)
        self.interval_s = interval_s
        self.connect_timeout_s = connect_timeout_s
        self.config = config
        if ssh is None:
            found = shutil.which("ssh")
            if found is None:
                raise UsageError("no `ssh` client on the PATH (OpenSSH's)", flag="--ssh")
            ssh = (found,)
        self.ssh = tuple(ssh)
        self.clock = clock
        self.silence_s = UNREACHABLE_INTERVALS * interval_s + connect_timeout_s
        """A connection silent this long (no line at all) is ended and retried."""
        self.first_wait_s = (
            connect_timeout_s + max(5.0, UNREACHABLE_INTERVALS * interval_s)
            if first_wait_s is None
            else first_wait_s
        )
        self.streams = {host: HostStream(host, clock) for host in self.hosts}
        self._control_dir = tempfile.mkdtemp(prefix="hwdash-ssh-")  # mode 0700 (tempfile's)
        os.chmod(self._control_dir, 0o700)
        self._stop = threading.Event()
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._procs_lock = threading.Lock()
        self._indices: dict[tuple[str, int], int] = {}
        self._started_at = clock()
        self._first = True
        self._threads = [
            threading.Thread(target=self._read_host, args=(host,), name=f"ssh {host}", daemon=True)
            for host in self.hosts
        ]
        if start:
            for thread in self._threads:
                thread.start()

    @property
    def source(self) -> str:
        """Where the readings come from, in words (the status line and JSON's ``nvml.source``)."""
        if len(self.hosts) <= 3:
            return "SSH " + ", ".join(self.hosts)
        return f"SSH {len(self.hosts)} hosts"

    # -- the connection ---------------------------------------------------------------------------

    def argv(self, host: str) -> list[str]:
        """The ``ssh`` command line for ``host`` (``--`` before the host: never an option)."""
        options = [
            "-o",
            "BatchMode=yes",
            "-o",
            f"ConnectTimeout={self.connect_timeout_s}",
            "-o",
            "ControlMaster=auto",
            "-o",
            f"ControlPath={self._control_dir}/%C",
            "-o",
            f"ControlPersist={CONTROL_PERSIST_S}",
            "-o",
            f"ServerAliveInterval={max(1, math.ceil(self.interval_s * 2))}",
            "-o",
            "ServerAliveCountMax=2",
        ]
        config = ["-F", str(self.config)] if self.config is not None else []
        return [*self.ssh, *config, *options, "-T", "--", host, remote_command(self.interval_s)]

    def _read_host(self, host: str) -> None:
        stream = self.streams[host]
        backoff = 1.0
        while not self._stop.is_set():
            got_data = self._connect_once(host, stream)
            if self._stop.is_set():
                return
            backoff = 1.0 if got_data else min(BACKOFF_MAX_S, backoff * 2)
            self._stop.wait(backoff)

    def _connect_once(self, host: str, stream: HostStream) -> bool:
        """Run the remote command until it ends, feeding ``stream``; True when a line came."""
        try:
            proc = subprocess.Popen(
                self.argv(host),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # Ctrl-C in the terminal is hwdash's, not ssh's
            )
        except OSError as exc:
            with stream.lock:
                stream.error = f"cannot run ssh: {exc.strerror or exc}"
            return False
        with self._procs_lock:
            self._procs[host] = proc
        with stream.lock:
            stream.connected = True
        got_data = False
        said: bytes = b""
        assert proc.stdout is not None and proc.stderr is not None
        try:
            got_data, said = self._pump(proc, stream)
        finally:
            with contextlib.suppress(OSError):
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=2)
            proc.stdout.close()
            proc.stderr.close()
            with self._procs_lock:
                self._procs.pop(host, None)
            words = said.decode("utf-8", errors="replace").strip().splitlines()
            why = words[-1] if words else f"ssh exited with status {proc.returncode}"
            with stream.lock:
                stream.connected = False
                stream.error = stream.remote_error or clean_text(why)
        return got_data

    def _pump(self, proc: subprocess.Popen[bytes], stream: HostStream) -> tuple[bool, bytes]:
        """Read ``proc``'s output into ``stream`` until it ends, goes silent past
        :attr:`silence_s` or the sampler closes; (a line came, ssh's last stderr bytes)."""
        assert proc.stdout is not None and proc.stderr is not None
        out, err = proc.stdout.fileno(), proc.stderr.fileno()
        selector = selectors.DefaultSelector()
        selector.register(out, selectors.EVENT_READ)
        selector.register(err, selectors.EVENT_READ)
        pending = b""
        skipping = False
        said = b""
        got_data = False
        heard_at = time.monotonic()
        open_fds = {out, err}
        try:
            while open_fds and not self._stop.is_set():
                ready = selector.select(timeout=min(0.5, self.silence_s))
                if not ready:
                    if time.monotonic() - heard_at > self.silence_s:
                        said += f"\nno data for {self.silence_s:g} s".encode()
                        return got_data, said
                    continue
                for key, _events in ready:
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        selector.unregister(key.fd)
                        open_fds.discard(key.fd)
                        continue
                    if key.fd == err:
                        said = (said + chunk)[-2048:]
                        continue
                    heard_at = time.monotonic()
                    pending += chunk
                    lines = pending.split(b"\n")
                    pending = lines.pop()
                    for raw in lines:
                        if skipping:  # the end of a line already cut
                            skipping = False
                            continue
                        if len(raw) > MAX_LINE_BYTES:
                            stream.cut_line()
                            continue
                        stream.feed(raw.decode("utf-8", errors="replace"))
                        got_data = True
                    if len(pending) > MAX_LINE_BYTES:
                        if not skipping:
                            stream.cut_line()
                        skipping = True
                        pending = b""
        finally:
            selector.close()
        return got_data, said

    # -- the sampler ------------------------------------------------------------------------------

    def _wait_first(self) -> None:
        """The first sample waits (at most :attr:`first_wait_s`) until every host has given a
        reading or its connection has failed (``--once`` and the first frame show every host)."""
        deadline = time.monotonic() + self.first_wait_s
        while time.monotonic() < deadline and not self._stop.is_set():
            waiting = False
            for stream in self.streams.values():
                with stream.lock:
                    answered = stream.last_data_at is not None or (
                        not stream.connected and stream.error is not None
                    )
                waiting = waiting or not answered
            if not waiting:
                return
            time.sleep(0.05)

    def sample(self) -> Snapshot:
        started = time.perf_counter()
        if self._first:
            self._first = False
            self._wait_first()
        now = self.clock()
        gpus: list[GpuSample] = []
        errors: list[str] = []
        for host in self.hosts:
            placed, said = self._host_gpus(host, now)
            gpus.extend(placed)
            errors.extend(said)
        gpus.sort(key=lambda gpu: gpu.index)
        if gpus:
            status = NvmlStatus(available=True, source=self.source)
        else:
            status = NvmlStatus(
                available=False,
                source=self.source,
                error="no GPU readings from any host over SSH"
                + (f" ({errors[0]})" if errors else ""),
            )
        return Snapshot(
            timestamp=now,
            nvml=status,
            gpus=tuple(gpus),
            errors=tuple(errors),
            sample_seconds=time.perf_counter() - started,
        )

    def _host_gpus(self, host: str, now: float) -> tuple[list[GpuSample], list[str]]:
        """The host's GPUs placed in the cluster and marked by their age, and what to say."""
        stream = self.streams[host]
        with stream.lock:
            readings = stream.readings()
            last, connected, error, bad, remote_error, mode = (
                stream.last_data_at,
                stream.connected,
                stream.error,
                stream.bad_lines,
                stream.remote_error,
                stream.mode,
            )
        said = []
        if bad:
            said.append(f"{host}: {bad} line(s) of its output could not be read and were skipped")
        if last is None:
            if error is not None and not connected:
                said.append(f"{host}: unreachable: {error}")
            elif now - self._started_at > self.first_wait_s:
                said.append(f"{host}: no GPU readings yet")
            return [], said
        if not readings:
            said.append(f"{host}: no GPUs" + (f" ({remote_error})" if remote_error else ""))
        period = self.interval_s
        if mode == "nvidia-smi":  # its -l takes whole seconds (remote_command)
            period = max(1.0, float(math.ceil(self.interval_s)))
        age = now - last
        unreachable = not connected or age >= UNREACHABLE_INTERVALS * period
        if unreachable:
            reason = f"; {error}" if error and not connected else ""
            said.append(
                f"{host}: unreachable: no data for {age:.0f} s{reason} "
                "(its last values are shown, marked stale)"
            )
        placed = []
        for gpu, at in readings:
            number = gpu.index
            index = self._indices.setdefault((host, number), len(self._indices))
            gpu_age = now - at
            note = None
            if unreachable:
                note = f"unreachable: no data from {host} for {gpu_age:.0f} s (last values shown)"
            elif gpu_age > STALE_INTERVALS * period:
                note = f"stale: no data from {host} for {gpu_age:.0f} s (last values shown)"
            placed.append(
                dataclasses.replace(
                    gpu,
                    index=index,
                    host=host,
                    host_gpu=number,
                    errors=(*gpu.errors, ("host", note)) if note else gpu.errors,
                    # A forecast read from frozen data is not a forecast.
                    forecast_full_s=None if note else gpu.forecast_full_s,
                    processes=tuple(
                        dataclasses.replace(
                            process,
                            gpu_index=index,
                            host=host,
                            host_gpu=number,
                            visible=False,
                            verifiable=False,
                        )
                        for process in gpu.processes
                    ),
                )
            )
        return placed, said

    def close(self) -> None:
        """End every connection, the multiplexing masters too, and remove the sockets' directory."""
        if self._stop.is_set():
            return
        self._stop.set()
        with self._procs_lock:
            procs = list(self._procs.values())
        for proc in procs:
            with contextlib.suppress(OSError):
                proc.kill()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout=3)
        self._exit_masters(self.hosts)
        shutil.rmtree(self._control_dir, ignore_errors=True)

    def _exit_masters(self, hosts: Iterable[str]) -> None:
        """``ssh -O exit`` for each host's master (ControlPersist would keep it a minute)."""
        config = ["-F", str(self.config)] if self.config is not None else []
        stops = []
        for host in hosts:
            argv = [
                *self.ssh,
                *config,
                "-o",
                f"ControlPath={self._control_dir}/%C",
                "-O",
                "exit",
                "--",
                host,
            ]
            with contextlib.suppress(OSError):
                stops.append(
                    subprocess.Popen(
                        argv,
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                )
        for stop in stops:
            try:
                stop.wait(timeout=3)
            except subprocess.TimeoutExpired:
                stop.kill()
