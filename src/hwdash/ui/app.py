"""The hwdash dashboard app and :func:`make_app`, the one factory that builds it.

The CLI (``hwdash``, ``--demo``), the tests and the screenshot script all call :func:`make_app` with a
catalog and a sampler; nothing here reads a driver. Samples arrive from the one sampling thread
(:mod:`hwdash.ui.sampling`) as messages; alerts turn a GPU red, show a banner in the monitor pane and
a status line visible from every tab, raise a notification and ring the bell.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Literal

from textual.app import App, ComposeResult, ScreenStackError
from textual.binding import Binding, BindingType
from textual.css.query import NoMatches
from textual.driver import Driver
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Footer

from hwdash.errors import CatalogError
from hwdash.telemetry.history import process_key
from hwdash.telemetry.signals import Signaller, SignalName, SignalRefused, refusal
from hwdash.telemetry.types import ProcessSample, Sampler, Snapshot
from hwdash.ui import startup_gc
from hwdash.ui.dashboard_tabs import TAB_NAMES, DashboardTabs, TabName, TabPage
from hwdash.ui.help_screen import HELP_TEXT, HelpScreen
from hwdash.ui.monitor_pane import MonitorPane
from hwdash.ui.sampling import (
    AlertNotice,
    FrameBuilder,
    MonitorFrame,
    SamplingThread,
    SnapshotReady,
    alerting_frame_builder,
    plain_frame,
    replay_of,
)
from hwdash.ui.screen_diff import ScreenDiff, diffing_driver, terminal_hung_up
from hwdash.ui.time_cursor import TimeCursor
from hwdash.ui.time_cursor_keys import TIME_CURSOR_BINDINGS, TimeCursorKeys
from hwdash.ui.widgets.monitor_cells import TextCell
from hwdash.ui.widgets.monitor_process_detail import ProcessDetailScreen
from hwdash.ui.widgets.planner_dialogs import ConfirmDialog

if TYPE_CHECKING:
    from hwdash.core.catalog import Catalog
    from hwdash.core.plans.store import PlanStore
    from hwdash.ui.compare_pane import ComparePane
    from hwdash.ui.planner_pane import PlannerPane

__all__ = [
    "HELP_TEXT",
    "TAB_NAMES",
    "DashboardTabs",
    "HelpScreen",
    "HwdashApp",
    "TabName",
    "TabPage",
    "make_app",
]

#: Seconds an alert toast stays up (alerts raised meanwhile join it).
ALERT_TOAST_SECONDS = 10.0

#: Seconds running ``--on-alert`` commands get to finish when the app quits.
ALERT_COMMAND_GRACE_SECONDS = 3.0

#: Seconds without an answer from the sampler after which the monitor says a call is hung
#: (at least this, and at least three intervals; a guess at "clearly longer than a slow round").
STALL_AFTER_SECONDS = 5.0

#: Seconds between checks that the terminal is still there (a poll() call each).
TERMINAL_CHECK_SECONDS = 0.5

#: Exit status when the terminal went away: 128 + SIGHUP, as a shell reports a hung-up job.
TERMINAL_HUNG_UP_EXIT = 129


def alert_status_text(frame: MonitorFrame) -> str:
    """The line above the tabs: every GPU in alert and how full (empty when none is)."""
    if not frame.active:
        return ""
    if len(frame.active) == 1:
        return f"⚠ {frame.active[0].message}"
    line = "⚠ " + "  ·  ".join(notice.brief for notice in frame.active)
    return line + " memory" if all(n.kind == "raised" for n in frame.active) else line


class HwdashApp(TimeCursorKeys, App[None]):
    """Planner, compare and monitor tabs over one sampler."""

    CSS_PATH = "app.tcss"
    TITLE = "hwdash"

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("p", "show_tab('planner')", "Planner"),
        Binding("c", "show_tab('compare')", "Compare"),
        Binding("m", "show_tab('monitor')", "Monitor"),
        Binding("o", "sort_processes", "Sort processes"),
        Binding("enter", "process_detail", "Process detail", show=False),
        # The process table is the monitor's only list: the arrows move its selection from
        # anywhere on the tab (the table takes the focus, so the row `k` acts on is drawn).
        Binding("up", "process_cursor('up')", "Previous process", show=False),
        Binding("down", "process_cursor('down')", "Next process", show=False),
        Binding("home", "process_cursor('first')", "First process", show=False),
        Binding("end", "process_cursor('last')", "Last process", show=False),
        Binding("k", "signal_process('TERM')", "Terminate process", show=False),
        Binding("K", "signal_process('KILL')", "Kill process", show=False),
        Binding("space", "replay_pause", "Pause replay", show=False, priority=True),
        Binding("left", "replay_step(-1)", "Replay back", show=False, priority=True),
        Binding("right", "replay_step(1)", "Replay forward", show=False, priority=True),
        *TIME_CURSOR_BINDINGS,
        Binding("question_mark", "help", "Help", key_display="?"),
        Binding("q", "quit", "Quit"),
        Binding("escape", "leave_field", "Leave field", show=False),
        Binding("ctrl+l", "redraw", "Redraw", show=False),
    ]

    def __init__(
        self,
        *,
        catalog: Catalog | Callable[[], Catalog],
        sampler: Sampler | None,
        interval: float,
        alert_threshold: float,
        bell: bool,
        plan_store: PlanStore | None,
        initial_tab: TabName,
        build_frame: FrameBuilder = plain_frame,
        clock: Callable[[], float] = time.monotonic,
        on_exit_callbacks: tuple[Callable[[], object], ...] = (),
        stall_after_s: float = STALL_AFTER_SECONDS,
        first_snapshot: Snapshot | None = None,
        signaller: Signaller | None = None,
        toast_seconds: float = ALERT_TOAST_SECONDS,
    ) -> None:
        super().__init__()
        self.toast_seconds = toast_seconds
        """Real seconds the alert and allocator toasts stay up (Textual times toasts by the wall
        clock, not by ``clock``: tests that replay a scenario keep them up for good)."""
        self.signaller = signaller
        """Sends SIGTERM/SIGKILL to a process the user picked and confirmed (None: ``--readonly``)."""
        self.replay = replay_of(sampler)
        """The recording being replayed (``--replay``), or None for live samples."""
        self._first_snapshot = first_snapshot
        self._catalog_source = catalog
        self.catalog_error: CatalogError | None = None
        """Why the catalog could not be loaded when the planner was built (the app then exits 2)."""
        self.sampler = sampler
        """Where snapshots come from (None: no monitor data at all)."""
        self.interval = interval
        """Seconds between samples."""
        self.alert_threshold = alert_threshold
        """Memory pressure (0..1) above which a GPU is in alert."""
        self.bell_on_alert = bell
        """Ring the terminal bell when an alert is raised."""
        self._plan_store = plan_store
        """Saved plans (shared by the planner and compare panes)."""
        self.initial_tab: TabName = initial_tab
        self._build_frame = build_frame
        self._clock = clock
        self._on_exit_callbacks = on_exit_callbacks
        self._stall_after_s = max(stall_after_s, 3 * interval)
        self._start_empty(alert_threshold)

    def _start_empty(self, alert_threshold: float) -> None:
        """What the app holds before its first frame: no frames or alerts yet, the status line and
        the monitor pane built, the planner and compare panes not yet."""
        self._exit_requested = False
        self.frames_received = 0
        """Frames shown so far (tests wait on it)."""
        self.alerts_raised = 0
        """Alert notifications raised so far."""
        self._recent_toasts: list[tuple[float, AlertNotice]] = []
        self._thrashing: set[tuple[int, int]] = set()
        self._local_flavor_added = False
        self.sampling: SamplingThread | None = None
        """The one sampling thread, once mounted."""
        self.alert_status = TextCell(id="alert-status")
        """The line above the tabs that names every GPU in alert, whatever tab is shown."""
        self.monitor = MonitorPane(threshold=alert_threshold)
        """The monitor pane."""
        self._planner: PlannerPane | None = None
        self._compare: ComparePane | None = None
        self._local_gpus: list[tuple[str | None, int | None, int | None]] | None = None
        self._hidden_panes_mounted = False
        self._cluster_shown = False
        """The last frame came from several hosts (the process keys are hidden then)."""
        self.time_cursor = TimeCursor(None)
        """Where the monitor looks back in this box's history ring (``[ ] { }``, ``end``: live);
        its directory is set by the dashboard command (None: no history to look back in)."""
        self._live_frame: MonitorFrame | None = None

    @property
    def plan_store(self) -> PlanStore:
        """Saved plans (shared by the planner and compare panes; opened when first needed)."""
        if self._plan_store is None:
            from hwdash.core.plans.store import PlanStore

            self._plan_store = PlanStore()
        return self._plan_store

    @property
    def catalog(self) -> Catalog:
        """What the planner knows about hardware and models (loaded when first needed when the
        dashboard opens on the monitor: a training box sees its GPUs before the catalog is read)."""
        source = self._catalog_source
        if callable(source):
            source = self._catalog_source = source()
        return source

    @property
    def planner(self) -> PlannerPane:
        """The planner pane (the form and its estimate), built when first needed: its modules,
        the estimator and the flavor table cost a fifth of a second that a monitor opened on a
        training box should not wait for."""
        if self._planner is None:
            from hwdash.ui import planner_pane

            self._planner = planner_pane.PlannerPane(
                self.catalog, self.plan_store, id="planner-pane"
            )
            if self._local_gpus is not None:
                self._add_local_flavor(self._planner)
            self._mount_when_asked()
        return self._planner

    def _add_local_flavor(self, planner: PlannerPane) -> None:
        """This machine's GPUs become the planner's `local` flavor."""
        from hwdash.core.planning.local_flavor import LocalGpu

        gpus = [LocalGpu(*gpu) for gpu in self._local_gpus or ()]
        self._local_flavor_added = planner.set_local_gpus(gpus)

    @property
    def compare(self) -> ComparePane:
        """Saved plans side by side (built when first needed, like the planner)."""
        if self._compare is None:
            from hwdash.ui import compare_pane

            self._compare = compare_pane.ComparePane(
                self.plan_store, self.catalog, id="compare-pane"
            )
            self._mount_when_asked()
        return self._compare

    def get_driver_class(self) -> type[Driver]:
        """Textual's driver, writing only the characters that changed (see :mod:`screen_diff`);
        ``HWDASH_SCREEN_DIFF=0`` turns that off."""
        base = super().get_driver_class()
        if os.environ.get("HWDASH_SCREEN_DIFF", "1").strip() == "0":
            return base
        return diffing_driver(base)

    def action_redraw(self) -> None:
        """Write the whole screen again (after another program drew over it)."""
        screen_diff = getattr(self._driver, "screen_diff", None)
        if isinstance(screen_diff, ScreenDiff):
            screen_diff.invalidate()
        self.refresh(repaint=True)

    # -- layout -------------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield self.alert_status
        # Only the first tab's pane now: the others are built when their tab is first shown.
        first: Widget = getattr(self, self.initial_tab)
        yield DashboardTabs(self.initial_tab, first)
        # The command palette (ctrl+p) is in the help: its footer key pushed the app's keys off
        # an 80-column footer.
        yield Footer(show_command_palette=False)

    def mount_hidden_panes(self) -> None:
        """Build and mount the panes of the tabs not shown first (once: when one of them is first
        shown, or right after the first frame when the dashboard opens on the planner)."""
        if self._hidden_panes_mounted or self._exit_requested:
            return
        self._hidden_panes_mounted = True
        try:
            panes: dict[str, Widget] = {
                "planner": self.planner,
                "compare": self.compare,
                "monitor": self.monitor,
            }
        except CatalogError as error:
            # The CLI says what is wrong with the catalog once the screen is restored.
            self.catalog_error = error
            self._exit_requested = True
            self.exit(return_code=2)
            return
        for tab, pane in panes.items():
            if not pane.is_mounted and not pane.is_attached:
                self.query_one(DashboardTabs).get_pane(tab).mount(pane)
        # Start-up is over once they are on screen: the garbage collector comes back (if the
        # monitor's first frame has not brought it back already).
        self.call_after_refresh(startup_gc.resume)

    def first_frame_shown(self) -> None:
        """The monitor's first full frame is on screen: start-up is over (the garbage collector
        comes back). The planner and compare panes, and with them pydantic, the catalog and the
        estimator (about 25 MiB), are built when their tab is first shown, so a dashboard that
        only watches the GPUs never holds them."""
        startup_gc.resume()
        if self._planner is not None or self._compare is not None:
            self.mount_hidden_panes()  # asked for before the first frame (a plan loaded early)

    def _mount_when_asked(self) -> None:
        """A pane built after the first frame because something needs it (a plan loaded into the
        planner by compare or a script) goes on its page at once, to post its estimate."""
        if self.frames_received and not self._hidden_panes_mounted:
            self.call_after_refresh(self.mount_hidden_panes)

    @property
    def active_tab(self) -> str:
        """Id of the tab on screen."""
        return self.query_one(DashboardTabs).active

    # -- sampling -----------------------------------------------------------------------------

    def on_mount(self) -> None:
        terminal = getattr(self._driver, "fileno", None)
        if not self.is_headless and isinstance(terminal, int):
            self.set_interval(TERMINAL_CHECK_SECONDS, lambda: self._check_terminal(terminal))
        if self.sampler is None or self.initial_tab != "monitor":
            # Nothing to wait for: the hidden panes come right after the first frame.
            self.call_after_refresh(self.mount_hidden_panes)
        if self.sampler is not None:
            self.sampling = SamplingThread(
                self.sampler,
                self,
                interval=self.interval,
                build_frame=self._build_frame,
                clock=self._clock,
            )
            first = self._first_snapshot
            self._first_snapshot = None
            if first is not None:
                # A sample taken before the app started (to choose the tab) is the first frame:
                # the first screen already shows the GPUs; the thread samples one interval later.
                self.show_frame(self._build_frame(first, 1))
                self.sampling.start_after(1)
            else:
                self.sampling.start()
            self.set_interval(min(1.0, max(0.1, self._stall_after_s / 2)), self._check_stalled)

    def _check_terminal(self, fd: int) -> None:
        """Quit when the terminal is gone: nobody can see the app, and Textual would spin."""
        if not self._exit_requested and terminal_hung_up(fd):
            self._exit_requested = True
            if self.sampling is not None:
                self.sampling.stop(timeout=0.0)
            self.exit(return_code=TERMINAL_HUNG_UP_EXIT)

    def _check_stalled(self) -> None:
        if self.sampling is None:
            return
        busy = self.sampling.busy_seconds
        if busy >= self._stall_after_s:
            self.monitor.show_stalled(busy)

    def on_snapshot_ready(self, message: SnapshotReady) -> None:
        """A frame from the sampling thread: redraw, then raise its alerts."""
        if self._exit_requested:
            return
        self.show_frame(message.frame)

    def show_frame(self, frame: MonitorFrame) -> None:
        """Show one frame everywhere it matters (the monitor pane and the alert status line)."""
        self.frames_received += 1
        if not self._local_flavor_added and frame.snapshot.gpus and not frame.snapshot.stale:
            # This machine becomes the planner's `local` flavor (once: its GPUs do not change).
            self._local_gpus = [
                (gpu.name, gpu.total_bytes, gpu.free_bytes)
                for gpu in frame.snapshot.gpus
                if gpu.memory_source == "device"
            ]
            if self._planner is not None:
                self._add_local_flavor(self._planner)
            else:
                self._local_flavor_added = True  # applied when the planner is built
        cluster = any(gpu.host for gpu in frame.snapshot.gpus)
        if cluster != self._cluster_shown:
            self._cluster_shown = cluster
            self.refresh_bindings()  # the process keys come and go with the process table
        if self.frames_received == 1:
            self.call_after_refresh(self.first_frame_shown)
        self._live_frame = frame
        with self.batch_update():
            self._show_replay_note()
            if self.time_cursor.live:  # looking back: the live frames wait for `end`
                self.monitor.show_frame(frame)
            screen = self._top_screen()
            if isinstance(screen, ProcessDetailScreen):
                process, history, total = self._process_view(screen.key)
                screen.follow(process, history, total)
            status = self.alert_status
            status.set_class(bool(frame.active), "-active")
            status.show(alert_status_text(frame))
        self._warn_thrashing(frame)
        if frame.raised:
            self._toast_alerts(frame)
            if self.bell_on_alert:
                self.bell()

    def _top_screen(self) -> Screen[object] | None:
        """The screen on top, or None while there is none (starting, shutting down)."""
        try:
            return self.screen
        except ScreenStackError:
            return None

    def _warn_thrashing(self, frame: MonitorFrame) -> None:
        """A warning when a probed process's allocator starts retrying allocations (once per
        process until it calms down; the process table keeps its ``!`` meanwhile)."""
        rising = {
            (process.gpu_index, process.pid): process
            for gpu in frame.snapshot.gpus
            for process in gpu.processes
            if process.torch is not None and process.torch.retries_rising
        }
        for key in rising.keys() - self._thrashing:
            process = rising[key]
            assert process.torch is not None
            self.notify(
                f"PID {process.pid} on GPU {process.gpu_index}: PyTorch's allocator is freeing its "
                f"cache to fit allocations ({process.torch.alloc_retries} retries): an OOM is near",
                title="Allocator thrashing",
                severity="warning",
                timeout=self.toast_seconds,
                markup=False,
            )
        self._thrashing = set(rising)

    def _toast_alerts(self, frame: MonitorFrame) -> None:
        """One toast for the alerts raised lately: GPUs of one job cross within seconds of each
        other, and a stack of toasts would hide the screen they warn about."""
        now = self._clock()
        self.alerts_raised += len(frame.raised)
        self._recent_toasts = [
            (at, notice) for at, notice in self._recent_toasts if now - at < ALERT_TOAST_SECONDS
        ]
        if self._recent_toasts:
            self.clear_notifications()
        self._recent_toasts += [(now, notice) for notice in frame.raised]
        self.notify(
            "\n".join(notice.message for _at, notice in self._recent_toasts),
            title="GPU memory alert"
            if all(notice.kind == "raised" for _at, notice in self._recent_toasts)
            else "GPU alert",
            severity="error",
            timeout=self.toast_seconds,
            markup=False,  # GPU and MIG names come from the driver
        )

    # -- planner and compare ------------------------------------------------------------------

    def on_planner_pane_plan_changed(self, message: PlannerPane.PlanChanged) -> None:
        """Draw the planner's per-GPU total on the monitor's bars."""
        report = message.report
        if report is None or not message.chosen:
            # Only a plan the user chose is held against the live GPUs, not the starting form.
            self.monitor.set_plan_expectation(None)
            return
        self.monitor.set_plan_expectation(
            report.estimate.per_gpu.total, message.label, report.plan.gpus
        )

    def on_planner_pane_plan_saved(self, message: PlannerPane.PlanSaved) -> None:
        """A saved plan shows up in the compare view at once."""
        if self._compare is not None and self._compare.is_mounted:
            self.compare.refresh_plans()

    def on_compare_pane_load_plan(self, message: ComparePane.LoadPlan) -> None:
        """Load a saved plan back into the planner form and show it."""
        self.action_show_tab("planner")
        self.planner.load_plan(message.plan, message.name or None)

    # -- actions ------------------------------------------------------------------------------

    def action_show_tab(self, tab: str) -> None:
        """Switch to the planner, compare or monitor tab."""
        if tab not in TAB_NAMES:
            return
        self.mount_hidden_panes()
        tabbed = self.query_one(DashboardTabs)
        if tabbed.active != tab:
            # The tab bar takes the focus first (at once, not after a refresh): a widget hidden
            # with focus hands it to a sibling, and a sibling in the pane being hidden (the
            # planner's "fits only" checkbox and provider select) pulled that pane back on
            # screen. From the tab bar the new tab's keys work at once.
            self.screen.set_focus(tabbed.tab_bar)
        tabbed.active = tab

    def on_dashboard_tabs_tab_activated(self, event: DashboardTabs.TabActivated) -> None:
        """The footer's keys depend on the tab (sorting is offered on the monitor only)."""
        if not self.query_one(DashboardTabs).get_pane(event.tab).children:
            self.mount_hidden_panes()  # a tab chosen (key or click) before they were built
        self.refresh_bindings()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Offer "sort processes" only on the monitor tab (on the planner, the tab bar passes
        ``o`` to the planner, where it shows only the flavors that fit)."""
        if action in ("time_step", "time_jump"):
            try:
                return self.replay is None and self.active_tab == "monitor" and not self.is_cluster
            except NoMatches:
                return False
        if action in ("replay_pause", "replay_step"):
            if self.replay is None:
                return False  # space and the arrows keep their usual meaning
            try:
                return self.active_tab == "monitor" and self.screen is self.screen_stack[0]
            except NoMatches:
                return False
        if action in ("sort_processes", "process_detail", "signal_process", "process_cursor"):
            try:
                on_monitor = self.active_tab == "monitor"
            except NoMatches:  # asked before the tabs exist
                return False
            if action != "signal_process" and self.is_cluster:
                return False  # a cluster shows no process table to sort or open
            return on_monitor
        return True

    def _process_view(
        self, key: str
    ) -> tuple[ProcessSample | None, tuple[tuple[float, int | None], ...], int | None]:
        """A process of the last frame by row key, its memory history and its GPU's memory."""
        frame = self.monitor.frame
        if frame is None:
            return None, (), None
        for gpu in frame.snapshot.gpus:
            for process in gpu.processes:
                if process_key(process.gpu_index, process.mig_index, process.pid) == key:
                    return process, frame.process_points_for(key), gpu.total_bytes
        return None, (), None

    def action_process_cursor(self, where: str) -> None:
        """Up/down/home/end on the monitor tab: focus the process table and move its selection;
        ``end`` while looking back in the history returns to live first."""
        if where == "last" and self.time_cursor_to_live():
            return
        table = self.monitor.process_table
        if not table.display:
            return
        table.focus()
        moves = {
            "up": table.action_cursor_up,
            "down": table.action_cursor_down,
            "first": table.action_cursor_first,
            "last": table.action_cursor_last,
        }
        moves[where]()

    def action_process_detail(self) -> None:
        """``enter`` on the monitor: the selected process in detail."""
        key = self.monitor.selected_process_key()
        process, history, total = self._process_view(key) if key else (None, (), None)
        if process is None:
            self.notify("No process selected (move in the process table with up/down)", timeout=3)
            return
        self.push_screen(
            ProcessDetailScreen(
                process,
                history,
                total,
                signals=self.signaller is not None,
                attach=getattr(self.sampler, "attach", None),
            )
        )

    @property
    def is_cluster(self) -> bool:
        """The snapshots cover several hosts (a Prometheus source)."""
        frame = self.monitor.frame
        return frame is not None and any(gpu.host for gpu in frame.snapshot.gpus)

    def action_replay_pause(self) -> None:
        """``space`` in a replay: pause or resume."""
        replay = self.replay
        if replay is None:
            return
        replay.paused = not replay.paused
        self._show_replay_note()
        if not replay.paused and self.sampling is not None:
            self.sampling.request_sample()

    def action_replay_step(self, by: int) -> None:
        """``left``/``right`` in a replay: one recorded snapshot back or forward (pauses)."""
        replay = self.replay
        if replay is None:
            return
        replay.paused = True
        replay.step(by)
        if self.sampling is not None:
            self.sampling.request_sample()

    def _show_replay_note(self) -> None:
        replay = self.replay
        if replay is None:
            return
        where = f"Replay {max(0, replay.position) + 1}/{len(replay.snapshots)}"
        if replay.paused:
            where += " paused (space resumes, left/right step)"
        elif replay.finished:
            where += " ended"
        self.monitor.set_source_note(where)

    def action_signal_process(self, name: str) -> None:
        """``k``/``K``: SIGTERM/SIGKILL to the selected process, after a confirmation naming it."""
        if self.signaller is None:
            why = (
                "a replay's processes are not live"
                if self.replay
                else "another machine's processes"
                if self.is_cluster
                else "--readonly"
            )
            self.notify(f"Signals are off ({why}): hwdash sends none", timeout=4)
            return
        if isinstance(self.screen, ProcessDetailScreen):
            process: ProcessSample | None = None if self.screen.ended else self.screen.process
        else:
            key = self.monitor.selected_process_key()
            process = self._process_view(key)[0] if key else None
        if process is None:
            self.notify("No process selected (move in the process table with up/down)", timeout=3)
            return
        signal_name: SignalName = "KILL" if name == "KILL" else "TERM"
        reason = refusal(process, user=self.signaller_user, root=self.signaller_root)
        if reason is not None:
            self.notify(reason, severity="warning", timeout=5, markup=False)
            return
        # The whole command line: the dialog wraps it (it is what decides yes or no).
        command = process.cmdline or process.name or "unknown command"
        question = (
            f"Send SIG{signal_name} to PID {process.pid} on GPU {process.gpu_index} "
            f"(user {process.user or 'unknown'}: {command})?"
        )
        signaller = self.signaller
        target = process

        def answered(yes: bool | None) -> None:
            if not yes:
                return
            try:
                message = signaller.send(target, signal_name)
            except SignalRefused as refused:
                self.notify(str(refused), severity="warning", timeout=5, markup=False)
            else:
                self.notify(message, timeout=4, markup=False)

        self.push_screen(ConfirmDialog(question), answered)

    @property
    def signaller_user(self) -> str | None:
        """The user the signaller acts as (for the refusal said before asking)."""
        return getattr(self.signaller, "user", None)

    @property
    def signaller_root(self) -> bool:
        """Whether the signaller may signal other users' processes."""
        return bool(getattr(self.signaller, "root", False))

    def action_sort_processes(self) -> None:
        """``o``: sort the process table by the next column."""
        self.monitor.action_next_sort()

    def action_leave_field(self) -> None:
        """Escape from a form field to the tab bar, where the single-letter keys work again."""
        self.query_one(DashboardTabs).tab_bar.focus()

    def action_help(self) -> None:
        """Show the list of keys."""
        if not isinstance(self.screen, HelpScreen):
            frame = self.monitor.frame
            webhooks = frame.webhooks if frame is not None else None
            status = f"Alerts to --webhook: {webhooks.counts()}" if webhooks is not None else ""
            self.push_screen(HelpScreen(status))

    async def action_quit(self) -> None:
        """Quit: stop sampling first so no frame arrives while the screen is torn down."""
        self._exit_requested = True
        if self.sampling is not None:
            self.sampling.stop(timeout=0.0)
        self.exit()

    def on_unmount(self) -> None:
        if self.sampling is not None:
            self.sampling.stop(timeout=0.5)

    def finish(self) -> None:
        """After the app has exited: stop sampling and let alert commands finish (call once)."""
        if self.sampling is not None:
            self.sampling.stop(timeout=0.5)
        for callback in self._on_exit_callbacks:
            callback()


