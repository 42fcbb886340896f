"""The deploy rehearsal's plan: what the documented deploy paths run, read from the files as written.

A rehearsal follows ``deploy/README.md``, ``docker-compose.yml``, the ``Dockerfile`` and the
Kubernetes manifests as an operator would, and turns them into a :class:`Deployment`: every process
they start (its command and its environment, fully resolved), the database they point at and the
names under which the server is reached. :mod:`tests.deploy.compose_plan` and
:mod:`tests.deploy.kubernetes_plan` build one each; :mod:`tests.deploy.local_run` starts it as
local processes and checks that it comes up.

This module holds what both paths share: the plan's types, the Dockerfile's targets (each one's
``CMD`` and ``HEALTHCHECK``, inherited from the stage it is built ``FROM``), the README's sections
and their ``sh`` blocks, and the execution of a block's commands in bash with ``kubectl`` (and the
other cluster tools) replaced by a recorder, so that values such as ``"tt_$(openssl rand -hex 32)"``
are evaluated as the operator's shell would and every ``kubectl`` call is read back with its
arguments.

Every defect found is a :class:`RehearsalError` naming the file, the service or container, the
variable, Secret and key concerned; resolution collects all of them before raising.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from sqlalchemy.engine import make_url

#: The repository: the deploy files' home.
ROOT = Path(__file__).resolve().parents[2]

ProcessKind = Literal["server", "worker", "once"]


class RehearsalError(AssertionError):
    """A documented deploy path does not come up: the message names every defect found."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("the deploy rehearsal failed:\n- " + "\n- ".join(problems))


@dataclass
class ProcessPlan:
    """One process of a deployment, as its files declare it.

    ``argv`` and ``env`` are resolved (interpolated, Secrets looked up) but not yet rewritten for
    this machine (:mod:`tests.deploy.local_run` does that). ``target`` is the Dockerfile target of
    its image (or the image's name when no target matches); ``kind`` follows from the command:
    ``tiletune server`` serves, ``tiletune worker`` works, anything else runs once to its end.
    ``readiness_path`` is the HTTP path the deployment polls before it counts a server ready.
    """

    source: str
    target: str
    argv: list[str]
    env: dict[str, str] = field(repr=False)  # tokens: never in a test's report
    readiness_path: str = "/readyz"

    @property
    def kind(self) -> ProcessKind:
        """``server``, ``worker`` or ``once``: by the command's first word after the program."""
        command = next((word for word in self.argv[1:] if not word.startswith("-")), "")
        return "server" if command == "server" else "worker" if command == "worker" else "once"


@dataclass
class DatabaseService:
    """A PostgreSQL the deployment runs: the port it is reached on and the credentials it is made with
    (``None``: not said, any is accepted)."""

    port: int
    user: str | None = None
    password: str | None = field(default=None, repr=False)
    database: str | None = None
    trust: bool = False  # POSTGRES_HOST_AUTH_METHOD=trust: no password needed


@dataclass
class Deployment:
    """What a deploy path runs: processes in start order, and the names its processes reach each other by.

    ``database_hosts`` maps a host name (a compose service, a Kubernetes Service and its longer
    forms) to the PostgreSQL behind it; ``server_hosts`` maps a host name to the port the server
    is reached on under that name and the port its process listens on.
    """

    name: str
    processes: list[ProcessPlan]
    database_hosts: dict[str, DatabaseService] = field(default_factory=dict)
    server_hosts: dict[str, tuple[int, int]] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)


def option_value(argv: list[str], option: str) -> str | None:
    """The value of ``option`` in a command (``--option VALUE`` or ``--option=VALUE``); None without it."""
    for index, word in enumerate(argv):
        if word == option and index + 1 < len(argv):
            return argv[index + 1]
        if word.startswith(f"{option}="):
            return word.partition("=")[2]
    return None


#: What each kind of process must be given (the deploy files' contract): the server its database, its
#: first admin token and the token it registers for the workers; a worker the server's URL and that
#: token. A variable, or the command-line option that stands in for it.
REQUIRED_VARIABLES: dict[ProcessKind, tuple[tuple[str, str], ...]] = {
    "server": (("TILETUNE_DB_URL", "--db"), ("TILETUNE_ADMIN_TOKEN", ""), ("TILETUNE_WORKER_TOKEN", "")),
    "worker": (("TILETUNE_SERVER", "--server"), ("TILETUNE_TOKEN", "--token")),
}


