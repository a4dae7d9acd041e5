"""A ``pynvml`` that serves a hwdash fake scenario to any program that imports ``pynvml``.

Put this folder first on ``PYTHONPATH`` (bench/ui_bench.py does) and set ``HWDASH_FAKE_NVML`` to a
packaged scenario name or a scenario file: nvitop, gpustat or any NVML client then sees exactly the
fake GPUs hwdash's own monitor sees, so the two can be measured side by side.

For a fair measurement give it a *compiled* scenario (``.json``, written by
``hwdash.telemetry.fake_scenario.compile_scenario``; bench/ui_bench.py writes one before its runs):
the fake then runs from plain data with the standard library (:mod:`hwdash.telemetry.scenario_data`)
and the client's process loads no pydantic, no scenario models, nothing of hwdash's planner, only
the fake itself (about 12 ms of imports where a real box loads libnvidia-ml). A TOML scenario
still works, but validating it loads pydantic into the client.

How: the real nvidia-ml-py module is loaded under another name for its constants, error classes
and ctypes structs; every ``nvml*`` function the fake implements is the fake's; every other one
raises NVML's NotSupported (what a driver says about a field it lacks), so nothing ever calls
into a real libnvidia-ml. Benchmark code only: not part of the hwdash package.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent


def _load_real_bindings() -> Any:
    """nvidia-ml-py's own pynvml.py, from the first sys.path entry that is not this folder."""
    for entry in sys.path:
        if not entry or Path(entry).resolve() == _HERE:
            continue
        candidate = Path(entry) / "pynvml.py"
        if candidate.is_file():
            loader = importlib.machinery.SourceFileLoader("_real_pynvml", str(candidate))
            spec = importlib.util.spec_from_loader("_real_pynvml", loader)
            assert spec is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules["_real_pynvml"] = module
            loader.exec_module(module)
            return module
    raise ImportError("nvidia-ml-py is not installed next to the pynvml shim")


_real = _load_real_bindings()
globals().update({name: value for name, value in vars(_real).items() if not name.startswith("__")})

# The fake imports `pynvml` for the real error classes: point that at the real bindings while it
# loads, then make this module the `pynvml` everyone else sees.
_shim = sys.modules[__name__]
sys.modules["pynvml"] = _real
try:
    from hwdash.telemetry.fake_nvml import make_fake_pynvml

    _fake = make_fake_pynvml(os.environ.get("HWDASH_FAKE_NVML", "a100x8-sawtooth"))
finally:
    sys.modules["pynvml"] = _shim

#: Helpers of the bindings that never touch the library.
_PURE = {"nvmlExceptionClass", "nvmlStructToFriendlyObject", "nvmlFriendlyObjectToStruct"}


def _not_supported(name: str) -> Any:
    def call(*_args: Any, **_kwargs: Any) -> Any:
        raise _real.NVMLError_NotSupported()

    call.__name__ = name
    return call


for _name, _value in list(vars(_real).items()):
    if _name.startswith("nvml") and callable(_value) and _name not in _PURE:
        globals()[_name] = _not_supported(_name)
for _name in dir(_fake.module):
    if _name.startswith("nvml"):
        globals()[_name] = getattr(_fake.module, _name)


def nvmlInitWithFlags(_flags: int) -> None:
    """Start the fake (flags are ignored)."""
    _fake.module.nvmlInit()


def nvmlInit() -> None:
    """Start the fake."""
    _fake.module.nvmlInit()


# No C library behind the shim: clients that look symbols up in it (nvitop patches a few calls
# with ctypes) must not find the lookup, and then fall back to the module's functions, the fake's.
globals().pop("_nvmlGetFunctionPointer", None)
