"""One GPU in the monitor pane: a compact row (80 columns) or a two-line card (wide terminals).

The text of every cell comes from pure functions of a :class:`GpuSample` (tested on their own); the
widget only pushes that text into cells that repaint when it changes.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import ClassVar

from rich.cells import cell_len, set_cell_size
from rich.segment import Segment
from rich.style import Style
from textual.geometry import Region
from textual.strip import Strip
from textual.widget import Widget

from hwdash.core.units import (
    format_bytes,
    format_forecast,
    format_gib_pair,
    format_power,
    format_temperature,
)
from hwdash.telemetry.types import GpuSample, GpuState
from hwdash.ui.sampling import LOST_HINT, short_gpu_name
from hwdash.ui.widgets.monitor_cells import (
    POWER_THRESHOLDS,
    SPARK_STYLE,
    TEMPERATURE_THRESHOLDS,
    UTILIZATION_THRESHOLDS,
    BarModel,
    bar_cells,
    bar_runs,
    bar_used_style,
    intensity_style,
    sparkline,
)

NOT_AVAILABLE = "n/a"


def percent_text(value: float | None) -> str:
    """A 0..100 value as ``97%``, or ``n/a``."""
    return NOT_AVAILABLE if value is None else f"{value:.0f}%"


def gib_pair_text(part: int | None, total: int | None, *, wide: bool) -> str:
    """``74.5/80.0 GiB`` (compact) or ``74.5 / 80.0 GiB`` (wide); ``n/a`` when unknown."""
    if part is None or total is None:
        return NOT_AVAILABLE
    return format_gib_pair(part, total, compact=not wide)


def taken_bytes(gpu: GpuSample) -> int | None:
    """Memory a new allocation can no longer get: ``total - free`` (used plus reserved)."""
    if gpu.total_bytes is None or gpu.free_bytes is None:
        return None
    return gpu.total_bytes - gpu.free_bytes


def power_text(gpu: GpuSample, *, wide: bool) -> str:
    """``310 W``, or ``310 / 400 W`` with the limit when there is room."""
    if gpu.power_w is None:
        return NOT_AVAILABLE
    return format_power(gpu.power_w, gpu.power_limit_w if wide else None)


def temperature_text(gpu: GpuSample) -> str:
    """``64°C`` or ``n/a``."""
    return NOT_AVAILABLE if gpu.temperature_c is None else format_temperature(gpu.temperature_c)


def problem_text(gpu: GpuSample) -> str | None:
    """A lost or failing GPU in words; None when the GPU answers."""
    name = short_gpu_name(gpu.name)
    if gpu.state is GpuState.LOST:
        reason = dict(gpu.errors).get("gpu") or "it stopped answering (fell off the bus?)"
        return f"GPU {gpu.index} {name} is lost: {reason}; {LOST_HINT}"
    if gpu.state is GpuState.ERROR:
        reasons = "; ".join(f"{field}: {why}" for field, why in gpu.errors) or "unknown error"
        return f"GPU {gpu.index} {name} cannot be read: {reasons}"
    return None


def clock_text(mhz: int) -> str:
    """A clock in GHz to 0.1 (``1.4 GHz``): enough to see a GPU throttle (1.4 -> 1.1 GHz), and it
    does not redraw the line every second for the few MHz a busy GPU's clock wanders."""
    return f"{mhz / 1000:.1f} GHz"


def activity_text(gpu: GpuSample) -> str | None:
    """How busy the SMs are and where the number comes from: ``SM active 63% (GPM)`` (Hopper and
    later), else NVML's utilization said to be what it is (the share of time a kernel ran,
    however few SMs it used): ``util 98% (NVML, not SM activity)``; None without either."""
    activity = gpu.activity
    if activity is None or activity.sm_active is None:
        return None
    if activity.source == "gpm":
        return f"SM active {activity.sm_active:.0f}% (GPM)"
    return f"util {activity.sm_active:.0f}% (NVML, not SM activity)"


