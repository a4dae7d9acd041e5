"""Write screenshots/*.svg from the real dashboard running headless on fake GPU scenarios.

    .venv/bin/python scripts/export_screenshots.py [--out screenshots] [--only planner-serving.svg]

Every screenshot is the app that ``hwdash`` runs, built by the same ``make_app`` factory, on a packaged
fake NVML scenario whose clock the script steps (so the sparklines have a history and the numbers are
the same on every run). The host line reads fixed numbers instead of this machine's, for the same
reason. Nothing here is drawn by hand.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The fake-GPU app builder shared with the snapshot tests (real sampler, fake pynvml, fixed host).
sys.path.insert(0, str(ROOT / "tests" / "ui"))

from snapshot_apps.fake_dashboard import (  # noqa: E402
    cluster_app,
    fake_app,
    replay,
    shared_catalog,
    wait_for_frames,
)

from hwdash.core.plan import Engine, Method, Plan, Precision  # noqa: E402
from hwdash.core.planning.fit import evaluate_plan  # noqa: E402
from hwdash.core.plans.store import PlanStore, PlanSummary  # noqa: E402
from hwdash.telemetry.signals import SimulatedSignaller  # noqa: E402
from hwdash.ui.app import TabName  # noqa: E402
from hwdash.ui.widgets.planner_flavors import FlavorTable  # noqa: E402


@dataclass(frozen=True)
class Shot:
    """One screenshot: which scenario, how far into it, which tab, what size."""

    filename: str
    scenario: str
    until_s: float
    tab: TabName = "monitor"
    size: tuple[int, int] = (120, 36)
    step_s: float = 2.0
    saved_plans: bool = False
    plan: Plan | None = None
    """A plan loaded into the planner form before the keys."""
    flavor: str | None = None
    """A flavor row selected in the planner's table before the keys."""
    keys: tuple[str, ...] = ()
    """Keys pressed last (``f`` opens the make-it-fit options)."""
    scenario_time: bool = True
    """Snapshots stamped with scenario time (the OOM forecast needs the scenario's minutes, and
    wall-clock stamps would make a shot depend on how fast this machine replays)."""


SHOTS = (
    Shot("planner.svg", "a100x4-training", until_s=0, tab="planner"),
    Shot("compare.svg", "a100x4-training", until_s=0, tab="compare", saved_plans=True),
    Shot("monitor.svg", "a100x4-training", until_s=40),
    Shot("monitor-alert.svg", "a100x4-training", until_s=70),
    Shot("monitor-8gpu.svg", "h100x8", until_s=40, step_s=3),
    Shot("no-gpu.svg", "no-driver", until_s=0),
    Shot("monitor-80x24.svg", "a100x4-training", until_s=70, size=(80, 24)),
    Shot("planner-80x24.svg", "a100x4-training", until_s=70, tab="planner", size=(80, 24)),
    Shot(
        "planner-fit.svg",
        "a100x4-training",
        until_s=0,
        tab="planner",
        plan=Plan(model="qwen2.5-7b", method=Method.LORA, batch=4, seq=2048, examples=10_000),
        flavor="l4x1",
        keys=("f",),
    ),
    # Issue 30: a serving plan (vLLM, max len 8192) on the box's own H100s (the "local" flavor of
    # the fake 8 x H100 scenario): the engine's KV pool, blocks, tokens and maximum concurrency.
    Shot(
        "planner-serving.svg",
        "h100x8",
        until_s=6,
        tab="planner",
        plan=Plan(
            model="llama-3.1-8b",
            method=Method.INFERENCE,
            engine=Engine.VLLM,
            max_model_len=8192,
            flavors=("local",),
        ),
    ),
    Shot("monitor-mig.svg", "mig", until_s=60, step_s=5),
    # Ranks 0 and 1 run hwdash.probe: PyTorch allocated/reserved per process, rank 0's allocator
    # retrying (!), and the OOM forecast of memory that still creeps up.
    Shot("monitor-probe.svg", "a100x4-training", until_s=100, step_s=4),
    Shot(
        "monitor-process.svg",
        "a100x4-training",
        until_s=100,
        step_s=4,
        keys=("enter",),
    ),
    # Issue 28: per-process SM%, and the health rules explained in the GPU rows: a stray context
    # on GPU 0, a slow PCIe link, a throttled GPU, ECC errors, an input-bound loader.
    Shot("monitor-health.svg", "health", until_s=130, step_s=5, size=(140, 44)),
    # Rank 0's run against its plan (issue 26): speed, MFU, time to finish, cost, energy and the
    # planned vs measured peak, in the process detail on a taller terminal.
    Shot(
        "monitor-run.svg",
        "a100x4-training",
        until_s=120,
        step_s=4,
        size=(120, 44),
        keys=("enter",),
    ),
)

#: Plans saved before the compare screenshot (model, method and the settings that differ).
EXAMPLE_PLANS = (
    ("qwen2.5-7b LoRA", Plan(model="qwen2.5-7b", method=Method.LORA, examples=50_000, epochs=2)),
    (
        "qwen2.5-7b full, ZeRO-3 x8",
        Plan(
            model="qwen2.5-7b",
            method=Method.FULL,
            precision=Precision.MIXED,
            zero=3,
            gpus=8,
            grad_ckpt=True,
            examples=50_000,
            epochs=2,
        ),
    ),
    ("qwen2.5-7b QLoRA", Plan(model="qwen2.5-7b", method=Method.QLORA, examples=50_000, epochs=2)),
)


#: The "saved" time shown for the example plans (frozen, so the SVG is the same on every run).
FROZEN_SAVED_AT = "2026-11-02T09:30:00Z"


