"""Reading a PyTorch CUDA memory snapshot (``torch.cuda.memory._snapshot()``, pickled) safely.

The file is untrusted input: it may come from another machine or another user. It is never given
to the standard unpickler. :class:`_RefusingUnpickler` refuses every ``find_class`` (and every
persistent id), so no callable, class or module can be reached: the only objects a load can build
are the builtin containers and scalars whose opcodes need no lookup (dict, list, tuple, str, int,
float, bool, None, bytes, set). The snapshot format uses only those: see the ``Snapshot``,
``Segment``, ``Block``, ``Frame`` and ``TraceEntry`` TypedDicts in the docstring of
``torch.cuda.memory._snapshot`` (torch/cuda/memory.py), and the keys the allocator's C++ side
writes (torch/csrc/cuda/Module.cpp, ``_cuda_memorySnapshot``).

Bounds, each refused with a one-line :class:`SnapshotError` (exit status 2 in the CLI):

* the file's size: at most :data:`MAX_SNAPSHOT_BYTES`;
* an opcode that claims more bytes than the file has left (a 2 GB string in a small file) is
  refused before anything is allocated for it;
* containers built per byte read: a pickle that builds more than one container per
  :data:`MIN_BYTES_PER_CONTAINER` bytes (past a start allowance) is refused while loading. A
  snapshot's smallest containers (a frame's dict, an entry's dict) take tens of bytes; a deep
  nest (``[[[[...]]]]``, one byte per level) or an inflating pickle takes one or two, so a
  10**7-deep nest is refused within its first few hundred kilobytes;
* values under keys this reader does not interpret are walked iteratively (never recursively) and
  refused past :data:`MAX_DEPTH` levels.

Then every field the analysis uses is type-checked into frozen dataclasses; a wrong type, a
missing key or an unknown block state is a :class:`SnapshotError` naming where it is.
"""

from __future__ import annotations

import gc
import io
import os
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hwdash.errors import UsageError

#: The largest snapshot file read (PyTorch's own docs warn dumps "can easily be in the GB range").
MAX_SNAPSHOT_BYTES = 1 << 30
#: The deepest nesting accepted under keys this reader does not interpret.
MAX_DEPTH = 32
#: A snapshot builds at most one container per this many bytes read (see the module docstring).
MIN_BYTES_PER_CONTAINER = 4
#: Containers any pickle may build before the per-byte rule applies.
CONTAINER_ALLOWANCE = 65_536
#: The container types a refusing load can build (the depth walk descends into these only).
_CONTAINERS = (dict, list, tuple, set, frozenset)

#: Block states: PyTorch's docs say ``active_awaiting_free``, its C++ side writes
#: ``active_pending_free`` (torch/csrc/cuda/Module.cpp); both mean "freed, a stream still uses it".
BLOCK_STATES = {
    "active_allocated": "active_allocated",
    "active_awaiting_free": "active_awaiting_free",
    "active_pending_free": "active_awaiting_free",
    "inactive": "inactive",
}


#: The trace entries converted by default: the analysis reads the failed request and nothing else
#: of the history, and a long run's trace holds about a million entries (converting each into a
#: dataclass would take seconds); the others are counted (and must be dicts).
ANALYSED_ACTIONS = frozenset({"oom", "snapshot"})


class SnapshotError(UsageError):
    """A snapshot file that cannot be read, or is refused. Exit status 2, one line."""


@dataclass(frozen=True, slots=True)
class Frame:
    """One frame of an allocation's stack (``frames[0]`` is the innermost call)."""

    filename: str
    line: int
    name: str


@dataclass(frozen=True, slots=True)
class Block:
    """A piece of a segment: live (``active_allocated``), freed but awaiting a stream
    (``active_awaiting_free``) or free (``inactive``)."""

    address: int
    size: int
    requested_size: int
    state: str
    frames: tuple[Frame, ...]


@dataclass(frozen=True, slots=True)
class Segment:
    """Memory one ``cudaMalloc`` returned; its blocks tile it."""

    device: int
    address: int
    total_size: int
    stream: int
    segment_type: str
    blocks: tuple[Block, ...]


