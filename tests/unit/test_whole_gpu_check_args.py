"""bench/whole_gpu_accuracy.py's --file / --check-args and the whole-file held-out split (issue 29).

--check-args exists so that a held-out table can be checked without anyone seeing hwdash's numbers for it:
these tests plan only made-up rows and check that the mode prints "ok" or an error per row, never a number.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load_accuracy() -> ModuleType:
    path = REPO / "bench" / "whole_gpu_accuracy.py"
    spec = importlib.util.spec_from_file_location("whole_gpu_accuracy", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["whole_gpu_accuracy"] = module
    spec.loader.exec_module(module)
    return module


accuracy = _load_accuracy()

GOOD = "--model qwen2.5-0.5b --method lora --batch 1 --seq 512"


def _row(row_id: str, args: str, gpu: str = "a100-80gb", split: str | None = None) -> str:
    lines = [
        "[[reading]]",
        f'id = "{row_id}"',
        'measure = "nvml"',
        'parallel = "none"',
        "per_gpu_gib = 12.5",
        f'gpu = "{gpu}"',
        f'hwdash_args = "{args}"',
    ]
    if split is not None:
        lines.append(f'split = "{split}"')
    return "\n".join(lines) + "\n"


def _write(tmp_path: Path, header: str, *rows: str) -> Path:
    path = tmp_path / "readings.toml"
    path.write_text(header + "\n" + "\n".join(rows), encoding="utf-8")
    return path


def test_check_args_reports_ok_and_the_bad_flag_per_row(tmp_path, capsys) -> None:
    path = _write(
        tmp_path,
        'split = "held_out"',
        _row("good-row", GOOD),
        _row("bad-flag-row", GOOD + " --no-such-flag 3"),
        _row("bad-gpu-row", GOOD, gpu="no-such-card"),
    )
    assert accuracy.main(["--file", str(path), "--check-args"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "good-row: ok"
    assert out[1].startswith("bad-flag-row: error: ")
    assert "--no-such-flag" in out[1]
    assert out[2].startswith("bad-gpu-row: error: ")
    assert "no-such-card" in out[2]
    assert out[3] == "1 ok, 2 failed"
    # No estimate and no reading leaks: the only digits are the summary's counts and the flag's own value.
    assert not re.search(r"GiB|GB|\d+\.\d", "\n".join(out))


def test_check_args_all_ok_exits_zero(tmp_path, capsys) -> None:
    path = _write(
        tmp_path, 'split = "held_out"', _row("a", GOOD), _row("b", GOOD + " --zero 2 --gpus 2")
    )
    assert accuracy.main(["--file", str(path), "--check-args"]) == 0
    assert capsys.readouterr().out.splitlines() == ["a: ok", "b: ok", "2 ok, 0 failed"]


def test_top_level_held_out_overrides_every_row(tmp_path) -> None:
    path = _write(
        tmp_path,
        'split = "held_out"',
        _row("says-derive", GOOD, split="derive"),
        _row("says-nothing", GOOD),
    )
    assert [row["split"] for row in accuracy.load_rows(path)] == ["held_out", "held_out"]


def test_without_top_level_split_each_row_keeps_its_own(tmp_path) -> None:
    path = _write(tmp_path, "", _row("d", GOOD, split="derive"), _row("h", GOOD, split="held_out"))
    assert [row["split"] for row in accuracy.load_rows(path)] == ["derive", "held_out"]
    missing = _write(tmp_path, "", _row("none", GOOD))
    with pytest.raises(ValueError, match="'none' has no split"):
        accuracy.load_rows(missing)


def test_a_top_level_split_other_than_held_out_is_a_usage_error(tmp_path, capsys) -> None:
    path = _write(tmp_path, 'split = "derive"', _row("x", GOOD))
    with pytest.raises(SystemExit) as exc:
        accuracy.main(["--file", str(path), "--check-args"])
    assert exc.value.code == 2
    assert "--file" in capsys.readouterr().err


def test_existing_table_keeps_its_hash_split() -> None:
    rows = accuracy.load_rows(accuracy.READINGS)
    assert {row["split"] for row in rows} == {"derive", "held_out"}


def test_second_held_out_table_is_whole_held_out_and_new() -> None:
    # bench/data/whole_gpu_readings_b.toml: read without planning any row (its estimates stay unseen).
    rows = accuracy.load_rows(REPO / "bench" / "data" / "whole_gpu_readings_b.toml")
    first = {row["id"] for row in accuracy.load_rows(accuracy.READINGS)}
    assert len(rows) >= 20
    assert {row["split"] for row in rows} == {"held_out"}
    ids = [row["id"] for row in rows]
    assert len(ids) == len(set(ids))
    assert not set(ids) & first
    for row in rows:
        assert row["measure"] in {"nvml", "allocated", "reserved"}, row["id"]
        assert row["per_gpu_gib"] > 0 and row["quote"] and row["source"].startswith("https://"), (
            row["id"]
        )
        assert row["hwdash_args"].startswith("--model "), row["id"]


SET_C = sorted((REPO / "bench" / "data").glob("whole_gpu_readings_c*.toml"))


DATA = REPO / "bench" / "data"
SET_D = sorted(DATA.glob("whole_gpu_readings_d*.toml"))
SETS_A_B = [DATA / "whole_gpu_readings.toml", DATA / "whole_gpu_readings_b.toml"]
SET_E = [DATA / "whole_gpu_readings_e.toml"]
SET_F = [DATA / "whole_gpu_readings_f.toml"]
SET_G = sorted(DATA.glob("whole_gpu_readings_g*.toml"))
SET_H = sorted(DATA.glob("whole_gpu_readings_h*.toml"))
SET_I = sorted(DATA.glob("whole_gpu_readings_i*.toml"))
SET_J = sorted(DATA.glob("whole_gpu_readings_j*.toml"))
SET_K = sorted(DATA.glob("whole_gpu_readings_k*.toml"))
SET_L = sorted(DATA.glob("whole_gpu_readings_l*.toml"))
SET_M = sorted(DATA.glob("whole_gpu_readings_m*.toml"))
SET_N = sorted(DATA.glob("whole_gpu_readings_n*.toml"))
SET_O = sorted(DATA.glob("whole_gpu_readings_o*.toml"))
SET_P = sorted(DATA.glob("whole_gpu_readings_p*.toml"))


def _check_new_held_out_set(tables, earlier_tables, at_least, capsys) -> None:
    """Every row of ``tables`` is held out, new (no id of ``earlier_tables``) and plans under
    --check-args, which prints no estimate."""
    earlier = {row["id"] for path in earlier_tables for row in accuracy.load_rows(path)}
    rows = [row for path in tables for row in accuracy.load_rows(path)]
    ids = [row["id"] for row in rows]
    assert len(ids) == len(set(ids)) >= at_least
    assert not set(ids) & earlier
    assert {row["split"] for row in rows} == {"held_out"}
    argv = ["--check-args"] + [arg for path in tables for arg in ("--file", str(path))]
    assert accuracy.main(argv) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith(f"{len(rows)} ok, 0 failed")
    assert "GiB" not in out


def test_set_c_is_held_out_new_and_every_row_plans(capsys) -> None:
    # the third held-out set, collected in four tables after the fitted pool
    assert len(SET_C) == 4
    _check_new_held_out_set(SET_C, SETS_A_B, 70, capsys)


def test_set_d_is_held_out_new_and_every_row_plans(capsys) -> None:
    # the fourth held-out set, collected after set C was scored
    assert len(SET_D) == 2
    _check_new_held_out_set(SET_D, [*SETS_A_B, *SET_C], 30, capsys)


def test_set_e_is_held_out_new_and_every_row_plans(capsys) -> None:
    # hwdash's own H100 readings: 9 runs, each read three ways (nvml, reserved, allocated)
    _check_new_held_out_set(SET_E, [*SETS_A_B, *SET_C, *SET_D], 27, capsys)
    rows = accuracy.load_rows(SET_E[0])
    runs = {row["hwdash_args"] for row in rows}
    assert len(runs) == 9
    for args in runs:
        measures = sorted(row["measure"] for row in rows if row["hwdash_args"] == args)
        assert measures == ["allocated", "nvml", "reserved"]


def test_set_f_is_held_out_new_and_every_row_plans(capsys) -> None:
    # measured after set E's formula changes: no setting of set E again
    _check_new_held_out_set(SET_F, [*SETS_A_B, *SET_C, *SET_D, *SET_E], 12, capsys)
    earlier = {row["hwdash_args"] for row in accuracy.load_rows(SET_E[0])}
    assert not {row["hwdash_args"] for row in accuracy.load_rows(SET_F[0])} & earlier


def test_set_g_is_held_out_new_and_every_row_plans(capsys) -> None:
    # public readings collected after set F, by two helpers who ran only --check-args
    assert len(SET_G) == 2
    _check_new_held_out_set(SET_G, [*SETS_A_B, *SET_C, *SET_D, *SET_E, *SET_F], 47, capsys)


def test_sets_h_i_and_j_are_held_out_new_and_every_row_plans(capsys) -> None:
    # set H: two helpers' public tables and hwdash's own H100 runs of stop 39 (h3); set I after
    # set H was scored, set J after set I: each new against every set before it
    earlier = [*SETS_A_B, *SET_C, *SET_D, *SET_E, *SET_F, *SET_G]
    assert [path.name[-7:] for path in SET_H] == ["h1.toml", "h2.toml", "h3.toml"]
    _check_new_held_out_set(SET_H, earlier, 62, capsys)
    assert len(SET_I) == len(SET_J) == 2
    _check_new_held_out_set(SET_I, [*earlier, *SET_H], 16, capsys)
    _check_new_held_out_set(SET_J, [*earlier, *SET_H, *SET_I], 10, capsys)
    # hwdash's own runs of set H are none of sets E's and F's settings
    own = {row["hwdash_args"] for row in accuracy.load_rows(SET_H[2])}
    assert len(own) == 8
    assert not own & {
        row["hwdash_args"] for path in (*SET_E, *SET_F) for row in accuracy.load_rows(path)
    }


def test_sets_k_and_l_are_held_out_new_and_every_row_plans(capsys) -> None:
    # set K after set J was scored (three helpers), set L after set K was collected (three more):
    # each new against every set before it
    earlier = [*SETS_A_B, *SET_C, *SET_D, *SET_E, *SET_F, *SET_G, *SET_H, *SET_I, *SET_J]
    assert [path.name[-7:] for path in SET_K] == ["k1.toml", "k2.toml", "k3.toml"]
    assert [path.name[-7:] for path in SET_L] == ["l1.toml", "l2.toml", "l3.toml"]
    _check_new_held_out_set(SET_K, earlier, 16, capsys)
    _check_new_held_out_set(SET_L, [*earlier, *SET_K], 53, capsys)
    measures = [row["measure"] for path in (*SET_K, *SET_L) for row in accuracy.load_rows(path)]
    assert measures.count("nvml") == 44


def _sets_up_to(letter: str) -> list:
    """Every readings table of the sets before ``letter`` (A and B together)."""
    named = sorted(
        path
        for path in DATA.glob("whole_gpu_readings_*.toml")
        if "c" <= path.name[len("whole_gpu_readings_")] < letter
    )
    return [*SETS_A_B, *named]


def test_sets_m_and_n_are_held_out_new_and_every_row_plans(capsys) -> None:
    # set M after sets K and L were scored (seven helpers, two waves); set N after set M was
    # scored (four helpers; two found no usable reading, their tables keep the searched sources in
    # their skipped lists): each new against every set before it
    assert [path.name[-7:] for path in SET_M] == [f"m{n}.toml" for n in range(1, 8)]
    assert [path.name[-7:] for path in SET_N] == [f"n{n}.toml" for n in range(1, 5)]
    assert _sets_up_to("m") == [*SETS_A_B, *SET_C, *SET_D, *SET_E, *SET_F, *SET_G, *SET_H,
                                *SET_I, *SET_J, *SET_K, *SET_L]  # fmt: skip
    _check_new_held_out_set(SET_M, _sets_up_to("m"), 83, capsys)
    _check_new_held_out_set(SET_N, _sets_up_to("n"), 45, capsys)
    m = [row["measure"] for path in SET_M for row in accuracy.load_rows(path)]
    n = [row["measure"] for path in SET_N for row in accuracy.load_rows(path)]
    assert m.count("nvml") == 40
    assert (n.count("nvml"), n.count("reserved")) == (2, 12)


def test_sets_o_and_p_are_held_out_new_and_every_row_plans(capsys) -> None:
    # set O after set N was scored, set P after set O (three helpers each): no whole-GPU reading
    # was left in their source families; O's 9 and P's 42 allocated readings, P's 7 reserved
    assert [path.name[-7:] for path in SET_O] == [f"o{n}.toml" for n in range(1, 4)]
    assert [path.name[-7:] for path in SET_P] == [f"p{n}.toml" for n in range(1, 4)]
    _check_new_held_out_set(SET_O, _sets_up_to("o"), 9, capsys)
    _check_new_held_out_set(SET_P, _sets_up_to("p"), 49, capsys)
    o = [row["measure"] for path in SET_O for row in accuracy.load_rows(path)]
    p = [row["measure"] for path in SET_P for row in accuracy.load_rows(path)]
    assert o.count("allocated") == 9
    assert (p.count("allocated"), p.count("reserved"), p.count("nvml")) == (42, 7, 0)


def test_one_id_in_two_tables_is_refused(tmp_path, capsys) -> None:
    table = tmp_path / "t.toml"
    table.write_text(
        'split = "held_out"\n[[reading]]\nid = "x"\nmeasure = "nvml"\n'
        'hwdash_args = "--model qwen2.5-0.5b"\ngpu = "h200"\nper_gpu_gib = 1.0\n'
    )
    with pytest.raises(SystemExit):
        accuracy.main(["--check-args", "--file", str(table), "--file", str(table)])
    assert "a reading id is in two tables: x" in capsys.readouterr().err
