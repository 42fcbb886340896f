"""A :class:`~tests.deploy.rehearsal.Deployment` started as local processes, and checked.

:func:`rehearse` runs the deployment's one-shot commands to their end, starts its servers and its
workers (together: a worker retries until the server answers; the order compose's ``depends_on``
sets is checked when the file is resolved), waits until each server answers its readiness path with
200, checks that the database was migrated to head, waits until the server counts every worker as
registered, submits a small sweep with the server's admin token and waits until its jobs are
``done``; then it stops the workers and the servers with SIGTERM. Whatever it started is stopped on
the way out, whether the rehearsal passed or not. A failure is a :class:`RehearsalError` that says
which process and why, with the tail of its log (a worker the server refuses: 401, its token
unknown to the server).

The rewrites a container network and the images would make, on one machine (:class:`LocalNetwork`):

- the database's URL (its host a database service of the deployment, its port, user, password and
  database those the database service is made with: checked) -> a fresh PostgreSQL database on
  127.0.0.1:5432 (trust auth), made and dropped per run by the caller;
- a server's name and port (``server:8642``, ``tiletune-server:8642``: a service that reaches the
  server) -> ``127.0.0.1:<a free port>``; ``--port 8642`` -> that free port; ``--host 0.0.0.0``
  (every interface of a container) -> ``127.0.0.1``;
- ``--backend cuda|npu|auto`` (and ``TILETUNE_BACKEND``) -> ``cpu``: no accelerator here;
- ``tiletune`` -> the venv's console script: ``.venv-server/bin`` for the server image (no torch,
  as in the image), ``.venv/bin`` for the others;
- variables holding container paths (``HOME``, ``PATH``, caches) -> this machine's, the working
  folder -> a folder per process; one torch thread per process (two workers share two cores).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
from alembic.script import ScriptDirectory
from sqlalchemy.engine import make_url

from tests.deploy.compose_plan import listening_port
from tests.deploy.rehearsal import ROOT, Deployment, ProcessPlan, RehearsalError
from tests.service.processes import free_port, kill, log_tail, stop
from tiletune.service.migrate import alembic_config, current_revision

SERVER_BIN = ROOT / ".venv-server" / "bin"
WORKER_BIN = ROOT / ".venv" / "bin"
#: Variables whose values are paths inside a container: this machine's own are used instead.
CONTAINER_PATH_VARIABLES = frozenset(
    {"HOME", "PATH", "VIRTUAL_ENV", "PYTHONPATH", "LD_LIBRARY_PATH", "XDG_CACHE_HOME", "TRITON_CACHE_DIR",
     "TILETUNE_NATIVE_DIR", "TILETUNE_CACHE_DIR"}
)  # fmt: skip
ACCELERATOR_BACKENDS = frozenset({"cuda", "npu", "auto"})
#: The sweep every rehearsal tunes: one small key of ``add``, a few trials, torch's implementation.
SWEEP = {
    "kernel": "add",
    "shapes": [{"n": 4096}],
    "dtypes": ["float32"],
    "trials": 4,
    "backend": "torch",
    "force": True,
}
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
REGISTER_TIMEOUT_S = 60.0
SWEEP_TIMEOUT_S = 90.0
TERMINAL_STATES = frozenset({"done", "failed", "cancelled", "skipped"})


class LocalNetwork:
    """The rewrites of a deployment's commands and environments for this machine (see the module)."""

    def __init__(self, deployment: Deployment, database_url: str) -> None:
        self.deployment = deployment
        self.database_url = database_url
        #: The local port of the first server process listening on each container port.
        self.server_ports: dict[int, int] = {}

    def command(self, plan: ProcessPlan, port: int | None) -> list[str]:
        """The plan's argv for this machine (``port``: the server's free port)."""
        program = (SERVER_BIN if plan.target == "server" else WORKER_BIN) / "tiletune"
        argv = [str(program)]
        words = iter(plan.argv[1:])
        for word in words:
            option, equals, inline = word.partition("=")
            if option in ("--port", "--host", "--db", "--server", "--backend"):
                value = inline if equals else next(words, "")
                argv += [option, self.option_value(plan, option, value, port)]
            else:
                argv.append(word)
        return argv

    def option_value(self, plan: ProcessPlan, option: str, value: str, port: int | None) -> str:
        if option == "--port" and port is not None:
            return str(port)
        if option == "--host":
            return "127.0.0.1" if value in ("0.0.0.0", "::", "[::]") else value
        if option == "--backend":
            return "cpu" if value in ACCELERATOR_BACKENDS else value
        return self.value(plan, option, value)

    def environment(self, plan: ProcessPlan) -> dict[str, str]:
        """The plan's environment for this machine, on a bare base (nothing of this test process's
        ``TILETUNE_*`` leaks in)."""
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", "/root"),
            "LANG": "C.UTF-8",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "PYTHONUNBUFFERED": "1",
        }
        for name, value in plan.env.items():
            if name in CONTAINER_PATH_VARIABLES:
                continue
            local = "cpu" if name == "TILETUNE_BACKEND" and value in ACCELERATOR_BACKENDS else value
            env[name] = self.value(plan, name, local)
        return env

    def value(self, plan: ProcessPlan, name: str, value: str) -> str:
        """A database URL -> the fresh database; a URL of a server's service -> the local server."""
        scheme = value.partition("://")[0]
        if scheme.startswith("postgres"):
            return self.database(plan, name, value)
        if scheme in ("http", "https"):
            return self.server_url(plan, name, value)
        return value

    def database(self, plan: ProcessPlan, name: str, value: str) -> str:
        """The fresh database, for a URL naming a database service (its credentials were checked when
        the deployment was resolved: :func:`tests.deploy.rehearsal.database_problems`)."""
        host = make_url(value).host or ""
        if host not in self.deployment.database_hosts:
            raise RehearsalError(
                [f"{plan.source}: {name} names database host {host!r}, which no service provides"]
            )
        return self.database_url

    def server_url(self, plan: ProcessPlan, name: str, value: str) -> str:
        parts = urlsplit(value)
        mapping = self.deployment.server_hosts.get(parts.hostname or "")
        if mapping is None:
            if name in ("TILETUNE_SERVER", "--server"):
                why = f"names host {parts.hostname!r}, by which no service of the deployment reaches a server"
                raise RehearsalError([f"{plan.source}: {name} {why}"])
            return value
        service_port, listen_port = mapping
        port = parts.port or (443 if parts.scheme == "https" else 80)
        if port != service_port:
            raise RehearsalError(
                [f"{plan.source}: {name} connects to port {port}; {parts.hostname} serves on {service_port}"]
            )
        return urlunsplit(
            ("http", f"127.0.0.1:{self.server_ports[listen_port]}", parts.path, parts.query, "")
        )


