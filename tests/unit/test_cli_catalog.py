"""``hwdash catalog list|validate`` through the real command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hwdash.cli import main
from hwdash.core.catalog import load_catalog
from hwdash.core.models.params import count_parameters
from hwdash.core.specs import Accelerator, Flavor, ModelSpec
from hwdash.core.units import MIB

DATA = Path(__file__).resolve().parent.parent / "data"
BAD = DATA / "catalog_bad"
USER = DATA / "catalog_user"


@pytest.fixture(autouse=True)
def _no_user_catalog(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the developer's own ~/.config/hwdash/catalog and HWDASH_CATALOG out of every test."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "empty-config"))
    monkeypatch.delenv("HWDASH_CATALOG", raising=False)


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> list[dict[str, object]]:
    assert main(list(argv)) == 0
    data = json.loads(capsys.readouterr().out)
    assert isinstance(data, list)
    return data


def test_list_json_flavors_has_every_field(capsys: pytest.CaptureFixture[str]) -> None:
    rows = _json(capsys, "catalog", "list", "--kind", "flavors", "--json")
    catalog = load_catalog()
    assert [row["id"] for row in rows] == list(catalog.flavors)
    for row in rows:
        assert set(row) == set(Flavor.model_fields)
        assert Flavor.model_validate(row) == catalog.flavors[str(row["id"])]


def test_list_json_accelerators_adds_usable_bytes(capsys: pytest.CaptureFixture[str]) -> None:
    rows = {
        str(row["id"]): row
        for row in _json(capsys, "catalog", "list", "--kind", "accelerators", "--json")
    }
    assert set(rows["t4"]) == set(Accelerator.model_fields) | {"usable_bytes"}
    assert rows["t4"]["usable_bytes"] == 15360 * MIB
    assert rows["h200"]["usable_bytes"] == 143771 * MIB
    assert isinstance(rows["cpu"]["usable_bytes"], int)


def test_list_json_models_adds_counted_params(capsys: pytest.CaptureFixture[str]) -> None:
    rows = {
        str(row["id"]): row
        for row in _json(capsys, "catalog", "list", "--kind", "models", "--json")
    }
    catalog = load_catalog()
    assert set(rows) == set(catalog.models)
    row = rows["mixtral-8x7b"]
    assert set(row) == set(ModelSpec.model_fields) | {"counted_params"}
    assert row["counted_params"] == count_parameters(catalog.models["mixtral-8x7b"])
    assert (row["experts"], row["experts_per_token"]) == (8, 2)


@pytest.mark.parametrize("kind", ["flavors", "accelerators", "models", "frameworks", "slowdowns"])
def test_list_table_shows_every_id(kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["catalog", "list", "--kind", kind]) == 0
    out = capsys.readouterr().out
    catalog = load_catalog()
    ids = {
        "flavors": catalog.flavors,
        "accelerators": catalog.accelerators,
        "models": catalog.models,
        "frameworks": catalog.frameworks,
        "slowdowns": catalog.slowdowns,
    }
    assert f"hwdash catalog: {kind} ({len(ids[kind])})" in out
    for ident in ids[kind]:
        assert ident in out


def test_frameworks_list_what_each_sets_and_a_user_override_wins(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["catalog", "list", "--kind", "frameworks"]) == 0
    out = capsys.readouterr().out
    # torchtune's stated defaults, and its full fine-tuning overrides in their own column
    torchtune = next(line for line in out.splitlines() if "torchtune" in line)
    assert "loss chunked" in torchtune and "optimizer in backward on" in torchtune
    rows = {
        row["id"]: row for row in _json(capsys, "catalog", "list", "--kind", "frameworks", "--json")
    }
    assert rows["torchtune"]["loss"] == "chunked"
    assert rows["torchtune"]["sources"]["loss"]  # every stated default carries its source
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "frameworks.toml").write_text(
        '[[framework]]\nid = "torchtune"\nname = "our fork"\nloss = "standard"\n'
        '[framework.sources]\nloss = "our recipe"\n'
    )
    mine = _json(
        capsys, "catalog", "list", "--kind", "frameworks", "--json", "--catalog", str(folder)
    )
    (ours,) = [row for row in mine if row["id"] == "torchtune"]
    assert (ours["name"], ours["loss"], ours["full"]["optimizer_in_backward"]) == (
        "our fork",
        "standard",
        None,
    )


def test_slowdowns_list_their_factor_and_source(capsys: pytest.CaptureFixture[str]) -> None:
    rows = {
        row["id"]: row for row in _json(capsys, "catalog", "list", "--kind", "slowdowns", "--json")
    }
    catalog = load_catalog()
    assert set(rows) == set(catalog.slowdowns)
    assert rows["qlora"]["factor"] == catalog.slowdowns["qlora"].factor
    assert all(row["source"] for row in rows.values())
    assert main(["catalog", "list", "--kind", "slowdowns"]) == 0
    assert f"x{catalog.slowdowns['qlora'].factor:g}" in capsys.readouterr().out


def test_catalog_alone_lists_flavors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["catalog"]) == 0
    out = capsys.readouterr().out
    assert "hwdash catalog: flavors" in out and "a100-large" in out and "$2.50" in out


def test_unknown_kind_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["catalog", "list", "--kind", "gpus"])
    assert caught.value.code == 2
    assert "--kind" in capsys.readouterr().err


def test_validate_builtin_prints_one_ok_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["catalog", "validate"]) == 0
    catalog = load_catalog()
    out = capsys.readouterr().out
    assert out == (
        f"catalog OK: {len(catalog.files)} files, {len(catalog.accelerators)} accelerators, "
        f"{len(catalog.flavors)} flavors, {len(catalog.models)} models, "
        f"{len(catalog.frameworks)} frameworks, {len(catalog.slowdowns)} slowdowns\n"
    )


def test_validate_user_folder_counts_its_entries(capsys: pytest.CaptureFixture[str]) -> None:
    builtin = load_catalog()
    assert main(["catalog", "validate", str(USER)]) == 0
    out = capsys.readouterr().out
    # The example adds one accelerator and one flavor, and overrides one flavor.
    assert f"{len(builtin.accelerators) + 1} accelerators" in out
    assert f"{len(builtin.flavors) + 1} flavors" in out


@pytest.mark.parametrize("name", sorted(p.name for p in BAD.glob("*.toml")))
def test_validate_bad_file_exits_2_with_one_line(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = BAD / name
    assert main(["catalog", "validate", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"hwdash: catalog error: {path}")
    assert "Traceback" not in captured.err


def test_validate_folder_without_toml_files_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["catalog", "validate", str(tmp_path)]) == 2
    assert "no .toml files" in capsys.readouterr().err


def test_validate_missing_path_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["catalog", "validate", str(tmp_path / "nope.toml")]) == 2
    assert "no such catalog folder or file" in capsys.readouterr().err


def test_python_dash_m_validate_bad_file_has_no_traceback() -> None:
    path = BAD / "wrong_type.toml"
    env = {**os.environ, "XDG_CONFIG_HOME": str(DATA / "no-such-config")}
    env.pop("HWDASH_CATALOG", None)
    result = subprocess.run(
        [sys.executable, "-m", "hwdash", "catalog", "validate", str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        f"hwdash: catalog error: {path}: model 'wrong-type-model': field 'layers': "
        "Input should be a valid integer (got 'twelve')"
    ]


@pytest.mark.parametrize(
    "argv",
    [
        ["--catalog", str(USER), "catalog", "list", "--kind", "accelerators", "--json"],
        ["catalog", "--catalog", str(USER), "list", "--kind", "accelerators", "--json"],
        ["catalog", "list", "--kind", "accelerators", "--json", "--catalog", str(USER)],
    ],
)
def test_catalog_flag_before_or_after_the_subcommand(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    ids = [row["id"] for row in _json(capsys, *argv)]
    assert "rtx-4080" in ids and "t4" in ids


def test_catalog_flag_overrides_a_flavor_in_the_listing(capsys: pytest.CaptureFixture[str]) -> None:
    rows = _json(capsys, "catalog", "list", "--json", "--catalog", str(USER))
    by_id = {row["id"]: row for row in rows}
    assert by_id["local-rtx-4090"]["price_per_hour"] == 0.15
    assert by_id["my-rtx-4080-box"]["accelerator"] == "rtx-4080"


def test_env_catalog_reaches_the_command(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("HWDASH_CATALOG", str(USER))
    ids = [row["id"] for row in _json(capsys, "catalog", "list", "--json")]
    assert "my-rtx-4080-box" in ids
