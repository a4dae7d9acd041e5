"""The collector is held off while the dashboard starts and comes back, with start-up frozen."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

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
