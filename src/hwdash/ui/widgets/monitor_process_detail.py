"""One GPU process in detail (``enter`` on the monitor): its memory history, command line, host
numbers and, where the process runs :mod:`hwdash.probe`, what its PyTorch allocator says.

The screen follows the process live (the app hands it every frame); when the process ends it says
so and keeps the last numbers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from hwdash.core.units import format_bytes
from hwdash.runs.display import plan_label, run_lines
from hwdash.telemetry.history import process_key
from hwdash.telemetry.types import ProcessSample, TorchSample
from hwdash.ui.widgets.monitor_cells import sparkline

#: How to start the probe, said where a process has none.
PROBE_HINT = (
    "no PyTorch numbers: start the probe in the script (import hwdash.probe; "
    "hwdash.probe.start()) or run it with python -m hwdash.probe"
)


def detail_text(
    process: ProcessSample,
    history: tuple[tuple[float, int | None], ...],
    total_bytes: int | None,
    *,
    width: int,
    ended: bool = False,
) -> Text:
    """The screen's text (plain: every string from outside is shown as is)."""
    text = Text()
    _append_identity(text, process, ended=ended)
    _append_gpu_memory(text, process, history, total_bytes, width=width)
    text.append("\n")
    if process.torch is None:
        text.append(PROBE_HINT + "\n", style="dim")
    else:
        _append_allocator(text, process.torch)
    if process.oom_snapshot is not None:
        text.append("\nOut-of-memory snapshot  ", style="bold red")
        text.append(process.oom_snapshot + "\n")
        text.append(f"  read it: hwdash oom {process.oom_snapshot}  (s: here)\n", style="dim")
    elif process.oom_recording:
        text.append(
            "\nRecording the allocator's history: an out-of-memory error (or SIGUSR2) leaves a "
            "snapshot\n",
            style="dim",
        )
    if process.run is not None:
        text.append(f"\nRun against its plan ({plan_label(process.run.plan)})\n", style="bold")
        for line in run_lines(process.run):
            text.append(f"  {line}\n")
    cpu = "n/a" if process.cpu_percent is None else f"{process.cpu_percent:.0f}%"
    rss = "n/a" if process.rss_bytes is None else format_bytes(process.rss_bytes)
    text.append(f"\nHost  CPU {cpu}  ·  RSS {rss}\n")
    return text


def _append_identity(text: Text, process: ProcessSample, *, ended: bool) -> None:
    """Who the process is (PID, GPU, user, container), whether it can be checked, its command."""
    head = f"PID {process.pid}  ·  GPU {process.gpu_index}"
    if process.mig_index is not None:
        head += f"/{process.mig_index}"
    head += f"  ·  user {process.user or 'unknown'}"
    if process.container:
        head += f"  ·  container {process.container}"
    text.append(head + "\n", style="bold")
    if ended:
        text.append("This process has ended; the numbers are the last seen.\n", style="bold yellow")
    elif not process.verifiable:
        text.append("A host PID that this container cannot check.\n", style="italic")
    elif process.exited:
        text.append(
            "Exited: its PID is gone from /proc, but NVML still lists it and its memory.\n",
            style="italic",
        )
    elif not process.visible:
        text.append("Not visible from here (another container or PID namespace).\n", style="italic")
    text.append("Command  ", style="bold")
    text.append((process.cmdline or process.name or "unknown") + "\n\n")


def _append_gpu_memory(
    text: Text,
    process: ProcessSample,
    history: tuple[tuple[float, int | None], ...],
    total_bytes: int | None,
    *,
    width: int,
) -> None:
    """NVML's memory of the process now, its range over the history, and its sparkline."""
    known = [used for _at, used in history if used is not None]
    used = "n/a" if process.used_bytes is None else format_bytes(process.used_bytes)
    text.append("GPU memory (NVML)  ", style="bold")
    text.append(used)
    if known:
        span = history[-1][0] - history[0][0]
        text.append(
            f"   min {format_bytes(min(known))}, max {format_bytes(max(known))} "
            f"over the last {span:.0f} s"
        )
    text.append("\n")
    if known and total_bytes:
        line = sparkline(tuple(value / total_bytes for value in known), max(8, width - 4))
        text.append(f"  {line}\n", style="green")
        text.append("  (height: share of the GPU's memory)\n", style="dim")


