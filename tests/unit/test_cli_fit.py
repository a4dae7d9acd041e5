"""`hwdash plan --fit`, `--check` and this machine as the `local` flavor, end to end."""

from __future__ import annotations

import json

import pytest

from hwdash.cli import main


@pytest.fixture(autouse=True)
def no_real_gpus(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    # Every test says which GPUs "this machine" has: none unless it picks a scenario.
    monkeypatch.setenv("HWDASH_FAKE_NVML", "no-driver")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))


def plan_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:  # type: ignore[type-arg]
    status = main(["plan", *args, "--json"])
    out = capsys.readouterr().out
    assert status == 0, out
    return json.loads(out)  # type: ignore[no-any-return]


def test_every_option_reruns_to_the_same_verdict_on_the_target(
    capsys: pytest.CaptureFixture[str],
) -> None:
    document = plan_json(
        capsys,
        "--model",
        "mistral-7b",
        "--method",
        "full",
        "--batch",
        "4",
        "--seq",
        "1024",
        "--fit",
        "l4x1",
    )
    fit = document["fit"]
    assert fit["target"] == "l4x1" and not fit["fits_already"]
    assert fit["options"]
    for option in fit["options"]:
        args = option["args"]
        if "--flavor" not in args:
            args = [*args, "--flavor", option["flavor"]]
        again = plan_json(capsys, *args)
        (flavor,) = again["flavors"]
        assert flavor["id"] == option["flavor"]
        assert flavor["fit"] == option["verdict"]
        assert again["memory"]["total"] == option["memory_total"]
        assert {change["field"] for change in option["changes"]}
        assert isinstance(option["keeps_experiment"], bool)
        assert option["slowdown"] is None or option["slowdown"] > 0


def test_the_human_table_names_the_changes_and_a_command_to_try(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status = main(["plan", "--model", "qwen2.5-7b", "--batch", "4", "--fit", "l4x1"])
    out = capsys.readouterr().out
    assert status == 0
    assert "to fit l4x1:" in out
    assert "checkpointing" in out and "kept" in out
    assert "try: hwdash plan --model qwen2.5-7b" in out


def test_nothing_fitting_without_fit_shows_three_options_for_a_close_flavor(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status = main(["plan", "--model", "llama-3.1-70b", "--method", "full"])
    out = capsys.readouterr().out
    assert status == 0
    assert "recommended: none" in out
    assert "(nothing fits: the cheapest flavor that comes close):" in out
    rows = [line for line in out.splitlines() if line.startswith("│ ") and line[2].isdigit()]
    assert 1 <= len(rows) <= 3


def test_nothing_to_try_is_said_with_no_options(capsys: pytest.CaptureFixture[str]) -> None:
    document = plan_json(
        capsys, "--model", "llama-3.1-70b", "--method", "full", "--seq", "1024", "--fit", "t4-small"
    )
    assert document["fit"]["options"] == []
    assert "nothing tried fits" in document["fit"]["notes"][0]


def test_any_gives_the_cheapest_options_overall(capsys: pytest.CaptureFixture[str]) -> None:
    document = plan_json(
        capsys, "--model", "qwen2.5-7b", "--batch", "4", "--examples", "10k", "--fit", "any"
    )
    fit = document["fit"]
    assert fit["fits_already"]
    costs = [o["cost"] for o in fit["options"] if o["keeps_experiment"] and o["verdict"] == "fits"]
    assert costs == sorted(costs)


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("l4", "did you mean l4x"),
        ("nowhere", "unknown target 'nowhere'"),
        ("local", "'local' needs this machine's GPUs, but no NVIDIA driver found"),
    ],
)
def test_a_bad_target_exits_2_with_a_reason(
    capsys: pytest.CaptureFixture[str], target: str, message: str
) -> None:
    status = main(["plan", "--model", "qwen2.5-7b", "--fit", target])
    err = capsys.readouterr().err
    assert status == 2
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize("flavor", ["local", "local-free"])
@pytest.mark.parametrize("extra", [[], ["--check"]])
def test_a_local_flavor_without_gpus_says_why_not_unknown_flavor(
    capsys: pytest.CaptureFixture[str], flavor: str, extra: list[str]
) -> None:
    # The README's launch guard (`--flavor local --check`) on a machine whose NVML fails.
    status = main(["plan", "--model", "qwen2.5-7b", "--flavor", flavor, *extra])
    err = capsys.readouterr().err
    assert status == 2
    assert f"--flavor: {flavor!r} needs this machine's GPUs, but no NVIDIA driver found" in err
    assert "unknown flavor" not in err


