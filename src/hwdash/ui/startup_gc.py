"""The garbage collector held off while the dashboard starts, and the start-up objects frozen after.

Starting the dashboard creates a few hundred thousand long-lived objects (Textual's classes, CSS rules,
the widget tree); the cyclic collector traverses them again and again while they are created, which
measured about a tenth of the time to the first monitor frame (``bench/ui_bench.py``). The collector
is paused from the start of ``hwdash`` until the first frame is on screen (opened on the planner:
until the other panes are built too); then one collection frees what start-up left over, and
``gc.freeze()`` moves the survivors to the permanent generation, so later collections of a
long-running monitor skip them (the use the Python documentation of :func:`gc.freeze` gives for
long-lived start-up state).
"""

from __future__ import annotations

import gc

_paused = False


def pause() -> None:
    """Hold the cyclic collector off (once, by the command that starts the dashboard)."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def resume() -> None:
    """Collect, freeze what survives and turn the collector back on; nothing if :func:`pause` did
    not pause it (tests, where freezing would keep every finished app alive)."""
    global _paused
    if not _paused:
        return
    _paused = False
    gc.collect()
    gc.freeze()
    gc.enable()


def cancel() -> None:
    """Turn the collector back on without freezing anything (start-up ended early: an error, a
    flag that only prints); nothing if it is not paused."""
    global _paused
    if _paused:
        _paused = False
        gc.enable()
