"""A training run's progress as the probe counts it: steps, tokens, and a robust tokens per second.

The training loop calls :meth:`Progress.step` once per optimizer step (through
:func:`hwdash.probe.step`); the probe's publishing thread calls :meth:`Progress.snapshot` once a
round. A step costs one monotonic clock read and one append to a deque (atomic under the GIL: no
lock on the training side); the publishing thread counts the steps it finds there once a round.

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

import bisect
import dataclasses
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

WINDOW_S = 60.0
"""Seconds of recent steps that ``tokens_per_s`` is measured over."""
MIN_WINDOW_STEPS = 3
"""The window holds at least this many of the latest steps, however long they took."""
SLOW_STEP_FACTOR = 5.0
"""A step longer than this many times the window's median is left out of ``tokens_per_s``."""
MAX_PENDING_STEPS = 10_000
"""Steps waiting to be counted above which :meth:`Progress.step` counts them itself (a probe whose
thread does not run, or is stuck, keeps flat memory)."""
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
        # The window, as three parallel deques (sums and sorts in C): when each step after the
        # first ended, its duration, its tokens.
        self._ends: deque[float] = deque(maxlen=MAX_WINDOW_STEPS)
        self._durations: deque[float] = deque(maxlen=MAX_WINDOW_STEPS)
        self._counts: deque[int] = deque(maxlen=MAX_WINDOW_STEPS)
        # Steps recorded by the training loop and not yet counted: (time, tokens, samples,
        # sequences, estimated); the publishing thread drains it once a round.
        self._pending: deque[tuple[float, int | None, int | None, int | None, bool]] = deque()

    def step(
        self,
        tokens: int | None = None,
        samples: int | None = None,
        sequences: int | None = None,
        estimated: bool = False,
    ) -> None:
        """Count one optimizer step (see :func:`hwdash.probe.step`): one clock read and one append
        (atomic under the GIL, no lock); the publishing thread does the counting (:meth:`_drain`)."""
        pending = self._pending
        pending.append((self._clock(), tokens, samples, sequences, estimated))
        if len(pending) > MAX_PENDING_STEPS:  # nobody drains (no thread): count them here
            self._drain()

    def _drain(self) -> None:
        """Count the steps recorded since the last drain, oldest first."""
        pending = self._pending
        with self._lock:
            while pending:
                try:
                    entry = pending.popleft()
                except IndexError:  # another thread drained the last one
                    break
                self._count(*entry)

    def _count(
        self,
        now: float,
        tokens: int | None,
        samples: int | None,
        sequences: int | None,
        estimated: bool,
    ) -> None:
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
            ends = self._ends
            ends.append(now)
            self._durations.append(now - last)
            self._counts.append(count)
            cutoff = now - WINDOW_S  # keep the window's minute (and its last few steps)
            while len(ends) > MIN_WINDOW_STEPS and ends[0] <= cutoff:
                ends.popleft()
                self._durations.popleft()
                self._counts.popleft()
        self._last = now

    def snapshot(self) -> ProgressSnapshot:
        """The counters now and the window's rate."""
        self._drain()
        with self._lock:
            window = (list(self._ends), list(self._durations), list(self._counts))
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
        rate, median = window_rate(*window)
        if snapshot.tokens is None:
            rate = None
        return dataclasses.replace(snapshot, tokens_per_s=rate, step_time_s=median)


def window_rate(
    ends: Sequence[float], durations: Sequence[float], tokens: Sequence[int]
) -> tuple[float | None, float | None]:
    """``(tokens_per_s, step_time_s)`` of steps given as three parallel sequences, oldest first
    (when each ended, its duration, its tokens), by the rule in the module docstring;
    ``(None, None)`` for no steps. The sort and the sums run in C (a steady window of 1200 steps
    costs about 20 microseconds, once a second)."""
    if not ends:
        return None, None
    cutoff = ends[-1] - WINDOW_S
    if ends[0] <= cutoff:  # steps older than the window (Progress trims them as it goes)
        first = next(index for index, ended in enumerate(ends) if ended > cutoff)
        first = min(first, max(0, len(ends) - MIN_WINDOW_STEPS))
        durations, tokens = list(durations)[first:], list(tokens)[first:]
    ordered = sorted(durations)
    middle = len(ordered) // 2
    median = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
    limit = SLOW_STEP_FACTOR * median
    if ordered[-1] <= limit:  # no slow step: everything counts
        seconds, total = sum(durations), sum(tokens)
    else:  # leave the slow steps out (still in C: compress by a map of comparisons)
        seconds = sum(ordered[: bisect.bisect_right(ordered, limit)])
        total = sum(itertools.compress(tokens, map(limit.__ge__, durations)))
    if seconds <= 0:
        return None, median
    return total / seconds, median
