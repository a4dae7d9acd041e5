"""One GPU in the monitor pane: a compact row (80 columns) or a two-line card (wide terminals).

The text of every cell comes from pure functions of a :class:`GpuSample` (tested on their own); the
widget only pushes that text into cells that repaint when it changes.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical

from hwdash.core.units import GIB, format_bytes
from hwdash.telemetry.types import GpuSample, GpuState
from hwdash.ui.sampling import short_gpu_name
from hwdash.ui.widgets.monitor_cells import BarModel, MemoryBar, SparkCell, TextCell

NOT_AVAILABLE = "n/a"


def percent_text(value: float | None) -> str:
    """A 0..100 value as ``97%``, or ``n/a``."""
    return NOT_AVAILABLE if value is None else f"{value:.0f}%"


def gib_pair_text(part: int | None, total: int | None, *, wide: bool) -> str:
    """``74.5/80.0G`` (compact) or ``74.5 / 80.0 GiB`` (wide); ``n/a`` when unknown."""
    if part is None or total is None:
        return NOT_AVAILABLE
    if wide:
        return f"{part / GIB:.1f} / {total / GIB:.1f} GiB"
    return f"{part / GIB:.1f}/{total / GIB:.0f}G"


def taken_bytes(gpu: GpuSample) -> int | None:
    """Memory a new allocation can no longer get: ``total - free`` (used plus reserved)."""
    if gpu.total_bytes is None or gpu.free_bytes is None:
        return None
    return gpu.total_bytes - gpu.free_bytes


def power_text(gpu: GpuSample, *, wide: bool) -> str:
    """``310W``, or ``310/400 W`` with the limit when there is room."""
    if gpu.power_w is None:
        return NOT_AVAILABLE
    if wide and gpu.power_limit_w is not None:
        return f"{gpu.power_w:.0f}/{gpu.power_limit_w:.0f} W"
    return f"{gpu.power_w:.0f}W"


def temperature_text(gpu: GpuSample) -> str:
    """``64°C`` or ``n/a``."""
    return NOT_AVAILABLE if gpu.temperature_c is None else f"{gpu.temperature_c:.0f}°C"


def problem_text(gpu: GpuSample) -> str | None:
    """A lost or failing GPU in words; None when the GPU answers."""
    name = short_gpu_name(gpu.name)
    if gpu.state is GpuState.LOST:
        reason = dict(gpu.errors).get("gpu") or "it stopped answering (fell off the bus?)"
        return f"GPU {gpu.index} {name} is lost: {reason}"
    if gpu.state is GpuState.ERROR:
        reasons = "; ".join(f"{field}: {why}" for field, why in gpu.errors) or "unknown error"
        return f"GPU {gpu.index} {name} cannot be read: {reasons}"
    return None


def detail_text(gpu: GpuSample) -> str:
    """The second line of a wide card: what rarely changes (reserved memory, clocks, processes,
    UUID) and what could not be read; the live numbers are on the first line."""
    parts = [
        "reserved "
        + (NOT_AVAILABLE if gpu.reserved_bytes is None else format_bytes(gpu.reserved_bytes))
    ]
    if gpu.sm_clock_mhz is not None:
        parts.append(f"SM {gpu.sm_clock_mhz} MHz")
    if gpu.memory_clock_mhz is not None:
        parts.append(f"mem {gpu.memory_clock_mhz} MHz")
    if gpu.processes:
        count = len(gpu.processes)
        parts.append(f"{count} process" + ("" if count == 1 else "es"))
    if gpu.mig:
        instances = []
        for mig in gpu.mig:
            pressure = NOT_AVAILABLE if mig.pressure is None else f"{mig.pressure * 100:.0f}%"
            size = mig.name.rsplit(" MIG ", 1)[-1] if mig.name else "MIG"
            mark = "!" if mig.state is GpuState.ALERT else ""
            instances.append(f"{mig.index}:{size} {pressure}{mark}")
        parts.append("MIG " + " ".join(instances))
    if gpu.memory_source == "host":
        parts.append("memory: host RAM (unified memory)")
    if not gpu.processes_reliable:
        parts.append("process list unreliable")
    unread = [
        field
        for field, why in gpu.errors
        if not (field == "memory" and gpu.memory_source == "host")
        and not (field == "processes" and not gpu.processes_reliable)
        and not why.startswith("unreliable")
    ]
    if unread:
        parts.append(f"n/a: {', '.join(unread)}")
    if gpu.uuid:
        parts.append(gpu.uuid)
    return "  ·  ".join(parts)


@dataclass(frozen=True)
class GpuCells:
    """The text of each cell of one GPU row."""

    name: str
    pressure: str
    memory: str
    utilization: str
    temperature: str
    power: str
    detail: str


def gpu_cells(gpu: GpuSample, *, wide: bool) -> GpuCells:
    """Every cell's text for one GPU (lost and failing GPUs read as dashes; the bar says why)."""
    label = f"{gpu.index} {short_gpu_name(gpu.name)}"
    if gpu.state in (GpuState.LOST, GpuState.ERROR):
        dash = "-"
        return GpuCells(label, dash, dash, dash, dash, dash, problem_text(gpu) or "")
    pressure = gpu.pressure
    return GpuCells(
        name=label,
        pressure=percent_text(None if pressure is None else pressure * 100),
        memory=gib_pair_text(taken_bytes(gpu), gpu.total_bytes, wide=wide),
        utilization=percent_text(gpu.utilization_gpu),
        temperature=temperature_text(gpu),
        power=power_text(gpu, wide=wide),
        detail=detail_text(gpu),
    )


