"""Running the service's processes: the ``server``, ``worker`` and ``up`` commands.

Owns what it takes to run the API or a worker in this process: settings from the command line
and ``TILETUNE_*``, migrations (:func:`tiletune.service.migrate.upgrade`), binding the port,
uvicorn, and stopping on SIGINT/SIGTERM.

- ``server``: migrate the database, then serve the API with uvicorn (default
  ``127.0.0.1:8642``); prints one line with the URL.
- ``worker``: lease jobs from a server and measure them on this machine until stopped
  (:class:`~tiletune.tuner.worker.Worker`); SIGTERM or Ctrl-C finishes the current trial and
  gives the job back.
- ``up``: the embedded all-in-one: SQLite, migrations, the server on a thread and one CPU
  :class:`~tiletune.tuner.worker.Worker` on another. Ctrl-C (or SIGTERM) stops the worker
  first (it finishes its trial and releases its lease), then the server. ``--submit FILE``
  submits a sweep once both run and prints each job as it finishes, then a summary
  (:mod:`tiletune.service.cli.follow`); ``--until-done`` then stops the same way and exits
  0, or 1 when a job failed.

FastAPI, uvicorn, SQLAlchemy, Alembic, Optuna, torch and the worker are imported inside the
functions that need them, never when this module is imported: the entry point imports it for
its parsers, on the base install too.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from tiletune.client.api import ServiceApi
from tiletune.client.calls import redacted
from tiletune.client.wire import ANY_CHIP, DEVICE_KINDS, MAX_ASK, Role, SweepCreate
from tiletune.service.cli.follow import SweepFollower
from tiletune.service.cli.options import (
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    TOKEN_ENV,
    BadInputError,
    CommandFailedError,
    Commands,
    add_server_options,
    server_token,
    server_url,
)
from tiletune.service.cli.remote import POLL_S
from tiletune.service.cli.sweepfile import read_sweep_file

if TYPE_CHECKING:
    import uvicorn

    from tiletune.kernels.device import Device
    from tiletune.service.auth import Tokens
    from tiletune.service.settings import Settings
    from tiletune.tuner.worker import Worker

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8642
#: How long ``up`` waits for its server to start, and for its worker and server to stop.
START_TIMEOUT_S = 60.0
WORKER_STOP_S = 60.0
SERVER_STOP_S = 15.0
#: Names of the tokens ``up`` makes at each start: its worker's and the person's at the terminal.
UP_WORKER_TOKEN = "tiletune up: worker"
UP_PERSON_TOKEN = "tiletune up: you"
#: How often ``up``'s main loop looks at its threads and the stop signal.
TICK_S = 0.2


# -- settings, database, socket, uvicorn ----------------------------------------------------------


def _settings(db: str | None, optuna_db: str | None = None) -> Settings:
    """Settings from ``TILETUNE_*`` with the command line's database URLs over them."""
    from tiletune.service.settings import Settings

    given: dict[str, Any] = {"db_url": db, "optuna_url": optuna_db}
    try:
        return Settings(**{key: value for key, value in given.items() if value is not None})
    except ValidationError as error:
        first = error.errors()[0]
        name = ".".join(str(part) for part in first["loc"])
        raise BadInputError(name, f"{first['msg']} (from $TILETUNE_{name.upper()})") from None


def _migrate(url: str) -> None:
    """Bring the database to the newest schema; a bad URL is bad input, an unreachable one a failure."""
    from sqlalchemy.exc import ArgumentError, SQLAlchemyError

    from tiletune.service.migrate import upgrade

    try:
        upgrade(url)
    except ArgumentError as error:
        raise BadInputError("db", f"not a usable database URL {_safe_url(url)!r}: {error}") from None
    except SQLAlchemyError as error:
        reason = str(error).splitlines()[0]
        raise CommandFailedError(f"cannot migrate the database {_safe_url(url)}: {reason}") from None


