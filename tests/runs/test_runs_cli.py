"""``hwdash runs``, ``hwdash runs show`` and ``hwdash report`` through the command line's entry point."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest
from ledger_records import H100, make_record

from hwdash.cli import main
from hwdash.runs import ledger

HOUR = 3600.0
DESIGN_KEYS = {
    "id",
    "pid",
    "command",
    "started",
    "ended",
    "exit",
    "gpus",
    "plan",
    "tokens",
    "tokens_per_s",
    "mfu",
    "energy_kwh",
    "cost_usd",
    "measured_peak_bytes",
    "planned_peak_bytes",
}


@pytest.fixture
def three_runs(state: Path) -> list[dict]:
    """Three runs that ended in the last 12 hours, the first an OOM on two GPUs; one alert."""
    now = time.time()
    records = [
        make_record(
            11,
            now - 9 * HOUR,
            seconds=HOUR,
            gpus=(0, 1),
            exit="oom",
            model=None,
            plan=None,
            command="python train.py --big",
            energy_kwh=1.5,
            cost_usd=9.0,
            tokens_per_s=None,
            mfu=None,
            measured_peak_bytes=85_000_000_000,
        ),
        make_record(12, now - 6 * HOUR, seconds=2 * HOUR, tokens_per_s=2048.4, mfu=0.412),
        make_record(13, now - 3 * HOUR, seconds=HOUR, method="full", energy_kwh=0.25, cost_usd=2.0),
    ]
    for record in records:
        ledger.append(record)
    alert = {
        "kind": "raised",
        "gpu_index": 1,
        "gpu_name": H100,
        "host": "box",
        "pid": 9,
        "message": "GPU 1 (NVIDIA H100 80GB HBM3): memory pressure 96%",
        "timestamp": now - 8.5 * HOUR,
    }
    (state / "hwdash" / "alerts.jsonl").write_text(json.dumps(alert) + "\n")
    return records


def test_runs_lists_one_line_per_run(
    three_runs: list[dict], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["runs"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == [
        "ID",
        "ENDED",
        "TIME",
        "RUN",
        "TOK/S",
        "MFU",
        "PEAK",
        "PLANNED",
        "ERR",
        "KWH",
        "COST",
        "EXIT",
    ]
    first, second, third = (line.split() for line in out[1:4])
    assert len(out) == 4
    assert first[0] == three_runs[0]["id"] and first[3:6] == ["1h00m", "python", "train.py"]
    assert first[6:] == [
        "--big",
        "-",
        "-",
        "79.2",
        "GiB",
        "55.9",
        "GiB",
        "+1.7%",
        "1.50",
        "$9.00",
        "oom",
    ]
    assert second[0] == three_runs[1]["id"]
    assert second[3:] == [
        "2h00m",
        "llama-3.1-8b",
        "lora",
        "2,048",
        "41.2%",
        "56.8",
        "GiB",
        "55.9",
        "GiB",
        "+1.7%",
        "0.60",
        "$4.50",
        "normal",
    ]
    assert third[4:6] == ["llama-3.1-8b", "full"]


def test_runs_json_lists_the_records(
    three_runs: list[dict], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["runs", "--json", "--last", "2"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert [record["id"] for record in document] == [three_runs[1]["id"], three_runs[2]["id"]]
    assert set(document[0]) >= DESIGN_KEYS
    assert document[0] == {key: three_runs[1][key] for key in ledger.RECORD_KEYS}
    assert main(["runs", "--json", "--since", "4h"]) == 0
    assert [r["pid"] for r in json.loads(capsys.readouterr().out)] == [13]


def test_runs_with_no_ledger_says_where_it_looked_and_how_to_record(
    state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["runs"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"no runs recorded in {state / 'hwdash' / 'runs.jsonl'} (no file yet).\n")
    assert "hwdash.probe.start()" in out and "python -m hwdash.probe train.py" in out
    assert main(["runs", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_runs_marks_a_newer_record_and_warns_of_skipped_lines(
    state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger.append(make_record(1, time.time() - HOUR, version=3))
    with (state / "hwdash" / "runs.jsonl").open("ab") as file:
        file.write(b'{"version": 1, "mfu": NaN}\n')
    assert main(["runs"]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines()[1].split()[0].endswith("*")
    assert "* from a newer hwdash: the fields this version reads are shown" in captured.out
    assert "line 2 skipped: not JSON (NaN is not a JSON number)" in captured.err
    assert "1 record(s) from a newer hwdash" in captured.err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["runs", "--last", "0"], "hwdash runs: error: --last: 0 runs shows nothing"),
        (["runs", "--last", "ten"], "hwdash runs: error: --last: 'ten' is not a whole number"),
        (["runs", "--since", "soon"], "hwdash runs: error: --since: 'soon' is neither a duration"),
        (
            ["report", "--since", "12x"],
            "hwdash report: error: --since: '12x' is neither a duration",
        ),
    ],
)
def test_bad_flags_exit_2_with_one_line(
    state: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1


def test_a_refused_ledger_exits_2_with_the_reason(
    three_runs: list[dict], state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = state / "hwdash" / "runs.jsonl"
    path.chmod(0o606)
    assert main(["runs"]) == 2
    assert capsys.readouterr().err == (
        f"hwdash runs: error: runs ledger not read: {path} is writable by other users "
        "(mode 606; chmod go-w it)\n"
    )


def test_runs_show_prints_one_run_whole(
    three_runs: list[dict], capsys: pytest.CaptureFixture[str]
) -> None:
    wanted = three_runs[0]
    assert main(["runs", "show", wanted["id"][:8]]) == 0
    lines = capsys.readouterr().out.splitlines()
    fields = {
        line.split(":", 1)[0]: line.split(":", 1)[1].strip()
        for line in lines
        if not line.startswith("  ")
    }
    assert fields["id"] == wanted["id"] and fields["exit"] == "oom"
    assert fields["command"] == "python train.py --big"
    assert fields["measured_peak_bytes"] == "79.2 GiB (85,000,000,000 B)"
    assert fields["peak_error"] == "+1.7%" and fields["cost_usd"] == "$9.00"
    assert fields["tokens_per_s"] == "-" and fields["duration_s"] == "1h00m (3600.0 s)"
    assert f"  0  {H100}  GPU-0000-aaaa" in lines and f"  1  {H100}  GPU-0001-aaaa" in lines
    assert main(["runs", "show", wanted["id"], "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {key: wanted[key] for key in ledger.RECORD_KEYS}


def test_runs_show_refuses_an_unknown_or_ambiguous_id(
    state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records = [make_record(n, 1_764_000_000.0 + n) for n in range(40)]
    for record in records:
        ledger.append(record)
    ids = [record["id"] for record in records]
    shared = next(i[0] for i in ids if sum(o[0] == i[0] for o in ids) > 1)
    assert main(["runs", "show", shared]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"hwdash runs: error: {sum(i[0] == shared for i in ids)} runs have an id starting '{shared}' ("
    )
    missing = next(p for p in ("ffff", "eeee", "dddd") if not any(i.startswith(p) for i in ids))
    assert main(["runs", "show", missing]) == 2
    assert f"no run with an id starting '{missing}'" in capsys.readouterr().err


def test_report_text_json_and_markdown_file(
    three_runs: list[dict], state: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", "--since", "12h"]) == 0
    out = capsys.readouterr().out
    assert "3 run(s), 1 alert(s), energy 2.35 kWh, cost $15.50" in out
    gpu0 = next(line for line in out.splitlines() if line.startswith(f"0 {H100}"))
    # GPU 0 ran runs 11 (1 h, half its energy and cost), 12 (2 h) and 13 (1 h): 4 h of 12 busy.
    assert gpu0.split()[5:] == [
        "GPU-0000-aaaa",
        "3",
        "4h00m",
        "8h00m",
        "79.2",
        "GiB",
        "1.60",
        "$11.00",
        "0",
    ]
    gpu1 = next(line for line in out.splitlines() if line.startswith(f"1 {H100}"))
    assert gpu1.split()[5:] == [
        "GPU-0001-aaaa",
        "1",
        "1h00m",
        "11h00m",
        "79.2",
        "GiB",
        "0.75",
        "$4.50",
        "1",
    ]
    assert "box GPU 1: raised: GPU 1 (NVIDIA H100 80GB HBM3): memory pressure 96%" in out

    assert main(["report", "--since", "12h", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert [run["pid"] for run in document["runs"]] == [11, 12, 13]
    assert document["energy_kwh"] == pytest.approx(2.35) and document["cost_usd"] == pytest.approx(
        15.5
    )
    assert [gpu["alerts"] for gpu in document["gpus"]] == [0, 1]
    assert document["until"] - document["since"] == pytest.approx(12 * HOUR)

    target = tmp_path / "morning.md"
    assert main(["report", "--since", "4h", "-o", str(target)]) == 0
    assert capsys.readouterr().out == f"wrote the report of 1 run(s) and 0 alert(s) to {target}\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644 & ~_umask()
    markdown = target.read_text()
    assert markdown.startswith("# hwdash report\n")
    assert f"| {three_runs[2]['id']} |" in markdown and f"| {three_runs[1]['id']} |" not in markdown
    assert "## Alerts (0)" in markdown


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_report_refuses_to_overwrite_what_is_not_a_regular_file(
    three_runs: list[dict], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "out.md"
    folder.mkdir()
    assert main(["report", "-o", str(folder)]) == 2
    assert capsys.readouterr().err == (
        f"hwdash report: error: -o: {folder} exists and is not a regular file; not overwritten\n"
    )
    link = tmp_path / "link.md"
    victim = tmp_path / "victim"
    victim.write_text("keep")
    link.symlink_to(victim)
    assert main(["report", "-o", str(link)]) == 2
    assert victim.read_text() == "keep"


def test_report_with_nothing_recorded(state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report"]) == 0
    out = capsys.readouterr().out
    assert "0 run(s), 0 alert(s), energy - kWh" not in out
    assert "0 run(s), 0 alert(s), energy -, cost -" in out
    assert "no recorded run" in out and "no GPU in a recorded run" in out


def test_an_alert_log_that_cannot_be_read_is_a_warning_and_a_group_writable_one_is_read(
    three_runs: list[dict], state: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = state / "hwdash" / "alerts.jsonl"
    log.chmod(0o664)  # the monitor writes it with the umask: 002 on many desktops
    with log.open("a") as file:
        file.write("garbage\n")
    assert main(["report", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert len(document["alerts"]) == 1
    assert document["warnings"] == [f"{log}: 1 line(s) skipped (not alert events)"]
    elsewhere = tmp_path / "planted.jsonl"
    log.rename(elsewhere)
    log.symlink_to(elsewhere)
    assert main(["report", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["alerts"] == [] and len(document["runs"]) == 3
    assert document["warnings"] == [f"alert log not read: {log} is a symbolic link"]
