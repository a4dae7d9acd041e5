"""The import graph of ``src/hwdash``: no circles, and each package imports only the layers below it.

Every import is an edge, wherever it is written: at the top of a module, inside a function (the lazy
imports that keep the monitor's start light), under ``if TYPE_CHECKING:``, and
``importlib.import_module("hwdash...")`` with a literal name. ``from package import name`` is an edge
to the submodule when ``name`` is one, else to the package's ``__init__``; the implicit import of a
module's parent packages is not an edge (Python initialises them first, whatever they hold).

The layers (issue 25; each package's ``__init__`` docstring says the same):

* ``hwdash.errors``: nothing of hwdash;
* the core's foundation (the modules directly in ``hwdash/core/``: units, numbers, plan, plan
  fields, specs, results, data files, module names, memo, strict JSON; the catalog loader
  excepted): the errors and each other;
* ``hwdash.core.estimator``: the foundation;
* ``hwdash.core.models`` (config.json readers): the foundation and the estimator;
* ``hwdash.core.catalog``: the foundation, the estimator and the models;
* ``hwdash.core.planning`` (fit verdicts, make-it-fit, run time): all of the above;
* ``hwdash.core.plans`` (store, imports, exports): all of the above and planning;
* ``hwdash.core.live`` (alerts, OOM forecast): the foundation;
* ``hwdash.telemetry``: the foundation and live; never the planner (the probe file's protocol,
  :mod:`hwdash.telemetry.probe_files`, is here: the probe writes what the telemetry reads);
* ``hwdash.runs`` (a run held against its plan, the runs ledger, calibration): the core and the
  telemetry;
* ``hwdash.probe`` (in the training process): the telemetry (the probe file's protocol, the NVML
  energy counter) and, at the end of a run, the runs ledger;
* ``hwdash.tracing``: the core;
* ``hwdash.ui``: the core, telemetry and tracing; never the commands or the CLI;
* ``hwdash.commands``: all but the CLI.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

FOUNDATION = "core"
#: layer -> the layers it may import (besides itself)
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    FOUNDATION: {"errors"},
    "core.estimator": {FOUNDATION, "errors"},
    "core.models": {FOUNDATION, "core.estimator", "errors"},
    "core.catalog": {FOUNDATION, "core.estimator", "core.models", "errors"},
    "core.planning": {FOUNDATION, "core.estimator", "core.models", "core.catalog", "errors"},
    "core.plans": {
        FOUNDATION,
        "core.estimator",
        "core.models",
        "core.catalog",
        "core.planning",
        "errors",
    },
    "core.live": {FOUNDATION, "errors"},
    "telemetry": {FOUNDATION, "core.live", "errors"},
}
CORE = {name for name in ALLOWED if name.startswith("core")}
ALLOWED["runs"] = CORE | {"telemetry", "errors"}
ALLOWED["probe"] = {"telemetry", "runs", "errors"}
ALLOWED["tracing"] = CORE | {"errors"}
ALLOWED["ui"] = CORE | {"telemetry", "tracing", "runs", "probe", "errors"}
ALLOWED["commands"] = CORE | {"telemetry", "tracing", "runs", "ui", "probe", "errors"}
ALLOWED["cli"] = {"commands", "ui", "errors", "version"}
ALLOWED["main"] = {"cli"}
ALLOWED["version"] = set()

_SUBPACKAGES = ("estimator", "models", "planning", "plans", "live")


def modules(root: Path = SRC) -> dict[str, Path]:
    """Every module under ``root/hwdash`` by dotted name (a package by its own name)."""
    found = {}
    for path in (root / "hwdash").rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _owner(name: str, known: dict[str, Path]) -> str | None:
    """The module ``name`` lives in (``a.b.c`` where ``a.b`` is the module and ``c`` a name in it)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _imported_names(node: ast.AST, package: str) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            base = ".".join([*anchor, base] if base else anchor)
        for alias in node.names:
            yield f"{base}.{alias.name}"  # the submodule, or a name inside ``base`` (see _owner)
    elif (
        isinstance(node, ast.Call)
        and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
        and node.args
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    ):
        yield node.args[0].value


def import_graph(root: Path = SRC) -> dict[str, set[str]]:
    """Module -> the hwdash modules it imports (every import statement in it, see the docstring)."""
    known = modules(root)
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            for target in _imported_names(node, package):
                if not target.startswith("hwdash"):
                    continue
                owner = _owner(target, known)
                if owner is not None and owner != name:
                    graph[name].add(owner)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each as a loop."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(node: str) -> None:
        nonlocal counter
        index[node] = low[node] = counter
        counter += 1
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def layer(module: str) -> str:
    """The layer a module belongs to (see the module docstring)."""
    parts = module.split(".")
    if module == "hwdash":
        return "version"
    if parts[1] == "__main__":
        return "main"
    if parts[1] == "core":
        if len(parts) > 2 and parts[2] in _SUBPACKAGES:
            return f"core.{parts[2]}"
        if len(parts) > 2 and parts[2] == "catalog":
            return "core.catalog"
        return FOUNDATION
    return parts[1]


def test_the_walker_sees_lazy_type_checking_and_import_module_edges(tmp_path: Path) -> None:
    package = tmp_path / "hwdash"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from hwdash.b import Thing\n"
        "def f():\n    import importlib\n    importlib.import_module('hwdash.sub.c')\n"
    )
    (package / "b.py").write_text("def g():\n    from hwdash import a\n")
    (package / "sub" / "c.py").write_text("from . import d\nfrom ..b import g\n")
    (package / "sub" / "d.py").write_text("")
    graph = import_graph(tmp_path)
    assert graph["hwdash.a"] == {"hwdash.b", "hwdash.sub.c"}
    assert graph["hwdash.b"] == {"hwdash.a"}
    assert graph["hwdash.sub.c"] == {"hwdash.sub.d", "hwdash.b"}
    assert cycles(graph) == [["hwdash.a", "hwdash.b", "hwdash.sub.c"]]


def test_no_import_circles() -> None:
    graph = import_graph()
    assert "hwdash.commands.dashboard" in graph["hwdash.cli"]  # a lazy import_module edge
    found = cycles(graph)
    assert not found, "import circles (every import counts, lazy ones too):\n" + "\n".join(
        " <-> ".join(component) for component in found
    )


def test_each_layer_imports_only_the_layers_below() -> None:
    graph = import_graph()
    wrong = []
    for module, targets in sorted(graph.items()):
        mine = layer(module)
        assert mine in ALLOWED, f"{module}: layer {mine!r} has no rule"
        for target in sorted(targets):
            theirs = layer(target)
            if theirs != mine and theirs not in ALLOWED[mine]:
                wrong.append(f"{module} ({mine}) imports {target} ({theirs})")
    assert not wrong, "imports across the layers' rules:\n" + "\n".join(wrong)


def test_every_package_says_what_it_may_import() -> None:
    for name in ("hwdash.core", *(f"hwdash.core.{sub}" for sub in _SUBPACKAGES), "hwdash.tracing"):
        path = modules()[name]
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        assert "May import" in doc, f"{path}: the docstring does not say what it may import"
