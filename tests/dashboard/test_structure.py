"""How the dashboard's modules depend on each other and on the service (read from their source).

Pages reach the service through typed dependencies, never ``request.app.state.services``, and
share helpers through :mod:`tiletune.service.dashboard.pages`, never by importing another page.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tiletune.service import dashboard

PACKAGE = "tiletune.service.dashboard"
FOLDER = Path(dashboard.__file__).parent
#: The modules that each serve a page (or pages) of their own.
PAGES = {
    "overview",
    "jobs_list",
    "job_page",
    "kernel_page",
    "shape_page",
    "misses_page",
    "compare_page",
    "signin",
}


def imported_modules(path: Path) -> set[str]:
    """The modules a source file imports (``from X import name``: ``X`` and ``X.name``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_no_page_imports_another_page() -> None:
    for page in sorted(PAGES):
        imported = imported_modules(FOLDER / f"{page}.py")
        others = {f"{PACKAGE}.{other}" for other in PAGES - {page}}
        assert not imported & others, f"{page} imports {sorted(imported & others)}"


def test_no_dashboard_module_reaches_the_untyped_services() -> None:
    for path in sorted(FOLDER.glob("*.py")):
        assert "state.services" not in path.read_text(), path.name