def detail_text(gpu: GpuSample) -> str:
    """The second line of a wide card: what rarely changes (reserved memory, clocks, processes,
    UUID) and what could not be read; the live numbers are on the first line."""
    parts = [
        "reserved "
        + (NOT_AVAILABLE if gpu.reserved_bytes is None else format_bytes(gpu.reserved_bytes))
    ]
    if gpu.diagnoses:
        # What the health rules say comes first: it is why the user should look at this GPU.
        first = gpu.diagnoses[0]
        more = f" (+{len(gpu.diagnoses) - 1} more)" if len(gpu.diagnoses) > 1 else ""
        parts.insert(0, f"⚠ {first.message}: {first.hint}{more}")
    activity = activity_text(gpu)
    if activity:  # left out first where the line is too short (fit_detail)
        parts.append(activity)
    if gpu.sm_clock_mhz is not None:
        parts.append(f"SM {clock_text(gpu.sm_clock_mhz)}")
    if gpu.memory_clock_mhz is not None:
        parts.append(f"mem {clock_text(gpu.memory_clock_mhz)}")
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


def forecast_text(seconds: float | None) -> str:
    """The OOM forecast in a few cells: ``45s``, ``12m``, ``2.5h``; empty when there is none
    (memory flat, falling or noisy)."""
    return format_forecast(seconds, compact=True)


@dataclass(frozen=True)
class GpuCells:
    """The text of each cell of one GPU row."""

    name: str
    pressure: str
    memory: str
    forecast: str
    utilization: str
    temperature: str
    power: str
    detail: str
    uuid: str | None = None
    """The UUID at the end of ``detail`` (cut in its middle when the line is too long)."""
    activity: str | None = None
    """The activity's words in ``detail`` (:func:`activity_text`), left out before the UUID is."""
    #: Colours of the utilization, temperature and power cells by intensity ("" for none).
    styles: tuple[str, str, str] = ("", "", "")


def reading_styles(gpu: GpuSample) -> tuple[str, str, str]:
    """Utilization, temperature and power coloured by how hard the GPU works, as nvitop does."""
    power_share = None
    if gpu.power_w is not None and gpu.power_limit_w:
        power_share = gpu.power_w / gpu.power_limit_w
    return (
        intensity_style(gpu.utilization_gpu, UTILIZATION_THRESHOLDS),
        intensity_style(gpu.temperature_c, TEMPERATURE_THRESHOLDS),
        intensity_style(power_share, POWER_THRESHOLDS),
    )


def gpu_cells(gpu: GpuSample, *, wide: bool) -> GpuCells:
    """Every cell's text for one GPU (lost and failing GPUs read as dashes; the bar says why)."""
    label = f"{gpu.index} {short_gpu_name(gpu.name)}"
    if gpu.state in (GpuState.LOST, GpuState.ERROR):
        dash = "-"
        return GpuCells(label, dash, dash, "", dash, dash, dash, problem_text(gpu) or "")
    pressure = gpu.pressure
    return GpuCells(
        name=label,
        pressure=percent_text(None if pressure is None else pressure * 100),
        memory=gib_pair_text(taken_bytes(gpu), gpu.total_bytes, wide=wide),
        forecast=forecast_text(gpu.forecast_full_s),
        utilization=percent_text(gpu.utilization_gpu),
        temperature=temperature_text(gpu),
        power=power_text(gpu, wide=wide),
        detail=detail_text(gpu),
        uuid=gpu.uuid,
        activity=activity_text(gpu),
        styles=reading_styles(gpu),
    )


#: The columns of a GPU row: (key, width in the compact layout, width in the wide layout, alignment).
#: The bar takes what the others leave; a negative width is a percentage of the row.
GPU_COLUMNS: tuple[tuple[str, int, int, str], ...] = (
    ("name", 16, 20, "left"),
    ("bar", 0, 0, "bar"),
    ("pressure", 4, 4, "right"),
    ("memory", 13, 17, "right"),
    ("forecast", 6, 8, "right"),
    ("utilization", 4, 4, "right"),
    ("temperature", 5, 5, "right"),
    ("power", 6, 12, "right"),
    ("spark", 8, -18, "left"),
)
#: The narrowest memory bar.
MIN_BAR_WIDTH = 8