@dataclass
class Started:
    """A process the rehearsal started: its plan, process, log, and (a server) its local URL."""

    plan: ProcessPlan
    process: subprocess.Popen[bytes]
    log: Path
    argv: list[str]
    url: str = ""
    env: dict[str, str] = field(default_factory=dict, repr=False)

    def failure(self, what: str) -> RehearsalError:
        """A failure of this process, with its log's tail (and what a 401 in it means)."""
        tail = log_tail(self.log, 30)
        refused = ""
        if re.search(r"\b401\b|unauthorized", tail, re.IGNORECASE):
            refused = " (the server refused it: 401 unauthorized; its TILETUNE_TOKEN is no token it knows)"
        return RehearsalError([f"{self.plan.source}: {what}{refused}; `{' '.join(self.argv)}`, log:\n{tail}"])


@dataclass
class Outcome:
    """What a rehearsal that passed saw."""

    server_urls: list[str]
    workers_registered: int
    jobs: list[dict[str, Any]]
    worker_exit_codes: list[int]
    skipped: list[str]


def rehearse(deployment: Deployment, folder: Path, database_url: str) -> Outcome:
    """Start ``deployment`` in ``folder`` on ``database_url`` (an empty PostgreSQL database), check it
    comes up and tunes a sweep, and stop it; :class:`RehearsalError` at the first failure."""
    run = LocalRun(deployment, folder, database_url)
    try:
        return run.through()
    finally:
        run.stop_all()


