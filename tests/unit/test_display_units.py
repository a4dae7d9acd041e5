"""One spelling per unit on every surface (issue 16): memory, temperature, power and money."""

from __future__ import annotations

import pytest

from hwdash.cli import main
from hwdash.core.units import (
    GIB,
    TIB,
    format_gib,
    format_gib_pair,
    format_money,
    format_power,
    format_temperature,
)
from hwdash.telemetry.types import GpuSample, GpuState


def test_memory_reads_in_gib_and_in_tib_from_1024_gib() -> None:
    assert format_gib(76.94 * GIB) == "76.9 GiB"
    assert format_gib(1023.94 * GIB) == "1023.9 GiB"
    assert format_gib(1024 * GIB) == "1.0 TiB"
    assert format_gib(1.5 * TIB) == "1.5 TiB"
    assert format_gib(3.1 * GIB, signed=True) == "+3.1 GiB"
    assert format_gib(-2.25 * GIB, signed=True) == "-2.2 GiB"


def test_a_part_of_a_whole_is_said_in_the_wholes_unit() -> None:
    assert format_gib_pair(76.9 * GIB, 80 * GIB) == "76.9 / 80.0 GiB"
    assert format_gib_pair(76.9 * GIB, 80 * GIB, compact=True) == "76.9/80.0 GiB"
    assert format_gib_pair(76.9 * GIB, 80 * GIB, joiner=" of ") == "76.9 of 80.0 GiB"
    # a 2 TiB host: both numbers in TiB, never "512.0/2.0"
    assert format_gib_pair(512 * GIB, 2 * TIB, compact=True) == "0.5/2.0 TiB"


def test_temperature_power_and_money_have_one_format() -> None:
    assert format_temperature(64.4) == "64°C"
    assert format_power(310.2) == "310 W"
    assert format_power(310.2, 400) == "310 / 400 W"
    assert format_power(310.2, 400, compact=True) == "310/400 W"
    assert format_money(0.194) == "$0.19"
    assert format_money(30) == "$30.00"
    assert format_money(1234.5) == "$1,234.50"
    assert format_money(None) == "-"


def test_the_dashboards_cells_and_the_command_line_agree() -> None:
    from hwdash.ui.widgets.monitor_gpu import gpu_cells

    gpu = GpuSample(
        index=0,
        name="NVIDIA A100-SXM4-80GB",
        uuid=None,
        state=GpuState.OK,
        total_bytes=80 * GIB,
        free_bytes=4 * GIB,
        used_bytes=75 * GIB,
        temperature_c=64,
        power_w=310,
        power_limit_w=400,
    )
    compact = gpu_cells(gpu, wide=False)
    wide = gpu_cells(gpu, wide=True)
    assert compact.memory == "76.0/80.0 GiB" and wide.memory == "76.0 / 80.0 GiB"
    assert compact.temperature == wide.temperature == "64°C"
    assert compact.power == "310 W" and wide.power == "310 / 400 W"


def test_monitor_once_and_stream_use_the_same_units(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["monitor", "--once", "--fake-nvml", "h100x8"]) == 0
    once = capsys.readouterr().out
    assert main(["monitor", "--count", "1", "--interval", "0.1", "--fake-nvml", "h100x8"]) == 0
    stream = capsys.readouterr().out
    for text in (once, stream):
        assert "°C" in text and " W" in text and " GiB" in text
        assert "G " not in text.replace("GiB", "")  # no bare "80G"


def test_the_forecast_reads_alike_in_the_tables_and_the_narrow_column() -> None:
    from hwdash.core.units import format_forecast

    assert format_forecast(None) == format_forecast(None, compact=True) == ""
    assert (format_forecast(45), format_forecast(45, compact=True)) == ("45 s", "45s")
    assert (format_forecast(600), format_forecast(600, compact=True)) == ("10 min", "10m")
    assert (format_forecast(9000), format_forecast(9000, compact=True)) == ("2.5 h", "2.5h")
