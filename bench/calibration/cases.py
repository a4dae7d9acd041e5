"""The settings of one traced run, in hwdash ``Plan`` terms, and the calibration grid."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

#: Optimizer implementations a case can ask for. ``foreach`` is what ``torch.optim.AdamW()`` picks on
#: CUDA by default (it allocates a parameter-sized temporary for sqrt(v) during the step); ``fused`` is
#: what the Hugging Face Trainer picks by default on torch >= 2.8 (``adamw_torch_fused``).
OPTIMIZER_IMPLS = ("foreach", "fused", "single")

#: The harness's optimizer implementation names -> ``hwdash.core.plan.Plan.optimizer_impl`` values
#: (``single`` is torch's per-parameter loop, hwdash's ``for-loop``).
PLAN_OPTIMIZER_IMPL = {"foreach": "foreach", "fused": "fused", "single": "for-loop"}


@dataclass(frozen=True)
class CalibrationCase:
    """One traced setting. All fields but ``sdpa_backend`` map onto :class:`hwdash.core.plan.Plan`."""

    model: str
    """Catalog model id (``Plan.model``)."""
    method: str = "full"
    """``inference``, ``full``, ``lora`` or ``dora`` (``Plan.method``)."""
    precision: str = "bf16"
    """``fp32``, ``amp``, ``bf16`` or ``mixed`` (``Plan.precision``)."""
    batch: int = 2
    """Sequences per forward pass (``Plan.batch``)."""
    seq: int = 1024
    """Tokens per sequence; for inference the prompt plus one decoded token (``Plan.seq``)."""
    grad_ckpt: bool = False
    """Activation checkpointing, non-reentrant as transformers 5 enables it (``Plan.grad_ckpt``)."""
    attention: str = "sdpa"
    """``sdpa`` or ``eager`` (``Plan.attention``)."""
    optimizer: str = "adamw"
    """``adamw``, ``sgd`` or ``adafactor`` (``Plan.optimizer``)."""
    lora_r: int = 16
    """LoRA/DoRA rank (``Plan.lora_r``)."""
    lora_targets: tuple[str, ...] = ("all-linear",)
    """Adapted modules (``Plan.lora_targets``)."""
    optimizer_impl: str = "foreach"
    """How torch runs the optimizer: ``foreach``, ``fused`` or ``single`` (``Plan.optimizer_impl``,
    where ``single`` is called ``for-loop``)."""
    lora_dropout: float = 0.05
    """LoRA dropout; TRL/PEFT recipes mostly use 0.05 (``Plan.lora_dropout``)."""
    sdpa_backend: str = "auto"
    """``auto`` lets torch pick the SDPA kernel (on CPU: its flash kernel, fp32 included); ``math``
    forces the O(s^2) math path, which is what CUDA runs for fp32 inputs (not a Plan field)."""

    @property
    def case_id(self) -> str:
        """A stable, readable key for the case."""
        parts = [
            self.model,
            self.method,
            self.precision,
            f"b{self.batch}",
            f"s{self.seq}",
            "ckpt" if self.grad_ckpt else "nockpt",
            self.attention,
        ]
        if self.method != "inference":
            parts.append(f"{self.optimizer}-{self.optimizer_impl}")
        if self.method in ("lora", "dora"):
            parts.append(f"r{self.lora_r}-{'+'.join(self.lora_targets)}-d{self.lora_dropout:g}")
        if self.sdpa_backend != "auto":
            parts.append(f"sdpa-{self.sdpa_backend}")
        return "/".join(parts)

    def plan_fields(self) -> dict[str, Any]:
        """The keyword arguments of ``hwdash.core.plan.Plan`` this case stands for."""
        fields = asdict(self)
        fields["optimizer_impl"] = PLAN_OPTIMIZER_IMPL[self.optimizer_impl]
        fields.pop("sdpa_backend")
        fields["lora_targets"] = tuple(self.lora_targets)
        return fields


#: Models every core setting runs on (ids in ``catalog/models.toml``). Chosen to cover tied and untied
#: embeddings, GQA ratios 1 to 8, vocabularies of 32k to 256k, attention biases, an MoE and Gemma 2's
#: soft-capped eager attention.
CORE_MODELS = (
    "qwen2.5-0.5b",
    "qwen2.5-1.5b",
    "qwen3-0.6b",
    "llama-3.2-1b",
    "tinyllama-1.1b",
    "qwen2.5-7b",
    "llama-3.1-8b",
    "mistral-7b",
    "mixtral-8x7b",
    "gemma-2-2b",
    "phi-2",
    "seed-200m",
)

#: Models the one-factor-at-a-time variations run on.
SWEEP_MODELS = ("qwen2.5-0.5b", "llama-3.2-1b", "qwen2.5-7b")


def _attention_for(model: str) -> str:
    # Gemma 2 passes a logit soft-cap that SDPA refuses; transformers recommends eager for it.
    return "eager" if model.startswith("gemma-2-") else "sdpa"


#: MoE models whose fused 3-D expert weights the trace runs through ``torch._grouped_mm``.
MOE_PREFIXES = ("mixtral-", "qwen3-30b-a3b")


def _precisions_for(model: str) -> tuple[str, ...]:
    # MoE experts run through torch._grouped_mm, which on CPU takes bf16 only and which CPU
    # autocast does not cast: fp32 weights (amp) cannot be traced here.
    return ("bf16",) if model.startswith(MOE_PREFIXES) else ("bf16", "amp")


def _lora_dropout_for(model: str) -> float:
    # peft adapts fused 3-D expert weights with lora.ParamWrapper, which refuses dropout.
    return 0.0 if model.startswith(MOE_PREFIXES) else 0.05


def calibration_grid() -> list[CalibrationCase]:
    """Every case of the default grid, without duplicates, in a stable order."""
    cases: list[CalibrationCase] = []
    for model in CORE_MODELS:
        attention = _attention_for(model)
        for method in ("full", "lora"):
            for precision in _precisions_for(model):
                for grad_ckpt in (False, True):
                    cases.append(
                        CalibrationCase(
                            model=model,
                            method=method,
                            precision=precision,
                            grad_ckpt=grad_ckpt,
                            attention=attention,
                            lora_dropout=_lora_dropout_for(model),
                        )
                    )
        cases.append(
            CalibrationCase(model=model, method="inference", seq=4096, batch=1, attention=attention)
        )
    for model in SWEEP_MODELS:
        base = CalibrationCase(model=model)
        lora = replace(base, method="lora")
        variations = [
            replace(base, precision="fp32"),
            replace(base, precision="mixed"),
            replace(base, seq=256),
            replace(base, seq=4096),
            replace(base, batch=1),
            replace(base, batch=8),
            replace(base, attention="eager"),
            replace(base, precision="fp32", attention="eager"),
            replace(base, precision="fp32", sdpa_backend="math"),
            replace(base, precision="amp", sdpa_backend="math"),
            replace(base, precision="fp32", grad_ckpt=True),
            replace(base, seq=4096, grad_ckpt=True),
            replace(base, optimizer_impl="fused"),
            replace(base, optimizer="sgd", optimizer_impl="foreach"),
            replace(base, optimizer="adafactor", optimizer_impl="single"),
            replace(lora, precision="fp32"),
            replace(lora, seq=4096),
            replace(lora, seq=4096, grad_ckpt=True),
            replace(lora, batch=8),
            replace(lora, lora_r=64),
            replace(lora, lora_r=8, lora_targets=("q_proj", "v_proj")),
            replace(lora, lora_dropout=0.0),
            replace(lora, attention="eager"),
            replace(base, method="dora"),
            replace(base, method="dora", grad_ckpt=True),
            replace(base, method="inference", batch=1, seq=1024),
            replace(base, method="inference", batch=8, seq=2048),
            replace(base, method="inference", precision="fp32", batch=1, seq=4096),
        ]
        cases.extend(variations)
    unique: dict[str, CalibrationCase] = {}
    for case in cases:
        unique.setdefault(case.case_id, case)
    return list(unique.values())


#: Architectures added in issue 14 that the estimator was never tuned or checked on (their specs:
#: ``bench/calibration/heldout_models.toml``). Chosen for what they change: OLMo 2's post-norm blocks
#: and whole-projection q/k norms, Granite's scalar multipliers (embedding, residual, logits),
#: Falcon 3's wide heads (256) and 131K vocabulary, StableLM 2's LayerNorm with bias and partial
#: rotary, Qwen3-MoE's 128 fine-grained experts with top-8 routing.
HELD_OUT_MODELS = (
    "olmo-2-7b",
    "granite-3.1-2b",
    "falcon3-3b",
    "stablelm-2-1.6b",
    "qwen3-30b-a3b",
)

#: Architectures the issue asked for that hwdash's ``ModelSpec``/estimator cannot express, with why.
#: They are not traced: a trace without an estimate scores nothing, and faking the spec (say, MLA as
#: plain multi-head attention) would score a different model.
NOT_EXPRESSIBLE = {
    "DeepSeek-V2-Lite (deepseek-ai/DeepSeek-V2-Lite)": (
        "multi-head latent attention: K and V come from a shared 512-wide latent (kv_lora_rank 512) "
        "with a separate 64-wide rotary key (qk_rope_head_dim 64) and 128-wide value heads "
        "(v_head_dim 128 vs qk head 192), so neither the weights, the saved activations nor the KV "
        "cache (the latent is cached, not per-head K/V) follow heads x head_dim; also 2 shared "
        "experts beside 64 routed ones and a dense first layer (first_k_dense_replace 1), which "
        "ModelSpec's single experts/intermediate_size cannot hold (config.json as copied by "
        "huggingface.co/ModelCloud/DeepSeek-V2-Lite-gptq-4bit)"
    ),
    "Qwen1.5-MoE / Qwen2-MoE (qwen2_moe)": (
        "a shared expert (shared_expert_intermediate_size, with its own sigmoid gate) runs beside "
        "the routed experts in every layer; ModelSpec has one expert width and no shared expert "
        "(hwdash.core.models.config reads qwen2_moe configs and says the shared expert is not counted), "
        "so Qwen3-MoE, which has none, stands in for the Qwen MoE family"
    ),
}


def held_out_grid() -> list[CalibrationCase]:
    """The held-out cases of issue 14: new architectures, and settings the grid had not traced.

    Per new architecture: full bf16 with and without checkpointing and at 4096 tokens, LoRA r16 and
    r64 on all linear
    layers, and a long bf16 prefill (8192 tokens, or the model's context when shorter). On models
    already in the grid, the settings a new user tried and found off (issue 14): Gemma 2 bf16 full
    fine-tuning and an 8k prefill, Qwen3 LoRA r64 and Llama 3.2 LoRA r8 on all linear layers, at the
    grid's batch 2 x 1024 and at hwdash's plan defaults (batch 1 x 2048), and a 16k prefill.
    """
    from hwdash.core.catalog import load_catalog

    contexts = {m.id: m.max_context for m in held_out_catalog_models(load_catalog)}
    cases: list[CalibrationCase] = []
    for model in HELD_OUT_MODELS:
        attention = _attention_for(model)
        dropout = _lora_dropout_for(model)
        base = CalibrationCase(model=model, attention=attention, lora_dropout=dropout)
        lora = replace(base, method="lora")
        cases += [
            base,
            replace(base, grad_ckpt=True),
            # long enough that the activations, not the optimizer step, make the peak
            replace(base, seq=4096),
            lora,
            replace(lora, lora_r=64),
            replace(lora, seq=4096),
            replace(base, method="inference", batch=1, seq=min(8192, contexts.get(model, 8192))),
        ]
    gemma = CalibrationCase(model="gemma-2-2b", attention="eager")
    qwen3_lora = CalibrationCase(model="qwen3-0.6b", method="lora", lora_r=64)
    llama_lora = CalibrationCase(model="llama-3.2-1b", method="lora", lora_r=8)
    cases += [
        replace(gemma, batch=1, seq=2048),
        replace(gemma, method="inference", batch=1, seq=8192),
        qwen3_lora,
        replace(qwen3_lora, batch=1, seq=2048),
        llama_lora,
        replace(llama_lora, batch=1, seq=2048),
        CalibrationCase(model="qwen2.5-1.5b", method="inference", batch=1, seq=16384),
    ]
    return cases


def held_out_catalog_models(load_catalog: Any) -> list[Any]:
    """The specs of the held-out architectures (``heldout_models.toml`` beside this module)."""
    from pathlib import Path

    path = Path(__file__).resolve().parent / "heldout_models.toml"
    return list(load_catalog([path], include_user=False).models.values())


def held_out_case_ids() -> frozenset[str]:
    """The ids of every held-out case."""
    return frozenset(case.case_id for case in held_out_grid())


def quick_grid() -> list[CalibrationCase]:
    """A handful of cases for a smoke run (``--quick``)."""
    return [
        CalibrationCase(model="qwen2.5-0.5b"),
        CalibrationCase(model="qwen2.5-0.5b", method="lora", grad_ckpt=True),
        CalibrationCase(model="llama-3.2-1b", precision="amp"),
        CalibrationCase(model="qwen2.5-0.5b", method="inference", batch=1, seq=2048),
    ]