def _safe_url(url: str) -> str:
    """``url`` with its password hidden."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


def _bind(host: str, port: int) -> socket.socket:
    """A socket bound to (host, port) for uvicorn; binding here makes a busy port a clear error."""
    if not 0 <= port <= 65535:
        raise BadInputError("port", f"must be between 0 and 65535, got {port}")
    # IPPROTO_TCP explicitly: asyncio turns Nagle off (TCP_NODELAY) only on sockets whose protocol
    # says TCP; with the default 0, every response waited ~40 ms for the client's delayed ACK.
    sock = socket.socket(
        socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP
    )
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise CommandFailedError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    return sock


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class _NoLeaseTokens(logging.Filter):
    """Rewrites a log record's text so that no lease token of a request path shows (access log)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(redacted(arg) if isinstance(arg, str) else arg for arg in record.args)
        record.msg = redacted(str(record.msg))
        return True


def _log_to_stderr() -> None:
    """Log lines of ours (and uvicorn's) at INFO on stderr, never a lease token; httpx's are noise."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    for name in ("uvicorn.access", "uvicorn.error"):
        logging.getLogger(name).addFilter(_NoLeaseTokens())


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _uvicorn_server(
    settings: Settings, host: str, port: int, access_log: bool
) -> tuple[uvicorn.Server, Tokens]:
    """A uvicorn server of the app, and the app's tokens.

    Reads are open when ``TILETUNE_OPEN_READS`` says so, else only on a loopback ``host``.
    """
    import uvicorn

    from tiletune.service.app import create_app

    _log_to_stderr()
    if settings.open_reads is None:
        settings = settings.model_copy(update={"open_reads": _is_loopback(host)})
    app = create_app(settings)
    config = uvicorn.Config(app, host=host, port=port, lifespan="on", log_level="info", access_log=access_log)
    tokens: Tokens = app.state.services.tokens
    return uvicorn.Server(config), tokens


# -- server ---------------------------------------------------------------------------------------


def cmd_server(args: argparse.Namespace) -> None:
    """Migrate the database, then serve the API until SIGINT or SIGTERM."""
    settings = _settings(args.db, args.optuna_db)
    sock = _bind(args.host, args.port)  # first: a busy port fails fast and touches no database
    _migrate(settings.db_url)
    server, tokens = _uvicorn_server(settings, args.host, args.port, access_log=True)
    first_admin = tokens.bootstrap(None)
    if first_admin is not None:
        print(
            "tiletune server: the database had no token; the first admin token (shown once, keep it"
            f" in a secret; `tiletune token create` makes others):\n{first_admin}",
            flush=True,
        )
    print(f"tiletune server: serving {_url(sock)} (database {_safe_url(settings.db_url)})", flush=True)
    server.run(sockets=[sock])


# -- worker ---------------------------------------------------------------------------------------


def cmd_worker(args: argparse.Namespace) -> None:
    """Lease tuning jobs from a server and measure them on this machine until stopped."""
    from tiletune.kernels.errors import DeviceUnavailableError
    from tiletune.tuner.worker import Worker, WorkerRejectedError

    if not 1 <= args.batch <= MAX_ASK:
        raise BadInputError("batch", f"must be an integer from 1 to {MAX_ASK}, got {args.batch}")
    url, token = server_url(args), server_token(args)
    _log_to_stderr()
    try:
        worker = Worker.connect(url, token, backend=args.backend, name=args.name, batch=args.batch)
    except DeviceUnavailableError as error:
        raise BadInputError("backend", str(error)) from None
    with worker, _stop_signals(worker.stop, "the worker after its current trial"):
        try:
            worker.run(once=args.once)
        except WorkerRejectedError as error:
            raise CommandFailedError(str(error)) from None


# -- up -------------------------------------------------------------------------------------------


@contextmanager
def _stop_signals(on_stop: Callable[[], object], what: str) -> Iterator[None]:
    """The first SIGINT or SIGTERM calls ``on_stop``; a second one acts as it would without us.

    Outside the main thread (signals cannot be handled there) it does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def handle(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s: stopping %s", signal.Signals(signum).name, what)
        on_stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    for sig in previous:
        signal.signal(sig, handle)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _start_server_thread(server: uvicorn.Server, sock: socket.socket) -> threading.Thread:
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="server", daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise CommandFailedError("the server did not start (see the log above)")
        time.sleep(0.05)
    return thread


def _run_worker(worker: Worker, failures: list[BaseException]) -> None:
    try:
        worker.run()
    except BaseException as error:  # reported by the main thread, which then stops the server
        failures.append(error)


def _check_chips(request: SweepCreate, file: str, device: Device, until_done: bool) -> None:
    """Jobs for a chip other than the local worker's wait for another worker: under
    ``--until-done`` forever, so that is bad input; otherwise a note on stderr."""
    others = [chip for chip in request.chips if chip not in (ANY_CHIP, device.chip.name)]
    if not others:
        return
    reason = f"the local worker runs jobs for {device.chip.name} only, not for {', '.join(others)}"
    if until_done:
        raise BadInputError(f"{file}: chips", f"{reason}; --until-done would wait forever")
    print(f"tiletune up: note: {reason}; those jobs wait for another worker", file=sys.stderr)


@dataclass
class _Up:
    """What ``up`` runs: the server (on its thread), its URL and database, and the sweep to submit."""

    url: str
    settings: Settings
    worker_token: str
    person_token: str
    server_thread: threading.Thread
    device: Device
    request: SweepCreate | None
    until_done: bool


def cmd_up(args: argparse.Namespace) -> int:
    """Serve an SQLite-backed API and run one local CPU worker until Ctrl-C (or ``--until-done``)."""
    from tiletune.kernels.device import get_device

    if args.until_done and not args.submit:
        raise BadInputError("until-done", "needs --submit FILE, the sweep to wait for")
    device = get_device("cpu")
    request = read_sweep_file(args.submit) if args.submit else None  # before anything starts
    if request is not None:
        _check_chips(request, args.submit, device, args.until_done)
    settings = _settings(args.db)
    sock = _bind(DEFAULT_HOST, args.port)
    _migrate(settings.db_url)
    server, tokens = _uvicorn_server(settings, DEFAULT_HOST, args.port, access_log=False)
    worker_token = tokens.replace(Role.WORKER, UP_WORKER_TOKEN).token
    person_token = tokens.replace(Role.ADMIN, UP_PERSON_TOKEN).token
    server_thread = _start_server_thread(server, sock)
    try:
        up = _Up(
            _url(sock), settings, worker_token, person_token, server_thread, device, request, args.until_done
        )
        return _run(up)
    finally:
        server.should_exit = True
        server_thread.join(SERVER_STOP_S)


def _run(up: _Up) -> int:
    """Run the worker (and follow the submitted sweep) until stopped or done; the exit status."""
    from tiletune.tuner.worker import Worker

    failures: list[BaseException] = []
    follower: SweepFollower | None = None
    stop = threading.Event()
    name = f"{socket.gethostname()}-up-{os.getpid()}"
    worker = Worker.connect(up.url, up.worker_token, device=up.device, name=name)
    with worker, ServiceApi(up.url, up.person_token) as api:
        worker_thread = threading.Thread(target=_run_worker, args=(worker, failures), name="worker")
        worker_thread.daemon = True
        with _stop_signals(stop.set, "the worker, then the server"):
            worker_thread.start()
            try:
                _print_banner(up)
                if up.request is not None:
                    follower = SweepFollower.submit(api, up.request)
                _serve(up, stop, worker_thread, follower)
            finally:
                worker.stop()
                worker_thread.join(WORKER_STOP_S)
    if failures:
        raise CommandFailedError(f"the local worker stopped: {failures[0]}")
    if up.until_done and follower is not None and follower.finished:
        failed = follower.failed_jobs
        if failed:
            print(f"tiletune up: {len(failed)} job(s) failed: {failed}", file=sys.stderr)
            return EXIT_FAILURE
        return 0
    if not stop.is_set():
        raise CommandFailedError("the server stopped unexpectedly (see the log above)")
    if up.until_done and follower is not None:
        print(
            f"tiletune up: stopped before sweep {follower.sweep.id} finished; its jobs wait in the"
            " database for the next `tiletune up` or worker",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    return 0


def _print_banner(up: _Up) -> None:
    print(
        f"tiletune up: {up.url} (API docs {up.url}/docs; database {_safe_url(up.settings.db_url)};"
        f" one worker on {up.device.chip.name}). Ctrl-C stops.",
        flush=True,
    )
    print(f"  your admin token (shown once): export {TOKEN_ENV}={up.person_token}", flush=True)
    if up.request is None:
        print(
            f"  try: tiletune submit --server {up.url} --kernel add --shape n=65536 --dtype float32 --wait",
            flush=True,
        )


def _serve(
    up: _Up, stop: threading.Event, worker_thread: threading.Thread, follower: SweepFollower | None
) -> None:
    """Return on a stop signal, when a thread has ended, or (``--until-done``) once the sweep is finished.

    The sweep, if any, is polled every :data:`~tiletune.service.cli.remote.POLL_S` seconds until
    it is finished; without ``--until-done`` serving goes on after it.
    """
    next_poll = time.monotonic() + POLL_S
    announced = False
    while True:
        if follower is not None and follower.finished:
            if up.until_done:
                return
            if not announced:
                print(f"tiletune up: still serving {up.url}. Ctrl-C stops.", flush=True)
                announced = True
        if stop.wait(TICK_S) or not worker_thread.is_alive() or not up.server_thread.is_alive():
            return
        if follower is not None and not follower.finished and time.monotonic() >= next_poll:
            follower.poll()
            next_poll = time.monotonic() + POLL_S


# -- parsers --------------------------------------------------------------------------------------


def add_server_parsers(commands: Commands) -> None:
    """The ``server`` and ``up`` subcommands."""
    server = commands.add_parser(
        "server",
        help="migrate the database, then serve the API",
        description="Bring the database to the newest schema, then serve the tiletune REST API "
        "(OpenAPI at /openapi.json, docs at /docs). Other settings come from TILETUNE_* variables "
        "(TILETUNE_LEASE_S, TILETUNE_HEARTBEAT_S, ...). SIGINT or SIGTERM stops it gracefully.",
    )
    server.add_argument("--db", help="database URL (default: $TILETUNE_DB_URL, else sqlite:///tiletune.db)")
    server.add_argument("--host", default=DEFAULT_HOST, help=f"address to listen on (default {DEFAULT_HOST})")
    server.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    server.add_argument(
        "--optuna-db",
        help="Optuna storage URL (default: journal file X.optuna.log beside X.db; PostgreSQL: schema optuna)",
    )
    server.set_defaults(handler=cmd_server, extra="server")

    up = commands.add_parser(
        "up",
        help="all in one: SQLite, the server and one local CPU worker",
        description="Migrate an SQLite database, serve the API on 127.0.0.1 and run one CPU worker in "
        "this process. Ctrl-C stops the worker (it finishes its trial and releases its job), "
        "then the server. With --submit FILE, submit that sweep once both run and print each job "
        "as it finishes, then a summary; with --until-done, then stop (exit status 1 when a job "
        "failed, 2 when FILE or the sweep is refused).",
    )
    up.add_argument("--db", help="database URL (default: sqlite:///tiletune.db in this folder)")
    up.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    up.add_argument(
        "--submit",
        metavar="FILE",
        help="a sweep to submit once the worker runs: JSON in SweepCreate form (as for `tiletune submit`)",
    )
    up.add_argument(
        "--until-done",
        action="store_true",
        help="with --submit: stop once the sweep is finished instead of serving until Ctrl-C",
    )
    up.set_defaults(handler=cmd_up, extra="server")


def add_worker_parser(commands: Commands) -> None:
    """The ``worker`` subcommand."""
    worker = commands.add_parser(
        "worker",
        help="lease tuning jobs from a server and measure them here",
        description="Register this machine's chip with a tiletune server, lease its tuning jobs, "
        "measure the configs the server asks for (each checked against the reference first) and "
        "report them, until stopped. SIGTERM or Ctrl-C finishes the current trial, gives the job "
        "back and exits; a lost server is waited for with capped exponential backoff.",
    )
    add_server_options(worker)
    worker.add_argument(
        "--backend",
        choices=(*DEVICE_KINDS, "auto"),
        default="auto",
        help="device to measure on (default: auto = npu, else cuda, else cpu)",
    )
    worker.add_argument("--once", action="store_true", help="exit when the server has no job for this chip")
    worker.add_argument("--name", help="worker name shown by the server (default: HOSTNAME-PID)")
    worker.add_argument(
        "--batch", type=int, default=1, help=f"configs asked per request, 1 to {MAX_ASK} (default 1)"
    )
    worker.set_defaults(handler=cmd_worker, extra="worker")