@dataclass(frozen=True, slots=True)
class TraceEntry:
    """One action of the allocator's history. For ``oom``, ``size`` is the request that failed and
    ``device_free`` what CUDA reported free; ``addr`` is None there."""

    action: str
    addr: int | None
    size: int
    stream: int
    frames: tuple[Frame, ...]
    device_free: int | None


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A whole snapshot: every device's segments, and each device's trace (index = device): its
    entries of the kept actions (:data:`ANALYSED_ACTIONS` unless asked for all), and how many
    entries it had in all."""

    segments: tuple[Segment, ...]
    device_traces: tuple[tuple[TraceEntry, ...], ...]
    trace_lengths: tuple[int, ...]
    device_limits: tuple[tuple[int, int], ...] = ()
    """(device, bytes) the allocator was held to at the out-of-memory error: the device's total
    or, under a memory fraction, the allowed maximum. Not in PyTorch's format: hwdash.probe adds it
    (a ``"hwdash"`` entry) from what the out-of-memory observer was told; empty otherwise."""


class _RefusingUnpickler(pickle.Unpickler):
    """An unpickler that can build only builtin containers and scalars."""

    def find_class(self, module: str, name: str) -> Any:
        raise SnapshotError(
            f"refused: the pickle asks for {module}.{name}; a memory snapshot holds only dicts, "
            "lists, strings and numbers (nothing was run)"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise SnapshotError("refused: the pickle holds a persistent id (nothing was run)")


class _GuardedFile:
    """The file as the unpickler reads it: a claim past the file's end is refused, and the
    containers built so far are held against the bytes read (``gc``'s allocation count)."""

    def __init__(self, raw: io.BufferedReader, size: int, count: Callable[[], int]) -> None:
        self._raw = raw
        self._left = size
        self._read = 0
        self._count = count
        self._start = count()

    def _check(self, wanted: int) -> None:
        if wanted > self._left:
            raise SnapshotError(
                f"refused: the pickle claims {wanted:,} bytes at byte {self._read:,}, "
                f"the file has {self._left:,} left (truncated or forged)"
            )
        built = self._count() - self._start
        if built > CONTAINER_ALLOWANCE + self._read // MIN_BYTES_PER_CONTAINER:
            raise SnapshotError(
                f"refused: the pickle builds {built:,} containers from {self._read:,} bytes "
                "(a deep nest or an inflating pickle, not a memory snapshot)"
            )

    def _took(self, data: bytes) -> bytes:
        self._left -= len(data)
        self._read += len(data)
        return data

    def read(self, n: int = -1) -> bytes:
        self._check(self._left if n is None or n < 0 else n)
        return self._took(self._raw.read(n))

    def readinto(self, buffer: bytearray | memoryview) -> int:
        self._check(len(buffer))
        got = self._raw.readinto(buffer)
        self._left -= got
        self._read += got
        return got

    def readline(self) -> bytes:
        self._check(0)
        return self._took(self._raw.readline())

    def peek(self, n: int = 0) -> bytes:
        self._check(0)
        return self._raw.peek(n)


def read_snapshot(path: str | Path) -> Snapshot:
    """Load and check the snapshot at ``path`` (see the module docstring). Raises SnapshotError."""
    was_enabled = gc.isenabled()
    gc.disable()  # millions of containers come and go: a collection pass would visit them all
    try:
        return to_snapshot(load_pickle(path))
    except SnapshotError as exc:
        message = str(exc)  # the loader's own errors name the file already
        raise SnapshotError(
            message if message.startswith(f"{path}:") else f"{path}: {message}"
        ) from None
    finally:
        if was_enabled:
            gc.enable()


def load_pickle(path: str | Path) -> Any:
    """The raw object in the file, read with the refusing unpickler under the bounds."""
    where = str(path)
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            if size > MAX_SNAPSHOT_BYTES:
                raise SnapshotError(
                    f"{where}: refused: {size:,} bytes, more than the {MAX_SNAPSHOT_BYTES:,} a "
                    "snapshot may have here"
                )
            return _load_guarded(handle, size, where)
    except FileNotFoundError:
        raise SnapshotError(f"{where}: no such file") from None
    except IsADirectoryError:
        raise SnapshotError(f"{where}: is a folder, not a snapshot file") from None
    except PermissionError:
        raise SnapshotError(f"{where}: not readable (permission denied)") from None
    except OSError as exc:
        raise SnapshotError(f"{where}: cannot be read: {exc.strerror or exc}") from None


def _load_guarded(handle: Any, size: int, where: str) -> Any:
    was_enabled = gc.isenabled()
    gc.disable()  # no collection while loading: gc's count then tracks the containers built
    try:
        guarded = _GuardedFile(handle, size, lambda: gc.get_count()[0])
        return _RefusingUnpickler(guarded).load()
    except SnapshotError as exc:
        raise SnapshotError(f"{where}: {exc}") from None
    except EOFError:
        raise SnapshotError(f"{where}: not a memory snapshot: the pickle ends early") from None
    except RecursionError:
        raise SnapshotError(f"{where}: refused: nested too deep") from None
    except MemoryError:
        raise SnapshotError(f"{where}: refused: too large to hold in memory") from None
    except Exception as exc:  # any unpickling failure is a bad file, said in one line
        reason = " ".join(str(exc).split())[:120] or type(exc).__name__
        raise SnapshotError(f"{where}: not a memory snapshot pickle ({reason})") from None
    finally:
        if was_enabled:
            gc.enable()


class _Reader:
    """Converts the raw object into the dataclasses, checking each field; frames lists and frame
    dicts that PyTorch shares between blocks are converted once (by identity)."""

    def __init__(self) -> None:
        self._stacks: dict[tuple[int, ...], tuple[Frame, ...]] = {}
        self._frame: dict[int, Frame] = {}

    def frames(self, value: Any, where: str) -> tuple[Frame, ...]:
        """A stack: PyTorch gives each allocation its own list of shared frame dicts, so stacks
        are known by the identities of their frames (the raw object lives while converting)."""
        items = _typed(value, list, where)
        key = tuple(map(id, items))
        known = self._stacks.get(key)
        if known is None:
            known = tuple(self.frame(item, f"{where}[{i}]") for i, item in enumerate(items))
            self._stacks[key] = known
        return known

    def frame(self, value: Any, where: str) -> Frame:
        known = self._frame.get(id(value))
        if known is not None:
            return known
        raw = _typed(value, dict, where)
        _bounded_extras(raw, ("filename", "line", "name"), where)
        frame = Frame(
            filename=_field(raw, "filename", str, where),
            line=_field(raw, "line", int, where),
            name=_field(raw, "name", str, where),
        )
        self._frame[id(value)] = frame
        return frame

    def block(self, value: Any, address: int, where: str) -> Block:
        raw = _typed(value, dict, where)
        size = _field(raw, "size", int, where)
        state = _field(raw, "state", str, where)
        if state not in BLOCK_STATES:
            raise SnapshotError(f"{where}.state: unknown block state {state[:40]!r}")
        return Block(
            address=_field(raw, "address", int, where, default=address),
            size=size,
            requested_size=_field(raw, "requested_size", int, where, default=size),
            state=BLOCK_STATES[state],
            frames=self.frames(raw["frames"], f"{where}.frames") if "frames" in raw else (),
        )

    def segment(self, value: Any, where: str) -> Segment:
        raw = _typed(value, dict, where)
        _bounded_extras(raw, ("blocks", "frames", "segment_pool_id"), where)
        address = _field(raw, "address", int, where)
        blocks = []
        offset = address
        for i, item in enumerate(_field(raw, "blocks", list, where)):
            block = self.block(item, offset, f"{where}.blocks[{i}]")
            blocks.append(block)
            offset += block.size
        return Segment(
            device=_field(raw, "device", int, where, default=0),
            address=address,
            total_size=_field(raw, "total_size", int, where),
            stream=_field(raw, "stream", int, where, default=0),
            segment_type=_field(raw, "segment_type", str, where, default="large"),
            blocks=tuple(blocks),
        )

    def entry(self, value: Any, where: str) -> TraceEntry:
        raw = _typed(value, dict, where)
        _bounded_extras(raw, ("frames",), where)
        return TraceEntry(
            action=_field(raw, "action", str, where),
            addr=_field(raw, "addr", int, where, default=None),
            size=_field(raw, "size", int, where, default=0),
            stream=_field(raw, "stream", int, where, default=0),
            frames=self.frames(raw["frames"], f"{where}.frames") if "frames" in raw else (),
            device_free=_field(raw, "device_free", int, where, default=None),
        )


def to_snapshot(data: Any, *, actions: frozenset[str] | None = ANALYSED_ACTIONS) -> Snapshot:
    """The checked snapshot from the raw object ``torch.cuda.memory._snapshot()`` returns; the
    trace entries of ``actions`` only (None: every entry)."""
    raw = _typed(data, dict, "the snapshot")
    for key in ("segments", "device_traces"):
        if key not in raw:
            found = ", ".join(sorted(str(k)[:30] for k in raw)[:8]) or "nothing"
            raise SnapshotError(f"not a memory snapshot: no {key!r} (it holds {found})")
    _bounded_extras(raw, ("segments", "device_traces", "hwdash"), "the snapshot")
    reader = _Reader()
    segments = tuple(
        reader.segment(item, f"segments[{i}]")
        for i, item in enumerate(_typed(raw["segments"], list, "segments"))
    )
    traces = []
    lengths = []
    for device, trace in enumerate(_typed(raw["device_traces"], list, "device_traces")):
        where = f"device_traces[{device}]"
        items = _typed(trace, list, where)
        kept = []
        for i, item in enumerate(items):
            if not isinstance(item, dict):
                _typed(item, dict, f"{where}[{i}]")
            if actions is None or item.get("action") in actions:
                kept.append(reader.entry(item, f"{where}[{i}]"))
        traces.append(tuple(kept))
        lengths.append(len(items))
    return Snapshot(
        segments=segments,
        device_traces=tuple(traces),
        trace_lengths=tuple(lengths),
        device_limits=_device_limits(raw.get("hwdash")),
    )


def _device_limits(extra: Any) -> tuple[tuple[int, int], ...]:
    """hwdash.probe's ``{"device", "device_limit_bytes"}`` entry, when it is one; else nothing
    (a snapshot of another writer is read all the same)."""
    if not isinstance(extra, dict):
        return ()
    device, limit = extra.get("device"), extra.get("device_limit_bytes")
    if isinstance(device, bool) or isinstance(limit, bool):
        return ()
    if not isinstance(device, int) or not isinstance(limit, int):
        return ()
    if not (0 <= device < 1024 and 0 < limit < 2**63):
        return ()
    return ((device, limit),)


_TYPE_NAMES = {dict: "a dict", list: "a list", str: "a string", int: "a whole number"}


def _typed(value: Any, kind: type, where: str) -> Any:
    if isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
        return value
    raise SnapshotError(
        f"not a memory snapshot: {where} is {type(value).__name__}, expected {_TYPE_NAMES[kind]}"
    )


_MISSING = object()


def _field(raw: dict[Any, Any], key: str, kind: type, where: str, default: Any = _MISSING) -> Any:
    value = raw.get(key, _MISSING)
    if value is _MISSING or (value is None and default is None):
        if default is _MISSING:
            raise SnapshotError(f"not a memory snapshot: {where} has no {key!r}")
        return default
    return _typed(value, kind, f"{where}.{key}")


def _bounded_extras(raw: dict[Any, Any], skip: tuple[str, ...], where: str) -> None:
    """Walk the values this reader does not interpret, iteratively, refusing past MAX_DEPTH."""
    stack: list[tuple[Any, int]] = [
        (value, 1)
        for key, value in raw.items()
        if key not in skip and isinstance(value, _CONTAINERS)
    ]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise SnapshotError(f"refused: {where} nests deeper than {MAX_DEPTH} levels")
        children = value.values() if isinstance(value, dict) else value
        stack.extend((child, depth + 1) for child in children if isinstance(child, _CONTAINERS))
