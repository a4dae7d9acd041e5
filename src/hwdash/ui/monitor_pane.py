"""The live monitor pane: one row (or card) per GPU, the host line and the process table.

The pane is fed :class:`~hwdash.ui.sampling.MonitorFrame` objects by the app (which receives them from
the sampling thread) and never reads a driver itself. Every widget in it repaints only when its text
changes, so a steady machine costs next to nothing to draw.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rich.cells import set_cell_size
from rich.segment import Segment
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.strip import Strip
from textual.widget import Widget

from hwdash.core.units import format_gib, format_gib_pair
from hwdash.telemetry.cluster import gpu_count_text, source_text
from hwdash.telemetry.types import GpuSample, GpuState, HostSample, ProcessSample, Snapshot
from hwdash.ui.sampling import MonitorFrame, short_gpu_name
from hwdash.ui.widgets.monitor_cells import TextCell
from hwdash.ui.widgets.monitor_cluster import ClusterHeading, ClusterTable
from hwdash.ui.widgets.monitor_gpu import GpuCard, GpuHeading
from hwdash.ui.widgets.monitor_processes import ProcessTable

#: Wide cards need this many columns inside the pane (a 120-column terminal) ...
WIDE_MIN_WIDTH = 116
#: ... and room for two lines per GPU plus this many lines for the rest (host line, table, headings).
WIDE_SPARE_LINES = 12


def host_parts(host: HostSample | None) -> tuple[str, str, str, str]:
    """The host line's cells: CPU, RAM, swap and load (each changes on its own)."""
    if host is None:
        return ("CPU n/a", "RAM n/a", "", "")
    cpu = "CPU " + ("n/a" if host.cpu_percent is None else f"{host.cpu_percent:.0f}%")
    if host.ram_total_bytes is not None and host.ram_used_bytes is not None:
        ram = "RAM " + format_gib_pair(host.ram_used_bytes, host.ram_total_bytes, compact=True)
    else:
        ram = "RAM n/a"
    if host.swap_total_bytes:
        swap = "swap " + format_gib_pair(
            host.swap_used_bytes or 0, host.swap_total_bytes, compact=True
        )
    else:
        swap = "swap none"
    load = ""
    if host.load_average is not None:
        load = "load " + " ".join(f"{value:.1f}" for value in host.load_average)
    return (cpu, ram, swap, load)


def host_text(host: HostSample | None) -> str:
    """The host line as one string: ``Host  CPU 12%  RAM 31.2/62.8 GiB  swap none  load 1.2 ...``."""
    return "  ".join(part for part in ("Host", *host_parts(host)) if part)


#: Widths of the host line's parts (label, CPU, RAM, swap; the load takes the rest), two spaces apart.
HOST_WIDTHS = (4, 8, 20, 19)


