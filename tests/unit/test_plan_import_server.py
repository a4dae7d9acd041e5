"""`hwdash plan --from FILE` with a serving engine's command line saved in a file: one `vllm serve`
or `python -m sglang.launch_server` line, read back into the serving plan's fields (round trip with
`--export vllm`); unknown flags are warned about, bad values refused naming the file and flag."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from monitor_cli import run_plan

from hwdash.core.plan import Engine, KvDtype, Method, Quant
from hwdash.core.plans.imports import read_plan_file

pytestmark = pytest.mark.usefixtures("quiet_machine")

SERVING_FIELDS = (
    "model",
    "method",
    "engine",
    "gpus",
    "gpu_memory_utilization",
    "max_model_len",
    "max_num_seqs",
    "max_num_batched_tokens",
    "kv_dtype",
    "quant",
)


def planned(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    status, out, err = run_plan(capsys, *args, "--json")
    assert status == 0, err
    return dict(json.loads(out))


@pytest.mark.parametrize(
    ("engine", "extra"),
    [
        ("vllm", ["--quant", "awq-4"]),
        ("sglang", []),
    ],
)
def test_export_vllm_then_from_gives_the_same_serving_plan(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, engine: str, extra: list[str]
) -> None:
    args = ["--model", "qwen2.5-7b", "--method", "inference", "--engine", engine, "--gpus", "2"]
    args += ["--gpu-memory-utilization", "0.85", "--max-model-len", "8192"]
    args += ["--max-num-seqs", "64", "--max-num-batched-tokens", "4096"]
    args += ["--kv-dtype", "fp8", *extra, "--flavor", "l40sx4"]
    saved = tmp_path / "serve.sh"
    status, _out, err = run_plan(capsys, *args, "--export", "vllm", "-o", str(saved))
    assert status == 0, err
    first = planned(capsys, *args)
    assert first["plan"]["max_num_batched_tokens"] == 4096
    # nothing but the file and the flavor: the serving settings come back from the line
    again = planned(capsys, "--from", str(saved), "--flavor", "l40sx4")
    model = first["plan"]["model"]
    for name in SERVING_FIELDS:
        if name == "model":  # the line names the Hugging Face id of the same catalog model
            assert again["plan"]["model"] in ("Qwen/Qwen2.5-7B", model)
            continue
        assert again["plan"].get(name) == first["plan"].get(name), name
    assert again["serving"] == first["serving"]
    assert again["memory"] == first["memory"]


def test_a_hand_written_line_with_unknown_flags_is_read_with_a_warning(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    saved = tmp_path / "serve.txt"
    saved.write_text(
        "#!/bin/sh\n# our server\n"
        "CUDA_VISIBLE_DEVICES=0,1 exec vllm serve meta-llama/Llama-3.1-8B \\\n"
        "  -tp 2 --enforce-eager --gpu-memory-utilization=0.8 --max-model-len 16384 \\\n"
        "  --max-num-batched-tokens 4096 --trust-remote-code --kv-cache-dtype fp8_e4m3\n"
    )
    imported = read_plan_file(saved)
    assert imported.kind == "vllm"
    assert imported.updates == {
        "method": Method.INFERENCE,
        "engine": Engine.VLLM,
        "model": "meta-llama/Llama-3.1-8B",
        "gpus": 2,
        "gpu_memory_utilization": 0.8,
        "max_model_len": 16384,
        "max_num_batched_tokens": 4096,
        "kv_dtype": KvDtype.FP8,
    }
    status, out, err = run_plan(capsys, "--from", str(saved), "--flavor", "h200x2", "--json")
    assert status == 0, err
    assert "--from " + str(saved) + ": ignored --enforce-eager, --trust-remote-code" in err
    document = json.loads(out)
    assert document["plan"]["engine"] == "vllm" and document["serving"]["flavor"] == "h200x2"


def test_an_sglang_line_maps_its_own_flag_names(tmp_path: Path) -> None:
    saved = tmp_path / "launch.sh"
    saved.write_text(
        "python3 -m sglang.launch_server --model-path Qwen/Qwen2.5-7B --tp-size 4 "
        "--mem-fraction-static 0.8 --context-length 32768 --max-running-requests 128 "
        "--chunked-prefill-size 4096 --quantization gptq --port 30000\n"
    )
    imported = read_plan_file(saved)
    assert imported.kind == "sglang"
    assert imported.updates == {
        "method": Method.INFERENCE,
        "engine": Engine.SGLANG,
        "model": "Qwen/Qwen2.5-7B",
        "gpus": 4,
        "gpu_memory_utilization": 0.8,
        "max_model_len": 32768,
        "max_num_seqs": 128,
        "max_num_batched_tokens": 4096,
        "quant": Quant.GPTQ_4,
    }
    assert imported.ignored == ["--port"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("vllm serve m --max-model-len lots\n", "--max-model-len must be a whole number"),
        ("vllm serve m --kv-cache-dtype int4\n", "--kv-cache-dtype 'int4'"),
        ("vllm serve m --quantization marlin9\n", "--quantization 'marlin9'"),
        ("vllm serve a\nvllm serve b\n", "holds 2 server command lines"),
    ],
)
def test_bad_server_lines_are_usage_errors_naming_the_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, message: str
) -> None:
    saved = tmp_path / "serve.sh"
    saved.write_text(text)
    status, _out, err = run_plan(capsys, "--from", str(saved))
    assert status == 2
    assert message in err and "--from" in err and "Traceback" not in err
