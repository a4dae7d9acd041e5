"""The public whole-GPU readings table of issue 29 and its mechanical derive / held-out split.

These tests never plan a row: the held-out rows' hwdash numbers stay unseen until the end of the issue.
"""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import shlex
import statistics
import sys
from pathlib import Path
from types import ModuleType

import pytest
import tomllib

REPO = Path(__file__).resolve().parents[2]
READINGS = REPO / "bench" / "data" / "whole_gpu_readings.toml"


def _load_bench(name: str) -> ModuleType:
    """bench/NAME.py as a module (bench/ is a folder of scripts, not a package)."""
    path = REPO / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


split = _load_bench("whole_gpu_split")


def _rows() -> list[dict]:
    with READINGS.open("rb") as fh:
        return tomllib.load(fh)["reading"]


def test_split_rule_matches_the_issue_by_hand() -> None:
    # The rule written out independently of the script: odd sha256 of the id -> held_out.
    for row_id in ("peft-ds-zero3-lora-llama2-70b-8xh100", "swift-zero2-qwen25-7b-lora-2gpu", "x"):
        digest = int(hashlib.sha256(row_id.encode()).hexdigest(), 16)
        assert split.split_for(row_id) == ("held_out" if digest % 2 else "derive")
    # Worked by hand: sha256("x") ends in hex ...1a4881 (last digit 1: odd), sha256("c") in ...5aefc6 (6: even).
    assert split.split_for("x") == "held_out"
    assert split.split_for("c") == "derive"


def test_committed_table_passes_the_check() -> None:
    assert split.main(["--file", str(READINGS)]) == 0


def test_table_has_both_halves_and_enough_rows() -> None:
    rows = _rows()
    assert len(rows) >= 30
    halves = {row["split"] for row in rows}
    assert halves == {"derive", "held_out"}
    assert {row["measure"] for row in rows} >= {"nvml", "allocated", "reserved"}
    # multi-GPU or offloaded, as the issue asks
    assert all(row["gpus"] > 1 or row["offload"] != "none" for row in rows)


def test_check_fails_on_a_flipped_split(tmp_path: Path) -> None:
    text = READINGS.read_text(encoding="utf-8")
    rows = _rows()
    first = rows[0]
    wrong = "derive" if first["split"] == "held_out" else "held_out"
    bad = text.replace(f'split = "{first["split"]}"', f'split = "{wrong}"', 1)
    path = tmp_path / "readings.toml"
    path.write_text(bad, encoding="utf-8")
    assert split.main(["--file", str(path)]) == 1
    found = split.problems(split.load_rows(path), split.accelerator_ids())
    assert found == [f"{first['id']}: split is {wrong!r}, the rule gives {first['split']!r}"]


def test_assign_rewrites_only_the_split_lines(tmp_path: Path) -> None:
    text = READINGS.read_text(encoding="utf-8")
    scrambled = text.replace('split = "derive"', 'split = "?"').replace(
        'split = "held_out"', 'split = "?"'
    )
    path = tmp_path / "readings.toml"
    path.write_text(scrambled, encoding="utf-8")
    assert split.main(["--file", str(path), "--assign"]) == 0
    assert path.read_text(encoding="utf-8") == text


def test_check_rejects_unknown_gpu_and_fields(tmp_path: Path) -> None:
    row = dict(_rows()[0])
    row["gpu"] = "a100"  # not a catalog id
    row["parallel"] = "zero4"
    del row["seq_len"]
    found = split.problems([row], split.accelerator_ids())
    assert f"{row['id']}: missing seq_len" in found
    assert any("gpu 'a100'" in line for line in found)
    assert any("parallel 'zero4'" in line for line in found)


