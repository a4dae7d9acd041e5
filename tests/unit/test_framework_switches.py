"""Issue 24: every boolean a ``--framework`` switches on has a ``--no-...`` flag that turns it off,
and the output lists every default the framework applied (not only the savers)."""

from __future__ import annotations

import json

import pytest

from hwdash.cli import build_parser, main
from hwdash.commands.plan import FIELD_FLAGS, apply_framework_defaults, plan_from_args
from hwdash.commands.plan_args import plan_arguments
from hwdash.core.catalog import load_catalog
from hwdash.core.estimator.savers import framework_settings
from hwdash.core.plan import Method
from hwdash.core.specs import FrameworkSettings

pytestmark = pytest.mark.usefixtures("quiet_machine")

CATALOG = load_catalog(include_user=False)

#: (framework, method, plan field) for every boolean a packaged framework turns on, read from the
#: catalog itself: a new entry or a new boolean is checked without touching this file.
SWITCHED_ON = [
    (framework_id, method, name)
    for framework_id, entry in sorted(CATALOG.frameworks.items())
    for method in (Method.LORA, Method.FULL)
    for name, value in sorted(framework_settings(entry, method).items())
    if value is True and name in FIELD_FLAGS
]
#: Booleans that describe how a framework's own code is written, not a setting a run changes:
#: no plan field, no flag (plan the other way with another --framework).
NOT_PLAN_FIELDS = {"fsdp1_adapters_share_units"}


def test_every_switched_boolean_but_the_framework_facts_is_a_plan_field() -> None:
    switched = {
        name
        for entry in CATALOG.frameworks.values()
        for method in (Method.LORA, Method.FULL)
        for name, value in framework_settings(entry, method).items()
        if value is True
    }
    assert switched - set(FIELD_FLAGS) == NOT_PLAN_FIELDS


def _plan_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:  # type: ignore[type-arg]
    status = main(["plan", "--model", "llama-3.2-1b", *argv, "--json"])
    out = capsys.readouterr().out
    assert status == 0, out
    document: dict = json.loads(out)  # type: ignore[type-arg]
    return document


def _framework_line(out: str, framework: str) -> str:
    """The printed "framework F: ..." line, its wrapped parts joined (it ends at the table)."""
    lines = out.splitlines()
    start = next(i for i, text in enumerate(lines) if text.startswith(f"framework {framework}:"))
    end = next(i for i in range(start, len(lines)) if lines[i][:1] in "┏┌+")
    return " ".join(text.strip() for text in lines[start:end])


def test_the_frameworks_do_switch_booleans_on() -> None:
    # the parametrised test below is not vacuous: torchtune and unsloth turn these on
    assert ("torchtune", Method.LORA, "grad_ckpt") in SWITCHED_ON
    assert ("torchtune", Method.FULL, "optimizer_in_backward") in SWITCHED_ON
    assert ("unsloth", Method.LORA, "activation_offload") in SWITCHED_ON


@pytest.mark.parametrize(("framework", "method", "name"), SWITCHED_ON)
def test_no_flag_turns_a_framework_default_off(
    framework: str, method: Method, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = FIELD_FLAGS[name].split("/")
    off = "--no-" + name.replace("_", "-")
    assert off in flags
    base = ("--framework", framework, "--method", method.value)
    on = _plan_json(capsys, *base)
    assert on["framework_defaults"][name] is True
    switched = _plan_json(capsys, *base, off)
    assert switched["plan"][name] is False
    assert name not in switched["framework_defaults"]  # the user chose it, not the framework
    # plan -> plan_arguments -> hwdash plan's parser: the same plan, still off
    args = build_parser().parse_args(["plan", "--model", "llama-3.2-1b", *base, off])
    plan = apply_framework_defaults(plan_from_args(args), CATALOG, [*base, off])
    written = plan_arguments(plan, CATALOG.framework_for(plan))
    assert off in written
    again = build_parser().parse_args(["plan", *written])
    assert apply_framework_defaults(plan_from_args(again), CATALOG, written) == plan


def test_json_lists_every_default_torchtune_applied(capsys: pytest.CaptureFixture[str]) -> None:
    document = _plan_json(capsys, "--framework", "torchtune", "--method", "lora")
    assert document["framework_defaults"] == {
        "precision": "bf16",
        "grad_ckpt": True,
        "optimizer": "adamw",
        "optimizer_impl": "fused",
        "loss": "chunked",
        "compile": False,
        "activation_offload": False,
        "sync_each_batch": True,
        "qlora_frozen_dtype": "bf16",
        "adapter_dtype": "bf16",
    }
    typed = _plan_json(
        capsys, "--framework", "torchtune", "--method", "lora", "--optimizer", "adamw-8bit"
    )
    assert "optimizer" not in typed["framework_defaults"]
    assert typed["framework_defaults"]["optimizer_impl"] == "fused"


def test_text_line_lists_unsloth_optimizer_and_checkpointing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status = main(
        ["plan", "--model", "llama-3.2-1b", "--framework", "unsloth", "--method", "qlora"]
    )
    out = capsys.readouterr().out
    assert status == 0
    line = _framework_line(out, "unsloth")
    assert "optimizer adamw-8bit" in line
    assert "grad_ckpt on" in line
    assert "activation offload" in line  # in the savers' words, said once
    status = main(
        [
            "plan",
            "--model",
            "llama-3.2-1b",
            "--framework",
            "unsloth",
            "--method",
            "qlora",
            "--no-grad-ckpt",
            "--optimizer",
            "adamw",
        ]
    )
    out = capsys.readouterr().out
    line = _framework_line(out, "unsloth")
    assert "grad_ckpt" not in line and "optimizer adamw" not in line


def test_text_line_lists_torchtune_precision(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(
        ["plan", "--model", "llama-3.2-1b", "--framework", "torchtune", "--method", "full"]
    )
    out = capsys.readouterr().out
    assert status == 0
    line = _framework_line(out, "torchtune")
    for words in (
        "precision bf16",
        "grad_ckpt on",
        "optimizer adamw-8bit-paged",
        "optimizer in backward",
        "sync_each_batch on",
    ):
        assert words in line


def test_every_boolean_a_framework_may_state_has_a_no_flag() -> None:
    # a user catalog's [[framework]] may turn on any of these: each needs its off switch
    booleans = [
        name
        for name, info in FrameworkSettings.model_fields.items()
        if info.annotation == (bool | None) and name not in NOT_PLAN_FIELDS
    ]
    assert "grad_ckpt" in booleans and "compile" in booleans
    for name in booleans:
        off = "--no-" + name.replace("_", "-")
        args = build_parser().parse_args(["plan", "--model", "llama-3.2-1b", off])
        assert getattr(plan_from_args(args), name) is False, off


def test_a_default_the_plan_cannot_use_is_not_listed(capsys: pytest.CaptureFixture[str]) -> None:
    # torchtune's optimizer in backward needs one micro-batch per step: with accumulation it is off
    document = _plan_json(
        capsys, "--framework", "torchtune", "--method", "full", "--grad-accum", "4"
    )
    assert "optimizer_in_backward" not in document["framework_defaults"]
    assert document["framework_defaults"]["optimizer"] == "adamw-8bit-paged"
