"""Build the real dashboard on a fake NVML scenario with a frozen clock and a fixed host.

Everything here is the production code path (``make_app``, the NVML sampler, the fake ``pynvml``,
the scenario process table) except the host readings: psutil reports this machine's CPU and RAM,
which change from run to run, so :class:`FixedHost` stands in for it with constant numbers.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from hwdash.core.catalog import Catalog, load_catalog
from hwdash.core.live.diagnoses import Diagnosis
from hwdash.core.plans.store import PlanStore
from hwdash.runs.watch import RunWatcher
from hwdash.telemetry.fake_nvml import ManualClock, make_fake_pynvml
from hwdash.telemetry.host_sampler import HostProcessInfo
from hwdash.telemetry.nvml_sampler import NvmlSampler
from hwdash.telemetry.probes import ProbeJoiner
from hwdash.telemetry.system_sampler import SystemSampler
from hwdash.telemetry.types import GpuSample, HostSample, NvmlStatus, Snapshot
from hwdash.ui.app import HwdashApp, TabName, make_app

GIB = 1024**3

#: An interval long enough that the sampling thread never wakes by itself during a test: tests
#: move the scenario clock and ask for each sample with ``request_sample``.
FROZEN_INTERVAL = 3600.0

_CATALOG: Catalog | None = None


def shared_catalog() -> Catalog:
    """The built-in catalog, loaded once per test session (it is immutable)."""
    global _CATALOG
    if _CATALOG is None:
        _CATALOG = load_catalog(include_user=False)
    return _CATALOG


class FixedHost:
    """A host that always reads the same (psutil's real numbers would change every run)."""

    def __init__(self, process_table: Any) -> None:
        self.process_table = process_table

    def sample(self) -> HostSample:
        return HostSample(
            cpu_percent=37.0,
            per_cpu_percent=(37.0,) * 8,
            load_average=(4.2, 3.9, 3.5),
            ram_total_bytes=512 * GIB,
            ram_used_bytes=96 * GIB,
            ram_available_bytes=416 * GIB,
            swap_total_bytes=8 * GIB,
            swap_used_bytes=0,
        )

    def processes(self, pids: set[int]) -> dict[int, HostProcessInfo]:
        return dict(self.process_table.lookup(pids))


#: Wall-clock second that scenario second 0 stands for when snapshots follow scenario time.
SCENARIO_EPOCH = 1_795_000_000.0


def fake_sampler(
    scenario: str, clock: ManualClock, *, scenario_time: bool = False
) -> SystemSampler:
    """The real NVML sampler on a fake scenario whose time is ``clock``. With ``scenario_time``
    the snapshots' timestamps follow the scenario too (so trends over time, the OOM forecast,
    see the scenario's seconds rather than the few real ones a test takes)."""
    fake = make_fake_pynvml(scenario, clock)
    host: Any = FixedHost(fake.process_table())
    wall_clock = (lambda: SCENARIO_EPOCH + clock()) if scenario_time else time.time
    system = SystemSampler(
        NvmlSampler(fake.module, round_timeout_s=2.0, wall_clock=wall_clock),
        host,
        fake,
        probes=ProbeJoiner(fake.probe_source()),
    )
    # As the dashboard command composes it: each probed run held against its plan.
    return RunWatcher(system, record=None)  # type: ignore[return-value]


def fake_app(
    scenario: str,
    *,
    data_dir: Path,
    start_s: float = 0.0,
    initial_tab: TabName = "monitor",
    interval: float = FROZEN_INTERVAL,
    scenario_time: bool = False,
    **options: Any,
) -> tuple[HwdashApp, ManualClock]:
    """The dashboard on ``scenario`` at scenario second ``start_s``; plans and alerts under ``data_dir``."""
    clock = ManualClock(start_s)
    options.setdefault("alert_log", data_dir / "alerts.jsonl")
    options.setdefault("bell", False)
    # Toasts time out in real time, which a loaded machine's slower replay would use up: frozen
    # (the scenario's clock decides everything else).
    options.setdefault("toast_seconds", FROZEN_INTERVAL)
    app = make_app(
        catalog=shared_catalog(),
        sampler=fake_sampler(scenario, clock, scenario_time=scenario_time),
        interval=interval,
        plan_store=PlanStore(data_dir / "plans.json"),
        initial_tab=initial_tab,
        **options,
    )
    return app, clock


async def wait_for_frames(pilot: Any, app: HwdashApp, count: int, timeout_s: float = 10.0) -> None:
    """Let the event loop run until ``app`` has shown ``count`` frames (short real waits only)."""
    deadline = time.monotonic() + timeout_s
    while app.frames_received < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"only {app.frames_received} of {count} frames arrived")
        await pilot.pause(0.01)
    await pilot.pause()


