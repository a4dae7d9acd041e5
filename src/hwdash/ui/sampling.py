"""The one long-lived sampling thread of the dashboard.

A single daemon thread calls ``sampler.sample()`` every interval until it is stopped, turns each
snapshot into a frozen :class:`MonitorFrame` (history, alert evaluation and alert actions happen here,
off the event loop), and hands it to the app with ``post_message`` (thread-safe in Textual). The thread
never touches a widget.

A driver call that hangs blocks only this thread: the UI keeps answering keys, the app can see how
long the call has been running (:attr:`SamplingThread.busy_seconds`) and say so, and no second thread
is ever started to "try again" (so hung calls cannot pile up). The thread is a daemon: quitting the app
does not wait for a call that never returns.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from textual.message import Message
from textual.message_pump import MessagePump

from hwdash.core.live.alerts import AlertEngine, AlertRule, blind_after_for
from hwdash.telemetry.alert_actions import AlertActions, AlertCommand, AlertLog, mark_alert_states
from hwdash.telemetry.history import DEFAULT_WINDOW_S, History
from hwdash.telemetry.replay import ReplaySampler
from hwdash.telemetry.subset import SubsetSampler
from hwdash.telemetry.types import GpuSample, GpuState, NvmlStatus, Sampler, Snapshot
from hwdash.telemetry.webhooks import WebhookSender, WebhookStats

#: Name of the sampling thread (tests count live threads by this name).
SAMPLING_THREAD_NAME = "hwdash-sampler"


@dataclass(frozen=True)
class AlertNotice:
    """One GPU over the alert threshold, in the words the UI shows."""

    gpu_index: int
    """Index of the GPU (as NVML numbers it)."""
    mig_index: int | None
    """The MIG slot the alert is about (None: the whole GPU)."""
    kind: str
    """``raised`` (memory), ``lost`` or ``blind``."""
    gpu_name: str
    """Short display name of the GPU (``A100-SXM4-80GB``)."""
    pressure: float | None
    """Memory pressure ``1 - free/total`` in 0..1 when the alert was computed; None for a lost GPU."""
    message: str
    """What the status line says, e.g. ``GPU 2 A100-SXM4-80GB at 94% memory``."""
    brief: str
    """The same without the name (``GPU 2 at 94%``, ``GPU 0 blind``), for when several share the
    line."""


@dataclass(frozen=True)
class MonitorFrame:
    """Everything the UI needs from one sampling round, frozen so it can cross threads."""

    snapshot: Snapshot
    """The sample, with GPU states already set by the alert rule."""
    memory_history: tuple[tuple[int, tuple[float, ...]], ...] = ()
    """Per GPU index, memory pressure (0..1) over the recent history, oldest first."""
    raised: tuple[AlertNotice, ...] = ()
    """Alerts raised by this round (one per crossing): notify and ring the bell for these."""
    active: tuple[AlertNotice, ...] = ()
    """Every alert active after this round (the status line lists them)."""
    round_number: int = 0
    """1 for the first round, then counting up."""
    process_history: tuple[tuple[str, tuple[tuple[float, int | None], ...]], ...] = ()
    """Per process (key ``gpu:pid``, see :func:`hwdash.telemetry.history.process_key`),
    (timestamp, NVML's used bytes) over the recent history, oldest first."""
    webhooks: WebhookStats | None = None
    """What ``--webhook`` has sent, failed and dropped so far (None: no webhook)."""

    def process_points_for(self, key: str) -> tuple[tuple[float, int | None], ...]:
        """(timestamp, used bytes) history of one process (empty when unknown)."""
        for candidate, points in self.process_history:
            if candidate == key:
                return points
        return ()

    def process_history_for(self, key: str) -> tuple[int | None, ...]:
        """Used-memory history of one process (empty when unknown)."""
        return tuple(used for _at, used in self.process_points_for(key))

    def history_for(self, gpu_index: int) -> tuple[float, ...]:
        """Pressure history of one GPU (empty when unknown)."""
        for index, values in self.memory_history:
            if index == gpu_index:
                return values
        return ()


class SnapshotReady(Message):
    """Posted by the sampling thread after each round."""

    def __init__(self, frame: MonitorFrame) -> None:
        self.frame = frame
        super().__init__()


#: Turns a raw snapshot into a frame. Runs on the sampling thread; it owns any state it keeps.
FrameBuilder = Callable[[Snapshot, int], MonitorFrame]


def plain_frame(snapshot: Snapshot, round_number: int) -> MonitorFrame:
    """A frame with no history and no alerts (the builder used when none is given)."""
    return MonitorFrame(snapshot=snapshot, round_number=round_number)


def short_gpu_name(name: str | None) -> str:
    """``NVIDIA A100-SXM4-80GB`` -> ``A100-SXM4-80GB``; unknown names read ``GPU``."""
    if not name:
        return "GPU"
    for prefix in ("NVIDIA ", "Tesla "):
        if name.startswith(prefix):
            name = name[len(prefix) :]
    return name


def short_gpu_label(gpu: GpuSample) -> str:
    """``GPU 2 A100-SXM4-80GB``: the index and the name without the vendor prefix; a cluster's GPU
    is named by its host and its number there (``node-c GPU 1 A100-SXM4-80GB``)."""
    if gpu.host:
        return f"{gpu.host} GPU {gpu.host_gpu} {short_gpu_name(gpu.name)}"
    return f"GPU {gpu.index} {short_gpu_name(gpu.name)}"


def _short_mig_name(name: str | None, slot: int) -> str:
    """``NVIDIA A100-SXM4-80GB MIG 3g.40gb`` -> ``MIG 3g.40gb``; unknown names read ``MIG slot 3``."""
    if name and " MIG " in name:
        return "MIG " + name.rsplit(" MIG ", 1)[1]
    return f"MIG slot {slot}"


#: What to check when a GPU is lost (NVIDIA's driver logs an Xid error to the kernel log).
LOST_HINT = "check `dmesg` for an NVIDIA Xid error (and `nvidia-smi`)"


def alert_notice(gpu: GpuSample, kind: str = "raised", mig_index: int | None = None) -> AlertNotice:
    """The words for one alert (``raised``, ``lost`` or ``blind``) on a GPU or one of its MIG
    instances, from the current sample (so the status line stays live)."""
    label = short_gpu_label(gpu)
    who = f"{gpu.host} GPU {gpu.host_gpu}" if gpu.host else f"GPU {gpu.index}"
    pressure = gpu.pressure
    mig = next((m for m in gpu.mig if m.index == mig_index), None)
    if mig_index is not None:
        mig_name = _short_mig_name(mig.name if mig else None, mig_index)
        label = f"{label} {mig_name}"
        who = f"GPU {gpu.index}/{mig_index}"
        pressure = mig.pressure if mig else None
    if gpu.state is GpuState.LOST or kind == "lost":
        how = f"lost: {LOST_HINT}"
        brief = "lost"
    elif kind == "blind":
        how, brief = "blind: no fresh memory reading", "blind"
    elif pressure is None:
        how = brief = "memory alert"
    else:
        brief = f"at {pressure * 100:.0f}%"
        how = f"{brief} memory"
    return AlertNotice(
        gpu_index=gpu.index,
        mig_index=mig_index,
        kind=kind,
        gpu_name=short_gpu_name(gpu.name),
        pressure=pressure,
        message=f"{label} {how}",
        brief=f"{who} {brief}",
    )


#: Pressure points per GPU a frame carries (the widest sparkline is narrower than this).
FRAME_HISTORY_POINTS = 120


class AlertingFrameBuilder:
    """Builds frames on the sampling thread: history rings, the alert rule, and alert actions.

    It owns its state (the alert engine, the history) and is only ever called from the one sampling
    thread, so it needs no locks. Actions run here too, off the event loop: writing the alerts log
    and starting ``--on-alert`` commands never delays a keypress.
    """

    def __init__(
        self,
        rule: AlertRule,
        *,
        history: History,
        actions: AlertActions | None = None,
        history_feed: Callable[[History, Snapshot], None] | None = None,
    ) -> None:
        self.engine = AlertEngine(rule)
        """The pure alert rule with its per-GPU state."""
        self.history = history
        """Rings of recent points per GPU (telemetry's history)."""
        self.actions = actions
        """The alerts log, the ``--on-alert`` command and the webhooks (None: no actions, e.g.
        screenshots)."""
        self.history_feed = history_feed
        """Adds each snapshot to the history instead of ``history.add`` (a replay's, which keeps
        it equal to the recording up to the snapshot shown); None: every snapshot is added."""

    def __call__(self, snapshot: Snapshot, round_number: int) -> MonitorFrame:
        if self.history_feed is not None:
            self.history_feed(self.history, snapshot)
        else:
            self.history.add(snapshot)
        snapshot = self.history.with_forecasts(snapshot)  # the rule may alert on the forecast
        events = self.engine.update(snapshot)
        if events and self.actions is not None:
            self.actions.handle(events)  # logs its own failures; never raises for I/O trouble
        snapshot = mark_alert_states(snapshot, self.engine)
        by_index = {gpu.index: gpu for gpu in snapshot.gpus}
        raised = tuple(
            alert_notice(by_index[event.gpu_index], event.kind, event.mig_index)
            for event in events
            if event.kind in ("raised", "lost", "blind")
            and event.diagnosis is None  # a health diagnosis is shown in its GPU's row
            and event.gpu_index in by_index
        )
        active = tuple(
            alert_notice(by_index[event.gpu_index], event.kind, event.mig_index)
            for event in self.engine.active
            if event.gpu_index in by_index
        )
        return MonitorFrame(
            snapshot=snapshot,
            memory_history=tuple(
                (index, tuple(self.history.pressures(index)[-FRAME_HISTORY_POINTS:]))
                for index in self.history.gpu_indices()
            ),
            raised=raised,
            active=active,
            round_number=round_number,
            process_history=tuple(
                (key, self.history.process(key)) for key in self.history.process_keys()
            ),
            webhooks=self._webhook_stats(),
        )

    def _webhook_stats(self) -> WebhookStats | None:
        """The webhooks' counters now (deliveries run on their own thread: a round later at most)."""
        webhooks = self.actions.webhooks if self.actions is not None else None
        return webhooks.stats() if webhooks is not None else None


class SamplingThread:
    """One daemon thread that samples, builds a frame and posts it, until :meth:`stop`."""

    def __init__(
        self,
        sampler: Sampler,
        target: MessagePump,
        *,
        interval: float,
        build_frame: FrameBuilder = plain_frame,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if interval <= 0:
            raise ValueError("the sampling interval must be greater than zero")
        self._sampler = sampler
        self._target = target
        self._interval = interval
        self._build_frame = build_frame
        self._clock = clock
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._call_started: float | None = None
        self.rounds = 0
        """Rounds completed so far."""
        self._first_wait = 0.0

    @property
    def interval(self) -> float:
        """Seconds between the starts of two rounds."""
        return self._interval

    def start(self) -> None:
        """Start the thread. Calling it again is an error: there is only ever one."""
        if self._thread is not None:
            raise RuntimeError("the sampling thread was already started")
        self._thread = threading.Thread(target=self._run, name=SAMPLING_THREAD_NAME, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 0.5) -> bool:
        """Ask the thread to stop and wait up to ``timeout`` seconds.

        Returns whether it ended; a thread stuck in a hung driver call is left behind (it is a
        daemon, so it never keeps the process alive).
        """
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is None or thread is threading.current_thread():
            return True
        thread.join(timeout)
        return not thread.is_alive()

    def request_sample(self) -> None:
        """Sample now instead of at the end of the current wait (a round in progress is not doubled)."""
        self._wake.set()

    @property
    def alive(self) -> bool:
        """Whether the thread is running."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def busy_seconds(self) -> float:
        """How long the ``sample()`` call in progress has been running (0 when none is)."""
        started = self._call_started
        return 0.0 if started is None else max(0.0, self._clock() - started)

    def _sample_once(self) -> Snapshot:
        self._call_started = self._clock()
        try:
            return self._sampler.sample()
        except Exception as exc:  # a Sampler should report trouble, but a bug must not end sampling
            return Snapshot(
                timestamp=time.time(),
                nvml=NvmlStatus(available=False, error=f"the sampler failed: {exc}"),
                errors=(f"sampler raised {type(exc).__name__}: {exc}",),
            )
        finally:
            self._call_started = None

    def start_after(self, rounds: int) -> None:
        """Start the thread as if ``rounds`` rounds were already done (the caller showed a frame
        built from a sample it had): the first sample comes one interval from now."""
        self.rounds = rounds
        self._first_wait = self._interval
        self.start()

    def _run(self) -> None:
        if self._first_wait:
            self._wake.wait(self._first_wait)
            self._wake.clear()
        while not self._stop.is_set():
            started = self._clock()
            snapshot = self._sample_once()
            if self._stop.is_set():
                break
            self.rounds += 1
            try:
                frame = self._build_frame(snapshot, self.rounds)
            except Exception as exc:  # same: keep sampling, show the problem
                frame = MonitorFrame(
                    snapshot=Snapshot(
                        timestamp=snapshot.timestamp,
                        nvml=snapshot.nvml,
                        gpus=snapshot.gpus,
                        host=snapshot.host,
                        sample_seconds=snapshot.sample_seconds,
                        errors=(*snapshot.errors, f"alert processing failed: {exc}"),
                    ),
                    round_number=self.rounds,
                )
            self._target.post_message(SnapshotReady(frame))
            elapsed = self._clock() - started
            self._wake.wait(max(0.0, self._interval - elapsed))
            self._wake.clear()


def replay_of(sampler: Sampler | None) -> ReplaySampler | None:
    """The recording behind ``sampler`` (``--replay``, also under ``--gpus``), or None."""
    if isinstance(sampler, SubsetSampler):
        sampler = sampler.inner
    return sampler if isinstance(sampler, ReplaySampler) else None


def alerting_frame_builder(
    sampler: Sampler | None,
    *,
    interval: float,
    alert_threshold: float,
    blind_after_s: float | None,
    alert_forecast_s: float | None,
    alert_log: Path | Literal[False] | None,
    on_alert: str | None,
    webhooks: Sequence[str] = (),
) -> tuple[AlertingFrameBuilder, AlertActions]:
    """What turns each snapshot into a frame (alert rule, history, the replay's own history), and
    the actions it takes on an alert (the log, the ``--on-alert`` command), for :func:`make_app`."""
    if interval <= 0:
        raise ValueError("interval must be greater than zero")
    # Raises ValueError for a threshold outside (0, 1].
    blind_after = blind_after_for(interval) if blind_after_s is None else blind_after_s
    rule = AlertRule(
        threshold=alert_threshold, blind_after_s=blind_after, forecast_s=alert_forecast_s
    )
    actions = AlertActions(
        AlertLog(alert_log) if alert_log is not False else None,
        AlertCommand(on_alert) if on_alert else None,
        WebhookSender(webhooks) if webhooks else None,
    )
    # Ten minutes of history at the interval, and never fewer points than a sparkline can show.
    window_s = max(DEFAULT_WINDOW_S, FRAME_HISTORY_POINTS * interval)
    history = History(interval_s=interval, window_s=window_s)
    replay = replay_of(sampler)
    # A replay's sparklines are the recording up to the snapshot shown, not the frames viewed.
    feed = (
        None
        if replay is None
        else replay.history_feed(sampler.select if isinstance(sampler, SubsetSampler) else None)
    )
    builder = AlertingFrameBuilder(rule, history=history, actions=actions, history_feed=feed)
    return builder, actions
