"""The command line prints what bench/golden/ recorded (issue 25: restructuring changes nothing a user
sees). Every command of bench/golden/commands.txt runs in-process (about 2 s for all of them); a
difference fails with its unified diff. After an intended change of output, re-record with
``python bench/golden_transcripts.py record`` and say in the commit why the transcript moved.
Under a Python other than bench/golden/python-version.txt, transcripts that argparse wrote (help,
usage errors) are not compared: argparse's layout changes between versions."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def _load_golden() -> ModuleType:
    path = REPO / "bench" / "golden_transcripts.py"
    spec = importlib.util.spec_from_file_location("golden_transcripts", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


golden = _load_golden()


@pytest.fixture(scope="module")
def results() -> dict:
    return golden.run_all(golden.read_commands())


def test_every_transcript_is_identical(results: dict) -> None:
    diffs = golden.differences(results)
    if diffs:
        pytest.fail(
            f"{len(diffs)} of {len(results)} CLI transcripts differ from bench/golden/ "
            "(re-record with `python bench/golden_transcripts.py record` only if the change is "
            "meant):\n" + "\n".join(diffs),
            pytrace=False,
        )


def test_the_list_covers_the_command_line() -> None:
    commands = golden.read_commands()
    assert len(commands) >= 40
    args = [command.args for command in commands]

    def count(*words: str) -> int:
        return sum(all(word in line.split() for word in words) for line in args)

    for subcommand in ("plan", "catalog", "monitor", "compare", "exporter"):
        assert count(subcommand, "--help") >= 1, subcommand
    assert count("plan", "--fit") >= 2
    assert count("plan", "--check") >= 2
    for export in ("deepspeed", "trainer", "accelerate", "hf-jobs"):
        assert count("--export", export) >= 1, export
    assert count("plan", "--from") >= 4
    for kind in ("models", "flavors", "accelerators", "frameworks"):
        assert count("catalog", "list", kind) == 2, kind  # text and --json
    assert count("compare", "--list") == 1 and count("compare", "--json") == 1
    assert count("monitor", "--once") >= 8 and count("monitor", "--once", "--json") >= 3
    # every golden file belongs to a listed command (a renamed slug leaves none behind)
    listed = {command.path for command in commands}
    assert set(golden.GOLDEN.glob("[0-9][0-9]*-*.txt")) == listed


def test_bad_input_exits_2_with_one_message(results: dict) -> None:
    bad = {command: text for command, text in results.items() if command.slug.startswith("bad-")}
    assert len(bad) >= 10
    for command, text in bad.items():
        assert "exit: 2\n" in text, command.slug
        stderr = text.split("--- stderr\n", 1)[1]
        assert "error:" in stderr and "Traceback" not in stderr, command.slug


def test_a_changed_transcript_is_reported_with_its_diff(results: dict) -> None:
    command = next(c for c in results if c.slug == "plan-lora-ckpt")
    assert golden.differences({command: results[command]}) == []
    changed = results[command].replace("exit: 0\n", "exit: 1\n", 1)
    diffs = golden.differences({command: changed})
    assert len(diffs) == 1
    assert "--- bench/golden/08-plan-lora-ckpt.txt (golden)" in diffs[0]
    assert "\n-exit: 0\n+exit: 1\n" in diffs[0]


def test_what_differs_between_runs_is_normalised(tmp_path: Path) -> None:
    text = (
        f"saved plan to {tmp_path}/data/plans.json at 2026-11-26T02:15:00+00:00\n"
        '{"timestamp": 1795659286.7870996, "host": {"cpu_percent": null, "load_average": [1.1], '
        '"ram_total_bytes": 25276510208}, "gpus": [{"host": null}], "sample_seconds": 0.0031}\n'
        "host cpu n/a ram 1.5/23.5 GiB load 1.25\n"
    )
    assert golden.normalise(text, tmp_path) == (
        "saved plan to <TMP>/data/plans.json at <DATETIME>\n"
        '{"timestamp": "<TIME>", "host": "<HOST>", "gpus": [{"host": null}], '
        '"sample_seconds": "<TIME>"}\n'
        "host <HOST>\n"
    )
