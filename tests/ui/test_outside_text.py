"""Strings from outside (GPU, MIG and process names, users, command lines, plan and catalog names)
are shown as text in the dashboard, never parsed as markup: `[/x]` does not crash it, `[bold]` is
shown as typed."""

from __future__ import annotations

from pathlib import Path

from snapshot_apps.fake_dashboard import fake_app, replay, step

from hwdash.core.catalog import load_catalog
from hwdash.core.plan import Plan
from hwdash.core.plan_store import PlanStore
from hwdash.ui.app import make_app
from hwdash.ui.widgets.planner_flavors import FlavorTable

HOSTILE_SCENARIO = """
time_step_s = 10
[[gpus]]
name = "NVIDIA [bold]A100[/bold] [/x]"
memory_total_mib = 81920
used_mib = [[0, 1000], [30, 80000]]

[[gpus.processes]]
pid = 4100
name = "[/x]"
user = "[red]eve"
cmdline = "python [/x] train.py --tag [bold]run[/bold]"
used_mib = [[0, 900], [30, 79000]]

[[gpus]]
name = "NVIDIA H100 [/]"
memory_total_mib = 81920

[[gpus.mig]]
name = "NVIDIA H100 MIG [blink]1g[/blink]"
memory_total_mib = 9728
used_mib = 9700
"""

EVIL_CATALOG = """
[[accelerator]]
id = "evil[/x]gpu"
name = "Evil [bold]GPU[/bold] [/x]"
vendor = "nvidia"
kind = "gpu"
memory_gb = 24
bf16 = true
bf16_tflops = 100
source = "test"

[[flavor]]
id = "evil[/x]box"
name = "Evil box"
provider = "local"
accelerator = "evil[/x]gpu"
gpu_count = 1
source = "test"
"""


async def test_the_monitor_shows_hostile_names_as_typed(tmp_path: Path) -> None:
    scenario = tmp_path / "hostile.toml"
    scenario.write_text(HOSTILE_SCENARIO)
    app, clock = fake_app(str(scenario), data_dir=tmp_path, initial_tab="monitor")
    async with app.run_test(size=(160, 40), notifications=True) as pilot:
        await replay(pilot, app, clock, until_s=10, step_s=10)
        await step(pilot, app, clock, 30)  # GPU 0 and the MIG slice are over 90% now
        card = app.monitor.gpu_cards[0]
        assert "[bold]A100[/bold] [/x]" in card.name_cell.shown
        assert "[blink]1g[/blink]" in app.monitor.gpu_cards[1].detail_cell.shown
        table = app.monitor.process_table
        (row,) = [table.get_row(key) for key in table.row_keys_in_order]
        texts = [cell.text for cell in row]
        assert "[red]eve" in texts
        assert "python [/x] train.py --tag [bold]run[/bold]" in texts
        toast = "\n".join(n.message for n in app._notifications)
        assert "[bold]A100[/bold] [/x]" in toast


async def test_planner_and_compare_show_hostile_catalog_and_plan_names(
    tmp_path: Path, monkeypatch: object
) -> None:
    overlay = tmp_path / "evil.toml"
    overlay.write_text(EVIL_CATALOG)
    catalog = load_catalog([overlay], include_user=False)
    store = PlanStore(tmp_path / "plans.json")
    app = make_app(catalog=catalog, sampler=None, plan_store=store, alert_log=False, bell=False)
    async with app.run_test(size=(160, 40), notifications=True) as pilot:
        await pilot.pause()
        table = app.query_one(FlavorTable)
        row = table.get_row("evil[/x]box")
        assert "evil[/x]box" in str(row[1]) and "Evil [bold]GPU[/bold] [/x]" in str(row[8])
        app.planner.save_current("[/x] [bold]run[/bold]")
        await pilot.pause()
        assert any("[/x] [bold]run[/bold]" in n.message for n in app._notifications)
        await pilot.press("c")
        await pilot.pause()
        assert [saved.name for saved in app.compare.plans] == ["[/x] [bold]run[/bold]"]
    assert store.names() == ["[/x] [bold]run[/bold]"]


def test_plan_names_with_brackets_print_in_hwdash_compare(
    tmp_path: Path, capsys: object, monkeypatch: object
) -> None:
    import pytest

    from hwdash.cli import main

    assert isinstance(monkeypatch, pytest.MonkeyPatch)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    PlanStore().save("[/x] [bold]run[/bold]", Plan(model="qwen2.5-0.5b"))
    assert main(["compare", "--list"]) == 0
    assert isinstance(capsys, pytest.CaptureFixture)
    assert "[/x] [bold]run[/bold]" in capsys.readouterr().out
