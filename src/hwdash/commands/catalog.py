"""``hwdash catalog list|validate``: show the hardware and model catalog, or check catalog files.

``list`` prints one kind of entry (flavors by default; accelerators, models, the training
frameworks' saver defaults, the step-time slowdowns) as a table, or as JSON with every field (plus
``usable_bytes`` for accelerators and ``counted_params`` for models). ``validate`` loads the built-in
catalog, the user catalog folders and the given files or folders, and prints one line of counts; a
broken file raises :class:`~hwdash.core.catalog.CatalogError`, which ``hwdash.cli.main`` prints as one
line with exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from hwdash.core import strict_json
from hwdash.core.catalog import Catalog, load_catalog
from hwdash.core.models.params import count_parameters
from hwdash.core.specs import Accelerator, Flavor, Framework, ModelSpec
from hwdash.core.units import GIB, format_count
from hwdash.errors import UsageError

KINDS = ("flavors", "accelerators", "models", "frameworks", "slowdowns")


def _add_catalog_flag(parser: argparse.ArgumentParser) -> None:
    # SUPPRESS keeps a top-level `hwdash --catalog DIR catalog list` value when the flag is not
    # repeated after the subcommand (argparse copies every subcommand default over the parent's).
    parser.add_argument(
        "--catalog",
        dest="catalog",
        action="append",
        default=argparse.SUPPRESS,
        metavar="DIR",
        help=(
            "extra catalog folder or file; adds or overrides entries by id (repeatable; "
            "given after the subcommand it replaces any --catalog given before it)"
        ),
    )


def add_parser(subparsers: Any) -> None:
    """Register ``hwdash catalog`` and its ``list`` and ``validate`` actions."""
    parser = subparsers.add_parser(
        "catalog",
        help="list or validate the hardware and model catalog",
        description=(
            "Show the catalog of accelerators, flavors (machines with a price), models, the "
            "training frameworks' saver defaults and the step-time slowdowns, or check catalog "
            "files. User files in $XDG_CONFIG_HOME/hwdash/catalog/, in HWDASH_CATALOG "
            "folders or given with --catalog add entries or override them by id."
        ),
    )
    _add_catalog_flag(parser)
    actions = parser.add_subparsers(dest="catalog_action", metavar="ACTION")

    list_parser = actions.add_parser(
        "list", help="print catalog entries (flavors unless --kind says otherwise)"
    )
    list_parser.add_argument(
        "--kind", choices=KINDS, default="flavors", help="which entries to list (default: flavors)"
    )
    list_parser.add_argument(
        "--json", action="store_true", help="print a JSON list of objects with every field"
    )
    _add_catalog_flag(list_parser)

    validate_parser = actions.add_parser(
        "validate",
        help="check the built-in catalog, the user catalog and the given files or folders",
    )
    validate_parser.add_argument(
        "paths", nargs="*", metavar="PATH", help="catalog folder or .toml file to check as well"
    )
    _add_catalog_flag(validate_parser)


def run(args: argparse.Namespace) -> int:
    """Run ``hwdash catalog``; ``hwdash catalog`` alone lists flavors."""
    extra = list(getattr(args, "catalog", None) or [])
    if getattr(args, "catalog_action", None) == "validate":
        return _validate(extra, list(args.paths))
    kind = getattr(args, "kind", "flavors")
    catalog = load_catalog(extra)
    if kind == "models":
        # Models in the local Hugging Face cache are listed too (offline: read from the cache).
        from dataclasses import replace

        from hwdash.core.models.config import cached_models

        cached = {model.id: model for model in cached_models(catalog)}
        catalog = replace(catalog, models={**catalog.models, **cached})
    if getattr(args, "json", False):
        sys.stdout.write(strict_json.dumps(catalog_as_json(catalog, kind), indent=2) + "\n")
        return 0
    _print_table(catalog, kind)
    return 0


def _validate(extra: list[str], paths: list[str]) -> int:
    for path in paths:
        folder = Path(path)
        if folder.is_dir() and not any(folder.glob("*.toml")):
            raise UsageError(f"no .toml files in {path}", flag="validate")
    catalog = load_catalog([*extra, *paths])
    print(
        f"catalog OK: {len(catalog.files)} files, {len(catalog.accelerators)} accelerators, "
        f"{len(catalog.flavors)} flavors, {len(catalog.models)} models, "
        f"{len(catalog.frameworks)} frameworks, {len(catalog.slowdowns)} slowdowns"
    )
    return 0


def catalog_as_json(catalog: Catalog, kind: str) -> list[dict[str, Any]]:
    """Every entry of one kind as plain JSON objects (bytes as integers)."""
    if kind == "accelerators":
        return [
            {**acc.model_dump(mode="json"), "usable_bytes": acc.usable_bytes}
            for acc in catalog.accelerators.values()
        ]
    if kind == "models":
        return [
            {**model.model_dump(mode="json"), "counted_params": count_parameters(model)}
            for model in catalog.models.values()
        ]
    if kind == "flavors":
        return [flavor.model_dump(mode="json") for flavor in catalog.flavors.values()]
    if kind == "frameworks":
        return [framework.model_dump(mode="json") for framework in catalog.frameworks.values()]
    if kind == "slowdowns":
        return [slowdown.model_dump(mode="json") for slowdown in catalog.slowdowns.values()]
    raise UsageError(f"unknown kind {kind!r} (choose from {', '.join(KINDS)})", flag="--kind")


def _number(value: float | None, fmt: str = "{:g}") -> str:
    return "-" if value is None else fmt.format(value)


def _flavor_row(catalog: Catalog, flavor: Flavor) -> list[str]:
    acc = catalog.accelerator_for(flavor)
    hardware = "CPU only" if acc is None else f"{flavor.gpu_count}x {acc.id}"
    memory = "-" if acc is None else f"{acc.usable_bytes / GIB:.1f}"
    price = "-" if flavor.price_per_hour is None else f"${flavor.price_per_hour:.2f}"
    return [
        flavor.id,
        flavor.provider,
        hardware,
        memory,
        _number(flavor.vcpu),
        _number(flavor.ram_gb),
        price,
        flavor.price_date or "-",
    ]


def _accelerator_row(acc: Accelerator) -> list[str]:
    rate, dtype = acc.matmul_tflops()
    return [
        acc.id,
        acc.kind,
        _number(acc.memory_gb),
        f"{acc.usable_bytes / GIB:.1f}" if acc.kind != "cpu" else "-",
        _number(acc.memory_bandwidth_gbps),
        "-" if rate is None else f"{rate:g} {dtype}",
        _number(acc.fp32_tflops),
        _number(acc.power_w),
        f"{acc.default_mfu:.2f}",
        acc.name,
    ]


def _model_row(model: ModelSpec) -> list[str]:
    params = (
        format_count(model.params) if model.params else f"~{format_count(count_parameters(model))}"
    )
    experts = "-" if model.experts == 1 else f"{model.experts} (top {model.experts_per_token})"
    return [
        model.id,
        params,
        str(model.layers),
        str(model.hidden_size),
        f"{model.heads}/{model.kv_heads}",
        str(model.vocab_size),
        str(model.max_context),
        experts,
    ]


def _settings_words(settings: dict[str, Any]) -> str:
    def word(value: Any) -> str:
        if isinstance(value, bool):
            return "on" if value else "off"
        return str(value)

    return ", ".join(f"{name.replace('_', ' ')} {word(v)}" for name, v in settings.items()) or "-"


def _framework_row(framework: Framework) -> list[str]:
    return [
        framework.id,
        _settings_words(framework.given()),
        _settings_words(framework.full.given()),
    ]


def _print_table(catalog: Catalog, kind: str) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    if kind == "flavors":
        headers = [
            "id",
            "provider",
            "hardware",
            "GiB/GPU",
            "vCPU",
            "RAM GB",
            "$/hour",
            "price date",
        ]
        rows = [_flavor_row(catalog, flavor) for flavor in catalog.flavors.values()]
        caption = "GiB/GPU: memory a process can use (NVML total where known). Local: no price."
    elif kind == "accelerators":
        headers = ["id", "kind", "GB", "usable GiB", "GB/s", "TFLOPS", "FP32", "W", "MFU", "name"]
        rows = [_accelerator_row(acc) for acc in catalog.accelerators.values()]
        caption = (
            "TFLOPS: dense tensor rate training runs at (GeForce: FP32 accumulate). MFU: a guess."
        )
    elif kind == "models":
        headers = ["id", "params", "layers", "hidden", "heads/kv", "vocab", "context", "experts"]
        rows = [_model_row(model) for model in catalog.models.values()]
        caption = "params: published count; ~ marks a count from the architecture."
    elif kind == "frameworks":
        headers = ["id", "defaults", "full fine-tuning"]
        rows = [_framework_row(framework) for framework in catalog.frameworks.values()]
        caption = (
            "What --framework sets where neither the plan nor a flag does; unset: Hugging Face's "
            "behaviour. Sources: --json."
        )
    elif kind == "slowdowns":
        headers = ["id", "factor", "compared with"]
        rows = [
            [slowdown.id, f"x{slowdown.factor:g}", slowdown.compared_with]
            for slowdown in catalog.slowdowns.values()
        ]
        caption = "Step-time factors --fit multiplies an option's time by. Sources: --json."
    else:
        raise UsageError(f"unknown kind {kind!r} (choose from {', '.join(KINDS)})", flag="--kind")
    table = Table(title=f"hwdash catalog: {kind} ({len(rows)})", caption=caption)
    # Long prose columns wrap; every other column keeps its cells on one line.
    prose = ("defaults", "full fine-tuning", "compared with")
    for header in headers:
        text = header in ("id", "provider", "hardware", "kind", "name", "price date", *prose)
        table.add_column(
            header,
            no_wrap=header not in prose,
            justify="left" if text else "right",
            ratio=(2 if header == "defaults" else 1) if header in prose else None,
        )
    for row in rows:
        # Catalog names and ids come from user files: text, never rich markup.
        table.add_row(*(Text(str(cell)) for cell in row))
    # A terminal gets its own width; a pipe or file gets room for every column instead of 80.
    Console(width=None if sys.stdout.isatty() else 200).print(table)
