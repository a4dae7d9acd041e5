"""A training run's progress as the probe counts it: steps, tokens, and a robust tokens per second.

The training loop calls :meth:`Progress.step` once per optimizer step (through
:func:`hwdash.probe.step`); the probe's publishing thread calls :meth:`Progress.snapshot` once a
round. A step costs one monotonic clock read, a few integer additions and one append to a bounded
deque, under a lock that only the publishing thread shares (for the few microseconds it takes to
copy the numbers once a second).

**Tokens per second** (``tokens_per_s``) is measured over the *window*: the steps that ended in the
:data:`WINDOW_S` (60) seconds up to the latest step, and never fewer than the last
:data:`MIN_WINDOW_STEPS` steps (so a run whose steps take minutes still has a rate). A step's
duration is the time since the step before it. Steps longer than :data:`SLOW_STEP_FACTOR` (5) times
the window's median step duration are left out (a checkpoint save or an evaluation between two
steps is not training speed). ``tokens_per_s`` is the tokens of the remaining steps divided by the
sum of their durations; ``step_time_s`` is the window's median step duration (slow steps included:
the median ignores them anyway). Both are None until two steps have been seen (one duration), and
``tokens_per_s`` stays None while no step gave its tokens. The window is anchored at the latest
step, not at the clock: a run that is between steps (a long evaluation) keeps its last rate.

The deque holds at most :data:`MAX_WINDOW_STEPS` steps: above ~68 steps a second the window covers
less than a minute, which changes nothing for a steady rate.
"""

from __future__ import annotations

import dataclasses
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

WINDOW_S = 60.0
"""Seconds of recent steps that ``tokens_per_s`` is measured over."""
MIN_WINDOW_STEPS = 3
"""The window holds at least this many of the latest steps, however long they took."""
SLOW_STEP_FACTOR = 5.0
"""A step longer than this many times the window's median is left out of ``tokens_per_s``."""
MAX_WINDOW_STEPS = 4096
"""Bound of the recent-steps deque (memory stays flat over a run of millions of steps)."""


@dataclass(frozen=True)
class ProgressSnapshot:
    """The counters at one moment, and the window's rate (see the module docstring)."""

    steps: int
    """Steps counted (calls to :meth:`Progress.step`)."""
    tokens: int | None
    samples: int | None
    sequences: int | None
    tokens_estimated: bool
    first_step_at: float | None
    """Monotonic time of the first step."""
    last_step_at: float | None
    tokens_after_first: int
    """Tokens of every step after the first (what the stepping time produced)."""
    tokens_per_s: float | None
    step_time_s: float | None


class Progress:
    """Step counters and the recent-steps window (thread-safe; cheap on the stepping side)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._steps = 0
        self._tokens: int | None = None
        self._samples: int | None = None
        self._sequences: int | None = None
        self._estimated = False
        self._first: float | None = None
        self._last: float | None = None
        self._tokens_after_first = 0
        self._window: deque[tuple[float, float, int]] = deque(maxlen=MAX_WINDOW_STEPS)
        """(time the step ended, its duration, its tokens) for steps after the first."""

    def step(
        self,
        tokens: int | None = None,
        samples: int | None = None,
        sequences: int | None = None,
        estimated: bool = False,
    ) -> None:
        """Count one optimizer step (see :func:`hwdash.probe.step`)."""
        now = self._clock()
        with self._lock:
            self._steps += 1
            if tokens is not None:
                self._tokens = (self._tokens or 0) + int(tokens)
                self._estimated = self._estimated or bool(estimated)
            if samples is not None:
                self._samples = (self._samples or 0) + int(samples)
            if sequences is not None:
                self._sequences = (self._sequences or 0) + int(sequences)
            last = self._last
            if last is None:
                self._first = now
            else:
                count = int(tokens or 0)
                self._tokens_after_first += count
                self._window.append((now, now - last, count))
            self._last = now

    def snapshot(self) -> ProgressSnapshot:
        """The counters now and the window's rate."""
        with self._lock:
            window = list(self._window)
            snapshot = ProgressSnapshot(
                steps=self._steps,
                tokens=self._tokens,
                samples=self._samples,
                sequences=self._sequences,
                tokens_estimated=self._estimated,
                first_step_at=self._first,
                last_step_at=self._last,
                tokens_after_first=self._tokens_after_first,
                tokens_per_s=None,
                step_time_s=None,
            )
        rate, median = window_rate(window)
        if snapshot.tokens is None:
            rate = None
        return dataclasses.replace(snapshot, tokens_per_s=rate, step_time_s=median)


def window_rate(steps: list[tuple[float, float, int]]) -> tuple[float | None, float | None]:
    """``(tokens_per_s, step_time_s)`` of ``(ended, duration, tokens)`` steps, oldest first,
    by the rule in the module docstring; ``(None, None)`` for no steps."""
    if not steps:
        return None, None
    latest = steps[-1][0]
    recent = [item for item in steps if item[0] > latest - WINDOW_S]
    if len(recent) < MIN_WINDOW_STEPS:
        recent = steps[-MIN_WINDOW_STEPS:]
    median = statistics.median(duration for _ended, duration, _tokens in recent)
    kept = [item for item in recent if item[1] <= SLOW_STEP_FACTOR * median]
    seconds = sum(duration for _ended, duration, _tokens in kept)
    if seconds <= 0:
        return None, median
    return sum(tokens for _ended, _duration, tokens in kept) / seconds, median