class HostLine(Widget):
    """Host CPU, RAM, swap and load on one line, drawn only when one of them changes."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {"host-line--label"}

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._parts: tuple[str, ...] = host_parts(None)
        self._strip: Strip | None = None

    @property
    def shown(self) -> str:
        """The line as text (what tests read)."""
        return "  ".join(part for part in ("Host", *self._parts) if part)

    def show(self, host: HostSample | None) -> None:
        """Display one host reading."""
        parts = host_parts(host)
        if parts != self._parts:
            self._parts = parts
            self._strip = None
            self.refresh()

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._strip = None

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        if self._strip is not None and self._strip.cell_length == width:
            return self._strip
        base = self.rich_style
        label = base + self.get_component_rich_style("host-line--label", partial=True)
        segments = [Segment(set_cell_size("Host", HOST_WIDTHS[0]) + "  ", label)]
        for part, size in zip(self._parts, (*HOST_WIDTHS[1:], None), strict=True):
            text = part if size is None else set_cell_size(part, size) + "  "
            segments.append(Segment(text, base))
        self._strip = Strip(segments).crop_extend(0, width, base)
        return self._strip


def status_text(snapshot: Snapshot | None) -> str:
    """The first line of the pane: where the numbers come from and anything that went wrong."""
    if snapshot is None:
        return "Waiting for the first sample…"
    nvml = snapshot.nvml
    if snapshot.stale:
        reason = "; ".join(snapshot.errors) or "NVML did not answer in time"
        return f"Showing the last good values: {reason}"
    if not nvml.available:
        return "No GPU telemetry (the message below says why)."
    parts = [source_text(nvml, unknown="n/a"), snapshot.subset or gpu_count_text(snapshot.gpus)]
    if snapshot.errors:
        parts.append("; ".join(snapshot.errors))
    return "  ·  ".join(parts)


def nvml_problem_text(snapshot: Snapshot) -> str | None:
    """No driver, no library, or no GPUs, in words; None when GPUs are listed."""
    if not snapshot.nvml.available:
        reason = snapshot.nvml.error or "NVML could not be loaded"
        # The sampler's reasons end with what still works for the command line; said once here.
        reason = reason.removesuffix(": the planner still works")
        return f"No NVIDIA GPU can be read: {reason}. The planner and compare views still work."
    if not snapshot.gpus:
        if snapshot.subset:
            return f"No GPU to show: {snapshot.subset}."
        return "The NVIDIA driver answered but lists no GPUs."
    return None


@dataclass(frozen=True)
class _AlertUnit:
    """A GPU or a MIG instance in alert, in the words and numbers the banner needs."""

    index_label: str
    name: str
    pressure: float | None
    taken: int | None
    total: int | None


def _alert_units(gpus: tuple[GpuSample, ...]) -> list[_AlertUnit]:
    units: list[_AlertUnit] = []
    for gpu in gpus:
        if gpu.state is not GpuState.ALERT:
            continue
        migs = [mig for mig in gpu.mig if mig.state is GpuState.ALERT]
        for mig in migs:
            size = mig.name.rsplit(" MIG ", 1)[-1] if mig.name else f"slot {mig.index}"
            taken = None
            if mig.total_bytes is not None and mig.free_bytes is not None:
                taken = mig.total_bytes - mig.free_bytes
            units.append(
                _AlertUnit(
                    f"{gpu.index}/{mig.index}", f"MIG {size}", mig.pressure, taken, mig.total_bytes
                )
            )
        if not migs:
            taken = None
            if gpu.total_bytes is not None and gpu.free_bytes is not None:
                taken = gpu.total_bytes - gpu.free_bytes
            label = f"{gpu.host}:{gpu.host_gpu}" if gpu.host else str(gpu.index)
            units.append(
                _AlertUnit(label, short_gpu_name(gpu.name), gpu.pressure, taken, gpu.total_bytes)
            )
    return units


def _pressure_banner(units: list[_AlertUnit], threshold: float) -> str | None:
    if not units:
        return None
    limit = f"above the {threshold * 100:.0f}% alert threshold"
    if len(units) == 1:
        unit = units[0]
        name = f"GPU {unit.index_label} {unit.name}"
        if unit.pressure is None or unit.total is None or unit.taken is None:
            return f"{name}: memory {limit}"
        return (
            f"{name} is {unit.pressure * 100:.0f}% full "
            f"({format_gib_pair(unit.taken, unit.total, joiner=' of ')}), {limit}"
        )
    fullest = max(units, key=lambda unit: unit.pressure or 0.0)
    indices = ", ".join(unit.index_label for unit in units)
    worst = (
        ""
        if fullest.pressure is None
        else f"; GPU {fullest.index_label} is {fullest.pressure * 100:.0f}% full"
    )
    return f"GPUs {indices} are {limit}{worst}"


def alert_banner_text(gpus: tuple[GpuSample, ...], threshold: float) -> str | None:
    """One line naming the GPUs (and MIG instances) in alert and how full they are, and the GPUs
    the monitor is blind to; None when there are none."""
    parts = []
    blind = [gpu for gpu in gpus if gpu.state is GpuState.BLIND]
    if len(blind) == 1:
        gpu = blind[0]
        parts.append(
            f"GPU {gpu.index} {short_gpu_name(gpu.name)} is blind: no fresh memory reading "
            "(numbers shown are the last good ones)"
            if gpu.pressure is not None
            else f"GPU {gpu.index} {short_gpu_name(gpu.name)} is blind: its memory cannot be read"
        )
    elif blind:
        indices = ", ".join(str(gpu.index) for gpu in blind)
        parts.append(f"GPUs {indices} are blind: no fresh memory reading")
    pressure = _pressure_banner(_alert_units(gpus), threshold)
    if pressure is not None:
        parts.append(pressure)
    return "⚠ " + "; ".join(parts) if parts else None


def live_plan_bytes(gpu: GpuSample) -> tuple[int | None, bool]:
    """What a GPU's live memory is held against the plan: the probed processes' PyTorch peak
    allocated (tensor bytes, what the estimate counts) when any process there runs
    :mod:`hwdash.probe`, else NVML's used memory. The flag says which."""
    probed = [process.torch for process in gpu.processes if process.torch is not None]
    if probed:
        # Where no peak is known (a cluster's series), what is allocated now is the best reading.
        peaks = [
            torch.allocated_bytes
            if torch.max_allocated_bytes is None
            else torch.max_allocated_bytes
            for torch in probed
        ]
        return sum(peaks), True
    return gpu.used_bytes, False


