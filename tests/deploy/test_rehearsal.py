"""The deploy paths as written come up: ``docker-compose.yml`` after the README's ``.env`` line, and the
README's Kubernetes steps with the manifests they apply.

Each path is resolved from the files (every variable interpolated, every ``secretKeyRef`` looked up
in what the documented steps create) and started as local processes on a fresh PostgreSQL database
(:mod:`tests.deploy.local_run` lists the rewrites a container network would make): the server
answers its readiness path, the database is migrated, every worker registers, and a small sweep
submitted with the admin token ends with its jobs ``done``.

The rehearsal must also fail where an operator would: with one documented secret key removed from
the README's steps (resolution names the key), and with a worker whose token the server does not
know (the rehearsal reports the worker refused, 401).
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.compose_plan import Interpolation, resolve_compose
from tests.deploy.kubernetes_plan import resolve_kubernetes
from tests.deploy.local_run import rehearse
from tests.deploy.rehearsal import REQUIRED_VARIABLES, ROOT, RehearsalError, readme_section
from tests.service.conftest import postgres_database

README = ROOT / "deploy" / "README.md"


@pytest.fixture
def database_url() -> Iterator[str]:
    """A fresh PostgreSQL database (127.0.0.1:5432, trust auth), dropped afterwards."""
    with postgres_database() as url:
        yield url


def test_the_compose_path_comes_up_and_tunes(tmp_path: Path, database_url: str) -> None:
    deployment = resolve_compose()
    workers = [plan for plan in deployment.processes if plan.kind == "worker"]
    assert workers, "docker-compose.yml runs no worker"

    outcome = rehearse(deployment, tmp_path, database_url)

    assert outcome.workers_registered >= len(workers)
    assert [job["state"] for job in outcome.jobs] == ["done"]
    assert outcome.jobs[0]["progress"]["completed"] >= 1
    assert outcome.worker_exit_codes == [0] * len(workers), "a worker did not stop cleanly on SIGTERM"


def test_the_kubernetes_path_comes_up_and_tunes(tmp_path: Path, database_url: str) -> None:
    deployment = resolve_kubernetes()
    servers = [plan for plan in deployment.processes if plan.kind == "server"]
    workers = [plan for plan in deployment.processes if plan.kind == "worker"]
    assert servers, "the applied manifests run no server"
    assert workers, "the applied manifests run no worker"

    outcome = rehearse(deployment, tmp_path, database_url)

    assert len(outcome.server_urls) == len(servers)  # replicas started together: one migrates, then the other
    assert outcome.workers_registered >= len(workers)
    assert [job["state"] for job in outcome.jobs] == ["done"]
    assert outcome.worker_exit_codes == [0] * len(workers), "a worker did not stop cleanly on SIGTERM"


def literal_keys(steps: str) -> list[str]:
    """The keys the steps create with ``--from-literal=KEY=...``, in order."""
    return re.findall(r"--from-literal[= ]([A-Za-z0-9_.-]+)=", steps)


def without_literal(readme: str, key: str) -> str:
    """``readme`` with the ``--from-literal=KEY=VALUE`` of ``key`` dropped (quoted values included)."""
    pattern = rf"""[ \t]*--from-literal[= ]{re.escape(key)}=("[^"]*"|'[^']*'|\S+)"""
    dropped, count = re.subn(pattern, "", readme)
    assert count >= 1, f"the README creates no {key}"
    return dropped


def keys_read_by_manifests() -> set[str]:
    """Every key a ``secretKeyRef`` of a manifest under deploy/kubernetes reads."""
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("secretKeyRef"), dict):
                found.add(str(node["secretKeyRef"].get("key")))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for manifest in (ROOT / "deploy" / "kubernetes").glob("*.yaml"):
        for document in yaml.safe_load_all(manifest.read_text()):
            walk(document)
    return found


def test_a_secret_key_the_steps_no_longer_create_fails_naming_it() -> None:
    readme = README.read_text()
    contract = {variable for needs in REQUIRED_VARIABLES.values() for variable, _ in needs}
    created = literal_keys(readme_section(readme, "kubernetes"))
    needed = [key for key in dict.fromkeys(created) if key in keys_read_by_manifests() | contract]
    assert needed, f"the Kubernetes steps create none of the keys the containers need: {created}"
    resolve_kubernetes()  # as written, it resolves

    for key in needed:
        with pytest.raises(RehearsalError) as failure:
            resolve_kubernetes(readme_text=without_literal(readme, key))
        assert key in str(failure.value), f"removing {key} failed without naming it: {failure.value}"


def test_a_worker_with_a_token_the_server_does_not_know_is_reported_refused(
    tmp_path: Path, database_url: str
) -> None:
    deployment = resolve_compose()
    stranger = "tt_" + secrets.token_hex(32)  # generated-looking, never registered by the server
    for plan in deployment.processes:
        if plan.kind == "worker":
            plan.env["TILETUNE_TOKEN"] = stranger

    with pytest.raises(RehearsalError) as failure:
        rehearse(deployment, tmp_path, database_url)

    message = str(failure.value)
    assert any(plan.source in message for plan in deployment.processes if plan.kind == "worker")
    assert "401" in message
    assert "refused" in message
    assert stranger not in message  # the rehearsal's own report holds no token


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("${SET}", "a"),
        ("$SET-b", "a-b"),
        ("${EMPTY:-d}|${EMPTY-d}|${UNSET-d}", "d||d"),
        ("${UNSET:-${SET}}", "a"),  # nested in the default
        ("${UNSET:-${ALSO_UNSET:-x}y}", "xy"),
        ("${SET:+r}|${EMPTY:+r}|${EMPTY+r}|${UNSET+r}", "r||r|"),
        ("$${SET} $$SET", "${SET} $SET"),  # $$ is a literal $
        ("${SET:?unused}", "a"),
    ],
)
def test_compose_interpolation_follows_compose_rules(text: str, expected: str) -> None:
    problems: list[str] = []
    variables = {"SET": "a", "EMPTY": ""}
    assert Interpolation(variables, problems).expand(text, "x") == expected
    assert problems == []


@pytest.mark.parametrize(
    ("text", "named"),
    [("${UNSET:?set it in .env}", "set it in .env"), ("${EMPTY:?no}", "EMPTY"), ("${UNSET}", "UNSET")],
)
def test_compose_interpolation_reports_a_required_or_unset_variable(text: str, named: str) -> None:
    problems: list[str] = []
    Interpolation({"EMPTY": ""}, problems).expand(text, "services.server.environment.X")
    assert len(problems) == 1
    assert named in problems[0]
    assert "services.server.environment.X" in problems[0]
