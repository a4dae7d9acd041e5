"""The dashboard's keys for the monitor's time cursor (:mod:`hwdash.ui.time_cursor`): ``[`` / ``]``
one recorded point back / forward, ``{`` / ``}`` ten minutes, ``end`` (the process table's key)
back to live. :class:`TimeCursorKeys` is a mixin of :class:`hwdash.ui.app.HwdashApp`: the app
keeps the cursor (``time_cursor``), the newest live frame (``_live_frame``) and the monitor pane.

Leaving live reads the history directory (up to the ring's size cap, 200 MiB by default: a second
and more), so it is read in a worker thread, never on the UI thread: the monitor says "Reading
history" and keeps showing live frames meanwhile; the moves pressed while it reads wait for it and
are made, in order, once the points are handed over on the UI thread. ``end`` while it reads, or a
read that fails, drops it: a read whose number is not the newest is ignored when it ends.
"""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING, Any

from textual.binding import Binding

from hwdash.ui.time_cursor import JUMP_S, TimeCursor

if TYPE_CHECKING:
    from pathlib import Path

    from textual.worker import Worker

    from hwdash.telemetry.history_ring import HistoryRead
    from hwdash.ui.monitor_pane import MonitorPane
    from hwdash.ui.sampling import MonitorFrame

TIME_CURSOR_BINDINGS = [
    Binding("left_square_bracket", "time_step(-1)", "History back", show=False, key_display="["),
    Binding("right_square_bracket", "time_step(1)", "History forward", show=False, key_display="]"),
    Binding(
        "left_curly_bracket", "time_jump(-1)", "History 10 min back", show=False, key_display="{"
    ),
    Binding(
        "right_curly_bracket",
        "time_jump(1)",
        "History 10 min forward",
        show=False,
        key_display="}",
    ),
]

_Move = tuple[str, int]
"""A move of the cursor: ("step", points) or ("jump", direction)."""


