"""OOM forecast: seconds until one GPU's memory is full at its current climb.

Pure and standard library only. The input is the recent history of one GPU (or one MIG instance) as
``(timestamp_s, used_bytes, total_bytes)`` points; :func:`forecast_full` measures how fast memory is
climbing *now* and divides the memory still free by it.

**What "the current climb" means** (issue 22). A slope fitted over the whole window (two minutes,
one in the monitor) is the average climb of that window: when memory climbed fast and then slowed
(a model loaded, then its first steps filled the allocator's cache), the window's slope still says
"fast" for a minute, and a forecast from it counted down to an OOM that never came; when the climb
sped up it said "later" than the memory did. The monitor also used to count the forecast down
between fits, like a timer, and it jumped back up at the next fit. So:

* the slope is fitted over the *recent* part of the window only (its last quarter by default,
  15 s in the monitor's 60 s window; never fewer than 4 readings), and the forecast is the memory
  free at the latest reading over that slope: it follows a climb that speeds up or slows down
  within a quarter of the window, and counts down only because memory really rose;
* it goes blank when the climb slows: the recent slope is <= 0, or below :data:`SLOWDOWN_RATIO`
  (half) of the whole window's slope (the climb so far), or would raise memory by less than 1% of
  the total over a whole window (a crawl);
* a few recent readings are noisier than a window of them, so the recent rise must stand out of
  their noise by a margin that grows as they get fewer (:func:`_stands_out`, a standard error of
  the slope); where it does not, but the window's climb does and the recent slope is not below
  half of it, the window's slope is used (a steady climb under noise).

The price of following the recent part is a lag of about half of it after the slope changes (the
median below moves once half of the recent pairs lie after the change): the forecast is too soon
while it catches up after a slowdown, never later than the climb says, and blank within that
half-part once memory stops.

The slopes are the Theil–Sen estimator, the median of the slopes between pairs of points:

* H. Theil (1950), "A rank-invariant method of linear and polynomial regression analysis", Proc.
  Koninklijke Nederlandse Akademie van Wetenschappen 53, parts I–III (the median of pairwise slopes,
  and his abbreviated form that pairs point ``i`` with point ``i + n/2`` only);
* P. K. Sen (1968), "Estimates of the regression coefficient based on Kendall's tau", Journal of the
  American Statistical Association 63(324), 1379–1389 (ties in ``t`` skipped; breakdown point 29%).

A median ignores a minority of wild points (a spike when a checkpoint is written, a reading taken
mid-free), and only pairs far apart enter it, so the local slope of a training loop's saw-tooth
(memory that rises each step and falls back when the step ends) does not pass for the trend, as
long as the recent part holds a few steps (a step a minute long *is* the current climb).

No forecast (``None``) is the normal answer for a GPU whose memory is flat, falling, slowing down or
only noisy; the caller shows nothing rather than a countdown nobody should believe.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Forecast", "forecast_full"]

# Above this many points the pairwise slopes are subsampled (O(n) pairs instead of n(n-1)/2).
_ALL_PAIRS_MAX = 60
# Above _ALL_PAIRS_MAX points, at most this many index distances (strides) are used.
_MAX_STRIDES = 32
# The rise over the window must be at least this fraction of the total to count as a trend.
_MIN_RISE_FRACTION = 0.01
# The current climb is fitted over this fraction of the window (its most recent part).
_RECENT_FRACTION = 0.25
# The rise must be at least this many standard errors of the slope (see _stands_out).
_SIGNIFICANCE = 3.0
#: Below this fraction of the whole window's slope the current climb is "slowing down": no forecast.
SLOWDOWN_RATIO = 0.5
# The rise must be at least this many times the residual spread (MAD). With 1, pure Gaussian noise
# (no trend) still gave a forecast for 7% of 61-point windows and 19% of 25-point windows (300
# seeds each); with 2, 1% and 6%. Measured again with the recent part and _SIGNIFICANCE (issue 22,
# 300 seeds, noise of 2 GiB on 80 GiB): a forecast for 1.0% of 121-point / 120 s windows and 1.3%
# of 61-point / 60 s ones; a climb of 0.1 GiB/s under 1 GiB of noise found in 98% and 82%.
_NOISE_FACTOR = 2.0


@dataclass(frozen=True)
class Forecast:
    """A forecast that memory will be full.

    * ``seconds_to_full``: seconds from the last reading until memory reaches the total at the
      current climb (always > 0 and finite);
    * ``slope_bytes_per_s``: that climb, the Theil–Sen slope of used memory over the recent part
      of the window (or the whole window's, under noise; always > 0 and finite);
    * ``window_s``: the time span of the window's points (last minus first timestamp).
    """

    seconds_to_full: float
    slope_bytes_per_s: float
    window_s: float


def _median(values: Sequence[float]) -> float:
    """The median of a non-empty sequence (mean of the two middle values for an even count)."""
    ordered = sorted(values)
    n = len(ordered)
    mid = n // 2
    if n % 2:
        return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) / 2.0


def _pair_strides(n: int) -> list[int]:
    """Index distances of the pairs whose slopes enter the median.

    Only pairs at least ``n // 4`` points apart are used: far pairs carry the trend, while near pairs
    inside one step of a saw-tooth carry the saw's local slope (memory that rises through a training
    step and falls back at its end would otherwise read as a climb). This is Theil's (1950) idea of
    pairing distant points (his abbreviated method pairs ``i`` with ``i + n/2``), widened to many
    distances so that no single distance falls in step with the saw's period.

    Up to ``_ALL_PAIRS_MAX`` points every such distance is used (at most n²/2 pairs, n is small).
    Above it, ``_MAX_STRIDES`` distances spread evenly between ``n // 4`` and ``n - 1``: at most
    ``_MAX_STRIDES * n`` pairs, deterministic, so the fit stays O(n log n) (the sort of the slopes).
    """
    lo = max(1, n // 4)
    hi = n - 1
    if hi < lo:
        return []
    if n <= _ALL_PAIRS_MAX or hi - lo + 1 <= _MAX_STRIDES:
        return list(range(lo, hi + 1))
    step = (hi - lo) / (_MAX_STRIDES - 1)
    return sorted({lo + round(j * step) for j in range(_MAX_STRIDES)})


def _theil_sen_slope(ts: Sequence[float], ys: Sequence[float]) -> float | None:
    """Median of the slopes ``(y_j - y_i) / (t_j - t_i)`` over the pairs from :func:`_pair_strides`.

    ``ts`` must be sorted ascending. Pairs with equal timestamps are skipped (Sen 1968); ``None`` if
    no pair is left or a slope is not finite.
    """
    n = len(ts)
    slopes: list[float] = []
    for k in _pair_strides(n):
        for i in range(n - k):
            dt = ts[i + k] - ts[i]
            if dt > 0:
                slopes.append((ys[i + k] - ys[i]) / dt)
    if not slopes:
        return None
    slope = _median(slopes)
    return slope if math.isfinite(slope) else None


def _line(ts: Sequence[float], ys: Sequence[float]) -> tuple[float, float] | None:
    """The Theil–Sen slope and the residuals' median absolute deviation around its line (the
    intercept is ``median(y - slope * t)``), or None when there is no finite slope."""
    slope = _theil_sen_slope(ts, ys)
    if slope is None:
        return None
    pairs = list(zip(ts, ys, strict=True))
    intercept = _median([y - slope * t for t, y in pairs])
    spread = _median([abs(y - (intercept + slope * t)) for t, y in pairs])
    if not (math.isfinite(intercept) and math.isfinite(spread)):
        return None
    return slope, spread


def _stands_out(slope: float, spread: float, ts: Sequence[float]) -> bool:
    """Whether a line's rise over its points stands out of their noise: at least
    :data:`_NOISE_FACTOR` times the residuals' median absolute deviation, and at least
    :data:`_SIGNIFICANCE` standard errors of the slope.

    The standard error is the least-squares one for readings spread evenly over the span,
    ``sigma * sqrt(12 / n) / span`` (the variance of a uniform spread is ``span**2 / 12``), over the
    square root of Theil–Sen's asymptotic efficiency under normal noise, 3/pi (Sen 1968, section 5);
    ``sigma`` is the MAD over 0.6745, its value for normal noise (Hampel 1974, "The influence curve
    and its role in robust estimation", JASA 69(346)). A few recent readings need a clearer rise
    than a whole window of them."""
    n = len(ts)
    span = ts[-1] - ts[0]
    if n < 2 or span <= 0:
        return False
    rise = slope * span
    sigma = spread / 0.6745
    standard_error = sigma * math.sqrt(12 / n) / math.sqrt(3 / math.pi)
    return rise >= _NOISE_FACTOR * spread and rise >= _SIGNIFICANCE * standard_error


def _clean(
    points: Sequence[tuple[float, int, int]],
) -> list[tuple[float, float, float]]:
    """Points as floats, sorted by time; drops points with a ``None``, non-finite or negative value
    or a total of zero (a reading that cannot be part of a memory trend)."""
    cleaned: list[tuple[float, float, float]] = []
    for point in points:
        try:
            t_raw, used_raw, total_raw = point
            if t_raw is None or used_raw is None or total_raw is None:
                continue
            t, used, total = float(t_raw), float(used_raw), float(total_raw)
        except (TypeError, ValueError, OverflowError):
            continue
        if not (math.isfinite(t) and math.isfinite(used) and math.isfinite(total)):
            continue
        if used < 0 or total <= 0:
            continue
        cleaned.append((t, used, total))
    cleaned.sort(key=lambda p: p[0])  # stable: among equal timestamps the later reading stays last
    return cleaned


def forecast_full(
    points: Sequence[tuple[float, int, int]],
    *,
    window_s: float = 120.0,
    recent_s: float | None = None,
    min_points: int = 8,
    now: float | None = None,
) -> Forecast | None:
    """Seconds until the GPU is full at its current climb, or ``None`` when there is no clear climb.

    Rules, in order:

    1. **Window.** Only points with a timestamp in ``[end - window_s, end]`` are used, where ``end``
       is ``now`` if given, else the latest timestamp (points after ``now`` are ignored). Points with
       a ``None``, non-finite or negative value, or a total of 0, are dropped first. At least
       ``min_points`` points (and at least 2) must remain and span at least ``window_s / 4`` seconds,
       else ``None``: a few readings over a couple of seconds are no trend.
    2. **Current slope.** Theil–Sen (Theil 1950, Sen 1968) over the *recent* part of the window,
       the last ``recent_s`` seconds (default ``window_s / 4``), extended back to at least
       ``max(4, min_points // 2)`` readings: the median of the slopes between pairs of points at
       least ``n // 4`` points apart; every such pair up to 60 points, above that the pairs at 32
       distances spread evenly (O(n) pairs, O(n log n) time). The whole window's Theil–Sen slope
       is the climb so far.
    3. **Stopped or slowing.** ``None`` when the current slope is <= 0, or the climb so far is
       positive and the current slope is below :data:`SLOWDOWN_RATIO` of it.
    4. **Noise.** The residual spread is the median absolute deviation (MAD) of the residuals
       around the line (intercept ``median(y - slope * t)``); a rise stands out when it is at
       least twice that spread and three standard errors of the slope (:func:`_stands_out`). If
       the recent rise does not stand out, the climb so far is used when it does (the recent
       slope is not below half of it: a steady climb under noise); else ``None``.
    5. **Slow.** ``None`` when the slope would raise memory by less than 1% of the total over a
       whole window (``slope * window_s``).
    6. **Time to full.** ``(total - used) / slope`` at the latest reading (``total`` its total):
       the memory free now over the current climb. The count starts at the latest reading (not at
       ``now``).
    7. **Already full.** A GPU with no free memory left (``used >= total``) gives ``None``: the
       memory-pressure alert covers it, and a countdown of zero adds nothing.

    Never raises on odd input (empty, all timestamps equal, total 0, NaN, huge numbers): ``None``.
    """
    try:
        return _forecast(
            points, window_s=window_s, recent_s=recent_s, min_points=min_points, now=now
        )
    except (ArithmeticError, ValueError, TypeError):  # pragma: no cover - a last safety net
        return None


def _forecast(
    points: Sequence[tuple[float, int, int]],
    *,
    window_s: float,
    recent_s: float | None,
    min_points: int,
    now: float | None,
) -> Forecast | None:
    """:func:`forecast_full` without the safety net."""
    window = _window(points, window_s=window_s, recent_s=recent_s, min_points=min_points, now=now)
    if window is None:
        return None
    used_points, end, recent_s = window
    t_last, used_last, total = used_points[-1]
    span = t_last - used_points[0][0]
    if not math.isfinite(span) or span <= 0 or span < window_s / 4:
        return None

    # Times relative to the latest reading: the fitted line's value there is its intercept, and
    # large Unix timestamps lose no precision in the products below.
    ts = [p[0] - t_last for p in used_points]
    ys = [p[1] for p in used_points]
    slope = _climb_slope(ts, ys, cut=(end - t_last) - recent_s, min_points=min_points)
    if slope is None:
        return None
    if not math.isfinite(slope * window_s) or slope * window_s < _MIN_RISE_FRACTION * total:
        return None

    level = used_last
    free = total - level
    if free <= 0:
        return None
    seconds = free / slope
    if not math.isfinite(seconds) or seconds <= 0:
        return None
    return Forecast(seconds_to_full=seconds, slope_bytes_per_s=slope, window_s=span)


def _window(
    points: Sequence[tuple[float, int, int]],
    *,
    window_s: float,
    recent_s: float | None,
    min_points: int,
    now: float | None,
) -> tuple[list[tuple[float, float, float]], float, float] | None:
    """(the clean readings of the window, its end, the recent span), or None when the window, the
    recent span or ``now`` is not a usable number or the window holds too few readings."""
    if not math.isfinite(window_s) or window_s <= 0:
        return None
    if recent_s is None:
        recent_s = window_s * _RECENT_FRACTION
    if not math.isfinite(recent_s) or recent_s <= 0:
        return None
    recent_s = min(recent_s, window_s)
    if now is not None and not math.isfinite(now):
        return None
    cleaned = _clean(points)
    if not cleaned:
        return None
    end = cleaned[-1][0] if now is None else now
    used_points = [p for p in cleaned if end - window_s <= p[0] <= end]
    if len(used_points) < max(2, min_points):
        return None
    return used_points, end, recent_s


def _climb_slope(
    ts: Sequence[float], ys: Sequence[float], *, cut: float, min_points: int
) -> float | None:
    """The slope to forecast with (rules 2 to 4), or None when the climb has stopped, slows down
    or does not stand out of the noise. ``cut``: where the recent readings begin."""
    # The current climb (rule 2): the last recent_s seconds, never fewer than a few readings.
    fewest = max(4, min_points // 2)
    first = next(i for i, t in enumerate(ts) if t >= cut or i == len(ts) - 1)
    while first > 0 and (len(ts) - first < fewest or ts[first] == 0):
        first -= 1
    current = _line(ts[first:], ys[first:])
    whole = _line(ts, ys)
    if current is None or whole is None:
        return None
    slope = current[0]
    climb_so_far = whole[0]
    if slope <= 0:
        return None  # rule 3: the climb has stopped (or never began)
    if climb_so_far > 0 and slope < SLOWDOWN_RATIO * climb_so_far:
        return None  # rule 3: slowing down
    if not _stands_out(*current, ts[first:]):
        # Rule 4: the recent readings are too noisy to tell their slope from the window's (and it
        # is not slower than half of it): the window's climb, if it stands out of the noise.
        if climb_so_far <= 0 or not _stands_out(*whole, ts):
            return None
        slope = climb_so_far
    return slope
