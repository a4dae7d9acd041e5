"""``--from`` an axolotl config that trains under FSDP: the older spelling (the Trainer's ``fsdp``
words and an ``fsdp_config`` block of accelerate's ``fsdp_``-prefixed keys) and the newer one (a
top-level ``fsdp_version`` and an unprefixed block alone: axolotl/utils/schemas/fsdp.py). Before,
both were ignored and the run planned as plain data parallelism."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_plan_import import AXOLOTL, plan_command, planned, write_yaml

from hwdash.core.fsdp_modes import FsdpStateDict
from hwdash.core.plan import FsdpMode
from hwdash.core.plans.imports import read_plan_file

pytestmark = pytest.mark.usefixtures("quiet_machine")

OLDER = [
    "fsdp:",
    "  - full_shard",
    "  - auto_wrap",
    "fsdp_config:",
    "  fsdp_version: 2",
    "  fsdp_offload_params: false",
    "  fsdp_transformer_layer_cls_to_wrap: Qwen2DecoderLayer",
    "  fsdp_state_dict_type: SHARDED_STATE_DICT",
]
NEWER = [
    "fsdp_version: 2",
    "fsdp_config:",
    "  offload_params: true",
    "  state_dict_type: FULL_STATE_DICT",
    "  auto_wrap_policy: TRANSFORMER_BASED_WRAP",
    "  transformer_layer_cls_to_wrap: Qwen2DecoderLayer",
    "  reshard_after_forward: false",
]


def test_the_older_spelling_is_read_as_the_trainer_reads_it(tmp_path: Path) -> None:
    found = read_plan_file(write_yaml(tmp_path / "axolotl.yaml", AXOLOTL + OLDER))
    assert found.updates["fsdp"] is FsdpMode.FULL
    assert found.updates["fsdp_offload"] is False
    assert found.updates["fsdp_version"] == 2
    assert found.updates["fsdp_state_dict"] is FsdpStateDict.SHARDED


def test_the_newer_block_alone_turns_fsdp_on(tmp_path: Path) -> None:
    found = read_plan_file(write_yaml(tmp_path / "axolotl.yaml", AXOLOTL + NEWER))
    # reshard_after_forward: false is SHARD_GRAD_OP; offload_params sets the CPU offload
    assert found.updates["fsdp"] is FsdpMode.SHARD_GRAD_OP
    assert found.updates["fsdp_offload"] is True
    assert found.updates["fsdp_version"] == 2
    assert found.updates["fsdp_state_dict"] is FsdpStateDict.FULL
    resharded = [line.replace("false", "true") for line in NEWER]
    again = read_plan_file(write_yaml(tmp_path / "again.yaml", AXOLOTL + resharded))
    assert again.updates["fsdp"] is FsdpMode.FULL


def test_no_version_anywhere_is_fsdp1(tmp_path: Path) -> None:
    lines = ["fsdp:", "  - full_shard", "fsdp_config:", "  fsdp_offload_params: true"]
    found = read_plan_file(write_yaml(tmp_path / "axolotl.yaml", AXOLOTL + lines))
    assert found.updates["fsdp_version"] == 1 and found.updates["fsdp_offload"] is True
    without = read_plan_file(write_yaml(tmp_path / "plain.yaml", AXOLOTL))
    assert "fsdp" not in without.updates


def test_an_fsdp_run_is_planned_sharded_and_nothing_is_ignored(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = write_yaml(tmp_path / "axolotl.yaml", AXOLOTL + NEWER)
    plan, err = planned(capsys, path)
    assert plan["fsdp"] == "shard-grad-op" and plan["fsdp_offload"] is True
    ignored = [line for line in err.splitlines() if "ignored" in line]
    assert not any("fsdp" in line for line in ignored), ignored


def test_a_block_that_is_not_a_table_or_a_bad_reshard_is_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = write_yaml(tmp_path / "a.yaml", [*AXOLOTL, "fsdp: [full_shard]", "fsdp_config: 3"])
    status, _, err = plan_command(capsys, path)
    assert status == 2 and "fsdp_config" in err
    bad = [*AXOLOTL, "fsdp_version: 2", "fsdp_config:", "  reshard_after_forward: sometimes"]
    status, _, err = plan_command(capsys, write_yaml(tmp_path / "b.yaml", bad))
    assert status == 2 and "fsdp_config.reshard_after_forward" in err


def test_a_bad_top_level_version_is_named_as_written(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bad = [*AXOLOTL, "fsdp_version: 3", "fsdp_config:", "  offload_params: true"]
    status, _, err = plan_command(capsys, write_yaml(tmp_path / "v.yaml", bad))
    assert status == 2 and "'fsdp_version'" in err and "fsdp_config.version" not in err
