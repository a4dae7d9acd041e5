"""A plan written back as ``hwdash plan`` flags parses to the same plan."""

from __future__ import annotations

from hypothesis import given, reject, settings
from hypothesis import strategies as st

from hwdash.cli import build_parser
from hwdash.commands.plan import apply_framework_defaults, plan_from_args
from hwdash.commands.plan_args import plan_arguments
from hwdash.core.catalog import load_catalog
from hwdash.core.plan import (
    RL_TRAINABLE_METHODS,
    Attention,
    Framework,
    Loss,
    Method,
    Offload,
    Optimizer,
    OptimizerImpl,
    Plan,
    Precision,
    Quant,
    StoreDtype,
    ValueHead,
)

CATALOG = load_catalog(include_user=False)


@st.composite
def plans(draw: st.DrawFn) -> Plan:
    method = draw(st.sampled_from(list(Method)))
    zero = 0 if method is Method.INFERENCE else draw(st.integers(0, 3))
    grad_accum = draw(st.integers(1, 64))
    optional = st.none() | st.booleans()
    in_backward = draw(optional) if grad_accum == 1 else draw(st.none() | st.just(False))
    offload = Offload.NONE
    if zero == 3:
        offload = draw(st.sampled_from(list(Offload)))
    elif zero:
        offload = draw(st.sampled_from([Offload.NONE, Offload.OPTIMIZER]))
    quant = draw(st.sampled_from(list(Quant))) if method is Method.INFERENCE else Quant.NONE
    try:
        return _plan(draw, method, zero, grad_accum, optional, in_backward, offload, quant)
    except ValueError:
        # a combination Plan refuses (e.g. Megatron's optimizer offload with an 8-bit optimizer):
        # not a plan anyone can write back
        reject()


def _plan(  # type: ignore[no-untyped-def]
    draw: st.DrawFn, method, zero, grad_accum, optional, in_backward, offload, quant
) -> Plan:
    return Plan(
        model=draw(st.sampled_from(["qwen2.5-7b", "7B", "./my model/config.json"])),
        method=method,
        precision=draw(st.sampled_from(list(Precision))),
        batch=draw(st.integers(1, 64)),
        seq=draw(st.integers(1, 32768)),
        grad_ckpt=draw(st.booleans()),
        grad_accum=grad_accum,
        attention=draw(st.sampled_from(list(Attention))),
        optimizer=draw(st.sampled_from(list(Optimizer))),
        optimizer_impl=draw(st.sampled_from(list(OptimizerImpl))),
        lora_r=draw(st.integers(1, 256)),
        lora_targets=draw(st.sampled_from([("all-linear",), ("q_proj", "v_proj")])),
        lora_dropout=draw(st.sampled_from([0.0, 0.05, 0.1, 0.333])),
        lora_modules_to_save=draw(st.sampled_from([(), ("lm_head",), ("embed_tokens", "lm_head")])),
        zero=zero,
        offload=offload,
        gpus=draw(st.integers(1, 16)),
        examples=draw(st.none() | st.integers(1, 10**7)),
        epochs=draw(st.sampled_from([1.0, 2.0, 0.5, 3.25])),
        tokens=draw(st.none() | st.integers(1, 10**10)),
        mfu=draw(st.none() | st.sampled_from([0.3, 0.45])),
        flavors=draw(st.sampled_from([(), ("l4x1",), ("a10g-large", "t4-small")])),
        rl_method=draw(st.sampled_from(list(RL_TRAINABLE_METHODS))),
        rl_reference=draw(st.booleans()),
        rl_reward_model=draw(st.booleans()),
        vllm_memory_utilization=draw(st.sampled_from([0.0, 0.3, 0.55])),
        quant=quant,
        framework=draw(st.sampled_from(list(Framework))),
        loss=draw(st.none() | st.sampled_from(list(Loss))),
        compile=draw(optional),
        activation_offload=draw(optional),
        optimizer_in_backward=in_backward,
        sync_each_batch=draw(optional),
        qlora_frozen_dtype=draw(st.none() | st.sampled_from(list(StoreDtype))),
        adapter_dtype=draw(st.none() | st.sampled_from(list(StoreDtype))),
        value_head=draw(st.none() | st.sampled_from(list(ValueHead))),
    )


@settings(max_examples=300, deadline=None)
@given(plan=plans())
def test_plan_arguments_parse_back_to_the_same_plan(plan: Plan) -> None:
    # parsed as ``hwdash plan`` does: the flags, then the framework's defaults where none is given
    # (an Unsloth plan without checkpointing needs --no-grad-ckpt, one with plain AdamW --optimizer)
    argv = plan_arguments(plan)
    args = build_parser().parse_args(["plan", *argv])
    assert apply_framework_defaults(plan_from_args(args), CATALOG, argv) == plan
