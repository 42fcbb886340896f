"""The contract suites a torch-free server install runs: the ``server_contract`` marker.

``make test-lowest`` installs ``.[server,test]`` at the lowest versions pyproject's ranges admit
(no torch, no dev-only package) and runs ``pytest tests/service -m server_contract``: the REST
protocol, authentication, request bodies and input errors, config imports, lifecycle, searches,
metrics and migrations, in process (``TestClient``) on SQLite and PostgreSQL, in about three minutes.
A failure there is a lower bound that is not true.

The modules are listed here, not marked one by one: with ``-m server_contract`` the others are
not even imported (several need torch or dev-only packages), and every test of a listed module
is marked. :data:`NEWER_TEST_TOOLS` are tests of listed modules that need a newer test tool than
the server's own bounds admit; they run in the full suite only.
"""

from __future__ import annotations

from pathlib import Path

import pytest

MARKER = "server_contract"
HERE = Path(__file__).parent

#: Modules of tests/service whose tests need only the server's install.
SERVER_CONTRACT_MODULES = frozenset(
    {
        "test_auth.py",
        "test_bodies.py",
        "test_imports.py",
        "test_inputs.py",
        "test_lifecycle.py",
        "test_metrics.py",
        "test_migrations.py",
        "test_protocol.py",
        "test_searches.py",
        "test_shape_bounds.py",
        "test_worker_token_chip.py",
    }
)

#: Test name -> why it is left out: Starlette's ``TestClient(client=...)`` came in 0.44, while
#: the server itself runs on FastAPI 0.110's Starlette (0.36).
NEWER_TEST_TOOLS = {
    "test_failed_authentications_are_limited_per_address_and_valid_tokens_pass": "TestClient(client=)",
}


def _selected(config: pytest.Config) -> bool:
    return bool(config.getoption("markexpr") == MARKER)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With ``-m server_contract``: the other test modules of this folder are not imported."""
    if not _selected(config) or collection_path.parent != HERE or collection_path.suffix != ".py":
        return None
    return collection_path.name.startswith("test_") and collection_path.name not in SERVER_CONTRACT_MODULES


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test of a listed module, except :data:`NEWER_TEST_TOOLS`, is marked."""
    for item in items:
        name = getattr(item, "originalname", item.name)
        listed = item.path.parent == HERE and item.path.name in SERVER_CONTRACT_MODULES
        if listed and name not in NEWER_TEST_TOOLS:
            item.add_marker(MARKER)
