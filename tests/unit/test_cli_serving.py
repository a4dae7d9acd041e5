"""``hwdash plan --method inference --engine vllm|sglang`` end to end: the text's serving lines, the
JSON ``serving`` object, the flavor table's serving verdicts, ``--max concurrency``, ``--export
vllm`` and the refusals of bad input (a UsageError naming the flag, exit status 2)."""

from __future__ import annotations

import json

import pytest
from monitor_cli import run_plan

pytestmark = pytest.mark.usefixtures("quiet_machine")

SERVE = "--model qwen2.5-7b --method inference --engine vllm --flavor l4x1 --max-model-len 8192"
VLLM = SERVE.split()


def test_json_serving_object_for_the_flavor(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _err = run_plan(capsys, *VLLM, "--json")
    assert status == 0
    serving = json.loads(out)["serving"]
    # issue 30's fixed keys and the flavor, then the engine's memory parts (added, not renamed)
    assert set(serving) == {
        "kv_cache_bytes",
        "kv_blocks",
        "block_tokens",
        "kv_tokens",
        "max_concurrency",
        "flavor",
        "memory_fraction",
        "cuda_total_bytes",
        "budget_bytes",
        "weight_bytes",
        "activation_bytes",
        "non_torch_bytes",
        "cuda_graph_bytes",
        "context_bytes",
        "outside_budget_bytes",
        "total_bytes",
    }
    assert serving["flavor"] == "l4x1" and serving["block_tokens"] == 16
    assert serving["kv_tokens"] == 16 * serving["kv_blocks"]
    # Qwen2.5-7B: 28 layers x 2 x 4 heads x 128 x 2 bytes = 57,344 bytes per token
    assert serving["kv_blocks"] == serving["kv_cache_bytes"] // (16 * 57_344)
    assert serving["max_concurrency"] == round(serving["kv_tokens"] / 8192, 2)
    hf = json.loads(run_plan(capsys, *VLLM[:4], "--flavor", "l4x1", "--json")[1])
    assert "serving" not in hf


def test_json_memory_is_what_the_engine_takes(capsys: pytest.CaptureFixture[str]) -> None:
    """A serving plan's ``memory`` is the engine's on the shown flavor, not one generate call's:
    the budget (fraction x CUDA's total = weights + profile peak + non-torch + KV pool) and the
    CUDA-graph pool and the CUDA context on top of it; the flavor's need and free memory are the same total."""
    document = json.loads(run_plan(capsys, *VLLM, "--json")[1])
    memory, serving = document["memory"], document["serving"]
    budget = serving["budget_bytes"]
    assert budget == int(serving["memory_fraction"] * serving["cuda_total_bytes"])
    inside = serving["weight_bytes"] + serving["activation_bytes"] + serving["non_torch_bytes"]
    assert inside + serving["kv_cache_bytes"] == budget
    assert memory["kv_cache"] == serving["kv_cache_bytes"]
    assert memory["weights"] == serving["weight_bytes"]
    # one GPU: no TP buffers; the graph pool and V1's CUDA context (catalog/software.toml's
    # default row, 804,061,184 bytes: before vLLM V1's baseline snapshot) are outside the budget
    outside = serving["cuda_graph_bytes"] + serving["context_bytes"]
    assert serving["context_bytes"] == 804_061_184
    assert serving["outside_budget_bytes"] == outside
    assert memory["total"] == budget + outside == serving["total_bytes"]
    assert memory["whole_gpu"] == memory["total"]
    row = next(row for row in document["flavors"] if row["id"] == "l4x1")
    assert row["need_bytes"] == memory["total"]
    # the same plan as one transformers generate call needs far less than the engine's budget
    hf = json.loads(run_plan(capsys, *VLLM[:4], "--flavor", "l4x1", "--json")[1])
    assert hf["memory"]["total"] < budget / 1.2


def test_tp_buffers_outside_the_budget_are_in_the_engines_total(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """TP 4 on A100s (NVLink): a rank's communicator buffers (163 MiB, the line of
    test_text_says_where_the_tp_buffers_go) are outside vLLM V1's budget, counted in V0's
    non-torch, and 1 - 0.85 of them outside SGLang's: the engine's total has what it leaves out."""
    tp4 = ["--model", "llama-3.1-70b", "--method", "inference", "--flavor", "a100x4"]
    tp4 += ["--gpus", "4", "--max-model-len", "8192", "--json"]
    outside = {}
    for engine in (["vllm"], ["vllm", "--engine-version", "v0"], ["sglang"]):
        document = json.loads(run_plan(capsys, *tp4, "--engine", *engine)[1])
        serving = document["serving"]
        inside = serving["weight_bytes"] + serving["activation_bytes"]
        inside += serving["non_torch_bytes"] + serving["kv_cache_bytes"]
        assert inside == serving["budget_bytes"]
        assert document["memory"]["total"] == inside + serving["outside_budget_bytes"]
        graphs_and_context = serving["cuda_graph_bytes"] + serving["context_bytes"]
        outside[" ".join(engine)] = serving["outside_budget_bytes"] - graphs_and_context
    buffers = outside["vllm"]
    assert round(buffers / 2**20) == 163
    assert outside["vllm --engine-version v0"] == 0
    assert abs(outside["sglang"] - 0.15 * buffers) <= 1


def test_text_shows_the_engine_log_lines(capsys: pytest.CaptureFixture[str]) -> None:
    serving = json.loads(run_plan(capsys, *VLLM, "--json")[1])["serving"]
    status, out, _err = run_plan(capsys, *VLLM)
    assert status == 0
    assert "Serving (vLLM (V1 engine), TP 1) on l4x1, per GPU:" in out
    assert f"{serving['kv_blocks']:,} blocks of 16 = {serving['kv_tokens']:,} tokens" in out
    concurrency = f"{serving['max_concurrency']:.2f}x"
    assert f"Maximum concurrency for 8,192 tokens per request: {concurrency}" in out


def test_the_flavor_table_fits_when_the_pool_holds_one_sequence(
    capsys: pytest.CaptureFixture[str],
) -> None:
    long = [*VLLM[:-1], "131072", "--flavor", "h200", "--json"]
    document = json.loads(run_plan(capsys, *long)[1])
    verdicts = {row["id"]: row for row in document["flavors"]}
    assert verdicts["l4x1"]["fit"] == "no"
    assert "under one --max-model-len 131,072 sequence" in verdicts["l4x1"]["reason"]
    assert verdicts["h200"]["fit"] == "fits"
    assert document["recommended"] == "h200"
    status, out, _err = run_plan(capsys, *VLLM[:-1], "131072", "--check")
    assert status == 1 and "does not fit l4x1" in out


def test_max_concurrency_is_the_engines(capsys: pytest.CaptureFixture[str]) -> None:
    document = json.loads(run_plan(capsys, *VLLM, "--max", "concurrency", "--json")[1])
    serving, found = document["serving"], document["max"]
    assert found["value"] == serving["kv_tokens"] // 8192
    # re-planned at the answer's length a sequence fits; one more sequence's tokens do not
    assert found["value"] * 8192 <= serving["kv_tokens"] < (found["value"] + 1) * 8192
    assert 0 <= found["headroom_bytes"] < 8192 * 57_344


def test_export_vllm_writes_the_serve_line(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _err = run_plan(
        capsys,
        *VLLM,
        "--export",
        "vllm",
        "--kv-dtype",
        "fp8",
        "--max-num-seqs",
        "64",
        "--gpu-memory-utilization",
        "0.85",
    )
    assert status == 0
    assert out == (
        "vllm serve Qwen/Qwen2.5-7B --tensor-parallel-size 1 --gpu-memory-utilization 0.85 "
        "--max-model-len 8192 --max-num-seqs 64 --kv-cache-dtype fp8\n"
    )
    sglang = [*VLLM[:5], "sglang", "--flavor", "h200x2", "--gpus", "2", "--max-model-len", "4096"]
    status, out, _err = run_plan(capsys, *sglang, "--export", "vllm")
    assert status == 0
    assert out == (
        "python -m sglang.launch_server --model-path Qwen/Qwen2.5-7B --tp 2 "
        "--mem-fraction-static 0.87 --context-length 4096\n"
    )


def test_export_vllm_to_a_file(capsys: pytest.CaptureFixture[str], tmp_path) -> None:  # type: ignore[no-untyped-def]
    target = tmp_path / "serve.sh"
    assert run_plan(capsys, *VLLM, "--export", "vllm", "-o", str(target))[0] == 0
    assert target.read_text().startswith("vllm serve Qwen/Qwen2.5-7B ")
    status, _out, err = run_plan(capsys, *VLLM, "--export", "vllm", "-o", str(target))
    assert status == 2 and "-o" in err and "--force" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            "--model qwen2.5-7b --method lora --engine vllm",
            "--engine: a serving engine runs inference",
        ),
        (f"{SERVE} --gpu-memory-utilization 1.5", "--gpu-memory-utilization: 1.5 is not a share"),
        (f"{SERVE} --gpu-memory-utilization 0", "--gpu-memory-utilization: 0 is not a share"),
        (
            "--model qwen2.5-7b --method inference --max-model-len 4096",
            "--max-model-len: needs --engine vllm or sglang",
        ),
        (
            "--model qwen2.5-7b --method inference --kv-dtype fp8",
            "--kv-dtype: needs --engine vllm or sglang",
        ),
        (
            "--model qwen2.5-7b --method inference --export vllm",
            "--export vllm writes a server's command line",
        ),
        (f"{SERVE} --kv-dtype int8 --export vllm", "--kv-dtype: neither vllm serve nor SGLang"),
        (f"{SERVE} --engine tgi", "--engine: invalid choice: 'tgi'"),
        (f"{SERVE} --max-model-len many", "--max-model-len: 'many' is not a whole number"),
    ],
)
def test_bad_input_names_the_flag(
    capsys: pytest.CaptureFixture[str], args: str, message: str
) -> None:
    try:
        status, out, err = run_plan(capsys, *args.split())
    except SystemExit as exc:  # argparse's own refusal (a choice, a number): exit status 2
        captured = capsys.readouterr()
        status, out, err = int(exc.code or 0), captured.out, captured.err
    assert status == 2
    assert message in err and "Traceback" not in err + out


