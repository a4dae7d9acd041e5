"""Depth by extrapolation: trace a deep stack at two small depths and draw the line to its depth.

Every component of a stack of identical layers grows by the same bytes per layer (checked to the
byte at full depth on five models in docs/accuracy.md, "Depth by extrapolation"). Pure.
"""

from __future__ import annotations

from hwdash.tracing.results import TracePhase

#: A stack is traced at two small depths and extrapolated when it is deeper than this many layer
#: periods (every component of a uniform stack grows by the same bytes per layer; checked to the
#: byte at full depth on five models in docs/accuracy.md, "Depth by extrapolation").
_EXTRAPOLATE_ABOVE_PERIODS = 4


def layer_period(layer_types: list[str] | None) -> int:
    """The shortest run of layer kinds that repeats through the stack (1 for uniform stacks)."""
    if not layer_types:
        return 1
    count = len(layer_types)
    for period in range(1, count + 1):
        if all(layer_types[i] == layer_types[i % period] for i in range(count)):
            return period
    return count


def trace_depths(layers: int, period: int) -> tuple[int, ...]:
    """The depths to trace: the full depth when it is short, else two small ones to extrapolate from.

    The small depths are 2 and 4 layers for a uniform stack, one and two periods otherwise (Gemma 3's
    five sliding layers and one global: 6 and 12), so both hold whole repeats of the pattern.
    """
    if layers <= _EXTRAPOLATE_ABOVE_PERIODS * period:
        return (layers,)
    low = period if period > 1 else 2
    return (low, 2 * low)


def extrapolate_phases(
    low: tuple[int, list[TracePhase]], high: tuple[int, list[TracePhase]], layers: int
) -> list[TracePhase]:
    """Every phase's peak and components on the line through two depths, at ``layers``."""
    low_layers, low_phases = low
    high_layers, high_phases = high
    if [(p.step, p.phase) for p in low_phases] != [(p.step, p.phase) for p in high_phases]:
        raise ValueError("the two depths did not run the same phases")

    def line(a: int, b: int) -> int:
        # Per-layer bytes are whole numbers: integer arithmetic keeps the result exact.
        return a + (b - a) * (layers - low_layers) // (high_layers - low_layers)

    return [
        TracePhase(
            step=a.step,
            phase=a.phase,
            total=line(a.total, b.total),
            components={
                name: line(a.components[name], b.components[name]) for name in a.components
            },
            end_total=line(a.end_total, b.end_total),
            end_components={
                name: line(a.end_components[name], b.end_components[name])
                for name in a.end_components
            },
        )
        for a, b in zip(low_phases, high_phases, strict=True)
    ]


def _line_int(a: int, b: int, low: int, high: int, layers: int) -> int:
    return a + (b - a) * (layers - low) // (high - low)
