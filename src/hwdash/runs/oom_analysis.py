"""Why a run ran out of memory: a checked snapshot (:mod:`hwdash.runs.oom_snapshot`) -> OomReport.

What it reads (torch/cuda/memory.py, ``_snapshot``'s docstring; torch/cuda/_memory_viz.py):

* reserved = the sum of the device's segments' ``total_size``; allocated = the sum of its
  ``active_allocated`` blocks' ``size`` (what the allocator holds for them, rounding included);
* the failed request = the device trace's last ``oom`` entry: its ``size`` (the bytes asked for)
  and ``device_free`` (what CUDA reported free at that moment). None without an ``oom`` entry
  (a snapshot dumped on demand);
* the device's total is not in a snapshot: ``total_bytes`` is None unless the caller knows it;
* fragmentation = the free (``inactive``) bytes of the segments that could not have served the
  failed request: a segment whose largest run of free bytes is smaller than the request, on
  another stream than the request, or of the other pool (a request of at most 1 MiB is served
  from "small" segments only, a larger one from "large" segments only: ``kSmallSize`` in
  c10/cuda/CUDACachingAllocator.cpp). None without a failed request.

Stacks (``frames[0]`` is the innermost call). A frame is *library* when its file is under
``site-packages``/``dist-packages`` or the standard library (``/lib/pythonX.Y/``, ``<frozen ...>``)
or is not Python (C++ frames of ``stacks="all"``); every other frame is the user's. A site shows the
user's frames first (innermost first), then, folded, only two library frames: the innermost one
(where the tensor was made) and the one that decided the category. Live blocks whose shown frames
and category are the same are one site.

Categories, the first rule that a frame of the stack matches wins (:data:`CATEGORY_RULES`):

1. ``kv_cache``: a frame in transformers' ``cache_utils.py`` (``DynamicCache.update`` and kin), or
   a function whose name mentions ``past_key_values``;
2. ``optimizer``: a frame in a file under an ``optim`` folder or whose name has ``optim`` in it
   (``torch/optim/adamw.py``, ``accelerate/optimizer.py``, ``transformers/optimization.py``):
   the optimizer's ``step`` and its lazily built states;
3. ``gradients``: a ``backward`` frame (``Tensor.backward``, ``_engine_run_backward``, a custom
   Function's ``backward``), ``torch/autograd/__init__.py`` (``backward``, ``grad``), or a C++
   frame of the autograd engine (``autograd::Engine``, ``AccumulateGrad``). Everything allocated
   under the backward pass counts here, its temporaries included: at an OOM in the backward they are what the backward added. (With Python-only stacks
   the autograd engine's own thread has no Python frames: those blocks have no stack, below.)
4. ``parameters``: ``from_pretrained``, ``load_state_dict`` / ``_load_from_state_dict``,
   a module's ``__init__`` or ``reset_parameters`` under ``torch/nn/modules/``, or
   ``Module.to`` / ``cuda`` / ``_apply`` (``torch/nn/modules/module.py``);
5. ``activations``: a module's ``forward`` (or its call, ``_call_impl``): activations and the
   forward's temporaries;
6. ``unknown``: anything else, and every block without a stack.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from hwdash.errors import UsageError
from hwdash.runs.oom_snapshot import Block, Frame, Segment, Snapshot, TraceEntry

CATEGORIES = ("parameters", "gradients", "optimizer", "activations", "kv_cache", "unknown")
#: Requests of at most this size come from the small pool (c10/cuda/CUDACachingAllocator.cpp).
SMALL_REQUEST_BYTES = 1 << 20
DEFAULT_TOP = 10

#: (category, filename pattern, function-name pattern): a frame matches when either pattern does
#: (None: that side never matches). Checked in this order; see the module docstring.
CATEGORY_RULES: tuple[tuple[str, str | None, str | None], ...] = (
    ("kv_cache", r"(^|/)cache_utils\.py$", r"past_key_values"),
    ("optimizer", r"(^|/)optim(/|[^/]*\.py$)|(^|/)[^/]*optim[^/]*\.py$", None),
    (
        "gradients",
        r"(^|/)torch/autograd/__init__\.py$",
        r"(^|_)backward$|autograd::Engine|AccumulateGrad",
    ),
    ("parameters", None, r"^(from_pretrained|load_state_dict|_load_from_state_dict)$"),
    ("activations", None, r"^(forward|_call_impl|_wrapped_call_impl)$"),
)
#: Module construction and moving (torch/nn/modules/*.py): the parameters' rule, by file and name.
_MODULE_FILE = re.compile(r"(^|/)torch/nn/modules/[^/]+\.py$")
_MODULE_PARAMETER_NAMES = {"__init__", "reset_parameters", "to", "cuda", "_apply"}
_LIBRARY = re.compile(r"/(site|dist)-packages/|/lib/python\d+(\.\d+)?/|^<frozen ")
_COMPILED = tuple(
    (name, re.compile(path) if path else None, re.compile(func) if func else None)
    for name, path, func in CATEGORY_RULES
)


@lru_cache(maxsize=1 << 16)
def is_library(frame: Frame) -> bool:
    """A library frame: an installed package, the standard library, or not Python at all."""
    name = frame.filename
    if _LIBRARY.search(name):
        return True
    return not (name.endswith(".py") or name.startswith("<"))


@lru_cache(maxsize=1 << 16)
def _rule_of(frame: Frame) -> int | None:
    """The first of :data:`CATEGORY_RULES` that ``frame`` matches (its index), or None."""
    for index, (category, path, func) in enumerate(_COMPILED):
        if (path is not None and path.search(frame.filename)) or (
            func is not None and func.search(frame.name)
        ):
            return index
        if (
            category == "parameters"
            and frame.name in _MODULE_PARAMETER_NAMES
            and _MODULE_FILE.search(frame.filename)
        ):
            return index
    return None


def categorize(frames: tuple[Frame, ...]) -> tuple[str, Frame | None]:
    """(category, the frame that decided it): the first rule of :data:`CATEGORY_RULES` that any
    frame matches, decided by the innermost frame that matches it."""
    best: int | None = None
    decided_by = None
    for frame in frames:
        rule = _rule_of(frame)
        if rule is not None and (best is None or rule < best):
            best, decided_by = rule, frame
    if best is None:
        return "unknown", None
    return _COMPILED[best][0], decided_by


def fold(frames: tuple[Frame, ...], decided_by: Frame | None) -> tuple[Frame, ...]:
    """The frames a site shows: the user's (innermost first), then the innermost library frame
    and the library frame that decided the category."""
    flags = [is_library(frame) for frame in frames]
    user = [frame for frame, flag in zip(frames, flags, strict=True) if not flag]
    library = [frame for frame, flag in zip(frames, flags, strict=True) if flag]
    kept = library[:1]
    if decided_by is not None and decided_by in library and decided_by not in kept:
        kept.append(decided_by)
    return (*user, *kept)


@dataclass(frozen=True)
class Site:
    """Live blocks allocated from one (folded) stack."""

    frames: tuple[Frame, ...]
    category: str
    bytes: int
    count: int


@dataclass(frozen=True)
class FailedRequest:
    """The allocation that failed (the trace's last ``oom`` entry)."""

    requested_bytes: int
    free_bytes: int | None
    stream: int
    frames: tuple[Frame, ...]


@dataclass(frozen=True)
class LiveBlock:
    """One of the largest live blocks."""

    address: int
    bytes: int
    requested_bytes: int
    category: str
    frames: tuple[Frame, ...]


@dataclass
class OomReport:
    """What filled the device; :meth:`to_json` is ``hwdash oom --json``."""

    device: int
    devices: tuple[int, ...]
    total_bytes: int | None
    reserved_bytes: int
    allocated_bytes: int
    awaiting_free_bytes: int
    oom: FailedRequest | None
    fragmentation_bytes: int | None
    categories: dict[str, int]
    sites: list[Site]
    largest_blocks: list[LiveBlock]
    live_blocks: int
    segments: int
    plan: dict[str, Any] | None = field(default=None)

    @property
    def free_bytes(self) -> int:
        """Reserved bytes neither live nor awaiting a stream: the allocator's cache."""
        return self.reserved_bytes - self.allocated_bytes - self.awaiting_free_bytes

    def to_json(self) -> dict[str, Any]:
        """The issue's JSON (``plan`` stays None here: the lead's code fills it)."""
        oom = None
        if self.oom is not None:
            oom = {"requested_bytes": self.oom.requested_bytes, "free_bytes": self.oom.free_bytes}
        return {
            "device": self.device,
            "total_bytes": self.total_bytes,
            "reserved_bytes": self.reserved_bytes,
            "allocated_bytes": self.allocated_bytes,
            "oom": oom,
            "fragmentation_bytes": self.fragmentation_bytes,
            "categories": dict(self.categories),
            "sites": [
                {
                    "frames": _frames_json(site.frames),
                    "bytes": site.bytes,
                    "count": site.count,
                    "category": site.category,
                }
                for site in self.sites
            ],
            "largest_blocks": [
                {
                    "address": block.address,
                    "bytes": block.bytes,
                    "requested_bytes": block.requested_bytes,
                    "category": block.category,
                    "frames": _frames_json(block.frames),
                }
                for block in self.largest_blocks
            ],
            "plan": self.plan,
        }


def _frames_json(frames: Iterable[Frame]) -> list[dict[str, Any]]:
    return [{"filename": f.filename, "line": f.line, "name": f.name} for f in frames]


def devices_in(snapshot: Snapshot) -> tuple[int, ...]:
    """The devices a snapshot has segments or trace entries for."""
    found = {segment.device for segment in snapshot.segments}
    found.update(index for index, length in enumerate(snapshot.trace_lengths) if length)
    return tuple(sorted(found))


def last_oom(trace: tuple[TraceEntry, ...]) -> TraceEntry | None:
    """The trace's last ``oom`` entry."""
    for entry in reversed(trace):
        if entry.action == "oom":
            return entry
    return None


def choose_device(snapshot: Snapshot, device: int | None) -> int:
    """``--device N`` checked against the snapshot; without it, the device whose trace has an
    ``oom`` entry (the last such), else the one with the most reserved, else 0."""
    present = devices_in(snapshot)
    if device is not None:
        if device not in present and present:
            listed = ", ".join(str(d) for d in present)
            raise UsageError(
                f"the snapshot has no device {device} (it has {listed})", flag="--device"
            )
        return device
    with_oom = [i for i, trace in enumerate(snapshot.device_traces) if last_oom(trace)]
    if with_oom:
        return with_oom[-1]
    reserved: dict[int, int] = {}
    for segment in snapshot.segments:
        reserved[segment.device] = reserved.get(segment.device, 0) + segment.total_size
    return max(reserved, key=lambda d: (reserved[d], -d)) if reserved else 0


def analyse(
    snapshot: Snapshot,
    *,
    device: int | None = None,
    top: int = DEFAULT_TOP,
    total_bytes: int | None = None,
) -> OomReport:
    """The report for one device of ``snapshot`` (see the module docstring)."""
    chosen = choose_device(snapshot, device)
    total_bytes = dict(snapshot.device_limits).get(chosen) if total_bytes is None else total_bytes
    segments = [segment for segment in snapshot.segments if segment.device == chosen]
    trace = snapshot.device_traces[chosen] if chosen < len(snapshot.device_traces) else ()
    entry = last_oom(trace)
    failed = None
    if entry is not None:
        failed = FailedRequest(entry.size, entry.device_free, entry.stream, entry.frames)
    live = [block for segment in segments for block in segment.blocks]
    categories = dict.fromkeys(CATEGORIES, 0)
    grouped: dict[tuple[tuple[Frame, ...], str], list[int]] = {}
    live_shown: list[tuple[Block, str, tuple[Frame, ...]]] = []
    decided: dict[int, tuple[str, tuple[Frame, ...]]] = {}  # by the (shared) frames tuple's id
    allocated = awaiting = 0
    for block in live:
        if block.state == "active_awaiting_free":
            awaiting += block.size
        if block.state != "active_allocated":
            continue
        allocated += block.size
        known = decided.get(id(block.frames))
        if known is None:
            category, by = categorize(block.frames)
            known = decided[id(block.frames)] = (category, fold(block.frames, by))
        category, shown = known
        categories[category] += block.size
        totals = grouped.setdefault((shown, category), [0, 0])
        totals[0] += block.size
        totals[1] += 1
        live_shown.append((block, category, shown))
    sites = [Site(shown, category, b, n) for (shown, category), (b, n) in grouped.items()]
    sites.sort(key=lambda site: (-site.bytes, -site.count, site.category))
    biggest = heapq.nsmallest(top, live_shown, key=lambda item: (-item[0].size, item[0].address))
    largest = [
        LiveBlock(block.address, block.size, block.requested_size, category, shown)
        for block, category, shown in biggest
    ]
    return OomReport(
        device=chosen,
        devices=devices_in(snapshot),
        total_bytes=total_bytes,
        reserved_bytes=sum(segment.total_size for segment in segments),
        allocated_bytes=allocated,
        awaiting_free_bytes=awaiting,
        oom=failed,
        fragmentation_bytes=None if failed is None else fragmentation(segments, failed),
        categories=categories,
        sites=sites[:top],
        largest_blocks=largest[:top],
        live_blocks=len(live_shown),
        segments=len(segments),
    )


def fragmentation(segments: Iterable[Segment], failed: FailedRequest) -> int:
    """Free bytes in the segments that could not have served ``failed`` (module docstring)."""
    pool = "small" if failed.requested_bytes <= SMALL_REQUEST_BYTES else "large"
    unusable = 0
    for segment in segments:
        free = largest_run = run = 0
        for block in _in_address_order(segment.blocks):
            if block.state == "inactive":
                free += block.size
                run += block.size
                largest_run = max(largest_run, run)
            else:
                run = 0
        usable = (
            segment.segment_type == pool
            and segment.stream == failed.stream
            and largest_run >= failed.requested_bytes
        )
        if not usable:
            unusable += free
    return unusable


def _in_address_order(blocks: tuple[Block, ...]) -> list[Block]:
    return sorted(blocks, key=lambda block: block.address)
