"""The house rule on sizes: every module of the package is at most 450 lines, every function at
most 60, so that each module keeps one job and each function can be read at once.

Covers ``service/``, ``tuner/``, ``client/``, ``kernels/`` and ``nn/`` (every ``.py`` file below them).
The wire schemas (``client/wire.py``) are exempt from the module rule: they are one vocabulary,
read field by field. A function's length is counted from its ``def`` line to its last line
(decorators aside), nested functions and methods each on their own.

Each module is its own test case, named by its path (``test_module_lines[service/scheduling/jobs.py]``),
so a failure says which module broke the rule; a function failure lists each function over
the rule with its line and length.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: The package's folders the rule covers.
COVERED = ("service", "tuner", "client", "kernels", "nn")
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 60
#: Modules exempt from the module rule (not the function rule): the wire schemas.
MODULE_RULE_EXEMPT = frozenset({"client/wire.py"})

MODULES = sorted(
    path.relative_to(ROOT).as_posix()
    for folder in COVERED
    for path in (ROOT / folder).rglob("*.py")
    if "__pycache__" not in path.parts
)


def long_functions(source: str) -> list[tuple[str, int, int]]:
    """Each function of ``source`` over :data:`MAX_FUNCTION_LINES`: (name, first line, lines)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            assert node.end_lineno is not None
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                found.append((node.name, node.lineno, lines))
    return sorted(found, key=lambda function: function[1])


def test_the_rule_covers_the_package() -> None:
    assert {module.split("/", 1)[0] for module in MODULES} == set(COVERED)
    assert "service/app.py" in MODULES
    assert "tuner/search/search.py" in MODULES  # subpackages too


@pytest.mark.parametrize("module", [m for m in MODULES if m not in MODULE_RULE_EXEMPT])
def test_module_lines(module: str) -> None:
    lines = len((ROOT / module).read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_MODULE_LINES, (
        f"{module} has {lines} lines, over the rule's {MAX_MODULE_LINES}: split it into modules "
        "with one job each"
    )


@pytest.mark.parametrize("module", MODULES)
def test_function_lines(module: str) -> None:
    over = long_functions((ROOT / module).read_text(encoding="utf-8"))
    listed = ", ".join(f"{name} (line {line}: {lines} lines)" for name, line, lines in over)
    assert not over, f"{module}: functions over the rule's {MAX_FUNCTION_LINES} lines: {listed}"


def test_a_function_over_the_rule_is_found_in_a_class_counted_from_its_def_line() -> None:
    body = "".join(f"        x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES - 1))
    head = "class A:\n    @staticmethod\n    def long() -> None:\n"
    source = f"{head}{body}\n    def short() -> None:\n        pass\n"
    assert long_functions(source) == []  # exactly at the rule
    over = source.replace("    def long() -> None:\n", "    def long() -> None:\n        y = 0\n")
    assert long_functions(over) == [("long", 3, MAX_FUNCTION_LINES + 1)]
