"""``hwdash runs`` in a terminal of 80 columns: the table leaves columns out instead of wrapping."""

from __future__ import annotations

from pathlib import Path

from hwdash.runs import ledger
from hwdash.runs.table import COLUMNS, runs_table

DEVICE_LEDGER = Path(__file__).resolve().parents[2] / "bench/data/device_h200/runs.jsonl"


def _records() -> list[dict[str, object]]:
    return ledger.read(DEVICE_LEDGER, owner_uid=None).records


def test_an_80_column_terminal_gets_a_table_that_fits() -> None:
    table = runs_table(_records(), width=80)
    lines = table.splitlines()
    assert max(len(line) for line in lines) <= 80
    header = lines[0].split()
    # What a run is, how fast, how full against the plan and how it ended stay.
    for kept in ("ID", "RUN", "TOK/S", "MFU", "PEAK", "ERR", "EXIT"):
        assert kept in header
    assert "PLANNED" not in header and "KWH" not in header
    assert "llama-3.1-8b full" in table and "-5.9%" in table


def test_without_a_width_every_column_is_there() -> None:
    header = runs_table(_records()).splitlines()[0].split()
    assert header == list(COLUMNS)
