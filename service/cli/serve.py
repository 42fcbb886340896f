"""Running the service's processes: the ``server`` and ``worker`` commands, and what ``up`` shares.

Owns what it takes to run the API or a worker in this process: settings from the command line
and ``TILETUNE_*``, migrations (:func:`tiletune.service.migrate.upgrade`), binding the port,
uvicorn, and stopping on SIGINT/SIGTERM.

- ``server``: migrate the database (``--no-migrate``: :mod:`~tiletune.service.cli.migration`), then
  serve the API with uvicorn (default ``127.0.0.1:8642``); prints one line with the URL.
  ``--otel`` traces it (:mod:`tiletune.service.tracing`); its access lines carry each request's
  id (:mod:`tiletune.service.request_ids`).
- ``server`` and ``worker`` log on stderr as ``--log-level`` and ``--log-format`` say
  (:mod:`tiletune.service.logs`).
- ``worker``: lease jobs from a server and measure them on this machine until stopped
  (:class:`~tiletune.tuner.measure.worker.Worker`); SIGTERM or Ctrl-C finishes the current trial and
  gives the job back. ``--backend replay`` measures the recorded spaces of
  ``$TILETUNE_REPLAY_KERNELS`` by lookup (chip ``replay/recorded``; ``--replay-trial-ms``
  simulates each trial's duration).
- what ``up`` (:mod:`tiletune.service.cli.up`) builds on: :func:`settings_of`, :func:`migrate`,
  :func:`bind`, :func:`uvicorn_server`, :func:`stop_signals`.

FastAPI, uvicorn, SQLAlchemy, Alembic, Optuna, torch and the worker are imported inside the
functions that need them, never when this module is imported: the entry point imports it for
its parsers, on the base install too.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import signal
import socket
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from tiletune.client.wire import DEFAULT_BATCH, DEVICE_KINDS, MAX_ASK
from tiletune.service.cli.migration import add_no_migrate_option, prepare_schema, safe_url
from tiletune.service.cli.options import (
    BadInputError,
    CommandFailedError,
    Commands,
    add_server_options,
    server_token,
    server_url,
)
from tiletune.service.logs import LogSettingError, add_log_options, configure_logging, logging_configured
from tiletune.service.request_ids import ACCESS_LOGGER
from tiletune.service.tracing import add_otel_option

if TYPE_CHECKING:
    import uvicorn

    from tiletune.kernels.device import Device
    from tiletune.service.access.auth import Tokens
    from tiletune.service.settings import Settings

log = logging.getLogger(__name__)

#: The worker's backend whose device is a recorded space (``tiletune.kernels.replay.spec``).
REPLAY_BACKEND = "replay"

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8642
#: The interpreter's thread switch interval in a server process (see :func:`uvicorn_server`).
SWITCH_INTERVAL_S = 0.001
#: How long ``up`` waits for its server to start, and for its worker and server to stop.


# -- settings, database, socket, uvicorn ----------------------------------------------------------


#: The settings the ``server`` command line may give, and their options.
SETTING_FLAGS = {"db_url": "--db", "forwarded_allow_ips": "--forwarded-allow-ips"}


def settings_of(db: str | None, forwarded_allow_ips: str | None = None) -> Settings:
    """Settings from ``TILETUNE_*`` with the command line's database URL (and proxies) over them."""
    from tiletune.service.settings import Settings

    given: dict[str, Any] = {"db_url": db, "forwarded_allow_ips": forwarded_allow_ips}
    try:
        return Settings(**{key: value for key, value in given.items() if value is not None})
    except ValidationError as error:
        first = error.errors()[0]
        name = ".".join(str(part) for part in first["loc"])
        source = SETTING_FLAGS[name] if given.get(name) is not None else f"$TILETUNE_{name.upper()}"
        # A validator's own words, without pydantic's "Value error, " before them.
        reason = str(first["ctx"]["error"]) if first["type"] == "value_error" else first["msg"]
        raise BadInputError(name, f"{reason} (from {source})") from None


def bind(host: str, port: int) -> socket.socket:
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


