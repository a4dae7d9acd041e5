"""The dashboard shell: one factory, tabs switched by keys, help, quit, and the `hwdash` command."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from snapshot_apps.fake_dashboard import fake_app, shared_catalog, wait_for_frames
from textual.widgets import Input

from hwdash.cli import main
from hwdash.commands import dashboard
from hwdash.core.plans.store import PlanStore
from hwdash.ui.app import DashboardTabs, HelpScreen, HwdashApp, make_app
from hwdash.ui.compare_pane import ComparePane
from hwdash.ui.monitor_pane import MonitorPane
from hwdash.ui.planner_pane import PlannerPane


async def test_keys_switch_between_planner_compare_and_monitor(tmp_path: Path) -> None:
    app, _clock = fake_app("a100x4-training", data_dir=tmp_path, initial_tab="planner")
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        assert app.active_tab == "planner"
        assert app.planner.display and isinstance(app.planner, PlannerPane)
        await pilot.press("m")
        assert app.active_tab == "monitor"
        tabs = app.query_one(DashboardTabs)
        assert tabs.get_pane("monitor").query_one(MonitorPane) is app.monitor
        assert tabs.get_pane("monitor").display and not tabs.get_pane("planner").display
        await pilot.press("c")
        assert app.active_tab == "compare"
        assert isinstance(app.compare, ComparePane)
        await pilot.press("p")
        assert app.active_tab == "planner"


async def test_footer_offers_the_tab_keys_and_o_only_where_it_does_something(
    tmp_path: Path,
) -> None:
    app, _clock = fake_app("a100x4-training", data_dir=tmp_path, initial_tab="planner")
    async with app.run_test(size=(120, 36)) as pilot:
        keys = {key for key, active in app.active_bindings.items() if active.binding.show}
        assert {"p", "c", "m", "question_mark", "q"} <= keys
        # o sorts processes on the monitor only (on the planner the tab bar passes it to the planner,
        # where it shows only the fitting flavors: tests/ui/test_keys.py).
        assert app.check_action("sort_processes", ()) is False
        await pilot.press("c")
        assert app.check_action("sort_processes", ()) is False
        await pilot.press("m")
        assert app.check_action("sort_processes", ()) is True


async def test_escape_leaves_a_form_field_so_the_tab_keys_work_again(tmp_path: Path) -> None:
    app, _clock = fake_app("a100x4-training", data_dir=tmp_path, initial_tab="planner")
    async with app.run_test(size=(120, 36)) as pilot:
        field = app.planner.query(Input).first()
        field.focus()
        await pilot.pause()
        before = field.value
        await pilot.press("m")  # typed into the field, not a tab switch
        assert app.active_tab == "planner"
        assert field.value != before
        await pilot.press("escape", "m")
        assert app.active_tab == "monitor"


async def test_help_lists_the_keys_and_closes(tmp_path: Path) -> None:
    app, _clock = fake_app("a100x4-training", data_dir=tmp_path, initial_tab="monitor")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        text = str(app.screen.query_one("#help-text").render())
        for words in ("planner", "compare", "monitor", "quit", "sort the process table"):
            assert words in text
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
        await pilot.press("question_mark", "q")  # q closes the help, it does not quit
        assert not isinstance(app.screen, HelpScreen)
        assert app.is_running


async def test_q_quits_and_stops_the_sampling_thread(tmp_path: Path) -> None:
    app, _clock = fake_app("a100x4-training", data_dir=tmp_path, interval=0.05)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for_frames(pilot, app, 2)
        assert app.sampling is not None and app.sampling.alive
        await pilot.press("q")
        await pilot.pause()
    assert app.return_code == 0
    app.finish()
    assert not app.sampling.alive


def test_make_app_refuses_values_that_make_no_sense(tmp_path: Path) -> None:
    store = PlanStore(tmp_path / "plans.json")
    with pytest.raises(ValueError, match="interval"):
        make_app(catalog=shared_catalog(), sampler=None, interval=0, plan_store=store)
    with pytest.raises(ValueError, match="threshold"):
        make_app(catalog=shared_catalog(), sampler=None, alert_threshold=1.5, plan_store=store)


async def test_app_without_a_sampler_still_plans(tmp_path: Path) -> None:
    app = make_app(
        catalog=shared_catalog(),
        sampler=None,
        plan_store=PlanStore(tmp_path / "plans.json"),
        alert_log=False,
    )
    assert isinstance(app, HwdashApp)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert app.sampling is None
        assert app.planner.report is not None
        assert app.monitor.status_cell.shown.startswith("Waiting for the first sample")


class _NotATerminal(io.StringIO):
    def isatty(self) -> bool:
        return False


def test_dashboard_without_a_terminal_says_what_to_use_instead(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # pytest captures stdout, so it is not a terminal here: the command must refuse, not draw.
    status = main(["--demo"])
    assert status == 2
    err = capsys.readouterr().err
    assert "needs a terminal" in err
    assert "hwdash monitor --once" in err and "hwdash plan" in err


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--interval", "0"], "--interval"),
        (["--interval", "soon"], "--interval"),
        (["--alert-threshold", "120"], "--alert-threshold"),
        (["--alert-threshold", "-5"], "--alert-threshold"),
        (["--fake-nvml", "no-such-scenario"], "no fake NVML scenario"),
        (["--on-alert", "  "], "--on-alert"),
    ],
)
def test_bad_dashboard_flags_exit_2_with_one_line(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert flag in err
    assert len(err.splitlines()) == 1
    assert "Traceback" not in err


def test_dashboard_flags_parse_like_the_monitor() -> None:
    from hwdash.cli import build_parser

    args = build_parser().parse_args(
        [
            "--demo",
            "--interval",
            "0.5",
            "--alert-threshold",
            "85",
            "--no-bell",
            "--on-alert",
            "true",
        ]
    )
    assert args.demo and args.no_bell
    assert args.interval == "0.5" and args.alert_threshold == "85" and args.on_alert == "true"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--demo", "--fake-nvml", "h100x8"])  # one source at a time
    assert dashboard.run.__doc__


@pytest.mark.parametrize(
    ("scenario", "asked", "expected"),
    [
        ("h100x8", None, "monitor"),  # a training box opens on its GPUs
        ("no-driver", None, "planner"),
        ("h100x8", "compare", "compare"),
        ("no-driver", "monitor", "monitor"),
    ],
)
def test_the_dashboard_opens_on_the_monitor_where_there_are_gpus(
    scenario: str, asked: str | None, expected: str
) -> None:
    from hwdash.commands.dashboard import choose_tab
    from hwdash.telemetry.source import make_sampler

    sampler = make_sampler(scenario)
    try:
        tab, snapshot = choose_tab(asked, sampler)  # type: ignore[arg-type]
        assert tab == expected
        # The sample taken to decide is handed on (the dashboard's first frame); none when asked.
        assert (snapshot is None) == (asked is not None)
    finally:
        sampler.close()


def test_tab_flag_is_parsed() -> None:
    from hwdash.cli import build_parser

    assert build_parser().parse_args(["--tab", "monitor"]).tab == "monitor"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--tab", "bogus"])
