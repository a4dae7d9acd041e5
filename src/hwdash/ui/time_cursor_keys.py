"""The dashboard's keys for the monitor's time cursor (:mod:`hwdash.ui.time_cursor`): ``[`` / ``]``
one recorded point back / forward, ``{`` / ``}`` ten minutes, ``end`` (the process table's key)
back to live. :class:`TimeCursorKeys` is a mixin of :class:`hwdash.ui.app.HwdashApp`: the app
keeps the cursor (``time_cursor``), the newest live frame (``_live_frame``) and the monitor pane.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from textual.binding import Binding

from hwdash.ui.time_cursor import JUMP_S, TimeCursor

if TYPE_CHECKING:
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


class TimeCursorKeys:
    """The time cursor's actions, for the app that mixes this in."""

    time_cursor: TimeCursor
    _live_frame: MonitorFrame | None
    monitor: MonitorPane

    if TYPE_CHECKING:

        def notify(self, message: str, **kwargs: Any) -> None: ...

    def action_time_step(self, by: int) -> None:
        """``[`` / ``]``: one point of the history ring back / forward (past the newest: live)."""
        self._move_time_cursor(self.time_cursor.step(by), by)

    def action_time_jump(self, direction: int) -> None:
        """``{`` / ``}``: ten minutes of the history back / forward."""
        self._move_time_cursor(self.time_cursor.jump(direction * JUMP_S), direction)

    def _move_time_cursor(self, moved: bool, direction: int) -> None:
        if not moved:
            if direction < 0:
                where = self.time_cursor.directory
                self.notify(
                    "no history of this box to look back in"
                    + ("" if where is None else f" (nothing recorded in {where} yet)"),
                    severity="warning",
                    markup=False,
                )
            return
        self._show_time_cursor()

    def _show_time_cursor(self) -> None:
        frame = self.time_cursor.frame()
        self.monitor.set_source_note(self.time_cursor.note())
        if frame is None:
            frame = self._live_frame
        if frame is not None:
            self.monitor.show_frame(frame)