def contract_problems(deployment: Deployment, found: list[str]) -> list[str]:
    """Each process's :data:`REQUIRED_VARIABLES` that its deployment does not give it, once per
    service or container (not per replica), unless ``found`` already says why."""
    problems: list[str] = []
    for plan in deployment.processes:
        source = re.sub(r" [(]replica [0-9]+[)]$", "", plan.source)
        for variable, option in REQUIRED_VARIABLES.get(plan.kind, ()):
            given = variable in plan.env or (option and option_value(plan.argv, option) is not None)
            problem = f"{source}: {variable} is not set: nothing gives it"
            known = any(line.startswith(f"{source}: {variable} ") for line in [*found, *problems])
            if not given and not known:
                problems.append(problem)
    return problems


#: The variables of the ``postgres`` image that make each part of the database's URL.
DATABASE_VARIABLES = {
    "port": "the port",
    "user": "POSTGRES_USER",
    "password": "POSTGRES_PASSWORD",
    "database": "POSTGRES_DB",
}


def database_problems(deployment: Deployment) -> list[str]:
    """Database URLs (``TILETUNE_DB_URL``, ``--db``) whose host is no database service of the
    deployment, or whose port, user, password or database are not those it is made with (the values
    are never shown); a PostgreSQL made without a password (its image refuses to start)."""
    problems: list[str] = []
    for plan in deployment.processes:
        text = option_value(plan.argv, "--db") or plan.env.get("TILETUNE_DB_URL", "")
        if not text.startswith("postgres"):
            continue
        url = make_url(text)
        service = deployment.database_hosts.get(url.host or "")
        source = re.sub(r" [(]replica [0-9]+[)]$", "", plan.source)
        if service is None:
            problem = (
                f"{source}: the database URL names host {url.host!r}, which no database service provides"
            )
        elif service.password is None and not service.trust:
            problem = (
                f"{source}: its database {url.host} has no POSTGRES_PASSWORD (the image refuses to start)"
            )
        else:
            found = {
                "port": url.port or 5432,
                "user": url.username,
                "password": url.password,
                "database": url.database,
            }
            wrong = [
                DATABASE_VARIABLES[key] for key in found if getattr(service, key) not in (None, found[key])
            ]
            problem = (
                f"{source}: the database URL's {', '.join(wrong)} differ(s) from the database {url.host}'s"
                if wrong
                else ""
            )
        if problem and problem not in problems:
            problems.append(problem)
    return problems


# -- the Dockerfile --------------------------------------------------------------------------------


@dataclass
class DockerTarget:
    """One stage of the Dockerfile: its name, the stage it starts from, and its run-time instructions."""

    name: str
    base: str
    cmd: list[str] | None = None
    entrypoint: list[str] | None = None
    healthcheck: list[str] | None = None


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """The Dockerfile's instructions as (KEYWORD, arguments): comments dropped, ``\\`` continuations
    joined, heredoc bodies (``RUN python <<'PY' ... PY``) skipped."""
    instructions: list[tuple[str, str]] = []
    lines = iter(text.splitlines())
    for first in lines:
        if not first.strip() or first.lstrip().startswith("#"):
            continue
        line = first
        while line.endswith("\\"):
            following = next(lines, "")
            line = line[:-1] + ("" if following.lstrip().startswith("#") else " " + following.strip())
        keyword, _, arguments = line.strip().partition(" ")
        instructions.append((keyword.upper(), arguments.strip()))
        heredoc = re.search(r"<<-?\s*['\"]?(\w+)['\"]?", arguments)
        if heredoc:
            for body_line in lines:
                if body_line.strip() == heredoc[1]:
                    break
    return instructions


def exec_form(arguments: str) -> list[str]:
    """A ``CMD``/``ENTRYPOINT`` argument: the JSON exec form as is, the shell form under ``/bin/sh -c``."""
    if arguments.startswith("["):
        parsed = json.loads(arguments)
        if not isinstance(parsed, list) or not all(isinstance(part, str) for part in parsed):
            raise ValueError(f"not a list of strings: {arguments}")
        return parsed
    return ["/bin/sh", "-c", arguments]