async def step(pilot: Any, app: HwdashApp, clock: ManualClock, seconds: float) -> None:
    """Move scenario time by ``seconds``, take one sample and wait until it is on screen."""
    clock.advance(seconds)
    wanted = app.frames_received + 1
    assert app.sampling is not None
    app.sampling.request_sample()
    await wait_for_frames(pilot, app, wanted)


async def replay(
    pilot: Any, app: HwdashApp, clock: ManualClock, *, until_s: float, step_s: float
) -> None:
    """Wait for the first frame, then step scenario time to ``until_s`` (history fills up)."""
    await wait_for_frames(pilot, app, 1)
    while clock() + step_s <= until_s + 1e-9:
        await step(pilot, app, clock, step_s)
    await wait_for_hidden_panes(pilot, app)


async def wait_for_hidden_panes(pilot: Any, app: HwdashApp, timeout_s: float = 10.0) -> None:
    """Build the other tabs' panes (as the first switch to one of them does: the dashboard opened on
    the monitor builds them only then) and wait until they are mounted and the planner has posted
    its first plan: a test that sets the monitor's plan line before then would see the planner's
    starting form clear it (it is not a plan the user chose), depending on the machine's speed."""
    app.mount_hidden_panes()
    deadline = time.monotonic() + timeout_s
    while not all(
        pane is not None and pane.is_mounted for pane in (app._planner, app._compare, app.monitor)
    ):
        if time.monotonic() > deadline:
            raise AssertionError("the hidden panes were not mounted")
        await pilot.pause(0.01)
    await pilot.pause()
    await pilot.pause()


#: What two remote hosts' exporters say of their GPUs (``hwdash_gpu_diagnosis_info``), in the
#: health rules' words: node-00's GPU 3 is power-capped; node-01's GPU 2 had an Xid and ECC errors.
CLUSTER_DIAGNOSES: dict[tuple[int, int], tuple[Diagnosis, ...]] = {
    (0, 3): (
        Diagnosis(
            "throttled",
            "clocks throttled 42% of the last 60 s (power cap 42%)",
            1_794_999_700.0,
            "the board is at its power limit: compare the draw with the limit "
            "(nvidia-smi -q -d POWER) and check that no one lowered the limit",
        ),
    ),
    (1, 2): (
        Diagnosis(
            "xid",
            "Xid 79: the GPU fell off the bus",
            1_794_999_900.0,
            "drain the node and check the GPU's seating, power and PCIe link",
        ),
        Diagnosis("ecc", "uncorrected ECC errors rose 0 -> 2", 1_794_999_910.0, "reset the GPU"),
    ),
}


class ClusterSampler:
    """Four hosts of eight GPUs as a Prometheus source gives them: node-02's GPU 5 is 95% full,
    node-03 stopped reporting, two GPUs carry their hosts' diagnoses (:data:`CLUSTER_DIAGNOSES`)."""

    def sample(self) -> Snapshot:
        gib = 1024**3
        gpus = []
        for host in range(4):
            for gpu in range(8):
                full = 95 if (host, gpu) == (2, 5) else (host * 13 + gpu * 7) % 55 + 30
                gpus.append(
                    GpuSample(
                        index=host * 8 + gpu,
                        name="NVIDIA H100 80GB HBM3",
                        uuid=None,
                        host=f"node-{host:02d}",
                        host_gpu=gpu,
                        total_bytes=80 * gib,
                        free_bytes=round(80 * gib * (1 - full / 100)),
                        reserved_bytes=gib // 2,
                        utilization_gpu=95.0,
                        temperature_c=61.0,
                        power_w=512.0,
                        errors=(("host", "stale: no data from node-03 for 42 s"),)
                        if host == 3
                        else (),
                        diagnoses=CLUSTER_DIAGNOSES.get((host, gpu), ()),
                    )
                )
        return Snapshot(
            timestamp=1_795_000_000.0,
            nvml=NvmlStatus(available=True, source="Prometheus http://prometheus:9090"),
            gpus=tuple(gpus),
        )

    def close(self) -> None:
        pass


def cluster_app() -> HwdashApp:
    """The dashboard on :class:`ClusterSampler` (no alert log, no bell, one frame an hour)."""
    return make_app(
        catalog=shared_catalog(),
        sampler=ClusterSampler(),
        interval=3600,
        initial_tab="monitor",
        alert_log=False,
        bell=False,
    )
