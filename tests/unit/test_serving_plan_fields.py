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


def test_max_num_batched_tokens_needs_an_engine_and_is_left_out_unset() -> None:
    with pytest.raises(ValidationError, match="--max-num-batched-tokens: needs --engine vllm"):
        Plan(model="qwen2.5-7b", method=Method.INFERENCE, max_num_batched_tokens=4096)
    serving = Plan(model="qwen2.5-7b", method=Method.INFERENCE, engine=Engine.VLLM)
    assert "max_num_batched_tokens" not in serving.model_dump(mode="json")
    given = serving.model_copy(update={"max_num_batched_tokens": 4096})
    written = given.model_dump(mode="json")
    assert written["max_num_batched_tokens"] == 4096
    assert Plan.model_validate(written) == given
    argv = plan_arguments(given)
    assert argv[argv.index("--max-num-batched-tokens") + 1] == "4096"


def test_max_num_batched_tokens_sets_the_profile_run_and_a_sliding_layers_blocks() -> None:
    """Mistral-7B v0.1 (all 32 layers sliding, window 4096) on one L40S under vLLM V1 at
    --max-model-len 32768. A sliding layer's blocks per request (kv_cache_interface.py
    SlidingWindowSpec): cdiv(min(4096 - 1 + batched, 32768), 16) + 1: at the engine row's 2048,
    cdiv(6143, 16) + 1 = 385; at 4096, cdiv(8191, 16) + 1 = 513. One group of 32 layers."""
    from hwdash.core.catalog import load_catalog
    from hwdash.core.estimator.architecture import architecture
    from hwdash.core.estimator.serving import serving_memory
    from hwdash.core.models.config import resolve_model
    from hwdash.core.planning.serving_plan import serving_settings

    catalog = load_catalog(include_user=False)
    arch = architecture(resolve_model("mistral-7b", catalog))
    gpu = catalog.accelerators["l40s"]
    plan = Plan(model="mistral-7b", method=Method.INFERENCE, engine=Engine.VLLM, seq=32768)
    default = serving_settings(plan)
    given = serving_settings(plan.model_copy(update={"max_num_batched_tokens": 4096}))
    assert default is not None and given is not None
    assert (default.max_num_batched_tokens, given.max_num_batched_tokens) == (None, 4096)
    before = serving_memory(arch, gpu, default, engines=catalog.engines or None)
    after = serving_memory(arch, gpu, given, engines=catalog.engines or None)
    assert (before.profile_tokens, after.profile_tokens) == (2048, 4096)
    assert after.activation_bytes > before.activation_bytes
    assert before.groups is not None and after.groups is not None
    assert (before.groups.count, after.groups.count) == (1, 1)
    assert (before.request_blocks, after.request_blocks) == (385, 513)
