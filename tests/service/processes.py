"""Real ``tiletune`` processes for end-to-end tests: a server, workers, and one-shot commands.

Everything runs the installed console script (``.venv/bin/tiletune``), so these tests
also check the entry point. Each process writes stdout and stderr to a log file under
the test's folder; a failing wait raises with the log's tail, so a failure says why.

- :func:`start_server` runs ``tiletune server --db URL --port P`` from the server's own install
  (``.venv-server``: the ``[server]`` extra, no torch) with :data:`FAST_LEASES`
  (leases of 4 s, heartbeats every 1 s, reaping every 1 s) and waits until ``/healthz``
  answers. Starting it again with the same ``db_url`` and ``port`` is a server restart.
- :func:`start_worker` runs ``tiletune worker --server URL --backend cpu`` (one torch
  thread, so two workers and a server share two cores).
- :func:`stop` ends a process with SIGTERM (graceful: a worker finishes its trial and
  releases its lease), then SIGKILL after a grace period; :func:`kill` is SIGKILL at once
  (a worker that dies holding a lease).
- :func:`run_cli` runs one command to its end and returns its exit status and output.

For a fault test, e.g. a worker killed mid-job::

    server = start_server(tmp_path)
    worker = start_worker(server.url, tmp_path / "w1.log")
    ...  # wait until a job is running (GET /v1/jobs?state=running)
    kill(worker)                          # its lease expires after FAST_LEASES' 4 s
    start_worker(server.url, tmp_path / "w2.log")

Environment: ``TILETUNE_SERVER`` of the calling shell is removed; a server starts with the
suite's admin token (``TILETUNE_ADMIN_TOKEN``) and every command sends it (``TILETUNE_TOKEN``,
:data:`tests.credentials.ADMIN_TOKEN`) unless ``env`` says otherwise.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.credentials import ADMIN_TOKEN

#: The console script under test (the venv's, beside the running interpreter).
TILETUNE = str(Path(sys.executable).parent / "tiletune")
#: The server's console script: the install a deployment makes, ``pip install -e ".[server]"`` in
#: ``.venv-server`` (``make setup``), which holds no torch: every end-to-end test runs its server so.
SERVER_VENV = Path(__file__).resolve().parents[2] / ".venv-server"
SERVER_TILETUNE = str(SERVER_VENV / "bin" / "tiletune")

#: Short leases so a dead worker's job returns to the queue within seconds.
FAST_LEASES = {"TILETUNE_LEASE_S": "4", "TILETUNE_HEARTBEAT_S": "1", "TILETUNE_REAP_INTERVAL_S": "1"}

#: Server start: imports (torch, Optuna, FastAPI) and migrations, on a busy 2-core machine.
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0


def free_port() -> int:
    """A TCP port nobody listens on now (the kernel's pick for port 0)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment: no ``TILETUNE_SERVER``, the suite's tokens, one torch thread, ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in ("TILETUNE_SERVER", "TILETUNE_TOKEN")}
    env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    env.update({"TILETUNE_ADMIN_TOKEN": ADMIN_TOKEN, "TILETUNE_TOKEN": ADMIN_TOKEN})
    env.update(extra or {})
    return env


def log_tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a log file ('' if there is none)."""
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def spawn(
    args: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None, program: str = TILETUNE
) -> subprocess.Popen[bytes]:
    """``tiletune ARGS`` (``program``) in the background, stdout and stderr appended to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        return subprocess.Popen(
            [program, *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=environment(env),
        )


@dataclass
class ServerProcess:
    """A running ``tiletune server``: its URL, database, process and log."""

    url: str
    port: int
    db_url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self, lines: int = 40) -> str:
        """The tail of the server's log."""
        return log_tail(self.log_path, lines)


def wait_for_health(url: str, process: subprocess.Popen[bytes], log_path: Path, timeout_s: float) -> None:
    """Poll ``GET url/healthz`` until it answers 200.

    Raises with the log's tail if the process exits or ``timeout_s`` runs out first.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode}:\n{log_tail(log_path)}")
        try:
            if httpx.get(f"{url}/healthz", timeout=2.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{url}/healthz did not answer within {timeout_s:g} s:\n{log_tail(log_path)}")


def start_server(
    folder: Path,
    *,
    db_url: str | None = None,
    port: int | None = None,
    env: Mapping[str, str] | None = None,
    log_name: str = "server.log",
) -> ServerProcess:
    """``tiletune server`` (the torch-free install's, :data:`SERVER_TILETUNE`) on ``db_url`` (default:
    ``folder/t.db``) and ``port`` (default: a free one).

    Runs with :data:`FAST_LEASES` (``env`` overrides) and returns once ``/healthz`` answers.
    Call again with the returned ``db_url`` and ``port`` to restart a stopped server.
    """
    if not Path(SERVER_TILETUNE).exists():
        raise FileNotFoundError(f"{SERVER_TILETUNE} is missing: `make setup` installs the server's venv")
    db_url = db_url or f"sqlite:///{folder / 't.db'}"
    port = port or free_port()
    log_path = folder / log_name
    server_env = {**FAST_LEASES, **(env or {})}
    process = spawn(["server", "--db", db_url, "--port", str(port)], log_path, server_env, SERVER_TILETUNE)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for_health(url, process, log_path, START_TIMEOUT_S)
    except BaseException:
        kill(process)
        raise
    return ServerProcess(url=url, port=port, db_url=db_url, process=process, log_path=log_path)


@contextmanager
def serving_this_chip(folder: Path) -> Iterator[ServerProcess]:
    """A ``tiletune server`` in ``folder`` with this machine's CPU chip registered, stopped after."""
    from tiletune.tuner.measure.worker import Worker

    process = start_server(folder)
    try:
        with httpx.Client(base_url=process.url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as http:
            Worker(http, backend="cpu", name="test-registration").register()
        yield process
    finally:
        stop(process.process)


def start_worker(
    server_url: str, log_path: Path, *, args: Sequence[str] = (), env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """``tiletune worker --server URL --backend cpu [ARGS]`` in the background."""
    return spawn(["worker", "--server", server_url, "--backend", "cpu", *args], log_path, env)


def stop(process: subprocess.Popen[bytes], timeout_s: float = STOP_TIMEOUT_S) -> int:
    """SIGTERM, then SIGKILL if still running after ``timeout_s``; returns the exit status."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


def kill(process: subprocess.Popen[bytes]) -> int:
    """SIGKILL at once (no cleanup: a worker's lease is left to expire); returns the exit status."""
    if process.poll() is None:
        process.kill()
    return process.wait()


def run_cli(
    *args: str, env: Mapping[str, str] | None = None, timeout_s: float = 120.0
) -> subprocess.CompletedProcess[str]:
    """``tiletune ARGS`` to its end; stdout and stderr captured as text."""
    return subprocess.run(
        [TILETUNE, *args],
        capture_output=True,
        text=True,
        env=environment(env),
        timeout=timeout_s,
        check=False,
        stdin=subprocess.DEVNULL,
    )