def make_app(
    *,
    catalog: Catalog | Callable[[], Catalog],
    sampler: Sampler | None,
    interval: float = 1.0,
    alert_threshold: float = 0.9,
    blind_after_s: float | None = None,
    on_alert: str | None = None,
    bell: bool = True,
    plan_store: PlanStore | None = None,
    initial_tab: TabName = "planner",
    clock: Callable[[], float] | None = None,
    alert_log: Path | Literal[False] | None = None,
    stall_after_s: float = STALL_AFTER_SECONDS,
    first_snapshot: Snapshot | None = None,
    signaller: Signaller | None = None,
    alert_forecast_s: float | None = None,
    toast_seconds: float = ALERT_TOAST_SECONDS,
    webhooks: Sequence[str] = (),
) -> HwdashApp:
    """Build the dashboard. The one factory: the CLI, ``--demo``, tests and screenshots call it.

    ``sampler`` is any :class:`~hwdash.telemetry.types.Sampler` (NVML, the fake, a test's own);
    ``on_alert`` is the user's ``--on-alert`` command; ``clock`` (monotonic seconds) times the
    sampling thread, so tests can control it. ``alert_log`` is where alert events are appended
    (default ``$XDG_STATE_HOME/hwdash/alerts.jsonl``; False writes none, for screenshots).
    ``toast_seconds``: how long (real time) alert toasts stay up; tests that step scenario time
    make it long, so what they check does not depend on the machine's speed. ``webhooks``: the
    ``--webhook`` URLs (checked by :func:`hwdash.telemetry.webhooks.parse_webhook_urls`); their
    counters join the monitor's status line. Call :meth:`HwdashApp.finish` after ``run()`` so running
    alert commands and queued webhooks get a few seconds.
    """
    builder, actions = alerting_frame_builder(
        sampler,
        interval=interval,
        alert_threshold=alert_threshold,
        blind_after_s=blind_after_s,
        alert_forecast_s=alert_forecast_s,
        alert_log=alert_log,
        on_alert=on_alert,
        webhooks=webhooks,
    )
    return HwdashApp(
        catalog=catalog,
        sampler=sampler,
        interval=interval,
        alert_threshold=alert_threshold,
        bell=bell,
        plan_store=plan_store,
        initial_tab=initial_tab,
        build_frame=builder,
        clock=clock or time.monotonic,
        on_exit_callbacks=(lambda: actions.close(ALERT_COMMAND_GRACE_SECONDS),),
        stall_after_s=stall_after_s,
        first_snapshot=first_snapshot,
        signaller=signaller,
        toast_seconds=toast_seconds,
    )