def _append_allocator(text: Text, torch: TorchSample) -> None:
    """What the process's PyTorch allocator says (through :mod:`hwdash.probe`)."""
    step = "" if torch.step is None else f", step {torch.step}"
    text.append(f"PyTorch allocator (hwdash.probe{step})\n", style="bold")
    fragmented = torch.fragmentation
    text.append(
        f"  allocated {format_bytes(torch.allocated_bytes)}  ·  reserved "
        f"{format_bytes(torch.reserved_bytes)}  ·  cache {format_bytes(torch.cache_bytes)}"
        + ("" if fragmented is None else f"  ·  {fragmented:.0%} of the pool fragmented")
        + "\n"
    )
    if torch.max_allocated_bytes is not None and torch.max_reserved_bytes is not None:
        text.append(
            f"  peak allocated {format_bytes(torch.max_allocated_bytes)}  ·  peak reserved "
            f"{format_bytes(torch.max_reserved_bytes)}\n"
        )
    retries = f"  alloc retries {torch.alloc_retries}  ·  OOMs caught {torch.ooms}"
    text.append(retries)
    if torch.retries_rising:
        text.append(
            "  rising: the allocator frees its cache to fit allocations, an OOM is near",
            style="bold red",
        )
    text.append("\n")


class ProcessDetailScreen(ModalScreen[None]):
    """The detail of one process, following it frame by frame."""

    DEFAULT_CSS = """
    ProcessDetailScreen { align: center middle; }
    ProcessDetailScreen > VerticalScroll {
        width: 100; max-width: 100%; height: auto; max-height: 100%;
        border: round $accent; background: $surface; padding: 0 1;
    }
    ProcessDetailScreen #process-detail-keys { color: $text-muted; }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q,enter", "dismiss", "Close"),
        Binding("k", "signal('TERM')", "Terminate"),
        Binding("K", "signal('KILL')", "Kill"),
        Binding("p", "attach_plan", "Attach plan"),
        Binding("s", "oom_snapshot", "OOM snapshot"),
    ]

    def __init__(
        self,
        process: ProcessSample,
        history: tuple[tuple[float, int | None], ...],
        total_bytes: int | None,
        *,
        signals: bool,
        attach: Callable[[int, str | None], None] | None = None,
    ) -> None:
        super().__init__()
        self.attach = attach
        """Holds a PID's run against a plan (the run watcher's), None where runs are not watched."""
        self.process = process
        self.key = process_key(process.gpu_index, process.mig_index, process.pid)
        self.history = history
        self.total_bytes = total_bytes
        self.ended = False
        self.signals = signals
        self.body = Static(id="process-detail-body", markup=False)
        self.shown = ""
        """The plain text on screen (tests read it)."""

    def compose(self) -> ComposeResult:
        self._draw()
        with VerticalScroll():
            yield self.body
            keys = "escape close" + (
                "  ·  k SIGTERM  ·  K SIGKILL (asks first)" if self.signals else ""
            )
            if self.attach is not None and self.process.progress is not None:
                keys += "  ·  p attach a plan"
            if self.process.oom_snapshot is not None:
                keys += "  ·  s why it ran out of memory"
            yield Static(keys, id="process-detail-keys", markup=False)

    def action_oom_snapshot(self) -> None:
        """``s``: the process's newest out-of-memory snapshot, read and held against its plan."""
        path = self.process.oom_snapshot
        if path is None:
            self.notify(
                "No out-of-memory snapshot: start the probe with record_oom=True "
                "(HWDASH_RECORD_OOM=1); an OOM or SIGUSR2 then leaves one"
            )
            return
        from hwdash.ui.widgets.oom_screen import OomScreen

        plan = self.process.run.plan if self.process.run is not None else None
        self.app.push_screen(OomScreen(path, plan))

    def action_attach_plan(self) -> None:
        """``p``: hold this run against a plan (a saved plan's name or a plan file's path); an
        empty answer goes back to the plan the run names itself."""
        if self.attach is None or self.process.progress is None:
            self.notify("Only a run whose probe reports progress can be held against a plan")
            return
        from hwdash.ui.widgets.planner_dialogs import NameDialog

        current = self.process.run.plan if self.process.run is not None else None
        pid, attach = self.process.pid, self.attach

        def done(answer: str | None) -> None:
            if answer is None:
                return
            attach(pid, answer.strip() or None)
            self.notify(
                f"PID {pid} held against {answer.strip()}" if answer.strip() else "plan detached"
            )

        self.app.push_screen(
            NameDialog(
                "Hold this run against a plan (a saved plan's name or a plan file's path)",
                current or "",
                ok_label="Attach",
            ),
            done,
        )

    def follow(
        self,
        process: ProcessSample | None,
        history: tuple[tuple[float, int | None], ...],
        total_bytes: int | None,
    ) -> None:
        """The next frame's view of the process (None: it is gone)."""
        if process is None:
            self.ended = True
        else:
            self.process, self.history, self.total_bytes = process, history, total_bytes
            self.ended = False
        self._draw()

    def _draw(self) -> None:
        width = min(100, self.app.size.width) - 4
        text = detail_text(
            self.process,
            self.history,
            self.total_bytes,
            width=width,
            ended=self.ended,
        )
        self.shown = text.plain
        self.body.update(text)

    def action_signal(self, name: str) -> None:
        """Ask the app to signal this process (it confirms first)."""
        if not self.ended:
            self.app.call_later(self.app.run_action, f"signal_process({name!r})")
