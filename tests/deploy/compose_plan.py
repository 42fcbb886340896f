"""The compose path as written: ``deploy/README.md``'s ``.env`` line, then ``docker-compose.yml``.

:func:`resolve_compose` runs the one line of the README's compose section that writes ``.env``
(``... > .env``) in a temporary folder, reads the ``.env`` it wrote, interpolates the compose file
with it by Compose's rules (:class:`Interpolation`), and resolves each service: its environment
(``env_file`` then ``environment``), its command (``entrypoint`` and ``command``, else its build
target's ``CMD`` from the Dockerfile), its replicas and its place after the services it
``depends_on``. Services with an ``image:`` of PostgreSQL are the database (their
``POSTGRES_*`` variables are the credentials the server's URL must carry); services built from the
Dockerfile are the processes to run.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.rehearsal import (
    ROOT,
    DatabaseService,
    Deployment,
    DockerTarget,
    ProcessPlan,
    RehearsalError,
    command_words,
    contract_problems,
    database_problems,
    docker_targets,
    image_command,
    option_value,
    readme_section,
    run_steps,
    shell_blocks,
    url_path,
)

#: At most this many replicas of one service are started (the compose file's workers: 2).
MAX_REPLICAS = 2
#: The port ``tiletune server`` listens on without ``--port``.
DEFAULT_SERVER_PORT = 8642
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_OPERATORS = (":-", ":?", ":+", "-", "?", "+")


class Interpolation:
    """Compose's interpolation of ``$VAR``, ``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``,
    ``${VAR:?message}``, ``${VAR?message}``, ``${VAR:+other}``, ``${VAR+other}`` (nested in the
    default or other value) and ``$$`` (a literal ``$``) against ``variables``.

    A required variable (``?``) that is unset (``:?``: or empty) is a problem naming it and its
    message; so is a plain ``${VAR}`` that is unset, for which Compose substitutes an empty string
    with only a warning.
    """

    def __init__(self, variables: Mapping[str, str], problems: list[str]) -> None:
        self.variables = variables
        self.problems = problems

    def expand(self, text: str, where: str) -> str:
        """``text`` with every interpolation replaced; problems are recorded against ``where``."""
        out: list[str] = []
        index = 0
        while index < len(text):
            char = text[index]
            following = text[index + 1 : index + 2]
            if char != "$":
                out.append(char)
                index += 1
            elif following == "$":
                out.append("$")
                index += 2
            elif following == "{":
                end = self._closing_brace(text, index + 2, where)
                out.append(self._braced(text[index + 2 : end], where))
                index = end + 1
            elif match := _NAME.match(text, index + 1):
                out.append(self._lookup(match[0], where))
                index = match.end()
            else:
                out.append("$")
                index += 1
        return "".join(out)

    def _closing_brace(self, text: str, start: int, where: str) -> int:
        depth, index = 1, start
        while index < len(text):
            if text.startswith("$$", index):
                index += 2
                continue
            if text.startswith("${", index):
                depth, index = depth + 1, index + 2
                continue
            if text[index] == "}":
                depth -= 1
                if depth == 0:
                    return index
            index += 1
        raise RehearsalError([f"docker-compose.yml: {where}: an unclosed '${{' in {text!r}"])

    def _braced(self, body: str, where: str) -> str:
        match = _NAME.match(body)
        if match is None:
            raise RehearsalError([f"docker-compose.yml: {where}: a bad interpolation '${{{body}}}'"])
        name, rest = match[0], body[match.end() :]
        if not rest:
            return self._lookup(name, where)
        operator = next((op for op in _OPERATORS if rest.startswith(op)), None)
        if operator is None:
            raise RehearsalError([f"docker-compose.yml: {where}: a bad interpolation '${{{body}}}'"])
        argument = rest[len(operator) :]
        value = self.variables.get(name)
        missing = value is None or (operator.startswith(":") and value == "")
        if operator.endswith("-"):
            return self.expand(argument, where) if missing else str(value)
        if operator.endswith("+"):
            return "" if missing else self.expand(argument, where)
        if missing:
            self.problems.append(
                f"docker-compose.yml: {where}: ${{{name}}} is required and .env does not set it "
                f"({self.expand(argument, where) or 'no message'})"
            )
            return ""
        return str(value)

    def _lookup(self, name: str, where: str) -> str:
        if name not in self.variables:
            self.problems.append(
                f"docker-compose.yml: {where}: ${{{name}}} is not set in .env "
                "(Compose would use an empty string)"
            )
            return ""
        return self.variables[name]

    def tree(self, node: Any, where: str) -> Any:
        """``node`` (the loaded compose file) with every string value interpolated; keys stay."""
        if isinstance(node, str):
            return self.expand(node, where)
        if isinstance(node, dict):
            return {
                key: self.tree(value, f"{where}.{key}" if where else str(key)) for key, value in node.items()
            }
        if isinstance(node, list):
            return [self.tree(value, f"{where}[{index}]") for index, value in enumerate(node)]
        return node


def parse_dotenv(text: str) -> dict[str, str]:
    """A ``.env`` file as Compose reads it: ``KEY=VALUE`` lines (``export`` allowed), ``#`` comments,
    single quotes literal, double quotes with ``\\n`` and ``\\"`` escapes, unquoted values trimmed."""
    variables: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.removeprefix("export ").partition("=")
        value = value.strip()
        if value[:1] == "'" and value.count("'") >= 2:
            value = value[1 : value.index("'", 1)]
        elif value[:1] == '"' and value.count('"') >= 2:
            value = value[1 : value.rindex('"')].replace('\\"', '"').replace("\\n", "\n")
        else:
            value = re.split(r"\s+#", value, maxsplit=1)[0].strip()
        variables[key.strip()] = value
    return variables


