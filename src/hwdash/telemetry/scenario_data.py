"""The fake NVML's scenarios as plain data: what the fake needs at run time, with the standard library only.

:mod:`hwdash.telemetry.fake_scenario` holds the pydantic models that *validate* a TOML scenario. The
fake itself needs less: the values, the series arithmetic (:func:`series_value`,
:func:`integrate_watts`) and a few behaviours of a GPU and a process (:class:`GpuBehaviour`,
:class:`ProcessBehaviour`, which the models inherit). This module has all of those and no pydantic,
so that a process that must stay light can run the fake without the models:

* ``bench/pynvml_shim`` serves the fake to nvitop, whose process must load nothing nvitop would not
  load on a real box;
* ``hwdash monitor`` draws its first frame without pydantic when its scenario is compiled.

A **compiled scenario** is a validated scenario dumped to JSON
(:func:`hwdash.telemetry.fake_scenario.compile_scenario`): every model becomes an object with its
class name under :data:`MODEL_KEY` and every field, defaults included. :func:`load_compiled_scenario`
turns it back into attribute objects, recursively and generically: a field added to a model flows
through without a change here. A model's *methods* the fake calls must live in a behaviour class
here (listed in :data:`BEHAVIOURS`), which the model inherits, so both forms have them.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hwdash.core.units import MIB
from hwdash.errors import UsageError

SCENARIO_DIR = Path(__file__).parent / "scenarios"
"""Where the packaged scenarios live (shipped in the wheel: hatchling includes files under src/hwdash)."""

MODEL_KEY = "__model__"
"""The key naming a compiled object's model class (``ScenarioGpu``...)."""

COMPILED_FORMAT = "hwdash-compiled-scenario/1"
"""The compiled file's ``format`` (the loader refuses other JSON)."""


class ScenarioError(UsageError):
    """A scenario file that is missing or broken. The message names the file and the field."""


class GpuBehaviour:
    """What the fake asks of a scenario GPU beyond its fields (inherited by ``ScenarioGpu``)."""

    if TYPE_CHECKING:
        mig: list[Any]
        mig_mode_current: bool | None
        clocks_event_reasons: list[Any]

    @property
    def mig_current(self) -> bool:
        """Whether MIG is on now."""
        return bool(self.mig) if self.mig_mode_current is None else self.mig_mode_current

    def mig_slots(self) -> dict[int, Any]:
        """The MIG instances by slot."""
        return {
            (mig.slot if mig.slot is not None else place): mig for place, mig in enumerate(self.mig)
        }

    def clocks_event_reasons_at(self, at_s: float) -> list[str]:
        """The reasons in force at scenario second ``at_s`` (the last point at or before it)."""
        current: list[str] = []
        for second, names in self.clocks_event_reasons:
            if second > at_s:
                break
            current = names
        return current


class ProcessBehaviour:
    """What the fake asks of a scenario process beyond its fields (inherited by ``ScenarioProcess``)."""

    if TYPE_CHECKING:
        start_s: float
        end_s: float | None

    def alive_at(self, now: float) -> bool:
        """Whether the process runs at scenario second ``now`` (from ``start_s``, before ``end_s``)."""
        return now >= self.start_s and (self.end_s is None or now < self.end_s)


BEHAVIOURS: dict[str, type] = {"ScenarioGpu": GpuBehaviour, "ScenarioProcess": ProcessBehaviour}
"""Model class name -> the behaviour its compiled objects get."""


class CompiledNode:
    """One model of a compiled scenario: its fields as attributes (read-only by convention)."""

    def __init__(self, fields: dict[str, Any]) -> None:
        self.__dict__.update(fields)

    def __repr__(self) -> str:
        shown = ", ".join(f"{key}={value!r}" for key, value in self.__dict__.items())
        return f"{type(self).__name__}({shown})"


_NODE_CLASSES: dict[str, type[CompiledNode]] = {}


