"""``hwdash oom SNAPSHOT [--json] [--device N] [--top K]`` through the command line's entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from oom_fixtures import EXPECTED, training_oom, write

from hwdash.cli import main


@pytest.fixture
def snapshot_file(tmp_path: Path) -> Path:
    return write(tmp_path / "123-oom-1.pickle", training_oom().snapshot())


def test_text_report_fits_80_columns_and_says_what_filled_the_device(
    snapshot_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["oom", str(snapshot_file)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80, [line for line in lines if len(line) > 80]
    # a long path is clipped on its left: its file name stays
    assert lines[0].endswith("/123-oom-1.pickle: device 0, at the out-of-memory")
    assert "  failed request    300 MiB (314,572,800 B); CUDA reported 200 MiB free" in lines
    assert "  reserved          2.5 GiB  in 4 segments" in lines
    assert "  allocated         2.1 GiB  in 17 live blocks" in lines
    assert any(line.startswith("  fragmentation     320 MiB") for line in lines)
    assert "  optimizer states   384 MiB   18.2%" in lines
    top = lines.index("Top allocation sites (your frames first, library frames folded)")
    assert lines[top + 1 : top + 5] == [
        "   1.   1.0 GiB  x4      parameters",
        "        proj/train.py:12 in load_model",
        "        proj/train.py:80 in main",
        "        ~ torch/nn/modules/module.py:1340 in _apply",
    ]
    assert "Largest live blocks" in lines


def test_json_report(snapshot_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["oom", str(snapshot_file), "--json", "--top", "2"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["categories"] == EXPECTED["categories"]
    assert document["oom"]["requested_bytes"] == EXPECTED["request"]
    assert len(document["sites"]) == 2 and len(document["largest_blocks"]) == 2
    assert main(["oom", str(snapshot_file), "--json", "--device", "1"]) == 0
    other = json.loads(capsys.readouterr().out)
    assert other["device"] == 1 and other["oom"] is None


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--device", "x"], "--device: 'x' is not a whole number"),
        (["--device", "4"], "--device: the snapshot has no device 4 (it has 0, 1)"),
        (["--top", "0"], "--top: 0 is out of range (1 to 1000)"),
    ],
)
def test_bad_flags_exit_2_with_one_line(
    snapshot_file: Path, capsys: pytest.CaptureFixture[str], flags: list[str], said: str
) -> None:
    assert main(["oom", str(snapshot_file), *flags]) == 2
    err = capsys.readouterr().err
    assert err == f"hwdash oom: error: {said}\n"


def test_help_lists_oom(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "why a run ran out of memory" in capsys.readouterr().out


def test_a_missing_file_is_named_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "gone.pickle"
    assert main(["oom", str(missing)]) == 2
    assert capsys.readouterr().err.strip() == f"hwdash oom: error: {missing}: no such file"