def plan_text(
    gpus: tuple[GpuSample, ...], plan_bytes: int, label: str, plan_gpus: int = 1
) -> tuple[str, bool]:
    """The plan line and whether any GPU's live memory is over the plan's per-GPU total (or the
    plan needs more GPUs than are here). ``plan_gpus`` is the plan's GPU count."""
    head = f"┃ Plan {label}: {format_gib(plan_bytes)} per GPU expected"
    readable = [gpu for gpu in gpus if gpu.state in (GpuState.OK, GpuState.ALERT)]
    if not readable:
        # Nothing to compare with: saying "within" would claim a check that was not made.
        why = "no GPU here to compare it with" if not gpus else "no GPU reading to compare it with"
        return f"{head}; {why}", False
    shortfall = ""
    cluster = any(gpu.host for gpu in gpus)
    if not cluster and plan_gpus > len(gpus):
        shortfall = (
            f"; the plan is for {plan_gpus} GPUs and this machine shows {len(gpus)}"
            " (each GPU here would hold more than planned)"
        )
    overs = []
    probed_any = False
    for gpu in readable:
        live, probed = live_plan_bytes(gpu)
        probed_any = probed_any or probed
        if live is not None and live > plan_bytes:
            overs.append((gpu.index, live - plan_bytes, probed))
    source = " (PyTorch peak allocated where probed)" if probed_any else ""
    if not overs:
        return f"{head}; live memory{source} is within it{shortfall}", bool(shortfall)
    overs.sort(key=lambda item: -item[1])
    index, over, probed = overs[0]
    what = "PyTorch's peak allocated" if probed else "live memory"
    text = f"{head}; {what} is {format_gib(over)} over the plan on GPU {index}"
    if len(overs) > 1:
        text += f" (and {len(overs) - 1} more GPU" + ("s)" if len(overs) > 2 else ")")
    return text + shortfall, True