def save_example_plans(store: PlanStore) -> None:
    catalog = shared_catalog()
    for name, plan in EXAMPLE_PLANS:
        summary = PlanSummary.from_report(evaluate_plan(plan, catalog))
        store.save(name, plan, summary=summary)
    data = json.loads(store.path.read_text(encoding="utf-8"))
    for entry in data["plans"]:
        entry["saved_at"] = FROZEN_SAVED_AT
    store.path.write_text(json.dumps(data, indent=2), encoding="utf-8")
    assert [saved.name for saved in store.list()] == [name for name, _plan in EXAMPLE_PLANS]


async def take(shot: Shot, out_dir: Path) -> Path:
    with tempfile.TemporaryDirectory() as data:
        data_dir = Path(data)
        if shot.saved_plans:
            save_example_plans(PlanStore(data_dir / "plans.json"))
        app, clock = fake_app(
            shot.scenario,
            data_dir=data_dir,
            initial_tab=shot.tab,
            scenario_time=shot.scenario_time,
            # The k/K keys shown as on a real box; a fake scenario's signaller sends nothing.
            signaller=SimulatedSignaller(),
        )
        async with app.run_test(size=shot.size, notifications=True) as pilot:
            await replay(pilot, app, clock, until_s=shot.until_s, step_s=shot.step_s)
            if shot.plan is not None:
                app.planner.load_plan(shot.plan)
                await pilot.pause()
                await pilot.pause()
            if shot.flavor is not None:
                table = app.query_one(FlavorTable)
                table.focus()
                table.move_cursor(row=[fit.flavor.id for fit in table.shown].index(shot.flavor))
                await pilot.pause()
            if shot.keys:
                await pilot.press(*shot.keys)
                await pilot.pause()
            await pilot.wait_for_scheduled_animations()
            await pilot.pause()
            path = Path(app.save_screenshot(filename=shot.filename, path=str(out_dir)))
        app.finish()
    return path


async def take_cluster(out_dir: Path) -> Path:
    """The monitor over a cluster as a Prometheus source gives it (four hosts, one stale)."""
    app = cluster_app()
    async with app.run_test(size=(120, 40), notifications=True) as pilot:
        await wait_for_frames(pilot, app, 1)
        await pilot.wait_for_scheduled_animations()
        await pilot.pause()
        path = Path(app.save_screenshot(filename="cluster.svg", path=str(out_dir)))
    app.finish()
    return path


OOM_FOLDER = Path("/tmp/hwdash-demo")
"""Where the OOM screenshot's snapshot and plan are put (a fixed path: it is on the screen)."""


def oom_scenario() -> object:
    """The demo scenario whose rank 0 left the real H200 snapshot (tests/data/oom), held against a
    plan of the run that made it."""
    import gzip
    import shutil

    from hwdash.telemetry.fake_nvml import load_scenario

    data = ROOT / "tests" / "data" / "oom"
    OOM_FOLDER.mkdir(exist_ok=True)
    snapshot = OOM_FOLDER / "h200-llama-oom.pickle"
    with gzip.open(data / "h200-llama-oom.pickle.gz") as source, snapshot.open("wb") as target:
        shutil.copyfileobj(source, target)
    config = OOM_FOLDER / "config.json"
    shutil.copyfile(data / "h200-llama-oom.config.json", config)
    plan = OOM_FOLDER / "oom-run.plan.json"
    fields = {"model": str(config), "method": "full", "batch": 16, "seq": 1024}
    plan.write_text(json.dumps({"plan": fields}))
    scenario = load_scenario("a100x4-training")
    gpu = scenario.gpus[0]
    process = gpu.processes[0]
    assert process.torch is not None
    torch = process.torch.model_copy(update={"oom_snapshot": str(snapshot), "plan": str(plan)})
    gpu = gpu.model_copy(
        update={"processes": [process.model_copy(update={"torch": torch}), *gpu.processes[1:]]}
    )
    return scenario.model_copy(update={"gpus": [gpu, *scenario.gpus[1:]]})


async def take_oom(out_dir: Path) -> Path:
    """Why rank 0 ran out of memory: ``enter`` on it, then ``s``."""
    with tempfile.TemporaryDirectory() as data:
        app, clock = fake_app(
            oom_scenario(),  # type: ignore[arg-type]
            data_dir=Path(data),
            scenario_time=True,
            signaller=SimulatedSignaller(),
        )
        async with app.run_test(size=(120, 50), notifications=True) as pilot:
            await replay(pilot, app, clock, until_s=60, step_s=4)
            await pilot.press("enter")
            await pilot.pause()
            await pilot.press("s")
            screen = app.screen
            for _ in range(600):
                if getattr(screen, "shown", ""):
                    break
                await pilot.pause(0.05)
            await pilot.wait_for_scheduled_animations()
            await pilot.pause()
            path = Path(app.save_screenshot(filename="monitor-oom.svg", path=str(out_dir)))
        app.finish()
    return path


async def main(out_dir: Path, only: list[str] | None = None) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    extras = {"cluster.svg": take_cluster, "monitor-oom.svg": take_oom}
    known = [shot.filename for shot in SHOTS] + list(extras)
    unknown = sorted(set(only or ()) - set(known))
    if unknown:
        raise SystemExit(f"--only: no screenshot {', '.join(unknown)} (known: {', '.join(known)})")
    for shot in SHOTS:
        if only is None or shot.filename in only:
            path = await take(shot, out_dir)
            print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    for filename, extra in extras.items():
        if only is None or filename in only:
            path = await extra(out_dir)
            print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "screenshots", help="output folder")
    parser.add_argument(
        "--only", action="append", metavar="FILE", help="only this screenshot (repeatable)"
    )
    arguments = parser.parse_args()
    asyncio.run(main(arguments.out.resolve(), arguments.only))