class LocalRun:
    """One rehearsal's processes (see :func:`rehearse`)."""

    def __init__(self, deployment: Deployment, folder: Path, database_url: str) -> None:
        self.deployment = deployment
        self.folder = folder
        self.network = LocalNetwork(deployment, database_url)
        self.servers: list[Started] = []
        self.workers: list[Started] = []
        self.started = 0

    def through(self) -> Outcome:
        plans = self.deployment.processes
        for plan in (plan for plan in plans if plan.kind == "once"):
            self.run_once(plan)
        for plan in (plan for plan in plans if plan.kind == "server"):
            port = free_port()
            self.network.server_ports.setdefault(listening_port(plan.argv), port)
            self.servers.append(self.start(plan, port))
        if not self.servers:
            raise RehearsalError([f"{self.deployment.name}: no process runs `tiletune server`"])
        # Workers start with the servers (their imports overlap the servers' start and migrations; a
        # worker retries until the server answers): compose's depends_on order is checked statically.
        for plan in (plan for plan in plans if plan.kind == "worker"):
            self.workers.append(self.start(plan, None))
        for server in self.servers:
            self.wait_ready(server)
        heads = set(ScriptDirectory.from_config(alembic_config(self.network.database_url)).get_heads())
        if current_revision(self.network.database_url) not in heads:
            raise self.servers[0].failure("the server serves, yet the database is not migrated to head")
        registered = self.wait_registered()
        jobs = self.tune()
        codes = terminate([worker.process for worker in self.workers])
        return Outcome([s.url for s in self.servers], registered, jobs, codes, list(self.deployment.skipped))

    def start(self, plan: ProcessPlan, port: int | None) -> Started:
        self.started += 1
        workdir = self.folder / f"{self.started}-{plan.kind}"
        workdir.mkdir(parents=True, exist_ok=True)
        argv, env = self.network.command(plan, port), self.network.environment(plan)
        log = workdir / "log.txt"
        with log.open("ab") as out:
            process = subprocess.Popen(
                argv, cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        url = f"http://127.0.0.1:{port}" if port is not None else ""
        return Started(plan, process, log, argv, url, env)

    def run_once(self, plan: ProcessPlan) -> None:
        started = self.start(plan, None)
        try:
            code = started.process.wait(START_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            stop(started.process)
            raise started.failure(f"did not end within {START_TIMEOUT_S:g} s") from None
        if code != 0:
            raise started.failure(f"exited with {code}")

    def wait_ready(self, server: Started) -> None:
        """Until ``GET readiness_path`` answers 200 (the server exiting first is a failure)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        status = None
        while time.monotonic() < deadline:
            if server.process.poll() is not None:
                raise server.failure(f"exited with {server.process.returncode} before it was ready")
            try:
                status = httpx.get(server.url + server.plan.readiness_path, timeout=3.0).status_code
            except httpx.TransportError:
                status = None
            if status == 200:
                return
            time.sleep(0.25)
        raise server.failure(
            f"{server.plan.readiness_path} did not answer 200 within {START_TIMEOUT_S:g} s (last: {status})"
        )

    def admin_headers(self) -> dict[str, str]:
        """The admin token the deployment gives its server (else the one it printed at its first start)."""
        token = self.servers[0].env.get("TILETUNE_ADMIN_TOKEN")
        if not token:
            printed = re.findall(r"\btt_[A-Za-z0-9_-]{32,}", log_tail(self.servers[0].log, 200))
            token = printed[0] if printed else ""
        return {"Authorization": f"Bearer {token}"}

    def check_workers_alive(self) -> None:
        for worker in self.workers:
            if worker.process.poll() is not None:
                raise worker.failure(f"exited with {worker.process.returncode}")

    def wait_registered(self) -> int:
        """Until the server counts every worker (``GET /v1/workers``, else ``tiletune_workers_online``)."""
        deadline, count = time.monotonic() + REGISTER_TIMEOUT_S, 0
        with httpx.Client(base_url=self.servers[0].url, headers=self.admin_headers(), timeout=5.0) as http:
            while time.monotonic() < deadline:
                self.check_workers_alive()
                count = registered_workers(http)
                if count >= len(self.workers):
                    return count
                time.sleep(0.5)
        raise RehearsalError(
            [
                f"{self.deployment.name}: {count} of {len(self.workers)} workers registered "
                f"within {REGISTER_TIMEOUT_S:g} s"
            ]
        )

    def tune(self) -> list[dict[str, Any]]:
        """Submit :data:`SWEEP` with the admin token; its jobs once all are ``done``."""
        with httpx.Client(base_url=self.servers[0].url, headers=self.admin_headers(), timeout=10.0) as http:
            answer = http.post("/v1/sweeps", json=SWEEP)
            if answer.status_code != 201:
                raise self.servers[0].failure(
                    f"POST /v1/sweeps with the admin token answered {answer.status_code}: {answer.text}"
                )
            sweep_id = answer.json()["id"]
            deadline, jobs = time.monotonic() + SWEEP_TIMEOUT_S, []
            while time.monotonic() < deadline:
                self.check_workers_alive()
                jobs = http.get(f"/v1/sweeps/{sweep_id}").json()["jobs"]
                if all(job["state"] in TERMINAL_STATES for job in jobs):
                    break
                time.sleep(0.5)
        unfinished = [
            f"job {job['id']}: {job['state']} {job.get('failure_reasons') or ''}"
            for job in jobs
            if job["state"] != "done"
        ]
        if unfinished:
            raise RehearsalError(
                [f"{self.deployment.name}: the sweep did not finish: {'; '.join(unfinished)}"]
            )
        return list(jobs)

    def stop_all(self) -> None:
        """SIGTERM to every process still running (workers first), SIGKILL after the grace period."""
        for group in (self.workers, self.servers):
            terminate([started.process for started in group])


def terminate(processes: list[subprocess.Popen[bytes]], timeout_s: float = STOP_TIMEOUT_S) -> list[int]:
    """One SIGTERM to each running process at once (a worker finishes its trial and gives its lease
    back; a second signal would end it hard), SIGKILL to those still running after ``timeout_s``;
    their exit statuses."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for process in processes:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            kill(process)
    return [process.wait() for process in processes]


def registered_workers(http: httpx.Client) -> int:
    """Workers the server knows: ``GET /v1/workers`` where it exists, else the gauge in ``/metrics``."""
    answer = http.get("/v1/workers")
    if answer.status_code == 200:
        body = answer.json()
        listed = body if isinstance(body, list) else body.get("workers", body.get("items", []))
        return len(listed)
    metrics = http.get("/metrics")
    match = re.search(r"^tiletune_workers_online(?:\{[^}]*\})? ([0-9.e+]+)$", metrics.text, re.MULTILINE)
    return int(float(match[1])) if metrics.status_code == 200 and match else 0
