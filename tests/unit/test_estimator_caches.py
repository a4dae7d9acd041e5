"""The estimator's memoized pieces answer as if they were computed afresh.

The make-it-fit search asks the estimator thousands of times about one model, so the layout of a
model, a layer's activations and a framework's stated defaults are computed once and kept. These
tests pin what the caches must not change: a different model (even under the same id), a layout
differing in one field, and a caller changing the defaults it was handed.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from hwdash.core.catalog import load_catalog_from
from hwdash.core.estimator import architecture, estimate_memory, layer_activation_bytes
from hwdash.core.estimator.savers import framework_settings, packaged_frameworks
from hwdash.core.plan import Attention, Method, Plan
from hwdash.core.specs import ModelSpec

FIXTURE_DIR = Path(__file__).resolve().parent.parent / "data" / "catalog_estimator"


def _model(ident: str) -> ModelSpec:
    return load_catalog_from([FIXTURE_DIR]).models[ident]


def test_a_model_with_the_same_id_but_other_dimensions_gets_its_own_layout() -> None:
    model = _model("fx-8b-gqa")
    first = architecture(model)
    assert architecture(model) is first  # kept for the same model object
    wider = model.model_copy(update={"hidden_size": model.hidden_size * 2})
    assert wider.id == model.id
    assert architecture(wider).hidden == 2 * first.hidden
    assert architecture(wider).total_params > first.total_params
    # and the estimate follows the model, not the id
    plan = Plan(model=model.id, method=Method.FULL)
    assert (
        estimate_memory(plan, wider).per_gpu.weights > estimate_memory(plan, model).per_gpu.weights
    )


def test_equal_layouts_share_a_layer_count_and_a_changed_field_does_not() -> None:
    arch = architecture(_model("fx-8b-gqa"))
    copy = dataclasses.replace(arch)
    assert copy == arch and hash(copy) == hash(arch)
    base = layer_activation_bytes(arch, 1, 512, 2, Attention.SDPA)
    assert layer_activation_bytes(copy, 1, 512, 2, Attention.SDPA) == base
    wider_mlp = dataclasses.replace(arch, intermediate=arch.intermediate * 2)
    # a different layout compares unequal (so no cache hands it the other's counts) and hashes
    # apart (the kept field hash covers every field; ints hash to themselves, so this is exact)
    assert wider_mlp != arch
    assert hash(wider_mlp) != hash(arch)
    assert layer_activation_bytes(wider_mlp, 1, 512, 2, Attention.SDPA) > base
    # derived counts are per object: a replaced layout's are its own
    kept = arch.block_params
    fewer = dataclasses.replace(arch, linears=arch.linears[:-1])
    assert fewer.block_params == kept - arch.linears[-1].params


def test_changing_the_stated_defaults_handed_out_changes_nothing_kept() -> None:
    torchtune = packaged_frameworks()["torchtune"]
    first = framework_settings(torchtune, Method.FULL)
    assert first  # torchtune states defaults for full fine-tuning
    expected = dict(first)
    first.clear()
    first["loss"] = "nonsense"
    assert framework_settings(torchtune, Method.FULL) == expected
    assert framework_settings(torchtune, Method.LORA) != expected  # full's overrides only for full
