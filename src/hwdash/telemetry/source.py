"""Where snapshots come from: the real NVML, or a fake NVML scenario (``--fake-nvml``/``HWDASH_FAKE_NVML``).

Every hwdash command that shows live GPUs builds its sampler here, so the fake works everywhere.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from hwdash.telemetry.host_sampler import HostSampler, PsutilProcessTable, in_host_pid_namespace
from hwdash.telemetry.nvml_sampler import NvmlSampler
from hwdash.telemetry.probes import ProbeDirectory, ProbeJoiner
from hwdash.telemetry.system_sampler import SystemSampler

if TYPE_CHECKING:
    from hwdash.telemetry.fake_nvml import FakeNvml, Scenario

FAKE_NVML_ENV = "HWDASH_FAKE_NVML"
DEMO_SCENARIO = "a100x4-training"
"""The scenario ``--demo`` runs (its memory climbs past 90% within about a minute)."""


class _MissingBindings:
    """Stands in for pynvml when nvidia-ml-py is not installed: init fails like a missing library."""

    def nvmlInit(self) -> None:
        raise OSError("nvidia-ml-py (module pynvml) is not installed")


def _real_pynvml() -> Any:
    try:
        import pynvml
    except ImportError:
        return _MissingBindings()
    return pynvml


def bindings_version() -> str | None:
    """The installed nvidia-ml-py version (the process-row check refuses known-bad ones)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("nvidia-ml-py")
    except PackageNotFoundError:
        return None


def fake_scenario_from(
    fake_nvml: str | None, environ: Mapping[str, str] | None = None
) -> str | None:
    """The scenario asked for: the ``--fake-nvml`` value, else ``HWDASH_FAKE_NVML``, else None."""
    if fake_nvml:
        return fake_nvml
    value = (os.environ if environ is None else environ).get(FAKE_NVML_ENV, "").strip()
    return value or None


def make_sampler(
    fake_nvml: str | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    clock: Callable[[], float] | None = None,
    round_timeout_s: float = 2.0,
    loaded: Scenario | None = None,
    wall_clock: Callable[[], float] | None = None,
) -> SystemSampler:
    """Build the GPU+host sampler.

    ``fake_nvml`` is a scenario path or a packaged scenario name (``a100x4-training``, ``h100x8``...);
    when None, ``HWDASH_FAKE_NVML`` is consulted; when neither is set, the real ``pynvml`` is used.
    ``loaded`` is that scenario already read (the dashboard checks it before the screen opens).
    ``wall_clock`` stamps the snapshots (tests script hours of them: scenario time from an epoch);
    by default ``time.time``.
    A missing or broken scenario raises :class:`hwdash.telemetry.fake_nvml.ScenarioError` (a
    ``UsageError``). ``clock`` gives scenario time (tests); by default it is real time.
    """
    scenario = fake_scenario_from(fake_nvml, environ)
    fake: FakeNvml | None = None
    version: str | None = None
    if scenario is not None:
        # The fake (and the pydantic models of its scenarios) loads only when asked for: a real
        # training box starts without them.
        from hwdash.telemetry.fake_nvml import make_fake_pynvml

        fake = make_fake_pynvml(scenario if loaded is None else loaded, clock)
        nvml: Any = fake.module
        host = HostSampler(fake.process_table(fallback=PsutilProcessTable()))
        host_namespace = not fake.scenario.monitor_in_container
        probes = ProbeJoiner(fake.probe_source())
    else:
        nvml = _real_pynvml()
        version = bindings_version()
        host = HostSampler()
        host_namespace = in_host_pid_namespace()
        probes = ProbeJoiner(ProbeDirectory())
    gpu_sampler = NvmlSampler(
        nvml,
        round_timeout_s=round_timeout_s,
        bindings_version=version,
        **({} if wall_clock is None else {"wall_clock": wall_clock}),
    )
    return SystemSampler(gpu_sampler, host, fake, host_pid_namespace=host_namespace, probes=probes)