def _read_without_collecting(reader: Any, directory: Path) -> HistoryRead:
    """``reader(directory)`` with the cyclic garbage collector held off. An hour of 8 GPUs parses
    into a few million objects; while they pile up, the collector's full collections traverse all
    of them again and again, holding the GIL, so the UI thread froze just the same (measured with
    ``bench/history_cursor_bench.py``: full collections of 70-130 ms, the event loop's longest
    gaps). Parsed JSON holds no reference cycles, so nothing is left uncollected by the pause."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return reader(directory)  # type: ignore[no-any-return]
    finally:
        if enabled:
            gc.enable()


class TimeCursorKeys:
    """The time cursor's actions, for the app that mixes this in."""

    time_cursor: TimeCursor
    _live_frame: MonitorFrame | None
    monitor: MonitorPane
    _history_read_number = 0
    """Which read of the history directory is the newest (a read that ends with another number
    is stale and ignored)."""
    _waiting_moves: list[_Move] | None = None
    """The moves waiting for the read in flight; None while no read is in flight."""
    _history_errors_said: tuple[int, tuple[str, ...]] = (0, ())
    """The unreadable lines and segments last reported (each is said once, not on every read)."""

    if TYPE_CHECKING:

        def notify(self, message: str, **kwargs: Any) -> None: ...

        def run_worker(
            self,
            work: Any,
            name: str | None = "",
            group: str = "default",
            description: str = "",
            exit_on_error: bool = True,
            start: bool = True,
            exclusive: bool = False,
            thread: bool = False,
        ) -> Worker[Any]: ...

        def call_from_thread(self, callback: Any, *args: Any) -> Any: ...

    @property
    def reading_history(self) -> bool:
        """Whether the history directory is being read (the moves wait for it)."""
        return self._waiting_moves is not None

    def action_time_step(self, by: int) -> None:
        """``[`` / ``]``: one point of the history ring back / forward (past the newest: live)."""
        self._time_move(("step", by))

    def action_time_jump(self, direction: int) -> None:
        """``{`` / ``}``: ten minutes of the history back / forward."""
        self._time_move(("jump", direction))

    def time_cursor_to_live(self) -> bool:
        """``end``: back to live, dropping a read in flight; False when already live."""
        if self._waiting_moves is not None:
            self._drop_history_read()
            self.monitor.set_source_note("")
            return True
        if self.time_cursor.live:
            return False
        self.time_cursor.go_live()
        self._show_time_cursor()
        return True

    def _time_move(self, move: _Move) -> None:
        if self._waiting_moves is not None:  # a read in flight: this move is made after it
            self._waiting_moves.append(move)
            return
        cursor = self.time_cursor
        if cursor.live and move[1] < 0:  # leaving live: read the directory off the UI thread
            if not cursor.has_directory:
                self._say_no_history()
                return
            self._read_history(move)
            return
        self._move_time_cursor(self._make_move(move), move[1])

    def _make_move(self, move: _Move) -> bool:
        kind, amount = move
        if kind == "step":
            return self.time_cursor.step(amount)
        return self.time_cursor.jump(amount * JUMP_S)

    def _move_time_cursor(self, moved: bool, direction: int) -> None:
        if not moved:
            if direction < 0:
                self._say_no_history()
            return
        self._show_time_cursor()

    def _say_no_history(self) -> None:
        where = self.time_cursor.directory
        self.notify(
            "no history of this box to look back in"
            + ("" if where is None else f" (nothing recorded in {where} yet)"),
            severity="warning",
            markup=False,
        )

    def _show_time_cursor(self) -> None:
        frame = self.time_cursor.frame()
        self.monitor.set_source_note(self.time_cursor.note())
        if frame is None:
            frame = self._live_frame
        if frame is not None:
            self.monitor.show_frame(frame)

    # -- reading the history in a worker thread ---------------------------------------------------

    def _read_history(self, move: _Move) -> None:
        directory = self.time_cursor.directory
        assert directory is not None
        self._history_read_number += 1
        self._waiting_moves = [move]
        self.monitor.set_source_note(f"Reading history in {directory} ...")
        number, reader = self._history_read_number, self.time_cursor.reader
        self.run_worker(
            lambda: self._read_in_thread(number, reader, directory),
            name="history read",
            group="history",
            thread=True,
            exit_on_error=False,
        )

    def _read_in_thread(self, number: int, reader: Any, directory: Path) -> None:
        # Off the UI thread: the blocking read. Never raises into the worker: a failure is a
        # message on the UI thread.
        try:
            read, error = _read_without_collecting(reader, directory), None
        except Exception as exc:  # a reader's bug or an OS error: said, never a traceback
            read, error = None, f"{type(exc).__name__}: {exc}"
        self.call_from_thread(self._history_read, number, read, error)

    def _drop_history_read(self) -> None:
        self._history_read_number += 1  # the read in flight is stale when it ends
        self._waiting_moves = None

    def _history_read(self, number: int, read: HistoryRead | None, error: str | None) -> None:
        """On the UI thread: the read ended; make the moves that waited for it (a stale read,
        overtaken by ``end`` or a newer read, is ignored)."""
        if number != self._history_read_number or self._waiting_moves is None:
            return
        moves = self._waiting_moves
        self._waiting_moves = None
        cursor = self.time_cursor
        if read is None:
            self.monitor.set_source_note(cursor.note())
            self.notify(
                f"could not read the history in {cursor.directory}: {error}",
                severity="error",
                markup=False,
            )
            return
        self._say_read_errors(read)
        for kind, amount in moves:
            if cursor.live:
                if amount >= 0:
                    continue  # forward from live: nowhere to go
                cursor.give(read.points)  # back from live (again): the points just read
            if not self._make_move((kind, amount)):
                self.monitor.set_source_note(cursor.note())
                self._say_no_history()
                return
        self._show_time_cursor()

    def _say_read_errors(self, read: HistoryRead) -> None:
        # A line cut short at a segment's end (a kill) is skipped without a word, as every reader
        # of the ring does; lines that are not JSON and unreadable segments are damage: said.
        damaged = read.skipped - read.cut
        said = (damaged, tuple(read.errors))
        if said == self._history_errors_said or not (damaged or read.errors):
            self._history_errors_said = said
            return
        self._history_errors_said = said
        parts = [f"{damaged} unreadable line(s) skipped"] if damaged else []
        parts += [f"segment {error}" for error in read.errors]
        self.notify(
            f"history in {read.directory}: " + "; ".join(parts),
            severity="warning",
            markup=False,
        )
