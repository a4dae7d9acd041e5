"""The runs ledger file: locked appends, and a reader that survives hostile input (issue 26)."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import random
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ledger_records import make_record

from hwdash.commands.runs import show_text
from hwdash.core import strict_json
from hwdash.runs import ledger
from hwdash.runs.ledger import LedgerError
from hwdash.runs.report import build_report, report_json, report_markdown
from hwdash.runs.table import runs_table

T0 = 1_764_120_000.0


def ledger_file(state: Path) -> Path:
    return state / "hwdash" / "runs.jsonl"


def test_the_path_follows_hwdash_runs_then_xdg_state_home_then_home() -> None:
    assert ledger.ledger_path({"HWDASH_RUNS": "/srv/r.jsonl", "XDG_STATE_HOME": "/s"}) == Path(
        "/srv/r.jsonl"
    )
    assert ledger.ledger_path({"XDG_STATE_HOME": "/s"}) == Path("/s/hwdash/runs.jsonl")
    assert ledger.ledger_path({"XDG_STATE_HOME": "  "}) == (
        Path.home() / ".local" / "state" / "hwdash" / "runs.jsonl"
    )


def test_an_id_is_12_hex_of_the_sha256_of_host_pid_and_start() -> None:
    expected = hashlib.sha256(b"box:4242:1764120000.0").hexdigest()[:12]
    assert ledger.make_id("box", 4242, 1764120000.0) == expected
    assert len(expected) == 12
    assert ledger.make_id("box", 4242, 1764120000.5) != expected


def test_append_then_read_round_trip_private_file(state: Path) -> None:
    records = [make_record(100 + n, T0 + 3600 * n) for n in range(3)]
    del records[0]["version"]  # append sets it
    for record in records:
        ledger.append(record)
    path = ledger_file(state)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    lines = path.read_bytes().split(b"\n")
    assert len(lines) == 4 and lines[-1] == b""  # three lines, each ending in a newline
    result = ledger.read()
    assert result.path == path and result.exists
    assert result.warnings == [] and result.skipped == 0
    assert result.records == [{**records[0], "version": 1}, records[1], records[2]]
    assert [r["pid"] for r in ledger.read(last=2).records] == [101, 102]
    assert ledger.read(last=2).more and not ledger.read(last=3).more


def test_no_ledger_yet_is_an_empty_read(state: Path) -> None:
    result = ledger.read()
    assert result.records == [] and not result.exists
    assert result.path == ledger_file(state)


def _writer(path: str, writer: int, count: int) -> None:
    for n in range(count):
        # About 3 KB a record, so an unlocked writer would interleave within lines.
        ledger.append(
            make_record(writer * 10_000 + n, T0 + n, command="x" * 3000, writer=writer, n=n),
            Path(path),
        )


def test_two_processes_appending_at_once_leave_every_line_whole(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_writer, args=(str(path), w, 500)) for w in (1, 2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
        assert worker.exitcode == 0
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b"" and len(lines) == 1001
    parsed = [json.loads(line) for line in lines[:-1]]
    assert sorted((r["writer"], r["n"]) for r in parsed) == [
        (w, n) for w in (1, 2) for n in range(500)
    ]
    result = ledger.read(path)
    assert len(result.records) == 1000 and result.skipped == 0


def test_a_cut_short_last_line_is_skipped_with_its_line_number_and_the_next_append_ends_it(
    state: Path,
) -> None:
    ledger.append(make_record(1, T0))
    ledger.append(make_record(2, T0 + 10))
    path = ledger_file(state)
    whole = ledger.encode(make_record(3, T0 + 20))
    with path.open("ab") as file:
        file.write(whole[: len(whole) // 2])  # a writer killed mid-line
    result = ledger.read()
    assert [r["pid"] for r in result.records] == [1, 2]
    assert result.skipped == 1
    assert result.warnings == [
        f"{path}: line 3 skipped: cut short (no newline at the end of the file)"
    ]
    ledger.append(make_record(4, T0 + 30))
    result = ledger.read()
    assert [r["pid"] for r in result.records] == [1, 2, 4]  # not glued to the torn line
    assert len(result.warnings) == 1 and result.warnings[0].startswith(
        f"{path}: line 3 skipped: not JSON"
    )


def test_a_record_of_a_newer_version_is_kept_and_marked(state: Path) -> None:
    ledger.append(make_record(1, T0))
    newer = make_record(2, T0 + 10, version=2, carbon_g=12.5)
    newer["gpus"] = "a new shape"
    ledger.append(newer)
    result = ledger.read()
    old, new = result.records
    assert "_newer" not in old
    assert new["_newer"] is True and new["carbon_g"] == 12.5 and new["pid"] == 2
    assert result.skipped == 0
    assert result.warnings == [
        f"{ledger_file(state)}: 1 record(s) from a newer hwdash (format above 1); "
        "showing the fields this version reads"
    ]
    assert ledger.gpus_of(new) == []  # a field in a shape this version does not read
    completed = ledger.complete(new)
    assert "_newer" not in completed and completed["version"] == 2 and completed["carbon_g"] == 12.5


@pytest.mark.parametrize(
    ("line", "why"),
    [
        (b'{"version": 1, "id": "abc", "mfu": NaN}', "not JSON (NaN is not a JSON number)"),
        (b'{"version": 1, "tokens_per_s": 1e999}', "not JSON (the number 1e999 is out of range)"),
        (b"[1, 2, 3]", "not a JSON object (a list)"),
        (b'{"id": "abc"}', "no version (not a runs ledger record)"),
        (b'{"version": true}', "no version (not a runs ledger record)"),
        (b"\xff\xfe{}", "not UTF-8 text"),
        (b"[" * 40 + b"]" * 40, "not JSON (nested more than 16 levels deep)"),
    ],
)
def test_a_line_that_is_not_a_record_is_skipped_by_line_number(
    state: Path, line: bytes, why: str
) -> None:
    ledger.append(make_record(1, T0))
    path = ledger_file(state)
    with path.open("ab") as file:
        file.write(line + b"\n\n")  # a blank line is not counted
    ledger.append(make_record(2, T0 + 10))
    result = ledger.read()
    assert [r["pid"] for r in result.records] == [1, 2]
    assert result.skipped == 1
    assert result.warnings == [f"{path}: line 2 skipped: {why}"]


def test_a_line_over_64_kib_is_refused_by_append_and_skipped_by_read(state: Path) -> None:
    ledger.append(make_record(1, T0))
    path = ledger_file(state)
    before = path.read_bytes()
    with pytest.raises(ValueError, match=r"over the limit of 65536 bytes"):
        ledger.append(make_record(2, T0 + 1, command="x" * 70_000))
    assert path.read_bytes() == before
    with pytest.raises(ValueError, match="not a JSON number"):
        ledger.append(make_record(2, T0 + 1, mfu=float("nan")))
    # One that another writer put there: 300 KB, longer than a read block.
    with path.open("ab") as file:
        file.write(
            ledger.encode(make_record(3, T0 + 2))[:-1].replace(
                b'"ada"', b'"' + b"a" * 300_000 + b'"'
            )
            + b"\n"
        )
    ledger.append(make_record(4, T0 + 3))
    result = ledger.read()
    assert [r["pid"] for r in result.records] == [1, 4]
    assert result.warnings == [f"{path}: line 2 skipped: over 65536 bytes"]


def test_a_ledger_writable_by_others_is_refused(state: Path) -> None:
    ledger.append(make_record(1, T0))
    path = ledger_file(state)
    path.chmod(0o666)
    with pytest.raises(LedgerError, match=r"runs\.jsonl is writable by other users \(mode 666"):
        ledger.read()
    path.chmod(0o600)
    path.parent.chmod(0o777)
    with pytest.raises(LedgerError, match=r"its folder .*hwdash is writable by other users"):
        ledger.read()
    path.parent.chmod(0o1777)  # sticky, like /tmp: only the file's owner may replace it
    assert [r["pid"] for r in ledger.read().records] == [1]


def test_a_ledger_of_another_user_is_refused(state: Path) -> None:
    ledger.append(make_record(1, T0))
    someone_else = os.geteuid() + 1
    with pytest.raises(LedgerError, match=rf"belongs to uid {os.geteuid()}, not {someone_else}"):
        ledger.read(owner_uid=someone_else)
    if os.geteuid() == 0:  # root can make the file another user's for real
        os.chown(ledger_file(state), 4321, -1)
        with pytest.raises(LedgerError, match=r"runs\.jsonl belongs to uid 4321, not 0"):
            ledger.read()


def test_a_symbolic_link_is_neither_read_nor_written_through(state: Path, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.jsonl"
    target.write_bytes(ledger.encode(make_record(1, T0)))
    path = ledger_file(state)
    path.parent.mkdir(parents=True)
    path.symlink_to(target)
    with pytest.raises(LedgerError, match=r"runs\.jsonl is a symbolic link"):
        ledger.read()
    with pytest.raises(LedgerError, match="is a symbolic link; not written"):
        ledger.append(make_record(2, T0))
    assert target.read_bytes() == ledger.encode(make_record(1, T0))


def test_a_fifo_is_refused_without_waiting_for_a_writer(state: Path) -> None:
    path = ledger_file(state)
    path.parent.mkdir(parents=True, mode=0o700)
    os.mkfifo(path, 0o600)
    with pytest.raises(LedgerError, match="is not a regular file"):
        ledger.read()
    with pytest.raises(LedgerError, match="is not a regular file; not written"):
        ledger.append(make_record(1, T0))


def test_append_closes_hwdash_own_folder_left_group_writable_by_the_umask(state: Path) -> None:
    folder = state / "hwdash"
    folder.mkdir(parents=True)
    folder.chmod(0o775)
    ledger.append(make_record(1, T0))
    assert stat.S_IMODE(folder.stat().st_mode) == 0o755
    assert len(ledger.read().records) == 1


def test_last_reads_the_newest_and_since_stops_at_old_records(state: Path) -> None:
    path = ledger_file(state)
    path.parent.mkdir(parents=True, mode=0o700)
    # A broken line at the start, far older than the window: a since read never reaches it.
    path.write_bytes(b"not json\n")
    path.chmod(0o600)
    for n in range(120):
        ledger.append(make_record(n, T0 + n * 86400.0, seconds=600.0))
    # A record whose clock was wrong (it ended at 0) does not hide the window's older runs.
    ledger.append(make_record(999, 0.0, seconds=0.0))
    assert [r["pid"] for r in ledger.read(last=3).records] == [118, 119, 999]
    since = T0 + 117 * 86400.0 + 300  # run 117 ended at +600 s: in
    result = ledger.read(since=since)
    assert [r["pid"] for r in result.records] == [117, 118, 119]
    assert result.warnings == []  # it stopped 50 old records before the broken first line
    full = ledger.read()
    assert len(full.records) == 121 and full.warnings == [
        f"{path}: line 1 skipped: not JSON (Expecting value: line 1 column 1 (char 0))"
    ]


def test_since_counts_a_run_without_an_end_by_its_start(state: Path) -> None:
    ledger.append(make_record(1, T0, ended=None))
    ledger.append(make_record(2, T0 - 5000, ended=None))
    assert [r["pid"] for r in ledger.read(since=T0 - 10).records] == [1]


def test_find_by_unique_prefix_and_refusals(state: Path) -> None:
    records = [make_record(n, T0 + n) for n in range(40)]
    for record in records:
        ledger.append(record)
    target = records[7]
    prefix = next(
        target["id"][:k]
        for k in range(1, 13)
        if sum(r["id"].startswith(target["id"][:k]) for r in records) == 1
    )
    found, result = ledger.find(prefix.upper())
    assert found == target and result.warnings == []
    shared = next(r["id"][0] for r in records if sum(o["id"][0] == r["id"][0] for o in records) > 1)
    with pytest.raises(
        LedgerError, match=rf"runs have an id starting '{shared}' .*give more of the id"
    ):
        ledger.find(shared)
    with pytest.raises(LedgerError, match=r"no run with an id starting 'ffffffffffff'"):
        ledger.find(
            "ffffffffffff" if not any(r["id"] == "ffffffffffff" for r in records) else "0" * 12
        )
    with pytest.raises(LedgerError, match=r"'xyz' is not a run id"):
        ledger.find("xyz")


@pytest.mark.parametrize("seed", range(20))
def test_reading_backwards_in_blocks_gives_every_line(seed: int, tmp_path: Path) -> None:
    rng = random.Random(seed)
    lines = [
        bytes(rng.choice(b"abc{}") for _ in range(rng.choice([0, 1, 5, 30, 200, 70_000])))
        for _ in range(rng.randint(1, 30))
    ]
    data = b"\n".join(lines) + rng.choice([b"\n", b""])
    path = tmp_path / "lines"
    path.write_bytes(data)
    handle = os.open(path, os.O_RDONLY)
    try:
        found = list(ledger.lines_backwards(handle, len(data), block=rng.choice([7, 64, 4096])))
    finally:
        os.close(handle)
    expected, offset = [], 0
    for line in lines:
        expected.append((offset, line if len(line) <= ledger.MAX_LINE_BYTES else None))
        offset += len(line) + 1
    # Empty lines are the reader's caller's to skip; whether one is yielded is not pinned.
    assert [item for item in found[::-1] if item[1] != b""] == [
        item for item in expected if item[1] != b""
    ]


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
RECORD_LIKE = st.dictionaries(
    st.sampled_from([*ledger.RECORD_KEYS, "extra"]), JSON_VALUES, max_size=12
).map(lambda record: {**record, "version": record.get("version", 1)})
LINES = st.lists(
    st.one_of(
        RECORD_LIKE.map(lambda record: json.dumps(record).encode()),
        st.binary(max_size=60).filter(lambda data: b"\n" not in data),
    ),
    max_size=12,
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(lines=LINES, tail=st.sampled_from([b"\n", b""]), last=st.sampled_from([None, 1, 3]))
def test_any_ledger_content_reads_without_crashing_and_formats(
    tmp_path: Path, lines: list[bytes], tail: bytes, last: int | None
) -> None:
    path = tmp_path / "fuzz.jsonl"
    path.write_bytes(b"\n".join(lines) + tail)
    path.chmod(0o600)
    result = ledger.read(path, last=last, since=None if last else 0.0)
    assert all(isinstance(r, dict) and isinstance(r["version"], int) for r in result.records)
    assert last is None or len(result.records) <= last
    assert result.skipped <= len(lines)
    # Whatever the fields hold, the table, the report and --json are written without an error.
    runs_table(result.records)
    report = build_report(result.records, [], 0.0, 1e10)
    report_markdown(report)
    strict_json.dumps([ledger.complete(r) for r in result.records])
    for record in result.records:
        show_text(record)


def test_extreme_numbers_show_as_unknown_not_as_an_error(tmp_path: Path) -> None:
    record = make_record(
        1,
        -1e308,
        ended=1e308,
        duration_s=None,
        mfu=1e308,
        peak_error=None,
        measured_peak_bytes=1e308,
        planned_peak_bytes=1e-300,
        energy_kwh=1e308,
        cost_usd=1e308,
    )
    other = make_record(2, 0.0, energy_kwh=1e308, cost_usd=1e308)
    row = runs_table([record]).splitlines()[1].split()
    # No time the C library can show, no finite duration, MFU x 100 overflows, no believable peak.
    assert row[1:3] == ["-", "-"] and row[6] == "-" and row[7] == "-"
    assert row[-4:] == ["-", "-", "-", "normal"]  # peak error, kWh, cost
    report = build_report([record, other], [], 0.0, 3600.0)
    assert report.gpus[0].busy_s == 3600.0
    document = strict_json.loads(strict_json.dumps(report_json(report)))
    assert document["energy_kwh"] is None and document["cost_usd"] is None


def test_the_ledger_imports_nothing_but_the_standard_library_and_strict_json() -> None:
    # The training process imports it at the end of a run: no pydantic, no NVML, no Textual.
    code = (
        "import sys; import hwdash.runs.ledger; "
        "print(sorted(m.split('.')[0] if not m.startswith('hwdash') else m for m in sys.modules "
        "if m.startswith('hwdash') or m.split('.')[0] in "
        "('pydantic', 'pynvml', 'textual', 'rich', 'yaml', 'psutil', 'prometheus_client')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == str(
        [
            "hwdash",
            "hwdash.core",
            "hwdash.core.strict_json",
            "hwdash.errors",
            "hwdash.runs",
            "hwdash.runs.ledger",
        ]
    )
