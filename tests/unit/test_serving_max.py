"""``--max seq|batch|gpus`` on a serving plan answer with the engine's memory: the longest
``--max-model-len`` it starts with, its concurrency as the batch, the fewest TP GPUs. Each answer
is re-planned: the engine starts at the answer and refuses one step past it."""

from __future__ import annotations

import json

import pytest
from monitor_cli import run_plan

SERVE = ["--method", "inference", "--engine", "vllm", "--max-model-len", "32768"]


def _plan(capsys: pytest.CaptureFixture[str], *flags: str) -> dict:  # type: ignore[type-arg]
    status, out, err = run_plan(capsys, *flags, "--json")
    assert status == 0, err
    return json.loads(out)


@pytest.mark.parametrize(
    ("model", "flavor", "gpus", "version"),
    [
        ("llama-3.1-8b", "l4x1", "1", "v1"),
        ("qwen2.5-7b", "l4x1", "1", "v0"),
        ("gemma-3-27b", "a100-large", "1", "v1"),
        ("mistral-7b", "l4x1", "1", "v1"),
    ],
)
def test_longest_model_len_starts_and_one_more_does_not(
    capsys: pytest.CaptureFixture[str], model: str, flavor: str, gpus: str, version: str
) -> None:
    base = ["--model", model, *SERVE, "--engine-version", version, "--flavor", flavor]
    base += ["--gpus", gpus]
    answer = _plan(capsys, *base, "--max", "seq")["max"]
    value = answer["value"]
    assert value is not None
    at = ["--model", model, *SERVE[:4], "--engine-version", version, "--flavor", flavor]
    at += ["--gpus", gpus, "--max-model-len"]
    fits = _plan(capsys, *at, str(value))
    assert fits["serving"]["kv_tokens"] >= value or fits["serving"]["max_concurrency"] >= 1
    assert {f["id"]: f["fit"] for f in fits["flavors"]}[flavor] == "fits"
    assert answer["headroom_bytes"] >= 0
    if answer["bounded_by"] is not None:  # the model's context: nothing longer to try
        assert value == fits["plan"]["max_model_len"]
        return
    over = _plan(capsys, *at, str(value + 1))
    assert {f["id"]: f["fit"] for f in over["flavors"]}[flavor] == "no"


def test_the_models_context_caps_the_answer(capsys: pytest.CaptureFixture[str]) -> None:
    flags = ["--model", "qwen2.5-0.5b", *SERVE, "--flavor", "a100-large", "--max", "seq"]
    answer = _plan(capsys, *flags)["max"]
    assert answer["value"] == 32768  # qwen2.5-0.5b's max_position_embeddings
    assert "context" in answer["bounded_by"]


def test_fewest_gpus_divide_the_heads_and_one_size_fewer_does_not_start(
    capsys: pytest.CaptureFixture[str],
) -> None:
    flags = ["--model", "llama-3.1-70b", *SERVE, "--flavor", "a100x4", "--gpus", "4"]
    answer = _plan(capsys, *flags, "--max", "gpus")["max"]
    assert answer["value"] == 2
    two = _plan(capsys, "--model", "llama-3.1-70b", *SERVE, "--flavor", "a100x4", "--gpus", "2")
    assert two["serving"]["max_concurrency"] >= 1
    one = _plan(capsys, "--model", "llama-3.1-70b", *SERVE, "--flavor", "a100-large")
    assert {f["id"]: f["fit"] for f in one["flavors"]}["a100-large"] == "no"


def test_a_servers_batch_is_its_concurrency(capsys: pytest.CaptureFixture[str]) -> None:
    flags = ["--model", "llama-3.1-8b", *SERVE, "--flavor", "l4x1"]
    batch = _plan(capsys, *flags, "--max", "batch")["max"]
    concurrency = _plan(capsys, *flags, "--max", "concurrency")["max"]
    assert batch["field"] == "batch"
    assert (
        batch["value"]
        == concurrency["value"]
        == _plan(capsys, *flags)["serving"]["max_concurrency"] // 1
    )
    _status, out, _err = run_plan(capsys, *flags, "--max", "batch")
    assert "a server's" in out


def test_the_planners_max_column_is_the_same_answer(capsys: pytest.CaptureFixture[str]) -> None:
    from hwdash.core.catalog import load_catalog
    from hwdash.core.plan import Engine, Method, Plan
    from hwdash.core.planning.fit import evaluate_plan
    from hwdash.core.planning.max_fit import MaxField
    from hwdash.core.planning.serving_max import serving_max_by_flavor

    catalog = load_catalog(include_user=False)
    plan = Plan(
        model="llama-3.1-8b", method=Method.INFERENCE, engine=Engine.VLLM, max_model_len=32768
    )
    column = serving_max_by_flavor(evaluate_plan(plan, catalog), MaxField.SEQ, catalog)
    flags = ["--model", "llama-3.1-8b", *SERVE, "--flavor", "l4x1", "--max", "seq"]
    assert column["l4x1"].value == _plan(capsys, *flags)["max"]["value"]