def served_url(sock: socket.socket) -> str:
    """The http URL of what a bound socket serves."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _log_to_stderr(args: argparse.Namespace | None = None) -> None:
    """Log as ``--log-level`` and ``--log-format`` say, else ``$TILETUNE_LOG_*`` (see
    :mod:`tiletune.service.logs`); without ``args``, only when nothing configured logging yet."""
    if args is None and logging_configured():
        return
    try:
        configure_logging(getattr(args, "log_level", None), getattr(args, "log_format", None))
    except LogSettingError as error:
        raise BadInputError(error.field, error.reason) from None


def _check_tracing(settings: Settings) -> None:
    """Fail before anything starts when tracing is configured but cannot run."""
    from tiletune.service.tracing import TracingUnavailableError, check_tracing

    try:
        check_tracing(settings.otel)
    except TracingUnavailableError as error:
        raise CommandFailedError(str(error)) from None


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def head_timeout_protocol(head_timeout_s: float) -> type[asyncio.Protocol]:
    """uvicorn's HTTP/1.1 protocol (h11), closing a connection that takes over ``head_timeout_s``
    to send a request's head: from when it opens, and from the end of each answer.

    uvicorn bounds neither (an idle connection kept alive is closed after ``timeout_keep_alive``,
    but each byte trickled starts that again), so without it connections trickling their heads
    pile up. The body's own deadline is :mod:`tiletune.service.access.bodies`'.
    """
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeadTimeoutProtocol(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._await_head(after=None)

        def on_response_complete(self) -> None:
            answered = self.cycle
            super().on_response_complete()  # may start a pipelined request's cycle
            self._await_head(after=answered)

        def connection_lost(self, exc: Exception | None) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
            super().connection_lost(exc)

        def _await_head(self, after: object) -> None:
            """Close the connection unless a request after ``after`` (a cycle) starts in time."""
            if self._head_timer is not None:
                self._head_timer.cancel()

            def give_up() -> None:
                if self.cycle is after and not self.transport.is_closing():
                    self.transport.close()

            self._head_timer = self.loop.call_later(head_timeout_s, give_up)

    return HeadTimeoutProtocol


def uvicorn_server(
    settings: Settings, host: str, port: int, access_log: bool
) -> tuple[uvicorn.Server, Tokens]:
    """A uvicorn server of the app, and the app's tokens.

    Reads are open when ``TILETUNE_OPEN_READS`` says so, else only on a loopback ``host``.
    uvicorn believes ``X-Forwarded-Proto`` and ``X-Forwarded-For`` from the addresses of
    ``settings.forwarded_allow_ips`` only (the TLS proxy in front).
    """
    import uvicorn

    from tiletune.service.app import create_app

    _log_to_stderr()
    logging.getLogger(ACCESS_LOGGER).setLevel(logging.NOTSET if access_log else logging.WARNING)
    # Large bodies are checked in worker threads (tiletune.service.access.bodies); the event loop takes the
    # interpreter back from them within 1 ms instead of Python's default 5 ms, so a request that
    # meets such a check waits a few ms, not tens (each of its awaits may wait one interval).
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    if settings.open_reads is None:
        settings = settings.model_copy(update={"open_reads": _is_loopback(host)})
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        lifespan="on",
        log_config=None,  # uvicorn's lines go through ours (tiletune.service.logs)
        log_level=None,
        access_log=False,  # ours, with the request id: tiletune.service.request_ids
        forwarded_allow_ips=settings.forwarded_allow_ips,
        http=head_timeout_protocol(settings.head_timeout_s),
    )
    tokens: Tokens = app.state.services.tokens
    return uvicorn.Server(config), tokens


# -- server ---------------------------------------------------------------------------------------


def cmd_server(args: argparse.Namespace) -> None:
    """Migrate the database (``--no-migrate``: check it is at head), then serve until SIGINT or SIGTERM."""
    if args.optuna_db is not None:
        print("tiletune server: --optuna-db is ignored: job searches are rebuilt from the trials table")
    _log_to_stderr(args)
    settings = settings_of(args.db, args.forwarded_allow_ips)
    if args.otel:
        settings = settings.model_copy(update={"otel": True})
    _check_tracing(settings)
    sock = bind(args.host, args.port)  # first: a busy port fails fast and touches no database
    prepare_schema(settings.db_url, args.no_migrate)
    server, tokens = uvicorn_server(settings, args.host, args.port, access_log=True)
    first_admin = tokens.bootstrap(None)
    if first_admin is not None:
        print(
            "tiletune server: the database had no admin token; the first admin token (shown once, keep it"
            f" in a secret; `tiletune token create` makes others):\n{first_admin}",
            flush=True,
        )
    url = served_url(sock)
    print(f"tiletune server: serving {url} (database {safe_url(settings.db_url)})", flush=True)
    print(f"tiletune server: dashboard {url}/ · API docs {url}/docs", flush=True)
    server.run(sockets=[sock])


# -- worker ---------------------------------------------------------------------------------------


def cmd_worker(args: argparse.Namespace) -> None:
    """Lease tuning jobs from a server and measure them on this machine until stopped."""
    from tiletune.kernels.errors import DeviceUnavailableError
    from tiletune.tuner.measure.worker import Worker, WorkerRejectedError

    if not 1 <= args.batch <= MAX_ASK:
        raise BadInputError("batch", f"must be an integer from 1 to {MAX_ASK}, got {args.batch}")
    url, token = server_url(args), server_token(args)
    device = _replay_device(args)
    _log_to_stderr(args)
    try:
        worker = Worker.connect(
            url,
            token,
            backend=args.backend,
            name=args.name,
            batch=args.batch,
            device=device,
            isolate=args.isolate,
        )
    except DeviceUnavailableError as error:
        raise BadInputError("backend", str(error)) from None
    if args.build_native and worker.device.kind == "cpu":  # before the handlers: SIGTERM ends a build
        from tiletune.tuner.measure.native_prebuild import prebuild_native

        prebuild_native()  # never raises: without a build, no native_* kernels are offered
    with worker, stop_signals(worker.stop, "the worker after its current trial"):
        try:
            worker.run(once=args.once)
        except WorkerRejectedError as error:
            raise CommandFailedError(str(error)) from None


def _replay_device(args: argparse.Namespace) -> Device | None:
    """The replay device of ``--backend replay`` (with ``--replay-trial-ms``), else None.

    :class:`BadInputError`: ``replay_trial_ms`` without ``--backend replay`` or out of range;
    ``backend`` when ``$TILETUNE_REPLAY_KERNELS`` names no recorded spaces.
    """
    if args.backend != REPLAY_BACKEND:
        if args.replay_trial_ms is not None:
            raise BadInputError("replay_trial_ms", "--replay-trial-ms needs --backend replay")
        return None
    from tiletune.kernels.device import ReplayDevice
    from tiletune.kernels.errors import InputError
    from tiletune.kernels.registry import kernels_for
    from tiletune.kernels.replay.declaration import REPLAY_KERNELS_ENV

    if not kernels_for(REPLAY_BACKEND):
        raise BadInputError(
            "backend",
            f"--backend replay needs ${REPLAY_KERNELS_ENV} naming a directory of recorded spaces "
            "(*.json.gz); the server needs the same",
        )
    try:
        return ReplayDevice(trial_ms=args.replay_trial_ms or 0.0)
    except InputError as error:
        raise BadInputError(error.field, error.reason) from None


# -- signals ------------------------------------------------------------------------------------


@contextmanager
def stop_signals(on_stop: Callable[[], object], what: str) -> Iterator[None]:
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


# -- parsers --------------------------------------------------------------------------------------


def add_server_parser(commands: Commands) -> None:
    """The ``server`` subcommand."""
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
        "--forwarded-allow-ips",
        metavar="ADDRESSES",
        help="the TLS proxy's or ingress's addresses (IPs or networks, comma-separated; * for any) whose "
        "X-Forwarded-Proto and X-Forwarded-For are believed (default: $TILETUNE_FORWARDED_ALLOW_IPS, "
        "else $FORWARDED_ALLOW_IPS, else 127.0.0.1,::1)",
    )
    add_no_migrate_option(server)
    add_otel_option(server)
    add_log_options(server)
    # Earlier servers kept Optuna's studies apart; accepted and ignored so their scripts still run.
    server.add_argument("--optuna-db", help=argparse.SUPPRESS)
    server.set_defaults(handler=cmd_server, extra="server")


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
        choices=(*DEVICE_KINDS, REPLAY_BACKEND, "auto"),
        default="auto",
        help="device to measure on (default: auto = npu, else cuda, else cpu); replay: the recorded "
        "spaces of $TILETUNE_REPLAY_KERNELS as kernels of one chip, replay/recorded, measured by lookup",
    )
    worker.add_argument(
        "--replay-trial-ms",
        type=float,
        help="with --backend replay: simulated duration of each measured config in ms (default 0)",
    )
    worker.add_argument("--once", action="store_true", help="exit when the server has no job for this chip")
    worker.add_argument("--name", help="worker name shown by the server (default: HOSTNAME-PID)")
    worker.add_argument(
        "--batch",
        type=int,
        default=DEFAULT_BATCH,
        help=f"configs asked per request, 1 to {MAX_ASK} (default {DEFAULT_BATCH})",
    )
    worker.add_argument(
        "--build-native",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="CPU workers: build the native CPU kernels before registering, once into $TILETUNE_NATIVE_DIR "
        "(default: on; a failed build is logged and the worker runs without the native_* kernels)",
    )
    worker.add_argument(
        "--isolate",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="measure in a warm child process with a time limit per trial, so a config that crashes, "
        "hangs or breaks the device fails alone (default: on; replay workers never isolate)",
    )
    add_log_options(worker)
    worker.set_defaults(handler=cmd_worker, extra="worker")
