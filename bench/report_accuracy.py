"""Regenerate the accuracy report (issue 5) from the committed calibration data; no torch needed.

Reads ``bench/data/calibration.csv`` (the traced peaks, made by ``bench/calibrate.py``), runs hwdash's
estimator and the anchors' rules on every row, rewrites the CSV's estimate and error columns, and
rewrites the generated blocks of ``docs/accuracy.md`` (the results tables and the published-peaks
table from ``tests/data/published_peaks.toml``), and the config.json-door section (issue 24,
``bench/config_door.py``: ``est_now`` of ``bench/data/config_door.csv``). The prose around the
blocks is kept. From the
repository root:

    .venv/bin/python bench/report_accuracy.py
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

import config_door  # noqa: E402
from calibration.report import read_csv, score_rows, update_accuracy_doc, write_csv  # noqa: E402
from estimator_errors import calibration_catalog  # noqa: E402

DATA_CSV = REPO / "bench" / "data" / "calibration.csv"
ACCURACY_DOC = REPO / "docs" / "accuracy.md"
PUBLISHED_PEAKS = REPO / "tests" / "data" / "published_peaks.toml"


def regenerate() -> int:
    """Score the CSV, write it back and rewrite the doc's generated blocks; 2 when a marker is gone."""
    catalog = calibration_catalog()
    rows = score_rows(read_csv(DATA_CSV), catalog)
    write_csv(rows, DATA_CSV)
    print(f"scored {DATA_CSV.relative_to(REPO)} ({len(rows)} rows)")
    if not update_accuracy_doc(rows, ACCURACY_DOC, PUBLISHED_PEAKS, catalog):
        print(f"{ACCURACY_DOC.relative_to(REPO)}: generated-block markers missing, not updated")
        return 2
    print(f"rewrote the generated blocks of {ACCURACY_DOC.relative_to(REPO)}")
    # Held-out through the config.json door (issue 24): est_now recomputed, est_before kept.
    if config_door.regenerate(config_door.DATA_CSV, ACCURACY_DOC) != 0:
        return 2
    print(f"scored {config_door.DATA_CSV.relative_to(REPO)} and its section of the page")
    return 0


if __name__ == "__main__":
    raise SystemExit(regenerate())
