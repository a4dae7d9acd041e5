"""Issue 23: `--export FORMAT` then `--from` the file, for every method and every format: the plan
comes back, or every setting the file could not carry is named in a warning (never lost silently)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from monitor_cli import run_plan

from hwdash.commands.plan import FIELD_FLAGS
from hwdash.core.plan import Method, Plan
from hwdash.core.plans.exports import EXPORT_FORMATS

pytestmark = pytest.mark.usefixtures("quiet_machine")


SUFFIXES = {"trainer": ".py", "deepspeed": ".json", "accelerate": ".yaml", "hf-jobs": ".sh"}
MODEL = "qwen2.5-0.5b"


def test_every_export_format_is_covered() -> None:
    assert set(SUFFIXES) == set(EXPORT_FORMATS)


@pytest.mark.parametrize("kind", EXPORT_FORMATS)
@pytest.mark.parametrize("method", [m.value for m in Method])
def test_a_round_trip_keeps_the_method_or_says_what_it_lost(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, method: str, kind: str
) -> None:
    given = ["--model", MODEL, "--method", method, "--flavor", "l4x1"]
    if kind == "hf-jobs":
        given += ["--examples", "1k"]  # its timeout needs the run's length (no config holds it)
    path = tmp_path / f"plan{SUFFIXES[kind]}"
    status, _out, export_err = run_plan(capsys, *given, "--export", kind, "-o", str(path))
    if status == 2:  # a format that cannot hold this plan says so and writes nothing
        assert "hwdash plan: error: --export:" in export_err and not path.exists()
        return
    assert status in (0, 1), export_err
    # The model is given again: DeepSpeed and accelerate configs name none (that is an error).
    status, out, from_err = run_plan(
        capsys, "--model", MODEL, "--flavor", "l4x1", "--from", str(path), "--json"
    )
    if kind == "hf-jobs":  # a launch command: no plan to read back, said as such
        assert status == 2 and "hf-jobs command" in from_err and "Traceback" not in from_err
        return
    assert status == 0, from_err
    status, original_out, _ = run_plan(capsys, *given, "--json")
    original, back = json.loads(original_out)["plan"], json.loads(out)["plan"]
    lost = [name for name in Plan.model_fields if name in original and original[name] != back[name]]
    said = export_err + from_err
    for name in lost:
        assert FIELD_FLAGS[name] in said, f"{name}: {original[name]} -> {back[name]} unsaid"
    if back["method"] != method:
        # the reader of the file names the setting it could not carry, and what it assumed
        assert f"--method {back['method']}" in from_err, from_err