def dotenv_from_readme(readme: str) -> dict[str, str]:
    """Run the compose section's one ``... > .env`` line in a temporary folder; the ``.env`` it wrote."""
    section = readme_section(readme, "compose")
    lines = [
        line
        for block in shell_blocks(section)
        for line in block.splitlines()
        if re.search(r">\s*\.env(?![\w.])", line)
    ]
    if len(lines) != 1:
        raise RehearsalError(
            [
                "deploy/README.md: the compose section must hold one line in a ```sh block that writes .env "
                f"(`... > .env`); found {len(lines)}"
            ]
        )
    with tempfile.TemporaryDirectory(prefix="rehearsal-env-") as folder:
        run_steps(lines[0], Path(folder))
        written = Path(folder) / ".env"
        if not written.exists():
            raise RehearsalError([f"deploy/README.md: the line `{lines[0].strip()}` wrote no .env"])
        return parse_dotenv(written.read_text())


def service_environment(
    name: str, service: dict[str, Any], compose_dir: Path, problems: list[str]
) -> dict[str, str]:
    """A service's environment: its ``env_file``s, then ``environment`` (a map or ``KEY=VALUE`` list)."""
    env: dict[str, str] = {}
    env_files = service.get("env_file") or []
    for entry in [env_files] if isinstance(env_files, str | dict) else env_files:
        path, required = (
            (entry, True) if isinstance(entry, str) else (entry["path"], entry.get("required", True))
        )
        if (compose_dir / path).exists():
            env.update(parse_dotenv((compose_dir / path).read_text()))
        elif required:
            problems.append(f"docker-compose.yml: service {name}: env_file {path} does not exist")
    environment = service.get("environment") or {}
    if isinstance(environment, list):
        environment = dict(item.split("=", 1) if "=" in item else (item, None) for item in environment)
    for key, value in environment.items():
        if value is not None:  # a bare KEY passes the shell's variable on: unset in a clean shell
            env[str(key)] = str(value).lower() if isinstance(value, bool) else str(value)
    return env


def health_check(service: dict[str, Any], target: DockerTarget | None) -> str | None:
    """The service's health check as text (compose's ``healthcheck.test``, else its image's
    ``HEALTHCHECK``); None when it has none."""
    check = service.get("healthcheck") or {}
    if check.get("disable"):
        return None
    test = check.get("test")
    if test is not None:
        return None if test == ["NONE"] else " ".join(command_words(test))
    return " ".join(target.healthcheck) if target and target.healthcheck else None


def start_order(services: dict[str, Any]) -> list[str]:
    """Service names with each after the services it ``depends_on`` (file order otherwise)."""
    ordered: list[str] = []

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in ordered:
            return
        if name in path:
            raise RehearsalError([f"docker-compose.yml: depends_on loops: {' -> '.join((*path, name))}"])
        for dependency in services.get(name, {}).get("depends_on") or []:
            visit(dependency, (*path, name))
        ordered.append(name)

    for name in services:
        visit(name, ())
    return ordered


