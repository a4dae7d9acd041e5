"""This machine as a flavor: built from what NVML reports, matched to the catalog by name."""

from __future__ import annotations

import pytest

from hwdash.core.catalog import Catalog, load_catalog
from hwdash.core.plan import Plan
from hwdash.core.planning.fit import evaluate_plan
from hwdash.core.planning.local_flavor import (
    LocalGpu,
    NoLocalGpu,
    local_machine,
    with_local_machine,
)
from hwdash.core.units import MIB


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return load_catalog(include_user=False)


def a100(free_mib: int = 60000) -> LocalGpu:
    return LocalGpu("NVIDIA A100-SXM4-80GB", 81920 * MIB, free_mib * MIB)


def test_a_known_gpu_brings_the_catalogs_speed_and_nvmls_memory(catalog: Catalog) -> None:
    machine = local_machine([a100(), a100()], catalog)
    assert machine.flavor.id == "local" and machine.flavor.gpu_count == 2
    assert machine.accelerator.usable_bytes == 81920 * MIB
    assert machine.accelerator.bf16_tflops is not None
    assert machine.notes == ()


def test_local_free_uses_the_memory_free_now_on_the_fullest_gpu(catalog: Catalog) -> None:
    machine = local_machine([a100(60000), a100(20000)], catalog, free_only=True)
    assert machine.flavor.id == "local-free"
    assert machine.accelerator.usable_bytes == 20000 * MIB


def test_an_unknown_gpu_keeps_its_memory_and_says_its_speed_is_unknown(catalog: Catalog) -> None:
    machine = local_machine([LocalGpu("NVIDIA Imaginary 9000", 49152 * MIB, None)], catalog)
    assert machine.accelerator.usable_bytes == 49152 * MIB
    assert machine.accelerator.bf16_tflops is None
    assert "not in the catalog" in machine.notes[0]
    extended = with_local_machine(catalog, machine)
    report = evaluate_plan(Plan(model="qwen2.5-0.5b", examples=1000, flavors=("local",)), extended)
    (fit,) = report.flavors
    assert fit.verdict.value == "fits" and fit.hours is None


def test_no_readable_gpu_is_an_error_that_says_why(catalog: Catalog) -> None:
    with pytest.raises(NoLocalGpu, match="no GPU"):
        local_machine([], catalog)
    with pytest.raises(NoLocalGpu):
        local_machine([LocalGpu("NVIDIA GB10", None, None)], catalog)


def test_an_impossible_memory_size_is_said_not_a_traceback(catalog: Catalog) -> None:
    with pytest.raises(NoLocalGpu, match="impossible memory size"):
        local_machine([LocalGpu("NVIDIA Imaginary 9000", 10**18, None)], catalog)