def test_text_says_where_the_tp_buffers_go(capsys: pytest.CaptureFixture[str]) -> None:
    # A100 x4 (NVLink): a 16-channel NCCL ring (147 MiB) + the custom all-reduce (16 MiB)
    tp4 = ["--model", "llama-3.1-70b", "--method", "inference", "--flavor", "a100x4"]
    tp4 += ["--gpus", "4", "--max-model-len", "8192"]
    expected = {
        ("vllm",): "163 MiB per GPU, outside the budget",
        ("vllm", "--engine-version", "v0"): "163 MiB per GPU, counted in non-torch",
        ("sglang",): "163 MiB per GPU, the pool loses 0.85 x of them",
    }
    for engine, line in expected.items():
        status, out, _err = run_plan(capsys, *tp4, "--engine", *engine)
        assert status == 0 and f"(TP communicator buffers: {line})" in out
    one = run_plan(capsys, *VLLM)[1]
    assert "TP communicator buffers" not in one


def test_a_flavor_with_fewer_gpus_than_the_tp_group_is_refused_and_the_shown_is_the_recommended(
    capsys: pytest.CaptureFixture[str],
) -> None:
    flags = ["--model", "llama-3.1-70b", "--method", "inference", "--engine", "vllm"]
    flags += ["--max-model-len", "8192", "--gpus", "4", "--json"]
    document = json.loads(run_plan(capsys, *flags)[1])
    by_id = {entry["id"]: entry for entry in document["flavors"]}
    small = [entry for entry in document["flavors"] if 0 < entry["gpu_count"] < 4]
    assert small and all(entry["fit"] == "no" for entry in small)
    gpu_rows = [entry for entry in small if "TP 4 needs 4 GPUs" in entry["reason"]]
    assert gpu_rows  # the GPU flavors say why (a TPU or Mac row keeps its own reason)
    recommended = document["recommended"]
    assert by_id[recommended]["gpu_count"] >= 4
    # without --flavor the serving lines are the recommended flavor's, as the planner's are
    assert document["serving"]["flavor"] == recommended


def test_sglang_says_batched_tokens_do_nothing_to_its_memory(
    capsys: pytest.CaptureFixture[str],
) -> None:
    flags = ["--model", "llama-3.1-8b", "--method", "inference", "--engine", "sglang"]
    _status, out, err = run_plan(capsys, *flags, "--max-num-batched-tokens", "4096")
    assert "--max-num-batched-tokens does nothing here: SGLang" in out + err
    _status, out, err = run_plan(capsys, *flags[:-1], "vllm", "--max-num-batched-tokens", "4096")
    assert "does nothing here" not in out + err
