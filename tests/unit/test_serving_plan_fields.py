"""The serving settings as Plan fields (issue 30): the Plan refuses them as ``hwdash plan`` did
(each message naming its flag), a plan without them writes what it wrote before, and a saved
serving plan, its JSON ``plan``, ``plan compare`` and a written command line carry them."""

from __future__ import annotations

import json

import pytest
from monitor_cli import run_plan
from pydantic import ValidationError

from hwdash.cli import main
from hwdash.commands.plan_args import plan_arguments
from hwdash.core.plan import Engine, EngineVersion, KvDtype, Method, Plan
from hwdash.core.plan_unused import unused_settings
from hwdash.core.plans.store import PlanStore

pytestmark = pytest.mark.usefixtures("quiet_machine")

SERVE = [
    *("--model", "qwen2.5-7b", "--method", "inference", "--engine", "vllm", "--flavor", "l4x1"),
    *("--max-model-len", "8192", "--max-num-seqs", "64", "--kv-dtype", "fp8"),
]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"max_model_len": 4096}, "--max-model-len: needs --engine vllm or sglang"),
        ({"kv_dtype": "fp8"}, "--kv-dtype: needs --engine vllm or sglang"),
        ({"engine": "vllm"}, "--engine: a serving engine runs inference, not lora"),
        (
            {"method": "inference", "engine": "sglang", "gpu_memory_utilization": 0},
            "--gpu-memory-utilization: 0 is not a share of the GPU",
        ),
    ],
)
def test_the_plan_refuses_serving_settings_where_they_do_not_apply(
    fields: dict[str, object], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        Plan(model="qwen2.5-7b", **fields)


def test_a_plan_without_an_engine_writes_what_it_wrote_before() -> None:
    written = Plan(model="qwen2.5-7b", method=Method.INFERENCE).model_dump(mode="json")
    assert not {"engine", "engine_version", "max_model_len", "kv_dtype"} & set(written)
    serving = Plan(
        model="qwen2.5-7b", method=Method.INFERENCE, engine=Engine.VLLM, max_model_len=8192
    )
    written = serving.model_dump(mode="json")
    assert written["engine"] == "vllm" and written["max_model_len"] == 8192
    assert "kv_dtype" not in written and "engine_version" not in written
    assert Plan.model_validate(written) == serving


def test_saved_json_and_written_command_line_carry_the_serving_settings(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # 400,000 tokens: the engine's pool on an L4 holds no such sequence, one generate call fits
    long = [*SERVE, "--max-model-len", "400000", "--flavor", "h200"]
    status, out, _err = run_plan(capsys, *long, "--save", "server", "--json")
    assert status == 0
    document = json.loads(out)
    assert document["recommended"] == "h200"
    assert document["plan"]["engine"] == "vllm" and document["plan"]["max_num_seqs"] == 64
    [saved] = PlanStore().list()
    plan = saved.plan
    assert (plan.engine, plan.max_model_len, plan.kv_dtype) == (Engine.VLLM, 400000, KvDtype.FP8)
    assert plan.max_num_seqs == 64
    argv = plan_arguments(plan)
    assert argv[argv.index("--engine") + 1] == "vllm"
    assert argv[argv.index("--max-model-len") + 1] == "400000"
    # the saved summary and compare's recomputed one are the serving plan's (best flavor by
    # the engine's pool, as --json's "recommended")
    assert saved.summary is not None
    assert saved.summary.best_flavor == document["recommended"]
    assert main(["compare", "--json"]) == 0
    [entry] = json.loads(capsys.readouterr().out)["plans"]
    assert entry["plan"]["engine"] == "vllm" and entry["recomputed"]
    assert entry["summary"]["best_flavor"] == document["recommended"]
    # and so is their memory: what the engine takes on h200, not one generate call's
    engine_total = document["serving"]["total_bytes"]
    assert document["memory"]["total"] == engine_total
    assert saved.summary.per_gpu_total == engine_total
    assert entry["summary"]["per_gpu_total"] == engine_total


def test_engine_version_warns_without_vllm(capsys: pytest.CaptureFixture[str]) -> None:
    plan = Plan(
        model="qwen2.5-7b",
        method=Method.INFERENCE,
        engine=Engine.SGLANG,
        engine_version=EngineVersion.V0,
    )
    assert [name for name, _why in unused_settings(plan, ["engine_version"])] == ["engine_version"]
    args = [*SERVE[:5], "sglang", "--flavor", "l4x1", "--engine-version", "v0"]
    status, out, _err = run_plan(capsys, *args)
    assert status == 0 and "--engine-version does nothing here: only --engine vllm" in out