def test_every_row_replans_its_own_configuration() -> None:
    # hwdash_args must say what the row says (without running a plan): model, GPU count and micro-batch.
    for row in _rows():
        argv = shlex.split(row["hwdash_args"])
        opts = dict(itertools.pairwise(argv))
        assert opts.get("--model") == row["model"], row["id"]
        assert int(opts.get("--gpus", "1")) == row["gpus"], row["id"]
        assert int(opts.get("--batch", "1")) == row["micro_batch"], row["id"]
        assert int(opts.get("--seq", "2048")) == row["seq_len"], row["id"]
        assert ("--grad-ckpt" in argv) == row["grad_checkpointing"], row["id"]
        if row["parallel"].startswith("zero"):
            assert opts.get("--zero") == row["parallel"][-1], row["id"]
        if row["parallel"].startswith("fsdp"):
            assert opts.get("--fsdp") == "full", row["id"]
        if row["offload"] == "optimizer+params":
            assert "--fsdp-offload" in argv or opts.get("--offload") == "params", row["id"]
        model = row["model"]
        if model.endswith(".json"):
            assert (REPO / model).is_file(), row["id"]


@pytest.mark.parametrize("measure", ["nvml", "allocated", "reserved"])
def test_measure_kinds_are_documented_in_the_header(measure: str) -> None:
    header = READINGS.read_text(encoding="utf-8").split("\n[[reading]]\n", 1)[0]
    assert measure in header


def test_accuracy_bench_compares_each_reading_with_its_own_figure() -> None:
    """A reserved reading is scored against the estimate's reserved pool, an allocated one
    against the allocator's peak and an nvml one against the whole GPU (three distinct numbers)."""
    bench = _load_bench("whole_gpu_accuracy")
    from hwdash.core.results import MemoryBreakdown, MemoryEstimate

    estimate = MemoryEstimate(
        per_gpu=MemoryBreakdown(weights=100, overhead=30),
        gpus=2,
        allocated_bytes=100,
        reserved_bytes=108,
    )
    assert bench.figure(estimate, "allocated") == 100
    assert bench.figure(estimate, "reserved") == 108
    assert bench.figure(estimate, "nvml") == 130


def test_the_distributed_pools_are_the_fit_of_the_seen_readings() -> None:
    """catalog/software.toml's ``[[allocator_pool]]`` for ``distributed``, ``param_offload`` and
    ``megatron`` is what bench/fit_allocator_pool.py computes from the seen sets (each kind's form
    chosen by leaving one set out): a change that moves the tensors of those rows, or the rows
    themselves, shows here."""
    _load_bench("whole_gpu_accuracy")  # fit_allocator_pool imports it by name
    module = _load_bench("fit_allocator_pool")
    from hwdash.core.catalog import load_catalog

    # every scored set, A to M
    assert len(module.SEEN) == 32
    rows = module.implied()
    counts = {kind: len([row for row in rows if row.kind == kind]) for kind in module.KINDS}
    assert counts == {"distributed": 163, "param_offload": 40, "megatron": 88}
    assert all(row.measure in ("nvml", "reserved") for row in rows)
    # hwdash's 21 H100 runs of sets E, F and H3 vote once each (by their reserved reading)
    own = [row for row in rows if row.id.startswith("h100-")]
    assert len(own) == 21 and all(row.measure == "reserved" for row in own)
    software = load_catalog(include_user=False).software
    assert software is not None
    fitted = {kind: module.fit(rows, kind) for kind in module.KINDS}
    held = {kind: (software.pool_base(kind), software.pool_fraction(kind)) for kind in module.KINDS}
    assert held == {kind: (pool.base, pool.fraction) for kind, pool in fitted.items()}
    assert {kind: pool.form for kind, pool in fitted.items()} == {
        "distributed": "median",
        "param_offload": "base+fraction",
        "megatron": "median",
    }
    assert held["param_offload"] == (14 * module.QUARTER_GIB, 0.12)
    # the split the fit follows shows in hwdash's own runs, one setup: offloaded parameters pool more
    own_offloaded = statistics.median(row.fraction for row in own if row.kind == "param_offload")
    own_kept = statistics.median(row.fraction for row in own if row.kind == "distributed")
    assert own_offloaded > own_kept + 0.15