def _node_class(model: str) -> type[CompiledNode]:
    cls = _NODE_CLASSES.get(model)
    if cls is None:
        behaviour = BEHAVIOURS.get(model)
        bases = (behaviour, CompiledNode) if behaviour is not None else (CompiledNode,)
        cls = _NODE_CLASSES[model] = type(model, bases, {})
    return cls


def from_compiled(data: Any) -> Any:
    """Plain JSON data back into attribute objects (a dict naming its model) and lists."""
    if isinstance(data, list):
        return [from_compiled(item) for item in data]
    if isinstance(data, dict):
        fields = {key: from_compiled(value) for key, value in data.items() if key != MODEL_KEY}
        model = data.get(MODEL_KEY)
        return _node_class(model)(fields) if isinstance(model, str) else fields
    return data


def is_compiled_path(name_or_path: str | Path) -> bool:
    """Whether a scenario reference names a compiled scenario (a ``.json`` file)."""
    return str(name_or_path).endswith(".json")


def load_compiled_scenario(path: str | Path) -> Any:
    """Read a compiled scenario (see the module docstring). Raises :class:`ScenarioError`
    naming the file when it is missing or not one. The result has the attributes of a
    :class:`hwdash.telemetry.fake_scenario.Scenario` (this module cannot name the models: they
    import it)."""
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ScenarioError(
            f"cannot read compiled fake NVML scenario {path}: {exc.strerror}"
        ) from exc
    except ValueError as exc:
        raise ScenarioError(f"{path}: not valid JSON: {exc}") from exc
    if not isinstance(raw, dict) or raw.get("format") != COMPILED_FORMAT:
        raise ScenarioError(
            f"{path}: not a compiled fake NVML scenario (format {COMPILED_FORMAT!r})"
        )
    return from_compiled(raw["scenario"])


def _noise(second: int) -> float:
    """A repeatable value in [-1, 1) for a whole scenario second (no global random state)."""
    return (math.sin(second * 12.9898) * 43758.5453) % 1.0 * 2 - 1


def _is_wave(series: Any) -> bool:
    """A wave (``Wave`` or its compiled object) rather than a number or a list of points."""
    return not isinstance(series, int | float | list)


def series_value(series: Any, at_s: float) -> float:
    """Value of a series at scenario second ``at_s`` (linear between points, ends held; waves
    add their swing and noise)."""
    if _is_wave(series):
        wave = series
        value = series_value(wave.base, at_s)
        if at_s >= wave.start_s:
            phase = ((at_s - wave.start_s) % wave.period_s) / wave.period_s
            if wave.shape == "saw":
                value += wave.amplitude * phase
            else:
                value += wave.amplitude * math.sin(2 * math.pi * phase)
        return float(value + wave.jitter * _noise(math.floor(at_s)))
    if not isinstance(series, list):
        return float(series)
    if at_s <= series[0][0]:
        return float(series[0][1])
    for (t0, v0), (t1, v1) in itertools.pairwise(series):
        if at_s <= t1:
            if t1 == t0:
                return float(v1)
            return float(v0 + (v1 - v0) * (at_s - t0) / (t1 - t0))
    return float(series[-1][1])


def _mib(value: float) -> int:
    """Scenario MiB as bytes."""
    return round(value * MIB)


_ENERGY_STEP_S = 0.5
"""The widest trapezoid when integrating power (waves are not straight between points)."""


def integrate_watts(series: Any, start_s: float, end_s: float) -> float:
    """Joules of a power series (watts) from ``start_s`` to ``end_s``: trapezoids through the
    series' own points and at most :data:`_ENERGY_STEP_S` apart (exact for straight pieces)."""
    marks = {start_s, end_s}
    if isinstance(series, list):
        marks.update(float(t) for t, _value in series if start_s < t < end_s)
    width = end_s - start_s
    pieces = max(1, math.ceil(width / _ENERGY_STEP_S)) if _is_wave(series) else 1
    marks.update(start_s + width * n / pieces for n in range(1, pieces))
    ordered = sorted(marks)
    return sum(
        (b - a) * (max(0.0, series_value(series, a)) + max(0.0, series_value(series, b))) / 2
        for a, b in itertools.pairwise(ordered)
    )
