"""``hwdash plan`` on good and bad input: exit codes, messages naming the flag, the JSON shape."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hwdash.cli import main
from hwdash.core.plans.store import PlanStore

DATA = Path(__file__).resolve().parent.parent / "data"
FIXTURE = str(DATA / "catalog_estimator")


pytestmark = pytest.mark.usefixtures("isolated_home")


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:  # type: ignore[type-arg]
    status = main(["plan", *argv, "--json"])
    out = capsys.readouterr().out
    assert status == 0, out
    document: dict = json.loads(out)  # type: ignore[type-arg]
    return document


def test_issue_example_prints_breakdown_and_flavors(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(
        [
            "plan",
            "--model",
            "qwen2.5-7b",
            "--method",
            "lora",
            "--batch",
            "4",
            "--seq",
            "2048",
            "--grad-ckpt",
        ]
    )
    out = capsys.readouterr().out
    assert status == 0
    for word in (
        "weights",
        "activations",
        "overhead",
        "total",
        "a10g-large",
        "a100-large",
        "cheapest",
    ):
        assert word in out


def test_json_shape(capsys: pytest.CaptureFixture[str]) -> None:
    document = _json(
        capsys, "--model", "qwen2.5-7b", "--method", "lora", "--examples", "1000", "--seq", "1024"
    )
    assert set(document) >= {"plan", "memory", "host_memory", "flavors", "recommended", "warnings"}
    memory = document["memory"]
    components = ["weights", "gradients", "optimizer", "activations", "kv_cache", "overhead"]
    assert list(memory) == [*components, "total", "allocated", "reserved", "whole_gpu"]
    assert memory["total"] == sum(memory[name] for name in components)
    # the three totals: the tensors, the allocator's pool around them, and the whole GPU (the total)
    assert memory["allocated"] < memory["reserved"] < memory["whole_gpu"] == memory["total"]
    assert all(isinstance(value, int) for value in memory.values())
    assert document["plan"]["model_id"] == "qwen2.5-7b"
    assert document["plan"]["method"] == "lora"
    assert document["plan"]["tokens"] == 1000 * 1024
    for entry in document["flavors"]:
        assert entry["fit"] in ("fits", "tight", "no")
        assert isinstance(entry["headroom_bytes"], int)
    ids = [entry["id"] for entry in document["flavors"]]
    assert document["recommended"] in ids
    assert isinstance(document["warnings"], list)


def test_flavor_restriction_repeatable_and_comma_separated(
    capsys: pytest.CaptureFixture[str],
) -> None:
    document = _json(
        capsys,
        "--catalog",
        FIXTURE,
        "--model",
        "fx-1b",
        "--flavor",
        "small-24,big-80",
        "--flavor",
        "home-80",
    )
    assert sorted(entry["id"] for entry in document["flavors"]) == ["big-80", "home-80", "small-24"]


def test_params_gives_a_synthetic_model(capsys: pytest.CaptureFixture[str]) -> None:
    document = _json(capsys, "--params", "7B", "--method", "qlora", "--flavor", "t4-small")
    assert document["plan"]["total_params"] == pytest.approx(7e9, rel=0.03)
    assert document["plan"]["model"] == "7B"


@pytest.mark.parametrize("stages", ["2", "4"])
def test_params_model_splits_over_pipeline_stages(
    capsys: pytest.CaptureFixture[str], stages: str
) -> None:
    # a synthetic 7B has Llama-7B's 32 layers (it had 33, and --pp 2 was refused)
    document = _json(capsys, "--params", "7B", "--method", "full", "--pp", stages, "--gpus", stages)
    assert document["plan"]["pp"] == int(stages)


def test_config_json_model(capsys: pytest.CaptureFixture[str]) -> None:
    config = str(DATA / "model_configs" / "mixtral-style" / "config.json")
    document = _json(capsys, "--model", config, "--method", "qlora", "--flavor", "a100-large")
    assert document["plan"]["total_params"] == pytest.approx(46.7e9, rel=0.01)


def test_rl_flags_reach_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    document = _json(
        capsys,
        "--model",
        "qwen2.5-0.5b",
        "--method",
        "grpo",
        "--rl-method",
        "lora",
        "--no-reference",
        "--reward-model",
        "--vllm-util",
        "0.5",
        "--flavor",
        "a100-large",
    )
    plan = document["plan"]
    assert plan["rl_method"] == "lora"
    assert plan["rl_reference"] is False
    assert plan["rl_reward_model"] is True
    assert plan["vllm_memory_utilization"] == 0.5
    # The breakdown uses the named flavor's GPU: half of an A100's 80 GiB for vLLM.
    assert document["memory"]["kv_cache"] == 40 * 1024**3


def test_t4_plan_says_fp16(capsys: pytest.CaptureFixture[str]) -> None:
    document = _json(capsys, "--model", "qwen2.5-0.5b", "--method", "full", "--flavor", "t4-small")
    assert document["plan"]["compute_dtype"] == "fp16"
    assert any("fp16" in warning for warning in document["warnings"])


def test_save_stores_the_plan(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    document = _json(
        capsys, "--model", "qwen2.5-0.5b", "--save", "small run", "--flavor", "t4-small"
    )
    assert document["saved_as"] == "small run"
    store = PlanStore(tmp_path / "data" / "hwdash" / "plans.json")
    saved = store.get("small run")
    assert saved is not None
    assert saved.plan.model == "qwen2.5-0.5b"
    assert saved.summary is not None
    assert saved.summary.memory["total"] == document["memory"]["total"]


@pytest.mark.parametrize(
    ("argv", "flag", "fragment"),
    [
        (["--model", "qwen2.5-7b", "--batch", "0"], "--batch", "must be at least 1, got 0"),
        (["--model", "qwen2.5-7b", "--zero", "5"], "--zero", "must be at most 3, got 5"),
        (["--model", "qwen2.5-7b", "--seq", "-3"], "--seq", "must be at least 1, got -3"),
        (["--model", "qwen2.5-7b", "--mfu", "1.5"], "--mfu", "must be at most 1, got 1.5"),
        (["--model", "qwen2.5-7b", "--vllm-util", "1"], "--vllm-util", "must be less than 1"),
        (["--model", "nope-7b"], "--model", "unknown model"),
        (["--model", "qwen2.5-7"], "--model", "did you mean"),
        (["--params", "seven"], "--params", "is not a count"),
        (["--model", "qwen2.5-7b", "--params", "7B"], "--params", "not both"),
        ([], "--model", "which model"),
        (["--model", "qwen2.5-7b", "--offload", "optimizer"], "--offload", "needs ZeRO"),
        (["--model", "qwen2.5-7b", "--zero", "2", "--offload", "params"], "--offload", "stage 3"),
        (["--model", "qwen2.5-7b", "--method", "inference", "--zero", "3"], "--zero", "inference"),
        (["--model", "qwen2.5-7b", "--flavor", "a100-huge"], "--flavor", "unknown flavor"),
        (["--model", "phi-2", "--lora-targets", "gate_proj"], "--lora-targets", "no module"),
        (["--model", "qwen2.5-0.5b", "--method", "qlora", "--lora-r", "4096"], "--lora-r", "wider"),
        (
            ["--model", str(DATA / "model_configs" / "bad" / "unsupported.json")],
            "--model",
            "not supported",
        ),
        (["--model", "1000T"], "--model", "too large to size"),
        (["--model", "9" * 400], "--model", "unknown model"),  # parses as float infinity
        (["--model", "x" * 300], "--model", "unknown model"),  # too long for a file name
        (["--model", "7B", "--mfu", "1e-300"], "--mfu", "must be at least 0.001, got 1e-300"),
    ],
)
def test_bad_input_exits_2_naming_the_flag(
    capsys: pytest.CaptureFixture[str], argv: list[str], flag: str, fragment: str
) -> None:
    status = main(["plan", *argv])
    captured = capsys.readouterr()
    assert status == 2
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith(f"hwdash plan: error: {flag}: ")
    assert fragment in lines[0]
    assert "Traceback" not in captured.err


@pytest.mark.parametrize(
    "argv",
    [
        ["--model", "x", "--method", "sft"],
        ["--model", "x", "--precision", "fp8"],
        ["--model", "x", "--attn", "xformers"],
        ["--model", "x", "--batch", "two"],
        ["--model", "x", "--examples", "many"],
        ["--model", "x", "--examples", "9" * 400],
        ["--model", "x", "--tokens", "9" * 400 + "T"],
        ["--model", "x", "--rl-method", "inference"],
    ],
)
def test_argparse_rejections_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["plan", *argv])
    assert info.value.code == 2
    # argparse's refusals read like hwdash's own: "hwdash plan: error: --batch: ..."
    err = capsys.readouterr().err
    assert err.startswith(f"hwdash plan: error: {argv[2]}: ") and "argument" not in err


def test_help_documents_every_precision_layout(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "master copy" in out  # mixed
    assert "autocast" in out  # amp
    assert "TRL and torchtune" in out  # bf16
    assert "Everything fp32" in out  # fp32


@pytest.mark.parametrize("columns", ["80", "160"])
def test_reasons_are_readable_at_any_width(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, columns: str
) -> None:
    monkeypatch.setenv("COLUMNS", columns)
    status = main(["plan", "--model", "qwen2.5-7b", "--flavor", "t4-small,cpu-basic"])
    out = capsys.readouterr().out
    assert status == 0
    flat = " ".join(out.split())
    assert "CPU only: no GPU memory" in flat
    assert "needs" in flat and "has 15.0 GiB" in flat
    # the suggested command of the fit options stays one unbroken line, to be copied
    lines = [line for line in out.splitlines() if not line.startswith("try: hwdash plan ")]
    assert max(len(line) for line in lines) <= int(columns)


@pytest.mark.parametrize(
    ("flags", "warned"),
    [
        (["--method", "inference", "--examples", "100"], ["--examples", "use --tokens"]),
        (["--method", "inference", "--grad-ckpt"], ["--grad-ckpt", "does not train"]),
        (["--method", "full", "--rl-method", "dora"], ["--rl-method", "only RL plans"]),
        (["--method", "full", "--lora-r", "8"], ["--lora-r", "LoRA-style"]),
        (["--method", "grpo", "--rl-method", "full", "--lora-dropout", "0"], ["--lora-dropout"]),
    ],
)
def test_flags_the_method_ignores_are_warned_about(
    capsys: pytest.CaptureFixture[str], flags: list[str], warned: list[str]
) -> None:
    assert main(["plan", "--model", "qwen2.5-0.5b", *flags, "--json"]) == 0
    warnings = json.loads(capsys.readouterr().out)["warnings"]
    unused = [w for w in warnings if "does nothing here" in w]
    assert len(unused) == 1 and all(part in unused[0] for part in warned), warnings


@pytest.mark.parametrize(
    "flags",
    [
        ["--method", "lora", "--lora-r", "8", "--grad-ckpt", "--examples", "100"],
        ["--method", "grpo", "--rl-method", "lora", "--lora-r", "8", "--no-reference"],
        ["--method", "inference", "--tokens", "1000"],
        ["--method", "full"],  # the defaults of unused settings are never warned about
    ],
)
def test_flags_the_method_uses_are_not_warned_about(
    capsys: pytest.CaptureFixture[str], flags: list[str]
) -> None:
    assert main(["plan", "--model", "qwen2.5-0.5b", *flags, "--json"]) == 0
    warnings = json.loads(capsys.readouterr().out)["warnings"]
    assert not [w for w in warnings if "does nothing here" in w], warnings


def test_the_header_says_the_precision_once(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "qwen2.5-0.5b", "--precision", "bf16"]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert header.count("bf16") == 1, header
    assert main(["plan", "--model", "qwen2.5-0.5b", "--precision", "mixed"]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert "mixed (bf16 compute)" in header, header


def test_an_unknown_model_message_reads_as_sentences(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--model", "zzzz-unknown"]) == 2
    err = capsys.readouterr().err
    assert "like 7B). See `hwdash catalog list --kind models`." in err, err


def test_the_flavor_table_at_80_columns_keeps_the_verdict_and_the_numbers_whole(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A terminal of 80 columns: the flavor's name and marks wrap, the note becomes a number,
    # and fit, free GiB, GPUs, $/h, hours and cost are never cut to "…".
    monkeypatch.setenv("HWDASH_FAKE_NVML", "no-driver")
    monkeypatch.setenv("COLUMNS", "80")
    args = ["--model", "qwen2.5-7b", "--method", "lora", "--examples", "10000"]
    flavors = ["--flavor", "a10g-large", "--flavor", "l4x1", "--flavor", "local-a100-80gb"]
    assert main(["plan", *args, *flavors]) == 0
    out = capsys.readouterr().out
    table = out[out.index("flavors, cheapest first:") :]
    assert all(len(line) <= 80 for line in table.splitlines())
    assert "…" not in table
    assert main(["plan", *args, *flavors, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    for row in document["flavors"]:
        line = next(line for line in table.splitlines() if line.startswith(f"│ {row['id']} "))
        cells = [cell.strip() for cell in line.strip("│").split("│")]
        assert cells[1] == row["fit"]
        assert cells[2] == f"{row['headroom_bytes'] / 2**30:+.1f}"
        assert cells[3] == str(row["gpu_count"])
