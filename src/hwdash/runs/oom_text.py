"""The text of ``hwdash oom``: an :class:`~hwdash.runs.oom_analysis.OomReport` in lines that fit a
width (80 columns by default), for the command line and the dashboard alike."""

from __future__ import annotations

import re

from hwdash.core.units import format_bytes
from hwdash.runs.oom_analysis import CATEGORIES, OomReport, is_library
from hwdash.runs.oom_snapshot import Frame

WIDTH = 80
_INSTALLED = re.compile(r"^.*/(site|dist)-packages/")
_LABELS = {
    "parameters": "parameters",
    "gradients": "gradients",
    "optimizer": "optimizer states",
    "activations": "activations",
    "kv_cache": "KV cache",
    "unknown": "unknown",
}


def frame_text(frame: Frame) -> str:
    """``train.py:88 in train_step``; an installed package's file from its package folder
    (``torch/nn/functional.py``), the user's by its last two path parts."""
    name = frame.filename
    installed = _INSTALLED.search(name)
    shown = name[installed.end() :] if installed else "/".join(name.split("/")[-2:])
    return f"{shown}:{frame.line} in {frame.name}"


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _bytes(n: int) -> str:
    return format_bytes(n).rjust(9)


def header_lines(report: OomReport, source: str, width: int = WIDTH) -> list[str]:
    """The totals: the failed request, the device, reserved, allocated, fragmentation."""
    moment = "at the out-of-memory" if report.oom else "at the snapshot (no out-of-memory in it)"
    tail = f": device {report.device}, {moment}"
    room = width - len(tail)
    shown = source if len(source) <= room else "..." + source[len(source) - room + 3 :]
    lines = [shown + tail]
    if report.oom is not None:
        free = report.oom.free_bytes
        said = "" if free is None else f"; CUDA reported {format_bytes(free)} free"
        lines.append(
            f"  failed request  {_bytes(report.oom.requested_bytes)} "
            f"({report.oom.requested_bytes:,} B){said}"
        )
    if report.total_bytes is not None:
        lines.append(
            f"  device limit    {_bytes(report.total_bytes)}  (the total, or its fraction)"
        )
    else:
        lines.append("  device limit          ?  (not in the snapshot: not dumped by hwdash.probe)")
    lines.append(
        f"  reserved        {_bytes(report.reserved_bytes)}  in {report.segments} segments"
    )
    lines.append(
        f"  allocated       {_bytes(report.allocated_bytes)}  in {report.live_blocks:,} live blocks"
    )
    if report.awaiting_free_bytes:
        lines.append(
            f"  awaiting free   {_bytes(report.awaiting_free_bytes)}  (freed, stream busy)"
        )
    if report.fragmentation_bytes is not None:
        lines.append(
            f"  fragmentation   {_bytes(report.fragmentation_bytes)}  free, but in segments that "
            "could not serve it"
        )
        cache = report.free_bytes - report.fragmentation_bytes
        lines.append(f"  other free      {_bytes(cache)}  (allocator cache)")
    else:
        lines.append(f"  free (cache)    {_bytes(report.free_bytes)}")
    return [_clip(line, width) for line in lines]


def category_lines(report: OomReport, width: int = WIDTH) -> list[str]:
    """The allocated bytes by category, with their share."""
    lines = ["By category (live blocks, by the frames that made them)"]
    for category in CATEGORIES:
        size = report.categories[category]
        share = 100 * size / report.allocated_bytes if report.allocated_bytes else 0.0
        lines.append(f"  {_LABELS[category]:<17}{_bytes(size)}  {share:5.1f}%")
    return [_clip(line, width) for line in lines]


def site_lines(report: OomReport, width: int = WIDTH) -> list[str]:
    """The top allocation sites: bytes, count, category, then the shown frames."""
    lines = ["Top allocation sites (your frames first, library frames folded)"]
    if not report.sites:
        lines.append("  (no live blocks)")
    for rank, site in enumerate(report.sites, 1):
        lines.append(f"  {rank:>2}. {_bytes(site.bytes)}  x{site.count:<6,} {site.category}")
        if not site.frames:
            lines.append(
                "        (no Python stack: before the history began, C++, or autograd's thread)"
            )
        for frame in site.frames:
            mark = "~ " if is_library(frame) else ""
            lines.append(_clip(f"        {mark}{frame_text(frame)}", width))
    return lines


def block_lines(report: OomReport, width: int = WIDTH) -> list[str]:
    """The largest live blocks, one line each: size, category, the first shown frame."""
    lines = ["Largest live blocks"]
    if not report.largest_blocks:
        lines.append("  (no live blocks)")
    for block in report.largest_blocks:
        where = frame_text(block.frames[0]) if block.frames else "(no Python stack)"
        lines.append(_clip(f"  {_bytes(block.bytes)}  {block.category:<12} {where}", width))
    return lines


def report_text(report: OomReport, source: str, width: int = WIDTH) -> str:
    """The whole report; ``~`` marks a library frame."""
    parts = [
        header_lines(report, source, width),
        category_lines(report, width),
        site_lines(report, width),
        block_lines(report, width),
    ]
    return "\n\n".join("\n".join(part) for part in parts) + "\n"