class MonitorPane(Vertical):
    """GPU rows or cards, the host line and the process table, fed one frame at a time."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("O", "reverse_sort", "Reverse sort", show=False),
    ]

    def __init__(self, *, threshold: float, id: str = "monitor-pane") -> None:
        super().__init__(id=id)
        self.threshold = threshold
        """Alert threshold (fraction) the bars draw their tick at."""
        self.frame: MonitorFrame | None = None
        """The last frame shown."""
        self.plan_bytes: int | None = None
        """The plan's expected per-GPU total, drawn on every bar."""
        self.plan_label = ""
        self.plan_gpus = 1
        """How many GPUs the plan runs on."""
        self.wide = False
        """Cards (two lines per GPU) instead of rows."""
        self._cards: dict[int, GpuCard] = {}
        self._last_processes: dict[int, tuple[ProcessSample, ...]] = {}
        self._stalled_for: float | None = None
        self.source_note = ""
        """Said after the status (a replay's position)."""
        self.status_cell = TextCell(status_text(None), id="monitor-status")
        self.banner_cell = TextCell(id="monitor-banner", fixed_height=False)
        self.plan_cell = TextCell(id="plan-line")
        self.nvml_cell = TextCell(id="nvml-message", fixed_height=False)
        self.heading = GpuHeading(threshold, id="gpu-heading")
        self.gpu_list = Vertical(id="gpu-list")
        self.cluster_table = ClusterTable(id="cluster-table")
        self.cluster_table.display = False
        self.cluster_heading = ClusterHeading(self.cluster_table, id="cluster-heading")
        self.cluster_heading.display = False
        self.host_cell = HostLine(id="host-line")
        self.process_table = ProcessTable(id="process-table")

    def compose(self) -> ComposeResult:
        yield self.status_cell
        yield self.banner_cell
        yield self.plan_cell
        yield self.nvml_cell
        yield self.heading
        yield self.gpu_list
        yield self.cluster_heading
        yield self.cluster_table
        yield self.host_cell
        yield self.process_table

    def on_mount(self) -> None:
        # Frames or a plan may have arrived before the pane was mounted (it mounts lazily).
        self._redraw()

    # -- what the app calls -------------------------------------------------------------------

    def show_frame(self, frame: MonitorFrame) -> None:
        """Show one sampling round (call inside ``app.batch_update()``)."""
        self.frame = frame
        self._stalled_for = None
        self._redraw()

    def set_plan_expectation(
        self, plan_bytes: int | None, label: str = "", plan_gpus: int = 1
    ) -> None:
        """Draw the plan's expected per-GPU total on every bar (None removes it); ``plan_gpus``
        is how many GPUs the plan runs on (named when this machine has fewer)."""
        self.plan_bytes = plan_bytes
        self.plan_label = label
        self.plan_gpus = plan_gpus
        self._redraw()

    def set_source_note(self, note: str) -> None:
        """Say ``note`` before the status (a replay's position); empty removes it."""
        if note != self.source_note:
            self.source_note = note
            if self.is_mounted:
                self._show_status()

    def show_stalled(self, seconds: float | None) -> None:
        """Say that the sampler has not answered for ``seconds`` (None: it answers again)."""
        self._stalled_for = seconds
        self._show_status()

    # -- drawing ------------------------------------------------------------------------------

    @property
    def gpu_cards(self) -> dict[int, GpuCard]:
        """The cards on screen, by GPU index."""
        return dict(self._cards)

    def _show_status(self) -> None:
        snapshot = self.frame.snapshot if self.frame else None
        text = status_text(snapshot)
        if self.source_note:
            text = f"{self.source_note}  ·  {text}"
        webhooks = self.frame.webhooks if self.frame else None
        if webhooks is not None:
            text = f"{text}  ·  {webhooks.brief()}"
        if self._stalled_for is not None:
            text = (
                f"No answer from the GPU driver for {self._stalled_for:.0f} s (a call is hung); "
                "showing the last sample. Keys still work."
            )
        status = self.status_cell
        status.show(text)
        stale = snapshot is not None and snapshot.stale
        status.set_class(self._stalled_for is not None or stale, "-warning")

    def _redraw(self) -> None:
        if not self.is_mounted:
            return
        self._show_status()
        frame = self.frame
        snapshot = frame.snapshot if frame else None
        gpus = snapshot.gpus if snapshot else ()

        banner = self.banner_cell
        banner_text = alert_banner_text(gpus, self.threshold)
        banner.set_class(banner_text is not None, "-active")
        banner.show(banner_text or "")

        plan_line = self.plan_cell
        if self.plan_bytes is None:
            plan_line.set_class(False, "-active")
            plan_line.show("")
        else:
            text, over = plan_text(gpus, self.plan_bytes, self.plan_label, self.plan_gpus)
            plan_line.set_class(True, "-active")
            plan_line.set_class(over, "-over")
            plan_line.show(text)

        problem = nvml_problem_text(snapshot) if snapshot else None
        message = self.nvml_cell
        message.set_class(problem is not None, "-active")
        message.show(problem or "")
        cluster = any(gpu.host for gpu in gpus)
        self.heading.display = bool(gpus) and not cluster
        self.gpu_list.display = not cluster
        self.cluster_table.display = cluster
        self.cluster_heading.display = cluster
        # Many hosts' GPUs: one line each in one widget, grouped by host (not a card each); the
        # host line and the process table are this machine's, so they give the cluster the room.
        self.host_cell.display = not cluster
        self.process_table.display = not cluster
        if cluster:
            self.cluster_table.show(gpus, self.threshold)
            gpus_for_cards: tuple[GpuSample, ...] = ()
        else:
            gpus_for_cards = gpus
        self._sync_cards(gpus_for_cards)
        for gpu in gpus_for_cards:
            self._cards[gpu.index].show(
                gpu,
                frame.history_for(gpu.index) if frame else (),
                wide=self.wide,
                threshold=self.threshold,
                plan_bytes=self.plan_bytes,
            )
        if snapshot is not None:
            self.host_cell.show(snapshot.host)
            self.process_table.show(
                self._processes(gpus),
                frame.process_history_for if frame else None,
                {gpu.index: gpu.total_bytes for gpu in gpus},
            )

    def _processes(self, gpus: tuple[GpuSample, ...]) -> tuple[ProcessSample, ...]:
        """Every GPU's processes; a lost GPU keeps the ones it last had (the moment one wants to
        know what ran there), until it answers again or leaves the list."""
        shown: list[ProcessSample] = []
        for gpu in gpus:
            if gpu.state is GpuState.LOST and not gpu.processes:
                shown += self._last_processes.get(gpu.index, ())
            else:
                self._last_processes[gpu.index] = gpu.processes
                shown += gpu.processes
        for index in set(self._last_processes) - {gpu.index for gpu in gpus}:
            del self._last_processes[index]
        return tuple(shown)

    def selected_process_key(self) -> str | None:
        """Row key (``gpu:pid``) of the process under the table's cursor; None when empty."""
        table = self.process_table
        keys = table.row_keys_in_order
        if not keys:
            return None
        return keys[min(table.cursor_row, len(keys) - 1)]

    def _sync_cards(self, gpus: tuple[GpuSample, ...]) -> None:
        """Mount or remove cards when the set of GPUs changes (rare: start, lost for good)."""
        indices = [gpu.index for gpu in gpus]
        if indices == list(self._cards):
            return
        for card in self._cards.values():
            card.remove()
        self._cards = {index: GpuCard(index) for index in indices}
        self.gpu_list.mount_all(self._cards.values())
        self._update_wide(self.size.width, self.size.height)

    def _update_wide(self, width: int, height: int) -> None:
        needed = 2 * len(self._cards) + WIDE_SPARE_LINES
        wide = width >= WIDE_MIN_WIDTH and height >= needed
        # No CSS class for it: no rule needs one, and a class change restyles the whole pane.
        self.heading.set_wide(wide)
        if wide != self.wide:
            self.wide = wide
            self._redraw()

    def on_resize(self, event: events.Resize) -> None:
        self._update_wide(event.size.width, event.size.height)

    def action_next_sort(self) -> None:
        """Sort the process table by its next column."""
        self.process_table.action_next_sort()

    def action_reverse_sort(self) -> None:
        """Reverse the process table's order."""
        self.process_table.action_reverse_sort()
