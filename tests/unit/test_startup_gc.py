"""The collector is held off while the dashboard starts and comes back, with start-up frozen."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from hwdash.ui import startup_gc


@pytest.fixture
def collector() -> Iterator[None]:
    """Leave the collector as the test found it (enabled, nothing frozen by the test)."""
    frozen_before = gc.get_freeze_count()
    yield
    gc.enable()
    if gc.get_freeze_count() != frozen_before:
        gc.unfreeze()
    startup_gc._paused = False


def test_pause_then_resume_frees_start_up_garbage_and_freezes_the_rest(collector: None) -> None:
    startup_gc.pause()
    assert not gc.isenabled()

    class Node:
        pass

    # A reference cycle made while paused is garbage the collector has not seen yet.
    first, second = Node(), Node()
    first.other, second.other = second, first  # type: ignore[attr-defined]
    garbage = weakref.ref(first)
    del first, second
    survivors = [Node() for _ in range(5000)]  # enough allocations to trigger a collection
    assert garbage() is not None  # no automatic collection while paused

    startup_gc.resume()
    assert gc.isenabled()
    assert garbage() is None  # collected before the freeze, not kept forever
    assert gc.get_freeze_count() >= len(survivors)
    startup_gc.resume()  # a second resume changes nothing
    assert gc.isenabled()


def test_resume_without_pause_leaves_the_collector_alone(collector: None) -> None:
    frozen = gc.get_freeze_count()
    gc.disable()  # someone else's choice (a test runner, an embedding program)
    startup_gc.resume()
    assert not gc.isenabled()
    assert gc.get_freeze_count() == frozen


def test_pause_does_not_take_over_a_collector_that_is_already_off(collector: None) -> None:
    gc.disable()
    startup_gc.pause()
    startup_gc.resume()
    assert not gc.isenabled()


def test_a_dashboard_that_fails_before_its_first_frame_turns_the_collector_back_on(
    collector: None, capsys: pytest.CaptureFixture[str]
) -> None:
    from hwdash.cli import main

    frozen = gc.get_freeze_count()
    assert main(["--interval", "0"]) == 2  # refused before any screen
    assert gc.isenabled() and gc.get_freeze_count() == frozen
    assert "--interval" in capsys.readouterr().err


async def test_the_dashboard_resumes_the_collector_after_its_first_frame(
    collector: None, tmp_path: Path
) -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ui"))
    from snapshot_apps.fake_dashboard import fake_app, wait_for_frames, wait_for_hidden_panes

    startup_gc.pause()
    app, _clock = fake_app("a100x4-training", data_dir=tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for_frames(pilot, app, 1)
        await wait_for_hidden_panes(pilot, app)
        await pilot.pause()
        assert gc.isenabled()
        assert gc.get_freeze_count() > 0  # start-up's objects moved out of the collector's way
