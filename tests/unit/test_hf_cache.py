"""Models from the local Hugging Face cache: found offline, listed, and a clear error otherwise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hwdash.cli import main

CONFIG = {
    "model_type": "llama",
    "num_hidden_layers": 4,
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 688,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
}


def fill_cache(root: Path, repo_id: str, config: dict[str, object]) -> None:
    """The layout huggingface_hub writes: refs/main names a snapshot holding the files."""
    repo = root / ("models--" + repo_id.replace("/", "--"))
    commit = "0123456789abcdef0123456789abcdef01234567"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    blob = repo / "blobs" / "c0ffee"
    blob.parent.mkdir()
    blob.write_text(json.dumps(config))
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").symlink_to(blob)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "hub"
    root.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HWDASH_FAKE_NVML", "no-driver")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return root


def test_a_cached_model_is_planned_from_its_config(
    cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fill_cache(cache, "acme/tiny-llama", CONFIG)
    assert main(["plan", "--model", "acme/tiny-llama", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)["plan"]
    assert plan["model_name"] == "acme/tiny-llama"
    assert plan["total_params"] > 0


def test_cached_models_are_listed_with_the_catalog(
    cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fill_cache(cache, "acme/tiny-llama", CONFIG)
    assert main(["catalog", "list", "--kind", "models", "--json"]) == 0
    ids = {entry["id"] for entry in json.loads(capsys.readouterr().out)}
    assert "acme/tiny-llama" in ids and "qwen2.5-7b" in ids


def test_a_model_in_neither_place_says_where_hwdash_looked(
    cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", "--model", "acme/absent-model"]) == 2
    err = capsys.readouterr().err
    assert str(cache) in err and "never fetches" in err