@lru_cache(maxsize=16)
def column_layout(width: int, *, wide: bool) -> tuple[tuple[str, int, int, str], ...]:
    """Where each column of a GPU row starts and how wide it is: (key, x, width, alignment).

    One space separates two columns; the bar gets the rest (at least :data:`MIN_BAR_WIDTH`; a row
    narrower than that is cut at the right edge)."""
    sizes: dict[str, int] = {}
    for key, compact, wide_width, _align in GPU_COLUMNS:
        size = wide_width if wide else compact
        sizes[key] = max(1, width * -size // 100) if size < 0 else size
    separators = len(GPU_COLUMNS) - 1
    sizes["bar"] = max(MIN_BAR_WIDTH, width - separators - sum(sizes.values()))
    layout = []
    x = 0
    for key, _compact, _wide, align in GPU_COLUMNS:
        layout.append((key, x, sizes[key], align))
        x += sizes[key] + 1
    return tuple(layout)


def fit_text(text: str, width: int, align: str) -> str:
    """``text`` in exactly ``width`` cells: cut with an ellipsis when longer, else padded."""
    if width <= 0:
        return ""
    length = cell_len(text)
    if length > width:
        return set_cell_size(text, width - 1) + "…"
    padding = " " * (width - length)
    return padding + text if align == "right" else text + padding


#: A UUID cut to fit keeps at least this many cells (``GPU…00000003``): enough of its end to tell
#: GPUs apart whose UUIDs share a beginning (one batch of boards, a fake scenario); with less room
#: it is left out rather than shown as a beginning every GPU shares.
UUID_MIN_CELLS = 12


def cut_middle(text: str, width: int) -> str:
    """``text`` in at most ``width`` cells, cut in the middle (``GPU-7e2f…000000000003``): the
    beginning says what it is, the end tells similar ones apart."""
    if cell_len(text) <= width:
        return text
    if width <= 1:
        return "…"[:width]
    head = min(8, (width - 1) // 3)
    tail = width - 1 - head
    return text[:head] + "…" + (text[-tail:] if tail else "")


def fit_detail(text: str, width: int, uuid: str | None, optional: str | None = None) -> str:
    """A detail line in exactly ``width`` cells; when it ends with ``uuid`` and is too long, the
    UUID is cut in its middle, so the end that tells GPUs apart stays on screen (the parts before
    it keep their room: with less than :data:`UUID_MIN_CELLS` left, the UUID is left out). The
    ``optional`` part (the activity's words) goes first: it stays only while the UUID keeps at
    least :data:`UUID_MIN_CELLS`."""
    part = f"  ·  {optional}"
    if optional and uuid and text.endswith(uuid) and part in text:
        head = text[: -len(uuid)]
        if cell_len(text) > width and width - cell_len(head) < UUID_MIN_CELLS:
            text = text.replace(part, "", 1)
    if not uuid or cell_len(text) <= width or not text.endswith(uuid):
        return fit_text(text, width, "left")
    head = text[: -len(uuid)]
    room = width - cell_len(head)
    if room < UUID_MIN_CELLS:
        return fit_text(head.rstrip(" ·"), width, "left")
    return fit_text(head + cut_middle(uuid, room), width, "left")


class _Shown:
    """What one cell of a GPU row shows (tests read ``shown``; ``display``: whether on screen)."""

    def __init__(self) -> None:
        self.shown = ""
        self.display = True


class _BarShown:
    """The model the memory bar is drawn from."""

    def __init__(self) -> None:
        self.model = BarModel()


class GpuHeading(Widget):
    """Column headings above the GPU rows, laid out with the same widths."""

    HEADINGS: ClassVar[dict[str, str]] = {
        "name": "GPU",
        "pressure": "full",
        "memory": "in use",
        "forecast": "OOM in",
        "utilization": "util",
        "temperature": "temp",
        "power": "power",
        "spark": "history",
    }

    def __init__(self, threshold: float, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.threshold = threshold
        self.wide = False

    def set_wide(self, wide: bool) -> None:
        """Use the wide layout's widths."""
        if wide != self.wide:
            self.wide = wide
            self.refresh()

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        style = self.rich_style
        texts = dict(self.HEADINGS)
        layout = column_layout(width, wide=self.wide)
        bar_width = next(size for key, _x, size, _align in layout if key == "bar")
        threshold = f"{self.threshold * 100:.0f}%"
        for legend in (
            f"memory: ▒ reserved █ used │ {threshold} ┃ plan",
            f"▒ reserved █ used │ {threshold} ┃ plan",
            f"▒ rsvd █ used │ {threshold} ┃ plan",
            "memory",
        ):
            if cell_len(legend) <= bar_width:
                break
        texts["bar"] = legend
        parts = []
        x = 0
        for key, start, size, align in layout:
            parts.append(" " * (start - x))
            parts.append(fit_text(texts[key], size, "left" if align == "bar" else align))
            x = start + size
        text = set_cell_size("".join(parts), width)
        return Strip([Segment(text, style)], width)


class GpuCard(Widget):
    """One GPU: a row (name, memory bar, numbers, history) and, on wide terminals or when the GPU is
    lost, a detail line under it.

    The whole card is one widget drawing its lines itself: a line is rebuilt and refreshed only when
    its text changes, which keeps a dashboard of eight moving GPUs cheap to draw.
    """

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "gpu-card--hot",
        "gpu-card--detail",
    }

    def __init__(self, gpu_index: int) -> None:
        super().__init__(id=f"gpu-{gpu_index}", classes="gpu-card")
        self.gpu_index = gpu_index
        self.name_cell = _Shown()
        self.pressure_cell = _Shown()
        self.memory_cell = _Shown()
        self.forecast_cell = _Shown()
        self.util_cell = _Shown()
        self.temp_cell = _Shown()
        self.power_cell = _Shown()
        self.detail_cell = _Shown()
        self.detail_cell.display = False
        self.detail_uuid: str | None = None
        self.detail_activity: str | None = None
        """The UUID the detail line ends with (cut in its middle to fit)."""
        self.reading_styles: tuple[str, str, str] = ("", "", "")
        self.bar = _BarShown()
        self._history: tuple[float, ...] = ()
        self.wide = False
        self._keys: tuple[object, object] = (None, None)
        self._strips: dict[int, Strip] = {}
        self._styles: tuple[Style, Style, Style] | None = None

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._styles = None
        self._strips.clear()

    def _line_styles(self) -> tuple[Style, Style, Style]:
        """The base, hot (name and memory figures) and detail styles, from the CSS."""
        if self._styles is None:
            base = self.rich_style
            self._styles = (
                base,
                base + self.get_component_rich_style("gpu-card--hot", partial=True),
                base + self.get_component_rich_style("gpu-card--detail", partial=True),
            )
        return self._styles

    def _layout(self) -> tuple[tuple[str, int, int, str], ...]:
        return column_layout(self.size.width, wide=self.wide)

    def show(
        self,
        gpu: GpuSample,
        history: tuple[float, ...],
        *,
        wide: bool,
        threshold: float,
        plan_bytes: int | None,
    ) -> None:
        """Show one sample of this GPU; refresh only the lines whose content changed."""
        cells = gpu_cells(gpu, wide=wide)
        alert = gpu.state in (GpuState.ALERT, GpuState.BLIND)
        problem = problem_text(gpu)
        classes_before = (self.has_class("-alert"), self.has_class("-lost"), self.wide)
        self.set_class(alert, "-alert")
        self.set_class(problem is not None, "-lost")
        self.wide = wide
        self.name_cell.shown = cells.name
        self.pressure_cell.shown = cells.pressure
        self.memory_cell.shown = cells.memory
        self.forecast_cell.shown = cells.forecast
        self.util_cell.shown = cells.utilization
        self.temp_cell.shown = cells.temperature
        self.power_cell.shown = cells.power
        self.detail_cell.shown = cells.detail
        self.detail_uuid = cells.uuid
        self.detail_activity = cells.activity
        self.reading_styles = cells.styles
        two_lines = wide or problem is not None
        self.detail_cell.display = two_lines
        self.set_class(two_lines, "-two-lines")
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
        self.bar.model = BarModel(
            total=gpu.total_bytes,
            reserved=gpu.reserved_bytes,
            used=used,
            threshold=threshold,
            plan=plan_bytes,
            alert=alert or short_problem is not None,
            message=short_problem,
        )
        self._history = history
        if classes_before != (alert, problem is not None, wide):
            self._keys = (None, None)
            self._strips.clear()
            self._styles = None
            self.refresh()
            return
        self._refresh_changed()

    def _line_keys(self, width: int) -> tuple[object, object]:
        layout = self._layout()
        bar_width = next(size for key, _x, size, _a in layout if key == "bar")
        spark_width = next(size for key, _x, size, _a in layout if key == "spark")
        model = self.bar.model
        row = (
            width,
            self.name_cell.shown,
            self.pressure_cell.shown,
            self.memory_cell.shown,
            self.forecast_cell.shown,
            self.util_cell.shown,
            self.temp_cell.shown,
            self.power_cell.shown,
            self.reading_styles,
            bar_cells(model, bar_width),
            model.message,
            bar_used_style(model),
            sparkline(self._history, spark_width),
        )
        detail = (width, self.detail_cell.shown) if self.detail_cell.display else None
        return (row, detail)

    def _refresh_changed(self) -> None:
        if not self.is_mounted:
            return
        width = self.size.width
        keys = self._line_keys(width)
        for y, (old, new) in enumerate(zip(self._keys, keys, strict=True)):
            if old != new:
                self._strips.pop(y, None)
                self.refresh(Region(0, y, width, 1))
        self._keys = keys

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        strip = self._strips.get(y)
        if strip is not None and strip.cell_length == width:
            return strip
        self._keys = self._line_keys(width)
        strip = self._row_strip(width) if y == 0 else self._detail_strip(width)
        self._strips[y] = strip
        return strip

    def _row_strip(self, width: int) -> Strip:
        base, hot, _detail = self._line_styles()
        texts = {
            "name": self.name_cell.shown,
            "pressure": self.pressure_cell.shown,
            "memory": self.memory_cell.shown,
            "forecast": self.forecast_cell.shown,
            "utilization": self.util_cell.shown,
            "temperature": self.temp_cell.shown,
            "power": self.power_cell.shown,
        }
        utilization, temperature, power = self.reading_styles
        reading_colours = {"utilization": utilization, "temperature": temperature, "power": power}
        segments: list[Segment] = []
        x = 0
        for key, start, size, align in self._layout():
            if start > x:
                segments.append(Segment(" " * (start - x), base))
            if key == "bar":
                segments.extend(
                    Segment(text, base + Style.parse(style) if style else base)
                    for text, style in bar_runs(self.bar.model, size)
                )
            elif key == "spark":
                segments.append(
                    Segment(sparkline(self._history, size), base + Style.parse(SPARK_STYLE))
                )
            else:
                style = hot if key in ("name", "pressure", "memory", "forecast") else base
                colour = reading_colours.get(key)
                if colour:
                    style = style + Style.parse(colour)
                segments.append(Segment(fit_text(texts[key], size, align), style))
            x = start + size
        return Strip(segments).crop_extend(0, width, base)

    def _detail_strip(self, width: int) -> Strip:
        _base, _hot, style = self._line_styles()
        indent = self._layout()[1][1]  # under the bar
        text = " " * indent + self.detail_cell.shown
        return Strip(
            [Segment(fit_detail(text, width, self.detail_uuid, self.detail_activity), style)], width
        )
