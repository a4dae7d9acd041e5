"""The estimator against the traced training steps of ``bench/data/calibration.csv`` (issue 5).

The CSV is committed ground truth from fake-tensor traces (``bench/calibrate.py``); this test needs
no torch: it rebuilds each row's plan, runs ``estimate_memory`` and compares its total without the
overhead component with the traced peak, through ``bench/estimator_errors.py`` (which also converts
CPU-only storage, LoRA dropout masks, to what CUDA keeps; the bf16 LoRA rows are traced under
autocast). It turns the accuracy claim of
``docs/accuracy.md`` into a regression test.
"""

from __future__ import annotations

import importlib.util
import statistics
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load_scorer() -> ModuleType:
    path = REPO / "bench" / "estimator_errors.py"
    spec = importlib.util.spec_from_file_location("estimator_errors", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["estimator_errors"] = module
    spec.loader.exec_module(module)
    return module


scorer = _load_scorer()

#: Architectures whose layers do things the estimator does not count yet, with what (read off the
#: traces; see the estimator helper's report). Their rows are checked separately, loosely.
#: (issue 14 closed Phi-2's: gelu_new intermediates and its parallel block's one LayerNorm)
KNOWN_GAPS: dict[str, str] = {}
#: Row kinds the estimator does not model yet.
KNOWN_GAP_ROWS = {
    "/dora/bf16/b2/s1024/nockpt": (
        "DoRA with dropout: step-1 weight-norm transients held by reference cycles until collected"
    ),
}


def _gap(row: object) -> str:
    case_id = row.case_id  # type: ignore[attr-defined]
    model = row.model  # type: ignore[attr-defined]
    if model in KNOWN_GAPS:
        return KNOWN_GAPS[model]
    for marker, why in KNOWN_GAP_ROWS.items():
        if marker in case_id:
            return why
    return ""


@pytest.fixture(scope="module")
def scored() -> list:
    rows = scorer.load_rows(scorer.CALIBRATION_CSV)
    # the built-in catalog plus the held-out architectures of issue 14
    return scorer.score(rows, scorer.calibration_catalog())


def test_the_csvs_cover_every_method(scored: list) -> None:
    methods = {row.method for row in scored}
    assert {"full", "lora", "dora", "inference"} <= methods
    assert len(scored) >= 150
    assert sum(1 for row in scored if getattr(row, "expressible", False)) >= 150


@pytest.mark.parametrize("method", ["full", "lora", "inference"])
def test_median_within_5_and_worst_within_12_percent(scored: list, method: str) -> None:
    # issue 5's goal, per method, on every row of the tuning grid the plan can express, known gaps
    # aside (the held-out cases of issue 14 are scored apart: test_held_out_cases_are_scored)
    group = [
        r for r in scored if r.method == method and r.expressible and not _gap(r) and not r.held_out
    ]
    assert len(group) >= 15
    errors = [r.error for r in group]
    assert statistics.median(abs(e) for e in errors) <= 0.05
    worst = max(group, key=lambda r: abs(r.error))
    assert abs(worst.error) <= 0.12, worst.case_id


def test_known_gaps_stay_within_their_documented_size(scored: list) -> None:
    # The gaps are underestimates of known mechanisms; pin their size so a change that widens them
    # (or closes them: then move the model out of KNOWN_GAPS) shows up.
    gaps = [r for r in scored if r.expressible and _gap(r) and not r.held_out]
    assert gaps
    for row in gaps:
        assert -0.45 <= row.error <= 0.12, row.case_id


@pytest.mark.parametrize(
    "case_id",
    [
        # held-out models (not used to fit or derive the phase model), one per mechanism
        "tinyllama-1.1b/full/bf16/b2/s1024/nockpt/sdpa/adamw-foreach",
        "mistral-7b/full/amp/b2/s1024/ckpt/sdpa/adamw-foreach",
        "mixtral-8x7b/full/bf16/b2/s1024/nockpt/sdpa/adamw-foreach",
        "seed-200m/lora/amp/b2/s1024/nockpt/sdpa/adamw-foreach/r16-all-linear-d0.05",
        "qwen2.5-1.5b/lora/bf16/b2/s1024/ckpt/sdpa/adamw-foreach/r16-all-linear-d0.05",
        "mistral-7b/lora/bf16/b2/s1024/nockpt/sdpa/adamw-foreach/r16-all-linear-d0.05",
        "phi-2/full/bf16/b2/s1024/ckpt/sdpa/adamw-foreach",
        "tinyllama-1.1b/inference/bf16/b1/s4096/nockpt/sdpa",
        # tuned models: optimizer temporaries, master copy, accumulation-free backward
        "qwen2.5-7b/full/mixed/b2/s1024/nockpt/sdpa/adamw-foreach",
        "qwen2.5-7b/full/bf16/b2/s1024/nockpt/sdpa/adafactor-single",
        "llama-3.2-1b/full/bf16/b2/s1024/nockpt/sdpa/sgd-foreach",
    ],
)
def test_pinned_rows(scored: list, case_id: str) -> None:
    row = next(r for r in scored if r.case_id == case_id)
    assert row.expressible
    assert abs(row.error) <= 0.12
    # the estimator names the phase the trace peaked in (forward counts as backward's start: the
    # forward's loss tensors are a subset of what backward starts with)
    traced = {"optimizer": "optimizer step", "prefill": "prefill"}.get(
        row.traced_phase, "start of backward"
    )
    assert row.estimated_phase == traced


def _load_cases() -> ModuleType:
    sys.path.insert(0, str(REPO / "bench"))
    try:
        from calibration import cases
    finally:
        sys.path.remove(str(REPO / "bench"))
    return cases


def test_held_out_cases_are_scored(scored: list) -> None:
    # issue 14: every held-out case of the grid has a traced row, marked held out, with an estimate;
    # the new architectures are all among them, and no row outside the held-out grid is marked.
    cases = _load_cases()
    wanted = {case.case_id for case in cases.held_out_grid()}
    held = {row.case_id: row for row in scored if row.held_out}
    assert set(held) == wanted
    assert set(cases.HELD_OUT_MODELS) <= {row.model for row in held.values()}
    for row in held.values():
        assert row.measured > 0 and row.estimated > 0, row.case_id
        assert abs(row.error) < 1.0, row.case_id