class GpuHeading(Horizontal):
    """Column headings above the GPU rows, laid out with the same widths."""

    def __init__(self, threshold: float, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.threshold = threshold

    def compose(self) -> ComposeResult:
        yield TextCell("GPU", classes="gpu-name")
        yield TextCell(
            f"memory: ▒ reserved █ used │ {self.threshold * 100:.0f}% ┃ plan",
            classes="gpu-bar-heading",
        )
        yield TextCell("full", classes="gpu-pressure")
        yield TextCell("in use", classes="gpu-memory")
        yield TextCell("util", classes="gpu-util")
        yield TextCell("temp", classes="gpu-temp")
        yield TextCell("power", classes="gpu-power")
        yield TextCell("history", classes="gpu-spark")


class GpuCard(Vertical):
    """One GPU: a row of cells, plus a detail line shown on wide terminals."""

    def __init__(self, gpu_index: int) -> None:
        super().__init__(id=f"gpu-{gpu_index}", classes="gpu-card")
        self.gpu_index = gpu_index
        self.name_cell = TextCell(classes="gpu-name")
        self.bar = MemoryBar(classes="gpu-bar")
        self.pressure_cell = TextCell(classes="gpu-pressure")
        self.memory_cell = TextCell(classes="gpu-memory")
        self.util_cell = TextCell(classes="gpu-util")
        self.temp_cell = TextCell(classes="gpu-temp")
        self.power_cell = TextCell(classes="gpu-power")
        self.spark = SparkCell(classes="gpu-spark")
        self.detail_cell = TextCell(classes="gpu-detail")

    def compose(self) -> ComposeResult:
        with Horizontal(classes="gpu-line"):
            yield self.name_cell
            yield self.bar
            yield self.pressure_cell
            yield self.memory_cell
            yield self.util_cell
            yield self.temp_cell
            yield self.power_cell
            yield self.spark
        yield self.detail_cell

    def show(
        self,
        gpu: GpuSample,
        history: tuple[float, ...],
        *,
        wide: bool,
        threshold: float,
        plan_bytes: int | None,
    ) -> None:
        """Show one sample of this GPU."""
        cells = gpu_cells(gpu, wide=wide)
        alert = gpu.state in (GpuState.ALERT, GpuState.BLIND)
        problem = problem_text(gpu)
        self.set_class(alert, "-alert")
        self.set_class(problem is not None, "-lost")
        self.name_cell.show(cells.name)
        self.pressure_cell.show(cells.pressure)
        self.memory_cell.show(cells.memory)
        self.util_cell.show(cells.utilization)
        self.temp_cell.show(cells.temperature)
        self.power_cell.show(cells.power)
        self.detail_cell.show(cells.detail)
        used = gpu.used_bytes
        if used is None:
            taken = taken_bytes(gpu)
            used = None if taken is None else taken - (gpu.reserved_bytes or 0)
        short_problem = None
        if gpu.state is GpuState.LOST:
            short_problem = "GPU lost"
        elif gpu.state is GpuState.ERROR:
            short_problem = "cannot be read"
        elif gpu.state is GpuState.BLIND:
            short_problem = "blind: no fresh data"
        self.bar.show(
            BarModel(
                total=gpu.total_bytes,
                reserved=gpu.reserved_bytes,
                used=used,
                threshold=threshold,
                plan=plan_bytes,
                alert=alert or short_problem is not None,
                message=short_problem,
            )
        )
        self.spark.show(history)
