"""``hwdash plan --trace`` and :mod:`hwdash.tracing`.

Two kinds of test. The first half needs no torch and runs everywhere (CI has none): the missing-package
message, the Plan -> traced-setting mapping and the ModelSpec -> transformers-config mapping, which
are pure. The second half traces tiny models end to end and is skipped where torch, transformers or
peft are not importable.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hwdash.cli import main
from hwdash.core.catalog import load_catalog
from hwdash.core.models.config import model_from_config, model_from_config_file
from hwdash.core.plan import Method, Plan
from hwdash.core.specs import ModelSpec
from hwdash.tracing import (
    TracePhase,
    TraceResult,
    TraceUnavailable,
    build_hf_config_dict,
    comparison_rows,
    extrapolate_phases,
    hf_model_type,
    layer_period,
    local_config_dict,
    trace_depths,
    trace_settings,
)

DATA = Path(__file__).resolve().parent.parent / "data"
CONFIGS = DATA / "model_configs"

#: The architecture fields a ModelSpec carries (the identity fields id/name/source aside).
ARCHITECTURE_FIELDS = (
    "layers",
    "hidden_size",
    "heads",
    "kv_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "tied_embeddings",
    "mlp",
    "experts",
    "experts_per_token",
    "max_context",
)


pytestmark = pytest.mark.usefixtures("isolated_home")


def _without_trace_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    # A None entry in sys.modules makes `import torch` raise ImportError, installed or not.
    for name in ("torch", "transformers", "peft"):
        monkeypatch.setitem(sys.modules, name, None)


# --------------------------------------------------------------------------------------------------
# Without torch
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("extra", [[], ["--json"]])
def test_trace_without_torch_still_prints_the_estimate_and_says_why_it_skipped(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], extra: list[str]
) -> None:
    _without_trace_packages(monkeypatch)
    status = main(["plan", "--model", "seed-2m", "--method", "full", "--trace", *extra])
    captured = capsys.readouterr()
    assert status == 0
    # The estimate needs no torch: it is printed; one stderr line says the trace was skipped.
    if extra:
        document = json.loads(captured.out)
        assert document["memory"]["total"] > 0
        assert "torch" in document["trace"]["skipped"]
    else:
        assert "flavors, cheapest first" in captured.out
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1
    assert "trace skipped" in lines[0] and "torch" in lines[0] and "transformers" in lines[0]
    assert "pip install" in lines[0]


def test_lora_trace_names_peft_when_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    _without_trace_packages(monkeypatch)
    with pytest.raises(TraceUnavailable, match="peft"):
        from hwdash.tracing import check_trace_dependencies

        check_trace_dependencies(Plan(model="seed-2m", method="lora"))


def test_plan_without_trace_flag_runs_without_torch(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _without_trace_packages(monkeypatch)
    assert main(["plan", "--model", "seed-2m", "--method", "full", "--json"]) == 0
    assert "trace" not in json.loads(capsys.readouterr().out)


def test_importing_the_tracer_imports_no_torch() -> None:
    code = (
        "import sys, hwdash.tracing, hwdash.commands.plan_trace, hwdash.commands.plan\n"
        "print(','.join(sorted(m for m in ('torch', 'transformers', 'peft') if m in sys.modules)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == ""


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"method": "ppo"}, "not one training step"),
        ({"method": "grpo"}, "not one training step"),
        ({"method": "qlora"}, "bitsandbytes"),
        ({"method": "lora-8bit"}, "bitsandbytes"),
        ({"method": "full", "optimizer": "adamw-8bit"}, "adamw-8bit"),
        ({"method": "full", "optimizer": "adamw-8bit-paged"}, "adamw-8bit-paged"),
        ({"method": "full", "optimizer": "adamw-32bit-paged"}, "adamw-32bit-paged"),
        ({"method": "inference", "seq": 1}, "at least 2"),
    ],
)
def test_untraceable_settings_are_refused_with_a_reason(
    fields: dict[str, object], words: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(TraceUnavailable, match=words) as caught:
        trace_settings(Plan(model="seed-2m", **fields))  # type: ignore[arg-type]
    assert str(caught.value).startswith("--trace: ")
    # The CLI refuses them before printing anything, torch or not.
    _without_trace_packages(monkeypatch)
    argv = ["plan", "--model", "seed-2m", "--trace"]
    for key, value in fields.items():
        argv += [
            {"method": "--method", "optimizer": "--optimizer", "seq": "--seq"}[key],
            str(value),
        ]
    assert main(argv) == 2


def test_settings_map_the_plan_onto_one_step() -> None:
    flash = trace_settings(Plan(model="m", method="lora", attention="flash", lora_r=8))
    assert flash.attention == "sdpa" and flash.lora_r == 8 and flash.method == "lora"
    assert any("flash" in note for note in flash.notes)
    amp = trace_settings(Plan(model="m", method="full", precision="amp"))
    assert (amp.weight_dtype, amp.autocast, amp.master_copy) == ("float32", True, False)
    mixed = trace_settings(Plan(model="m", method="full", precision="mixed"))
    assert (mixed.weight_dtype, mixed.master_copy) == ("bfloat16", True)
    assert any("DeepSpeed" in note for note in mixed.notes)
    sharded = trace_settings(Plan(model="m", method="full", gpus=8, zero=3))
    assert any("one GPU's view" in note for note in sharded.notes)
    accumulated = trace_settings(Plan(model="m", method="full", grad_accum=16))
    assert accumulated.micro_batches == 2
    assert trace_settings(Plan(model="m", method="full")).micro_batches == 1
    inference = trace_settings(Plan(model="m", method="inference", grad_ckpt=True))
    assert inference.grad_ckpt is False and inference.micro_batches == 1
    # bf16 LoRA runs under autocast as the Trainer runs it; bf16 full training does not need it.
    lora = trace_settings(Plan(model="m", method="lora", lora_dropout=0.1, optimizer_impl="fused"))
    assert (lora.autocast, lora.lora_dropout, lora.optimizer_impl) == (True, 0.1, "fused")
    assert trace_settings(Plan(model="m", method="full")).autocast is False


def test_traced_plan_is_one_gpu_and_drops_dropout_on_experts() -> None:
    from hwdash.tracing import traced_plan

    catalog = load_catalog(include_user=False)
    plan = Plan(model="m", method="lora", gpus=4, zero=3, offload="params", lora_dropout=0.05)
    dense = traced_plan(plan, catalog.models["qwen2.5-7b"])
    assert (dense.gpus, dense.zero, dense.offload.value, dense.lora_dropout) == (1, 0, "none", 0.05)
    moe = traced_plan(plan, catalog.models["mixtral-8x7b"])
    assert moe.lora_dropout == 0.0
    full = Plan(model="m", method="full", lora_dropout=0.05)
    assert traced_plan(full, catalog.models["mixtral-8x7b"]).lora_dropout == 0.05


def test_a_framework_s_savers_are_compared_as_the_hugging_face_stack_the_trace_runs() -> None:
    # The trace runs transformers + PEFT as they are (the model's own fp32 loss, fp32 adapters, no
    # compile): a torchtune plan's chunked loss and bf16 adapters are not in it, so the estimate it
    # is compared with is the Hugging Face one, and the notes say so.
    from hwdash.core.estimator import estimate_memory
    from hwdash.tracing import comparable_estimate

    catalog = load_catalog(include_user=False)
    model = catalog.models["qwen2.5-7b"]
    torchtune = Plan(model="qwen2.5-7b", method="lora", framework="torchtune", seq=1024)
    hf = torchtune.with_changes({"framework": "hf"})
    compared = comparable_estimate(torchtune, model).per_gpu
    assert compared == comparable_estimate(hf, model).per_gpu
    assert compared != estimate_memory(torchtune, model, gpus=1).per_gpu
    (note,) = [n for n in trace_settings(torchtune).notes if "Hugging Face stack" in n]
    assert "loss chunked" in note and "loss standard" in note
    # a saver typed on the command line is left out the same way
    chunked = hf.with_changes({"loss": "chunked"})
    assert comparable_estimate(chunked, model).per_gpu == compared
    assert any("Hugging Face stack" in n for n in trace_settings(chunked).notes)
    # the Hugging Face stack itself, or a framework with the same savers: nothing to say
    assert not any("Hugging Face stack" in n for n in trace_settings(hf).notes)
    deepspeed = hf.with_changes({"framework": "deepspeed"})
    assert not any("Hugging Face stack" in n for n in trace_settings(deepspeed).notes)


def test_config_dict_round_trips_the_fixture_config_json() -> None:
    source = CONFIGS / "llama-style" / "config.json"
    original = json.loads(source.read_text(encoding="utf-8"))
    spec = model_from_config_file(source)
    built = build_hf_config_dict(spec)
    assert built["model_type"] == "llama"
    for key in (
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "vocab_size",
        "max_position_embeddings",
        "tie_word_embeddings",
    ):
        assert built[key] == original[key], key
    # the config itself (less the keys that would load or quantize weights), not a rebuilt one
    assert built == {k: v for k, v in original.items() if k not in ("architectures", "torch_dtype")}
    written_out = spec.model_copy(update={"model_type": "", "hf_config": None})
    rebuilt = build_hf_config_dict(written_out)
    assert rebuilt["head_dim"] == original["hidden_size"] // original["num_attention_heads"]
    again = model_from_config(built, name="round-trip", source="test")
    for name in ARCHITECTURE_FIELDS:
        assert getattr(again, name) == getattr(spec, name), name


def test_every_catalog_model_maps_to_a_config_hwdash_reads_back_the_same() -> None:
    catalog = load_catalog(include_user=False)
    assert len(catalog.models) > 10
    for spec in catalog.models.values():
        built = build_hf_config_dict(spec)
        again = model_from_config(built, name=spec.id, source="test")
        for name in ARCHITECTURE_FIELDS:
            assert getattr(again, name) == getattr(spec, name), (spec.id, name)


def test_model_type_comes_from_the_name_then_the_shape() -> None:
    catalog = load_catalog(include_user=False)
    assert hf_model_type(catalog.models["qwen2.5-7b"]) == "qwen2"
    assert hf_model_type(catalog.models["gemma-2-2b"]) == "gemma2"
    assert hf_model_type(catalog.models["mixtral-8x7b"]) == "mixtral"
    assert hf_model_type(catalog.models["phi-2"]) == "phi"
    assert hf_model_type(catalog.models["seed-2m"]) == "llama"
    # a spec written field by field (no config): its name, else its shape
    unnamed_moe = catalog.models["seed-2m"].model_copy(
        update={
            "id": "custom",
            "hf_id": "",
            "experts": 4,
            "experts_per_token": 2,
            "model_type": "",
            "hf_config": None,
        }
    )
    assert hf_model_type(unnamed_moe) == "mixtral"
    named = unnamed_moe.model_copy(update={"id": "qwen3-custom"})
    assert hf_model_type(named) == "qwen3"
    # with a config, its model_type, whatever the name says
    assert hf_model_type(catalog.models["gemma-3-4b"]) == "gemma3_text"
    assert hf_model_type(catalog.models["pythia-1.4b"]) == "gpt_neox"
    assert hf_model_type(named.model_copy(update={"model_type": "llama"})) == "llama"


def test_local_config_keeps_the_users_file_without_loader_keys(tmp_path: Path) -> None:
    raw = json.loads((CONFIGS / "llama-style" / "config.json").read_text(encoding="utf-8"))
    raw["quantization_config"] = {"quant_method": "gptq", "bits": 4}
    raw["auto_map"] = {"AutoModelForCausalLM": "remote.Model"}
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(raw), encoding="utf-8")
    local = local_config_dict(Plan(model=str(folder)))
    assert local is not None
    assert "quantization_config" not in local and "auto_map" not in local
    assert "torch_dtype" not in local and "architectures" not in local
    assert local["rope_theta"] == raw["rope_theta"] and local["model_type"] == "llama"
    multimodal = local_config_dict(Plan(model=str(CONFIGS / "gemma3-multimodal")))
    assert multimodal is not None and multimodal["model_type"] == "gemma3_text"
    assert multimodal["num_hidden_layers"] == 34
    assert local_config_dict(Plan(model="qwen2.5-7b")) is None
    assert local_config_dict(Plan(model="7B")) is None


def test_layer_period_and_depths() -> None:
    assert layer_period(None) == 1
    assert layer_period(["full"] * 5) == 1
    assert layer_period(["sliding", "full"] * 13) == 2
    assert layer_period((["sliding"] * 5 + ["full"]) * 4 + ["sliding"] * 2) == 6
    assert trace_depths(4, 1) == (4,)
    assert trace_depths(32, 1) == (2, 4)
    assert trace_depths(26, 2) == (2, 4)
    assert trace_depths(34, 6) == (6, 12)
    assert trace_depths(20, 6) == (20,)


def _phase(step: int, name: str, total: int, activations: int) -> TracePhase:
    return TracePhase(
        step, name, total, {"parameters": total - activations, "activations": activations}
    )


def test_extrapolation_follows_the_line_through_two_depths() -> None:
    low = [_phase(1, "forward", 1000, 400), _phase(1, "backward", 1100, 500)]
    high = [_phase(1, "forward", 1600, 700), _phase(1, "backward", 1900, 900)]
    out = extrapolate_phases((2, low), (4, high), 10)
    assert [p.total for p in out] == [1000 + 300 * 8, 1100 + 400 * 8]
    assert out[1].components == {"parameters": 600 + 200 * 8, "activations": 500 + 200 * 8}
    with pytest.raises(ValueError, match="same phases"):
        extrapolate_phases((2, low), (4, high[:1]), 10)


def test_comparison_rows_pair_the_breakdowns() -> None:
    components = {
        "parameters": 100,
        "buffers": 1,
        "gradients": 20,
        "optimizer": 30,
        "activations": 40,
        "temporaries": 5,
        "other": 7,
    }
    trace = TraceResult(
        peak_bytes=203,
        components=components,
        peak_step=2,
        peak_phase="backward",
        phases=(),
        device="cpu",
        layers=4,
        traced_layers=(4,),
        total_params=50,
        trainable_params=50,
        seconds=0.5,
    )
    estimate = {
        "weights": 99,
        "gradients": 21,
        "optimizer": 36,
        "activations": 44,
        "kv_cache": 3,
        "overhead": 10,
        "total": 213,
    }
    rows = {label.strip(): (est, traced) for label, est, traced in comparison_rows(trace, estimate)}
    assert rows["weights / parameters+buffers"] == (99, 101)
    assert rows["optimizer (+ master copy)"] == (36, 37)
    assert rows["activations, temporaries, KV cache"] == (44 + 3, 45)
    assert rows["KV cache"] == (3, None)
    assert rows["overhead (context, allocator)"] == (10, None)
    assert trace.as_dict()["components"] == components


# --------------------------------------------------------------------------------------------------
# With torch: tiny models traced end to end
# --------------------------------------------------------------------------------------------------


@pytest.fixture
def traced_packages() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("peft")


def _seed_model() -> ModelSpec:
    return load_catalog(include_user=False).models["seed-2m"]


@pytest.mark.validate
def test_full_training_step_of_a_tiny_model(traced_packages: None) -> None:
    from hwdash.tracing import comparable_estimate, trace_plan

    spec = _seed_model()
    plan = Plan(model="seed-2m", method="full", precision="bf16", batch=2, seq=128)
    trace = trace_plan(plan, spec, device="cpu")
    assert trace.device == "cpu" and trace.traced_layers == (spec.layers,)
    assert trace.trainable_params == trace.total_params > 0
    # bf16 parameters: 2 bytes each, every storage rounded up to 512 bytes.
    assert 2 * trace.total_params <= trace.components["parameters"] < 2 * trace.total_params * 1.05
    assert [(p.step, p.phase) for p in trace.phases] == [
        (step, phase) for step in (1, 2) for phase in ("forward", "backward", "optimizer")
    ]
    step_one_optimizer = trace.phases[2]
    # AdamW's two states exist only from the first step on (bf16: 2 x 2 bytes per parameter).
    assert trace.phases[0].components["optimizer"] == 0
    assert step_one_optimizer.components["optimizer"] >= 4 * trace.total_params
    assert trace.peak_bytes == max(p.total for p in trace.phases)
    estimate = comparable_estimate(plan, spec).per_gpu
    without_overhead = estimate.total - estimate.overhead
    assert 0.75 * trace.peak_bytes < without_overhead < 1.33 * trace.peak_bytes


@pytest.mark.validate
def test_lora_and_inference_traces(traced_packages: None) -> None:
    from hwdash.tracing import trace_plan

    spec = _seed_model()
    lora = trace_plan(Plan(model="seed-2m", method="lora", lora_r=4, seq=64), spec, device="cpu")
    assert 0 < lora.trainable_params < lora.total_params
    full = trace_plan(Plan(model="seed-2m", method="full", seq=64), spec, device="cpu")
    assert lora.peak_bytes < full.peak_bytes
    inference = trace_plan(Plan(model="seed-2m", method="inference", seq=64), spec, device="cpu")
    assert {p.phase for p in inference.phases} == {"prefill", "decode"}
    assert inference.components["gradients"] == inference.components["optimizer"] == 0


@pytest.mark.validate
def test_hooks_and_caller_config_leave_the_peak_unchanged(traced_packages: None) -> None:
    # issue 14: the calibration harness traces through trace_plan with its own transformers config
    # and hooks (an op recorder, an inventory); hooks see every phase in order and the model, the
    # caller's config builds the model, and none of it changes what is allocated.
    import contextlib

    from hwdash.tracing import TraceHooks, build_hf_config_dict, trace_plan

    spec = _seed_model()
    plan = Plan(model="seed-2m", method="lora", lora_r=4, seq=64)
    plain = trace_plan(plan, spec, device="cpu")
    seen: list[tuple[int, str]] = []
    models: list[object] = []

    @contextlib.contextmanager
    def around(model: object):  # type: ignore[no-untyped-def]
        models.append(model)
        yield

    hooked = trace_plan(
        plan,
        spec,
        device="cpu",
        hf_config=build_hf_config_dict(spec),
        hooks=TraceHooks(around_run=around, on_phase=lambda step, name: seen.append((step, name))),
    )
    assert hooked.peak_bytes == plain.peak_bytes
    assert [p.total for p in hooked.phases] == [p.total for p in plain.phases]
    assert len(models) == 1
    assert seen == [
        (step, name) for step in (1, 2) for name in ("forward", "backward", "optimizer")
    ]
    assert any("caller's transformers config" in note for note in hooked.notes)
    # the end of each forward holds what backward will consume: more than the weights alone
    forward = hooked.phases[0]
    assert forward.components["parameters"] < forward.end_total <= forward.total
    # a different caller config is really used: twice the layers, more parameters
    deeper = trace_plan(
        plan,
        spec,
        device="cpu",
        hf_config={**build_hf_config_dict(spec), "num_hidden_layers": 2 * spec.layers},
    )
    assert deeper.total_params > hooked.total_params and deeper.layers == 2 * spec.layers


@pytest.mark.validate
def test_extrapolated_depth_matches_the_full_depth(traced_packages: None) -> None:
    from hwdash.tracing import trace_plan

    deep = _seed_model().model_copy(update={"id": "seed-deep", "layers": 10})
    plan = Plan(model="seed-deep", method="lora", seq=64, grad_ckpt=True)
    extrapolated = trace_plan(plan, deep, device="cpu")
    full = trace_plan(plan, deep, device="cpu", full_depth=True)
    assert extrapolated.traced_layers == (2, 4) and full.traced_layers == (10,)
    assert extrapolated.peak_bytes == full.peak_bytes
    assert extrapolated.components == full.components
    assert extrapolated.total_params == full.total_params


@pytest.mark.validate
def test_trace_json_from_the_command_line(
    traced_packages: None, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(
        ["plan", "--model", "seed-2m", "--method", "full", "--seq", "64", "--trace", "--json"]
    )
    out = capsys.readouterr().out
    assert status == 0, out
    trace = json.loads(out)["trace"]
    assert trace["peak_bytes"] > 0 and trace["device"] in ("cpu", "cuda")
    estimate = trace["estimate"]
    assert estimate["total"] - estimate["without_overhead"] == estimate["components"]["overhead"]
    assert trace["error"] == pytest.approx(
        (estimate["without_overhead"] - trace["peak_bytes"]) / trace["peak_bytes"]
    )
    assert set(trace["components"]) >= {"parameters", "gradients", "optimizer", "activations"}


@pytest.mark.validate
def test_trace_text_output(traced_packages: None, capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["plan", "--model", "seed-2m", "--method", "lora", "--seq", "64", "--trace"])
    out = capsys.readouterr().out
    assert status == 0
    assert "traced peak" in out and "without overhead" in out
    assert "activations, temporaries, KV cache" in out


@pytest.mark.validate
def test_trace_runs_in_a_worker_thread(traced_packages: None) -> None:
    # The TUI traces in a worker thread; the result must not depend on the thread.
    import threading

    from hwdash.tracing import trace_plan

    spec = _seed_model()
    plan = Plan(model="seed-2m", method="lora", seq=64)
    results: list[TraceResult] = []
    worker = threading.Thread(target=lambda: results.append(trace_plan(plan, spec, device="cpu")))
    worker.start()
    worker.join(timeout=120)
    assert len(results) == 1
    assert results[0].peak_bytes == trace_plan(plan, spec, device="cpu").peak_bytes


@pytest.mark.validate
def test_cuda_device_needs_cuda(traced_packages: None) -> None:
    import torch

    from hwdash.tracing import trace_plan

    if torch.cuda.is_available():
        pytest.skip("this torch has CUDA")
    with pytest.raises(TraceUnavailable, match="no usable CUDA"):
        trace_plan(Plan(model="seed-2m", method="full", seq=16), _seed_model(), device="cuda")


@pytest.mark.validate
def test_cpu_dropout_runs_cuda_s_fused_kernel(traced_packages: None) -> None:
    # issue 24: off CUDA torch's dropout multiplies by a noise tensor in the input's dtype and keeps
    # it (4 bytes per element in PEFT's fp32 adapters); CUDA's fused native_dropout keeps a bool
    # mask only. The trace now runs CUDA's kernel, and restores torch's function afterwards.
    import torch

    from hwdash.tracing import _cuda_fused_dropout

    functional = torch.nn.functional
    original = functional.dropout
    x = torch.randn(4, 8, requires_grad=True)
    composite = torch.nn.Dropout(0.1)(x)
    assert composite.grad_fn._saved_other.dtype == torch.float32  # type: ignore[union-attr]
    with _cuda_fused_dropout():
        fused = torch.nn.Dropout(0.1)(x)
        assert functional.dropout(x, 0.0, True) is x
        assert functional.dropout(x, 0.1, False) is x
    assert type(fused.grad_fn).__name__ == "NativeDropoutBackward0"
    assert fused.grad_fn._saved_result1.dtype == torch.bool  # type: ignore[union-attr]
    fused.sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape
    assert functional.dropout is original


@pytest.mark.validate
def test_lora_dropout_trace_keeps_cuda_s_one_byte_masks(traced_packages: None) -> None:
    # Every adapted module's input has its own mask, all alive at the end of the forward (no
    # checkpointing): CPU's own dropout keeps 4 bytes per element, CUDA's fused kernel 1.
    from hwdash.core.estimator import architecture, lora_dropout_mask_elements
    from hwdash.core.estimator.architecture import resolve_lora_targets
    from hwdash.tracing import trace_plan

    spec = _seed_model()
    plan = Plan(model="seed-2m", method="lora", lora_r=4, seq=128, lora_dropout=0.1)
    cuda = trace_plan(plan, spec, device="cpu")
    cpu = trace_plan(plan, spec, device="cpu", cuda_dropout=False)
    undropped = trace_plan(plan.model_copy(update={"lora_dropout": 0.0}), spec, device="cpu")
    assert any("CUDA's fused kernel" in note for note in cuda.notes)
    assert not any("CUDA's fused kernel" in note for note in cpu.notes)
    arch = architecture(spec)
    targets = resolve_lora_targets(arch, plan.lora_targets)
    masks = spec.layers * lora_dropout_mask_elements(arch, plan.seq, targets)
    forward = [(p.step, p.phase) for p in cuda.phases].index((2, "forward"))
    kept = {
        name: t.phases[forward].end_total
        for name, t in (("cuda", cuda), ("cpu", cpu), ("none", undropped))
    }
    # per mask, CPU's own dropout keeps 4 bytes where CUDA's kernel keeps 1 (up to the 512-byte
    # rounding of down_proj's bool mask, 256 bytes per layer)
    cuda_masks, cpu_masks = kept["cuda"] - kept["none"], kept["cpu"] - kept["none"]
    assert cuda_masks > 0
    assert abs(cpu_masks - 4 * cuda_masks) <= 4 * 512 * spec.layers
    # bf16 LoRA under autocast: the dropout adds its masks and nothing else. The end-of-forward
    # snapshot holds 91% of the hand count here (1,038,336 of 1,135,616 bytes); nothing beyond it.
    assert 0.85 * masks <= cuda_masks <= masks + 512 * spec.layers
    assert cuda.peak_bytes < cpu.peak_bytes


def _tiny_encoder(tmp_path: Path, architectures: list[str], **extra: object) -> Path:
    config = {
        "model_type": "bert",
        "architectures": architectures,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "vocab_size": 500,
        "max_position_embeddings": 128,
        **extra,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


@pytest.mark.validate
def test_encoder_traces_build_the_configs_head(tmp_path: Path, traced_packages: None) -> None:
    # issue 24: an encoder is traced as AutoModelForMaskedLM or ...ForSequenceClassification,
    # with its own parameters (the causal LM would have none of the pooler, token types or MLM
    # transform), one forward for inference
    from hwdash.core.estimator import architecture
    from hwdash.core.models.config import model_from_config_file
    from hwdash.tracing import trace_plan

    for architectures in (["BertForMaskedLM"], ["BertForSequenceClassification"]):
        path = _tiny_encoder(tmp_path, architectures, num_labels=3)
        spec = model_from_config_file(path)
        plan = Plan(model=str(path), method="full", precision="bf16", batch=2, seq=64)
        trace = trace_plan(plan, spec, device="cpu")
        assert trace.total_params == architecture(spec).total_params
        assert any(architectures[0].removeprefix("Bert") in note for note in trace.notes)
    inference = trace_plan(plan.model_copy(update={"method": Method.INFERENCE}), spec, device="cpu")
    assert [p.phase for p in inference.phases] == ["forward"]


@pytest.mark.validate
def test_sdpa_dropout_runs_in_kernel_as_on_cuda(traced_packages: None) -> None:
    # CPU's SDPA sends dropout to the math kernel, which keeps s^2 probabilities and masks; CUDA's
    # flash/memory-efficient kernels keep neither. The trace runs SDPA at p 0 (the same kind of
    # kernel), except where it forces the math kernel itself; torch's function comes back after.
    import torch

    from hwdash.tracing import _cuda_fused_dropout

    functional = torch.nn.functional
    original = functional.scaled_dot_product_attention
    q = k = v = torch.randn(1, 2, 8, 4)
    plain = original(q, k, v)
    torch.manual_seed(0)
    assert not torch.equal(original(q, k, v, dropout_p=0.5), plain)
    with _cuda_fused_dropout():
        assert torch.equal(functional.scaled_dot_product_attention(q, k, v, dropout_p=0.5), plain)
        assert torch.equal(functional.scaled_dot_product_attention(q, k, v, None, 0.5), plain)
    with _cuda_fused_dropout(keep_sdpa_dropout=True):
        assert not torch.equal(functional.scaled_dot_product_attention(q, k, v, None, 0.5), plain)
    assert functional.scaled_dot_product_attention is original