def test_one_source_has_one_vote_in_the_pool_fit() -> None:
    """bench/fit_allocator_pool.py weighs each source's rows together: six rows of one benchmark
    pooling 50% do not outvote three sources pooling 10%."""
    _load_bench("whole_gpu_accuracy")
    module = _load_bench("fit_allocator_pool")
    gib = module.GIB

    def row(name: str, pool: float, source: str) -> object:
        return module.Implied(name, "nvml", 2, 10 * gib, int(pool * 10 * gib), 20 * gib,
                              "distributed", name, source)  # fmt: skip

    rows = [row(f"big{i}", 0.5, "one/benchmark") for i in range(6)]
    rows += [row("a", 0.1, "a/repo"), row("b", 0.1, "b/repo"), row("c", 0.1, "c/repo")]
    assert module.fit_form(rows, "median").fraction == 0.1
    assert statistics.median(r.fraction for r in rows) == 0.5  # one vote per row would say 0.5
    assert module.source_of("https://github.com/huggingface/trl/blob/abc/benchmark/report.md") == (
        "huggingface/trl"
    )
    assert module.source_of("https://huggingface.co/datasets/nanotron/old_bench/x") == (
        "nanotron/old_bench"
    )
    assert module.weighted_median([1.0, 2.0, 3.0], [1.0, 1.0, 1.0]) == 2.0


def test_a_pool_form_is_kept_by_its_error_on_the_sets_left_out() -> None:
    """bench/fit_allocator_pool.py keeps, for a kind, the form whose fit on the other sets scores a
    left-out set best; built rows with a fixed pool pick the form with a base, and its fit finds
    the base."""
    _load_bench("whole_gpu_accuracy")
    module = _load_bench("fit_allocator_pool")
    gib = module.GIB
    rows = [
        module.Implied(
            f"r{i}", "nvml", 2, alloc * gib, 3 * gib, (alloc + 4) * gib, "param_offload", t
        )
        for i, (alloc, t) in enumerate(
            [(4, "a"), (8, "a"), (16, "b"), (32, "b"), (64, "c"), (128, "c"), (12, "d"), (48, "d")]
        )
    ]
    pool = module.fit(rows, "param_offload")
    assert (pool.form, pool.base, pool.fraction) == ("base+fraction", 3 * gib, 0.0)
    assert module.leave_one_set_out(rows, "base+fraction") == 0.0
    assert module.leave_one_set_out(rows, "median") > 0.1
    # a pool proportional to the tensors keeps the median form (the first among equals)
    proportional = [
        module.Implied(
            r.id, r.measure, 2, r.allocated, r.allocated // 5, r.reading, r.kind, r.table
        )
        for r in rows
    ]
    pool = module.fit(proportional, "param_offload")
    assert (pool.form, pool.base, pool.fraction) == ("median", 0, 0.2)


def test_sets_e_f_and_h3_are_what_the_table_writer_makes_of_the_raw_device_output() -> None:
    """Every field of hwdash's own H100 readings comes from bench/data/device_h100/ and the runs'
    settings (bench/whole_gpu_device_table.py): a reading typed or edited by hand shows here."""
    _load_bench("gpu_runs")  # whole_gpu_device imports its NVML sampler by name
    _load_bench("whole_gpu_device")  # and the table writer imports whole_gpu_device
    writer = _load_bench("whole_gpu_device_table")
    assert writer.main(["e", "--check"]) == 0
    assert writer.main(["f", "--check"]) == 0
    # set E: the 9 runs that finished (the first call's ZeRO-2 run timed out and ran again in the
    # second); set F: 4 of 5 (the fifth timed out)
    assert len(writer._runs("e")) == 9 and len(writer._runs("f")) == 4
    # set H3: the second call's 5 finished runs (nvml, reserved, allocated), then the 3 runs of the
    # first call that the second lacks (its JSON did not come back: reserved and allocated only)
    assert writer.main(["h", "--check"]) == 0
    runs = writer._runs("h")
    assert [("nvml_peak_over_baseline" in run) for run in runs] == [True] * 5 + [False] * 3
    assert len({run["name"] for run in runs}) == 8
    text = (REPO / "bench" / "data" / "whole_gpu_readings_h3.toml").read_text()
    assert text.count('measure = "nvml"') == 5 and text.count("[[reading]]") == 21
    assert text.count("grad_checkpointing = false") == 6  # two runs without, three readings each
