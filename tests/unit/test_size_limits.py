"""Size limits (issue 25): no function over 60 lines, no module over 600 lines of logic.

A function's length is from its ``def`` (or first decorator) to its last line, docstring included; a
module's logic lines are its non-blank lines that are neither comments nor docstrings. Declarative
tables (a module-level assignment of a literal) are not functions and are not limited.

When the test was written, 40 functions and 8 modules were over the limits (``commands/plan.py``'s
``add_parser`` at 353 lines, ``ui/planner_pane.py`` at 1092 logic lines...); issue 25 split them by
concern, and none may grow back.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
FUNCTION_LINES = 60
MODULE_LOGIC_LINES = 600


def _docstring_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        first = node.body[0] if node.body else None
        if (
            isinstance(first, ast.Expr)
            and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)
        ):
            lines.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    return lines


def measure(src: Path = SRC) -> tuple[dict[str, int], dict[str, int]]:
    """(function -> lines over the limit's unit, module -> logic lines), for every source file."""
    functions: dict[str, int] = {}
    module_lines: dict[str, int] = {}
    for path in sorted((src / "hwdash").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        relative = path.relative_to(src).as_posix()
        skip = _docstring_lines(tree)
        module_lines[relative] = sum(
            1
            for number, line in enumerate(text.splitlines(), 1)
            if line.strip() and not line.strip().startswith("#") and number not in skip
        )
        for name, node in _functions(tree):
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            functions[f"{relative}:{name}"] = (node.end_lineno or start) - start + 1
    return functions, module_lines


def _functions(
    node: ast.AST, prefix: str = ""
) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function under ``node`` by its qualified name (``App.__init__``, ``run.inner``)."""
    found: list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]] = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            name = prefix + child.name
            if not isinstance(child, ast.ClassDef):
                found.append((name, child))
            found.extend(_functions(child, name + "."))
        else:
            found.extend(_functions(child, prefix))
    return found


def test_functions_and_modules_within_their_limits() -> None:
    functions, module_lines = measure()
    over = sorted(name for name, length in functions.items() if length > FUNCTION_LINES)
    big = sorted(name for name, length in module_lines.items() if length > MODULE_LOGIC_LINES)
    assert not over, f"functions over {FUNCTION_LINES} lines: " + ", ".join(
        f"{name} ({functions[name]})" for name in over
    )
    assert not big, f"modules over {MODULE_LOGIC_LINES} logic lines: " + ", ".join(
        f"{name} ({module_lines[name]})" for name in big
    )


def test_the_measure_counts_what_it_says(tmp_path: Path) -> None:
    package = tmp_path / "hwdash"
    package.mkdir()
    body = "".join(f"        x{i} = {i}\n" for i in range(59))
    source = (
        '"""Doc."""\n\n# a comment\n\n'
        f"class A:\n    @staticmethod\n    def long():\n{body}        return 0\n"
        "\n\ndef short():\n    '''Doc\n    string.'''\n    return 1\n"
    )
    (package / "m.py").write_text(source)
    functions, module_lines = measure(tmp_path)
    # the decorator, the def, 59 assignments and the return: 62 lines, qualified by its class
    assert functions["hwdash/m.py:A.long"] == 62
    assert functions["hwdash/m.py:short"] == 4
    # logic lines: class, decorator, def, 59 assignments, return, def short, return
    assert module_lines["hwdash/m.py"] == 3 + 60 + 2