def test_this_machine_is_a_flavor_and_local_free_uses_free_memory(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HWDASH_FAKE_NVML", "h100x8")
    document = plan_json(capsys, "--model", "qwen2.5-7b")
    local = next(f for f in document["flavors"] if f["id"] == "local")
    assert local["gpu_count"] == 8
    assert local["usable_bytes"] == 81559 * 2**20  # what the scenario's NVML reports
    assert "local-free" not in {f["id"] for f in document["flavors"]}
    free = plan_json(capsys, "--model", "qwen2.5-72b", "--method", "lora", "--fit", "local-free")
    assert free["fit"]["target"] == "local-free"
    assert all(o["flavor"] == "local-free" for o in free["fit"]["options"])
    status = main(["plan", "--model", "qwen2.5-7b"])
    assert "this machine)" in capsys.readouterr().out and status == 0


@pytest.mark.parametrize(
    ("args", "status", "start"),
    [
        (["--model", "qwen2.5-0.5b", "--flavor", "l4x1"], 0, "fits l4x1:"),
        (["--model", "qwen2.5-7b", "--batch", "8", "--flavor", "l4x1"], 1, "does not fit l4x1:"),
        (["--model", "qwen2.5-7b"], 2, ""),
        (["--model", "qwen2.5-7b", "--flavor", "l4x1,t4-small"], 2, ""),
    ],
)
def test_check_is_a_launch_guard(
    capsys: pytest.CaptureFixture[str], args: list[str], status: int, start: str
) -> None:
    assert main(["plan", *args, "--check"]) == status
    captured = capsys.readouterr()
    if status == 2:
        assert "--check" in captured.err
    else:
        (line,) = captured.out.splitlines()
        assert line.startswith(start)


def test_check_says_tight(capsys: pytest.CaptureFixture[str]) -> None:
    # Find a sequence length where the plan is tight on an L4, then check it.
    for seq in range(256, 8192, 64):
        main(["plan", "--model", "qwen2.5-1.5b", "--seq", str(seq), "--flavor", "l4x1", "--json"])
        (flavor,) = json.loads(capsys.readouterr().out)["flavors"]
        if flavor["fit"] == "tight":
            break
    else:
        pytest.fail("no tight sequence length found")
    status = main(
        ["plan", "--model", "qwen2.5-1.5b", "--seq", str(seq), "--flavor", "l4x1", "--check"]
    )
    assert status == 1
    assert capsys.readouterr().out.startswith("tight on l4x1:")


@pytest.mark.parametrize(
    "args",
    [
        # Issue 23: "FSDP + CPU offload, x3.00" ranked above "ZeRO-2 + optimizer offload, x1.50".
        ["--model", "llama-3.2-3b", "--method", "full", "--fit", "local-2x-rtx-3090"],
        ["--model", "llama-3.1-8b", "--method", "lora", "--seq", "8192", "--fit", "local-rtx-4090"],
        ["--model", "qwen2.5-3b", "--method", "full", "--fit", "l4x4"],
    ],
)
def test_options_that_keep_the_experiment_are_ranked_by_slowdown_then_cost(
    capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    options = plan_json(capsys, *args)["fit"]["options"]
    keeping = [o for o in options if o["keeps_experiment"] and o["verdict"] == "fits"]
    assert len({o["slowdown"] for o in keeping}) >= 2, "the plan must show two speeds"
    order = [(o["slowdown"], o["cost"] if o["cost"] is not None else 0.0) for o in keeping]
    assert order == sorted(order)
    # and they still come before every option that changes the experiment
    kinds = [o["keeps_experiment"] for o in options if o["verdict"] == "fits"]
    assert kinds == sorted(kinds, reverse=True)


def test_savers_at_the_plans_speed_are_found_beside_one_slow_offload(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Issue 23: one change (ZeRO-3 + parameter offload, x3) fits here, and the search stopped at
    # one change; two savers (fused-linear loss + activation offloading, x1.01) fit too and rank
    # first, as the cost to the run comes before the count of changes.
    options = plan_json(
        capsys,
        *("--model", "qwen2.5-7b", "--method", "lora", "--seq", "8192", "--grad-ckpt"),
        *("--fit", "l4x1"),
    )["fit"]["options"]
    first = options[0]
    assert first["keeps_experiment"] and first["verdict"] == "fits"
    assert first["slowdown"] < 1.1 and len(first["changes"]) >= 2
    offload = [
        o for o in options if {"field": "offload", "from": "none", "to": "params"} in o["changes"]
    ]
    assert offload and all(o["slowdown"] > first["slowdown"] for o in offload)


def test_the_table_says_keep_and_change_in_one_sense_each(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 23: the column listing an option's changes was headed "changes", and "changes" was
    # also the kind of an option that changes the experiment (beside "keeps"); "tight", a memory
    # verdict, sat in that kind column too.
    monkeypatch.setenv("COLUMNS", "200")
    # seq 7680 (8192 before issue 29's whole-GPU footprint made the tight option a "no")
    args = ["--model", "llama-3.1-8b", "--method", "lora", "--seq", "7680", "--grad-ckpt"]
    status = main(["plan", *args, "--fit", "local-rtx-4090"])
    out = capsys.readouterr().out
    assert status == 0
    table = out[out.index("to fit local-rtx-4090:") :]
    header = next(line for line in table.splitlines() if line.startswith("┃"))
    headers = [cell.strip() for cell in header.strip("┃").split("┃")]
    rows = [
        [cell.strip() for cell in line.strip("│").split("│")]
        for line in table.splitlines()
        if line.startswith("│ ") and line[2].isdigit()
    ]
    kinds = {row[headers.index("experiment")] for row in rows}
    assert kinds == {"kept", "changed"}  # the plan shows both
    assert not kinds & set(headers) and "changes" not in headers
    free = [row[headers.index("free")] for row in rows]
    assert any(cell.endswith("tight") for cell in free)
    assert "experiment kept: same model" in out


def test_nothing_fitting_the_flavor_asked_shows_options_for_that_flavor(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 23: with --flavor and no --fit, a plan that does not fit showed no option at all.
    monkeypatch.setenv("COLUMNS", "200")
    status = main(["plan", "--model", "qwen2.5-7b", "--method", "full", "--flavor", "l4x1"])
    out = capsys.readouterr().out
    assert status == 0
    assert "recommended: none" in out
    assert "to fit l4x1 (the flavor asked):" in out
    rows = [line for line in out.splitlines() if line.startswith("│ ") and line[2].isdigit()]
    assert 1 <= len(rows) <= 3
    assert "try: hwdash plan --model qwen2.5-7b" in out


def test_when_nothing_fits_the_target_its_three_closest_options_are_shown(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 23: "nothing tried fits" and nothing more. Now the target's own options that come
    # closest, least over first, said as such (never another flavor's options).
    args = ["--model", "llama-3.1-70b", "--method", "full", "--seq", "1024", "--fit", "t4-small"]
    fit = plan_json(capsys, *args)["fit"]
    assert fit["options"] == [] and "nothing tried fits" in fit["notes"][0]
    closest = fit["closest"]
    assert len(closest) == 3
    assert all(o["flavor"] == "t4-small" and o["verdict"] == "no" for o in closest)
    over = [-o["headroom_bytes"] for o in closest]
    assert all(value > 0 for value in over) and over == sorted(over)
    for option in closest:  # each re-runs to the memory shown
        again = plan_json(capsys, *option["args"], "--flavor", "t4-small")
        assert again["memory"]["total"] == option["memory_total"]
        (flavor,) = again["flavors"]
        assert flavor["fit"] == "no"
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["plan", *args]) == 0
    out = capsys.readouterr().out
    assert "the 3 options that come closest to fitting t4-small (least over its memory" in out
    assert "try:" not in out  # nothing to try that fits