def docker_targets(dockerfile: Path) -> dict[str, DockerTarget]:
    """Every stage of ``dockerfile`` by name, each with the CMD, ENTRYPOINT and HEALTHCHECK it runs with
    (its own, else its base stage's). The last stage is also under ``""`` (the default target)."""
    stages: list[DockerTarget] = []
    for keyword, arguments in dockerfile_instructions(dockerfile.read_text()):
        if keyword == "FROM":
            words = [word for word in arguments.split() if not word.startswith("--")]
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else f"stage-{len(stages)}"
            stages.append(DockerTarget(name=name, base=words[0]))
        elif stages and keyword in ("CMD", "ENTRYPOINT"):
            setattr(stages[-1], keyword.lower(), exec_form(arguments))
        elif stages and keyword == "HEALTHCHECK":
            check = re.sub(r"^(--\S+\s+)*", "", arguments)
            if check.upper().startswith("CMD"):
                stages[-1].healthcheck = exec_form(check[3:].strip())
    targets: dict[str, DockerTarget] = {}
    for stage in stages:
        base = targets.get(stage.base)
        if base is not None:
            stage.cmd = stage.cmd if stage.cmd is not None else base.cmd
            stage.entrypoint = stage.entrypoint if stage.entrypoint is not None else base.entrypoint
            stage.healthcheck = stage.healthcheck if stage.healthcheck is not None else base.healthcheck
        targets[stage.name] = stage
    if stages:
        targets[""] = stages[-1]
    return targets


def image_command(target: DockerTarget, command: list[str] | None) -> list[str]:
    """What a container of ``target`` runs: its ENTRYPOINT followed by ``command`` (or the image's CMD)."""
    return [*(target.entrypoint or []), *(command if command is not None else target.cmd or [])]


def url_path(text: str) -> str | None:
    """The path of the first http(s) URL in ``text`` (a health check's command), if any."""
    match = re.search(r"https?://[^/\s'\"]+(/[^\s'\")]*)", text)
    return match[1] if match else None


# -- the README -------------------------------------------------------------------------------------


def readme_section(text: str, word: str) -> str:
    """The ``## `` section of a README whose heading holds ``word`` (case-insensitive); '' when none."""
    sections = re.split(r"^(?=## )", text, flags=re.MULTILINE)
    for section in sections:
        heading = section.splitlines()[0] if section else ""
        if heading.startswith("## ") and word.lower() in heading.lower():
            return section
    return ""


def shell_blocks(section: str) -> list[str]:
    """The fenced ``sh`` (``bash``, ``shell``) blocks of a README section, in order."""
    return re.findall(r"^```(?:sh|bash|shell)\s*\n(.*?)^```", section, flags=re.MULTILINE | re.DOTALL)


#: Commands a README's block calls that act on a cluster or a registry: recorded, never run.
RECORDED_COMMANDS = ("kubectl", "docker", "helm", "kustomize", "tiletune", "curl", "systemctl")

_RECORDER = """
__record() { printf '%d\\0' "$#" >> "$REHEARSAL_RECORD"; printf '%s\\0' "$@" >> "$REHEARSAL_RECORD"; }
"""


def run_steps(script: str, folder: Path) -> list[list[str]]:
    """Run a README block's commands in bash (``set -euo pipefail``, in ``folder``, with a bare
    environment: the operator's variables are those the block defines) and return the calls of
    :data:`RECORDED_COMMANDS` it made, each as its evaluated argument list.

    A failing step (a variable the block uses but never defines, a missing tool) is a
    :class:`RehearsalError` with bash's message.
    """
    record = folder / "steps.record"
    record.write_bytes(b"")
    stubs = "".join(f'{name}() {{ __record {name} "$@"; }}\n' for name in RECORDED_COMMANDS)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(folder),
        "REHEARSAL_RECORD": str(record),
    }
    result = subprocess.run(
        ["bash", "-c", f"set -euo pipefail\n{_RECORDER}{stubs}{script}"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if result.returncode != 0:
        unbound = re.search(r"(\w+): unbound variable", result.stderr)
        why = f"they use ${unbound[1]}, which they never define" if unbound else result.stderr.strip()[-600:]
        raise RehearsalError(
            [
                f"deploy/README.md: the steps fail in bash (exit {result.returncode}): {why}\n"
                f"steps:\n{script.strip()}"
            ]
        )
    return recorded_calls(record.read_bytes())


def recorded_calls(data: bytes) -> list[list[str]]:
    """The calls a recorder wrote: per call, its argument count then its arguments, NUL-terminated."""
    parts = data.split(b"\0")
    calls: list[list[str]] = []
    index = 0
    while index < len(parts) - 1:
        count = int(parts[index])
        calls.append([part.decode() for part in parts[index + 1 : index + 1 + count]])
        index += 1 + count
    return calls


def command_words(command: str | list[str]) -> list[str]:
    """A compose or Kubernetes command: a list as is, a string split as a shell would (no expansion)."""
    return list(command) if isinstance(command, list) else shlex.split(command)