def dependency_problems(services: dict[str, Any], checks: dict[str, str | None]) -> list[str]:
    """``depends_on`` entries Compose could never satisfy: an unknown service, or ``service_healthy``
    on a service without a health check."""
    problems = []
    for name, service in services.items():
        depends = service.get("depends_on") or []
        for dependency in depends:
            condition = depends[dependency].get("condition") if isinstance(depends, dict) else None
            if dependency not in services:
                problems.append(
                    f"docker-compose.yml: service {name} depends on {dependency}, which is no service"
                )
            elif condition == "service_healthy" and checks.get(dependency) is None:
                problems.append(
                    f"docker-compose.yml: service {name} waits for {dependency} to be healthy, "
                    "which has no health check"
                )
    return problems


def database_service(env: Mapping[str, str]) -> DatabaseService:
    """The credentials a ``postgres`` image creates its database with (the image's defaults)."""
    user = env.get("POSTGRES_USER", "postgres")
    trust = env.get("POSTGRES_HOST_AUTH_METHOD") == "trust"
    return DatabaseService(5432, user, env.get("POSTGRES_PASSWORD"), env.get("POSTGRES_DB", user), trust)


def resolve_compose(root: Path = ROOT, readme_text: str | None = None) -> Deployment:
    """The compose path of ``root``'s deploy files as a :class:`Deployment` (``readme_text``: the
    README to follow instead of ``root``'s); every defect found is one :class:`RehearsalError`."""
    readme = readme_text if readme_text is not None else (root / "deploy" / "README.md").read_text()
    problems: list[str] = []
    compose_file = root / "docker-compose.yml"
    loaded = yaml.safe_load(compose_file.read_text()) or {}
    compose = Interpolation(dotenv_from_readme(readme), problems).tree(loaded, "")
    services: dict[str, Any] = compose.get("services") or {}
    targets = docker_targets(root / "Dockerfile")
    deployment = Deployment(name="compose", processes=[])
    checks: dict[str, str | None] = {}
    for name in start_order(services):
        service = services[name]
        env = service_environment(name, service, compose_file.parent, problems)
        build = service.get("build")
        if build is None:
            checks[name] = health_check(service, None)
            if str(service.get("image", "")).startswith("postgres"):
                deployment.database_hosts[name] = database_service(env)
            else:
                deployment.skipped.append(f"service {name}: image {service.get('image')} (not ours)")
            continue
        target_name = "" if isinstance(build, str) else str(build.get("target", ""))
        target = targets.get(target_name)
        checks[name] = health_check(service, target)
        if target is None:
            problems.append(
                f"docker-compose.yml: service {name}: build target {target_name!r} is no Dockerfile stage"
            )
            continue
        add_service(deployment, name, service=service, target=target, env=env, check=checks[name])
    problems.extend(dependency_problems(services, checks))
    problems.extend([*contract_problems(deployment, problems), *database_problems(deployment)])
    if problems:
        raise RehearsalError(problems)
    return deployment


def add_service(
    deployment: Deployment,
    name: str,
    *,
    service: dict[str, Any],
    target: DockerTarget,
    env: dict[str, str],
    check: str | None,
) -> None:
    """Add a Dockerfile-built service's replicas to ``deployment`` (a server also under its name)."""
    entrypoint, command = service.get("entrypoint"), service.get("command")
    if entrypoint is not None:
        target = DockerTarget(
            target.name, target.base, target.cmd, command_words(entrypoint), target.healthcheck
        )
    argv = image_command(target, command_words(command) if command is not None else None)
    replicas = int((service.get("deploy") or {}).get("replicas", service.get("scale", 1)))
    if replicas > MAX_REPLICAS:
        deployment.skipped.append(f"service {name}: {replicas} replicas, rehearsed with {MAX_REPLICAS}")
    for replica in range(1, min(replicas, MAX_REPLICAS) + 1):
        plan = ProcessPlan(
            source=f"docker-compose.yml service {name}" + (f" (replica {replica})" if replicas > 1 else ""),
            target=target.name,
            argv=argv,
            env=dict(env),
            readiness_path=url_path(check or "") or "/readyz",
        )
        deployment.processes.append(plan)
    if deployment.processes and deployment.processes[-1].kind == "server":
        port = listening_port(argv)
        deployment.server_hosts[name] = (port, port)


def listening_port(argv: list[str]) -> int:
    """The port a ``tiletune server`` command listens on (``--port``, else the default)."""
    port = option_value(argv, "--port")
    return int(port) if port is not None else DEFAULT_SERVER_PORT
