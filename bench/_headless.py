"""What the dashboard benches share: the real dashboard run headless on the monitor tab, the
frame builder the sampling thread uses, and the timing summary line.

Imported by ``bench/cluster_bench.py`` and ``bench/ssh_bench.py`` (run as scripts, so ``bench/`` is
on ``sys.path``); importing it puts ``src`` and ``tests/ui`` (the snapshot apps' shared catalog) on
``sys.path`` too.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for _folder in (ROOT / "src", ROOT / "tests" / "ui"):
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

#: The headless terminal the benches render into (columns, rows).
SIZE = (120, 40)


def headless_dashboard() -> Any:
    """The dashboard as ``hwdash monitor`` builds it, with no sampler of its own (the bench shows
    each frame itself), on the monitor tab, without the alert log or the bell."""
    from snapshot_apps.fake_dashboard import shared_catalog

    from hwdash.ui.app import make_app

    return make_app(
        catalog=shared_catalog(),
        sampler=None,
        interval=1.0,
        initial_tab="monitor",
        alert_log=False,
        bell=False,
    )


def frame_builder() -> Any:
    """The sampling thread's work on each snapshot: history, forecast and the alert rule, at 1 s."""
    from hwdash.core.live.alerts import AlertRule
    from hwdash.telemetry.history import History
    from hwdash.ui.sampling import AlertingFrameBuilder

    return AlertingFrameBuilder(AlertRule(), history=History(interval_s=1.0))


def check_cluster_shown(app: Any, gpus: int) -> None:
    """The monitor shows the cluster table with one line per GPU."""
    shown = app.monitor.cluster_table
    assert shown.display and len(shown.lines) == gpus


def summary(name: str, seconds: list[float], width: int) -> str:
    """One timing line: ``name`` padded to ``width``, the median and the 95th percentile in ms."""
    ordered = sorted(seconds)
    p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
    median = statistics.median(seconds)
    return f"{name:<{width}} median {median * 1000:7.1f} ms   p95 {p95 * 1000:7.1f} ms"
