"""The ``tiletune`` console command: the tuner's commands plus ``server``, ``up``, ``submit``, ``lookup``.

The tuner's parser (``kernels``, ``tune``, ``bench``, ``worker``; see
:mod:`tiletune.tuner.cli`) is extended here with the service's commands:

- ``server``: migrate the database (:func:`tiletune.service.migrate.upgrade`), then serve
  the API with uvicorn (default ``127.0.0.1:8642``); prints one line with the URL.
- ``up``: the embedded all-in-one: SQLite, migrations, the server on a thread and one CPU
  :class:`~tiletune.tuner.worker.Worker` on another. Ctrl-C (or SIGTERM) stops the worker
  first (it finishes its trial and releases its lease), then the server.
- ``submit``: post a sweep (from flags or a JSON file in ``SweepCreate`` form); ``--wait``
  follows it to the end with a progress bar on stderr (terminals only), then prints its jobs.
- ``lookup``: the config the server answers for one key, with its match and provenance.

Exit status: 0 success; 1 the server is unreachable, answers 5xx or something that is not
the API, a job of a waited-for sweep failed, or a local worker/port failure; 2 bad input,
here or as the server judged it (any 4xx: its message, which names the field, is printed);
130 interrupted. ``--server`` and ``--token`` default to ``$TILETUNE_SERVER`` and
``$TILETUNE_TOKEN``; the token is sent as ``Authorization: Bearer``.

FastAPI, uvicorn, SQLAlchemy and Optuna are imported only by ``server`` and ``up``: a
worker node without the server extras runs ``worker``, ``submit`` and ``lookup``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from tiletune.client.wire import (
    ANY_CHIP,
    MATCH_KINDS,
    STRATEGIES,
    ErrorBody,
    JobPublic,
    LookupPublic,
    SweepCreate,
    SweepPublic,
)
from tiletune.kernels.device import get_device
from tiletune.kernels.errors import DeviceUnavailableError, InputError
from tiletune.kernels.spec import DTYPES
from tiletune.tuner.cli import (
    EXIT_BAD_INPUT,
    EXIT_FAILURE,
    SERVER_ENV,
    TOKEN_ENV,
    _server_url,
    parse_dims,
)
from tiletune.tuner.cli import build_parser as build_tuner_parser
from tiletune.tuner.worker import Worker, WorkerRejectedError

if TYPE_CHECKING:
    import uvicorn

    from tiletune.service.settings import Settings

log = logging.getLogger(__name__)

EXIT_INTERRUPTED = 130
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8642
#: Seconds between polls of a sweep under ``submit --wait``.
POLL_S = 1.0
#: How long ``submit --wait`` keeps polling a server that went away (or answers 5xx) before giving up.
SERVER_GRACE_S = 60.0
#: How long ``up`` waits for its server to start, and for its worker and server to stop.
START_TIMEOUT_S = 60.0
WORKER_STOP_S = 60.0
SERVER_STOP_S = 15.0
FINISHED_SWEEP = "finished"
#: Job states that count as a failure of a waited-for sweep (exit status 1).
FAILED_JOB_STATES = ("failed",)

_Model = TypeVar("_Model", bound=BaseModel)


class ServerUnreachableError(Exception):
    """No answer from the server (connection refused, DNS, timeout)."""


class ServerRefusedError(Exception):
    """The server answered an error status; ``status`` < 500 is the caller's fault (exit 2)."""

    def __init__(self, status: int, error: ErrorBody | None, text: str) -> None:
        if error is not None:
            field = f" [field: {error.field}]" if error.field else ""
            detail = f"{error.message}{field} ({status} {error.code})"
        else:
            detail = f"HTTP {status}: {text[:300]}"
        super().__init__(f"the server refused: {detail}")
        self.status = status
        self.error = error


class CommandFailedError(Exception):
    """The command could not do its work for a reason other than bad input (exit 1)."""


# -- the REST API as the commands use it ------------------------------------------------------------


class ServiceApi:
    """The calls ``submit`` and ``lookup`` make; errors become the exceptions above."""

    def __init__(self, url: str, token: str | None, transport: httpx.BaseTransport | None = None) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url
        self._http = httpx.Client(
            base_url=url, headers=headers, timeout=httpx.Timeout(30.0, connect=10.0), transport=transport
        )

    def __enter__(self) -> ServiceApi:
        return self

    def __exit__(self, *_exc: object) -> None:
        self._http.close()

    def submit(self, sweep: SweepCreate) -> SweepPublic:
        """``POST /v1/sweeps``."""
        return self._call(SweepPublic, "POST", "/v1/sweeps", json=sweep.model_dump(mode="json"))

    def sweep(self, sweep_id: int) -> SweepPublic:
        """``GET /v1/sweeps/{id}``."""
        return self._call(SweepPublic, "GET", f"/v1/sweeps/{sweep_id}")

    def lookup(self, kernel: str, *, shape: str, dtype: str, chip: str, match: str) -> LookupPublic:
        """``GET /v1/configs/{kernel}?shape=&dtype=&chip=&match=``."""
        params = {"shape": shape, "dtype": dtype, "chip": chip, "match": match}
        return self._call(LookupPublic, "GET", f"/v1/configs/{kernel}", params=params)

    def _call(self, model: type[_Model], method: str, path: str, **kwargs: Any) -> _Model:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as error:
            raise ServerUnreachableError(
                f"cannot reach the server at {self.url} ({type(error).__name__}: {error})"
            ) from None
        if not response.is_success:
            raise ServerRefusedError(response.status_code, _error_body(response), response.text)
        try:
            return model.model_validate(response.json())
        except ValueError:
            raise CommandFailedError(
                f"{self.url}{path} answered something that is not a tiletune {model.__name__}"
                " (is this a tiletune server, of the same version?)"
            ) from None


def _error_body(response: httpx.Response) -> ErrorBody | None:
    try:
        return ErrorBody.model_validate(response.json())
    except ValueError:  # not JSON, or not an ErrorBody
        return None


def service_api(args: argparse.Namespace, transport: httpx.BaseTransport | None = None) -> ServiceApi:
    """The API at ``--server`` (else ``$TILETUNE_SERVER``) with ``--token`` (else ``$TILETUNE_TOKEN``)."""
    return ServiceApi(_server_url(args), args.token or os.environ.get(TOKEN_ENV), transport)


def _input_error(error: ValidationError, where: str = "") -> InputError:
    """The first problem pydantic found, as an :class:`InputError` naming its field."""
    first = error.errors()[0]
    field = ".".join(str(part) for part in first["loc"]) or "sweep"
    return InputError(f"{where}{field}", str(first["msg"]))


# -- submit ---------------------------------------------------------------------------------------


def _sweep_from_file(args: argparse.Namespace) -> SweepCreate:
    clashing = [f"--{name}" for name in ("kernel", "shape", "dtype") if getattr(args, name)]
    if clashing:
        raise InputError("file", f"give either FILE or {', '.join(clashing)}, not both")
    try:
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
    except OSError as error:
        raise InputError("file", f"cannot read {args.file}: {error.strerror}") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise InputError("file", f"{args.file} is not JSON ({error.msg}, line {error.lineno})") from None
    if not isinstance(document, dict):
        raise InputError("file", f"{args.file} must hold a JSON object in SweepCreate form")
    overrides = {"trials": args.trials, "strategy": args.strategy, "chips": args.chip or None}
    document.update({key: value for key, value in overrides.items() if value is not None})
    if args.force:
        document["force"] = True
    try:
        return SweepCreate.model_validate(document)
    except ValidationError as error:
        raise _input_error(error, where=f"{args.file}: ") from None


def _sweep_from_flags(args: argparse.Namespace) -> SweepCreate:
    for name in ("kernel", "shape", "dtype"):
        if not getattr(args, name):
            raise InputError(name, f"--{name} is required (or give a sweep FILE)")
    document: dict[str, Any] = {
        "kernel": args.kernel,
        "shapes": [parse_dims(text) for text in args.shape],
        "dtypes": args.dtype,
        "chips": args.chip or [],
        "force": args.force,
    }
    if args.trials is not None:
        document["trials"] = args.trials
    if args.strategy is not None:
        document["strategy"] = args.strategy
    try:
        return SweepCreate.model_validate(document)
    except ValidationError as error:
        raise _input_error(error) from None


def _finished_jobs(sweep: SweepPublic) -> int:
    return sum(1 for job in sweep.jobs if job.state not in ("queued", "running", "validating"))


def _wait(api: ServiceApi, sweep: SweepPublic, timeout_s: float | None) -> SweepPublic:
    """Poll the sweep until it is finished, with a progress bar of finished jobs on a terminal."""
    from tqdm import tqdm

    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    away_since: float | None = None
    with tqdm(
        total=len(sweep.jobs),
        desc=f"sweep {sweep.id}",
        unit="job",
        file=sys.stderr,
        disable=not sys.stderr.isatty(),
    ) as bar:
        while True:
            bar.n = _finished_jobs(sweep)
            bar.set_postfix_str(", ".join(f"{k} {v}" for k, v in sorted(sweep.counts.items())), refresh=False)
            bar.refresh()
            if sweep.state == FINISHED_SWEEP:
                return sweep
            if deadline is not None and time.monotonic() > deadline:
                raise CommandFailedError(
                    f"sweep {sweep.id} is not finished after {timeout_s:g} s; it goes on on the server"
                )
            time.sleep(POLL_S)
            try:
                sweep = api.sweep(sweep.id)
                away_since = None
            except (ServerUnreachableError, ServerRefusedError) as error:
                if isinstance(error, ServerRefusedError) and error.status < 500:
                    raise
                away_since = away_since or time.monotonic()
                if time.monotonic() - away_since > SERVER_GRACE_S:
                    raise
                bar.set_postfix_str(f"server away ({error}); retrying")


def _ms(value: float | None) -> str:
    return f"{value:.4f}" if value is not None else "-"


def _config_text(config: dict[str, int] | None) -> str:
    return " ".join(f"{k}={v}" for k, v in config.items()) if config else "-"


def _job_row(job: JobPublic) -> list[str]:
    progress = job.progress
    speedup = f"{progress.speedup_vs_default:.2f}x" if progress.speedup_vs_default else "-"
    return [
        str(job.id),
        job.shape_key,
        job.dtype,
        job.state,
        f"{progress.completed}/{job.trials}",
        _ms(progress.best_ms),
        _ms(progress.default_ms),
        speedup,
        _config_text(progress.best_config),
    ]


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns separated by two spaces."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in [header, *rows]
    )


def sweep_text(sweep: SweepPublic) -> str:
    """A sweep as its heading line and a table of its jobs."""
    counts = ", ".join(f"{state} {n}" for state, n in sorted(sweep.counts.items()))
    chips = sorted({"any" if job.chip == ANY_CHIP else job.chip for job in sweep.jobs})
    heading = f"sweep {sweep.id} ({sweep.kernel}): {sweep.state}; jobs: {counts}; chip: {', '.join(chips)}"
    header = ["job", "shape", "dtype", "state", "trials", "best_ms", "default_ms", "speedup", "best config"]
    return heading + "\n" + format_table(header, [_job_row(job) for job in sweep.jobs])


def cmd_submit(args: argparse.Namespace) -> int:
    """Submit a sweep; with ``--wait`` follow it to the end and print its jobs."""
    sweep = _sweep_from_file(args) if args.file else _sweep_from_flags(args)
    if args.timeout is not None and args.timeout <= 0:
        raise InputError("timeout", f"must be a positive number of seconds, got {args.timeout}")
    with service_api(args) as api:
        created = api.submit(sweep)
        if not args.wait:
            print(created.model_dump_json(indent=2) if args.json else sweep_text(created))
            return 0
        if not args.json:
            print(f"submitted sweep {created.id}: {len(created.jobs)} job(s)", file=sys.stderr)
        try:
            final = _wait(api, created, args.timeout)
        except KeyboardInterrupt:
            print(f"stopped waiting; sweep {created.id} goes on on the server", file=sys.stderr)
            return EXIT_INTERRUPTED
    print(final.model_dump_json(indent=2) if args.json else sweep_text(final))
    failed = [job.id for job in final.jobs if job.state in FAILED_JOB_STATES]
    if failed:
        print(f"tiletune submit: {len(failed)} job(s) failed: {failed}", file=sys.stderr)
        return EXIT_FAILURE
    return 0


# -- lookup ---------------------------------------------------------------------------------------


def lookup_text(answer: LookupPublic) -> str:
    """The config, its match and its provenance, one fact per line."""
    shape = ",".join(f"{k}={v}" for k, v in answer.shape.items())
    lines = [
        f"{answer.kernel} {shape} {answer.dtype} on {answer.chip}",
        f"match:    {answer.match}",
        f"config:   {_config_text(answer.config)}",
    ]
    best = answer.best
    if best is None:
        lines.append("source:   the kernel's built-in default (nothing tuned for this key or a near shape)")
        return "\n".join(lines)
    speedup = f", {best.speedup_vs_default:.2f}x faster" if best.speedup_vs_default else ""
    lines += [
        f"tuned:    {best.shape_key} (kernel v{best.kernel_version}): {best.median_ms:.4f} ms"
        f" (default {_ms(best.default_ms)} ms{speedup})",
        f"source:   job {best.job_id if best.job_id is not None else '-'},"
        f" promoted {best.promoted_at.isoformat(timespec='seconds')}",
        "software: " + (", ".join(f"{k} {v}" for k, v in best.software.items() if v) or "-"),
    ]
    return "\n".join(lines)


def cmd_lookup(args: argparse.Namespace) -> None:
    """Ask the server for the config of one key and print it with its provenance."""
    chip = args.chip or get_device("cpu").chip.name
    with service_api(args) as api:
        answer = api.lookup(args.kernel, shape=args.shape, dtype=args.dtype, chip=chip, match=args.match)
    print(answer.model_dump_json(indent=2) if args.json else lookup_text(answer))


# -- server and up --------------------------------------------------------------------------------


def _settings(db: str | None, optuna_db: str | None = None) -> Settings:
    """Settings from ``TILETUNE_*`` with the command line's database URLs over them."""
    from tiletune.service.settings import Settings

    given: dict[str, Any] = {"db_url": db, "optuna_url": optuna_db}
    try:
        return Settings(**{key: value for key, value in given.items() if value is not None})
    except ValidationError as error:
        first = error.errors()[0]
        name = ".".join(str(part) for part in first["loc"])
        raise InputError(name, f"{first['msg']} (from $TILETUNE_{name.upper()})") from None


def _migrate(url: str) -> None:
    """Bring the database to the newest schema; a bad URL is bad input, an unreachable one a failure."""
    from sqlalchemy.exc import ArgumentError, SQLAlchemyError

    from tiletune.service.migrate import upgrade

    try:
        upgrade(url)
    except ArgumentError as error:
        raise InputError("db", f"not a usable database URL {_safe_url(url)!r}: {error}") from None
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
        raise InputError("port", f"must be between 0 and 65535, got {port}")
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
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


def _uvicorn_server(settings: Settings, host: str, port: int, access_log: bool) -> uvicorn.Server:
    """A uvicorn server of the app; log lines of ours (and uvicorn's) at INFO on stderr."""
    import uvicorn

    from tiletune.service.app import create_app

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is uvicorn's to write
    config = uvicorn.Config(
        create_app(settings), host=host, port=port, lifespan="on", log_level="info", access_log=access_log
    )
    return uvicorn.Server(config)


def cmd_server(args: argparse.Namespace) -> None:
    """Migrate the database, then serve the API until SIGINT or SIGTERM."""
    settings = _settings(args.db, args.optuna_db)
    sock = _bind(args.host, args.port)  # first: a busy port fails fast and touches no database
    _migrate(settings.db_url)
    server = _uvicorn_server(settings, args.host, args.port, access_log=True)
    print(f"tiletune server: serving {_url(sock)} (database {_safe_url(settings.db_url)})", flush=True)
    server.run(sockets=[sock])


@contextmanager
def _stop_signals() -> Iterator[threading.Event]:
    """An event set by the first SIGINT or SIGTERM; a second one acts as it would without us."""
    stop = threading.Event()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def handle(signum: int, _frame: FrameType | None) -> None:
        log.info("received %s: stopping the worker, then the server", signal.Signals(signum).name)
        stop.set()
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    for sig in previous:
        signal.signal(sig, handle)
    try:
        yield stop
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


def cmd_up(args: argparse.Namespace) -> int:
    """Serve an SQLite-backed API and run one local CPU worker until Ctrl-C."""
    settings = _settings(args.db)
    sock = _bind(DEFAULT_HOST, args.port)
    _migrate(settings.db_url)
    url = _url(sock)
    server = _uvicorn_server(settings, DEFAULT_HOST, args.port, access_log=False)
    server_thread = _start_server_thread(server, sock)
    failures: list[BaseException] = []
    with httpx.Client(base_url=url, timeout=httpx.Timeout(30.0, connect=10.0)) as http:
        worker = Worker(http, backend="cpu", name=f"{socket.gethostname()}-up-{os.getpid()}")
        worker_thread = threading.Thread(target=_run_worker, args=(worker, failures), name="worker")
        worker_thread.daemon = True
        with _stop_signals() as stop:
            worker_thread.start()
            print(
                f"tiletune up: {url} (API docs {url}/docs; database {_safe_url(settings.db_url)};"
                f" one worker on {worker.device.chip.name}). Ctrl-C stops.",
                flush=True,
            )
            print(
                f"  try: tiletune submit --server {url} --kernel add --shape n=65536 --dtype float32 --wait",
                flush=True,
            )
            while not stop.wait(0.2) and worker_thread.is_alive() and server_thread.is_alive():
                pass
            worker.stop()
            worker_thread.join(WORKER_STOP_S)
    server.should_exit = True
    server_thread.join(SERVER_STOP_S)
    if failures:
        raise CommandFailedError(f"the local worker stopped: {failures[0]}")
    if not stop.is_set():
        raise CommandFailedError("the server stopped unexpectedly (see the log above)")
    return 0


# -- parser ---------------------------------------------------------------------------------------


def _commands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    """The subcommands action of the tuner's parser (argparse has no public accessor)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    raise RuntimeError("the tuner's parser has no subcommands")


def _add_client_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--server", help=f"server URL, e.g. http://tuner:8642 (default: ${SERVER_ENV})")
    parser.add_argument("--token", help=f"bearer token for the server (default: ${TOKEN_ENV})")
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")


def _add_server_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
        help="Optuna's database URL (default: X.optuna.db beside X.db; PostgreSQL: schema optuna)",
    )
    server.set_defaults(handler=cmd_server)

    up = commands.add_parser(
        "up",
        help="all in one: SQLite, the server and one local CPU worker",
        description="Migrate an SQLite database, serve the API on 127.0.0.1 and run one CPU worker in "
        "this process. Ctrl-C stops the worker (it finishes its trial and releases its job), "
        "then the server.",
    )
    up.add_argument("--db", help="database URL (default: sqlite:///tiletune.db in this folder)")
    up.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    up.set_defaults(handler=cmd_up)


def _add_submit_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    submit = commands.add_parser(
        "submit",
        help="submit a tuning sweep to a server",
        description="Submit a sweep: one job per shape x dtype (x chip) of one kernel, from flags or "
        "from FILE, a JSON object in SweepCreate form (see /docs); --trials, --strategy, --chip "
        "and --force override the file's values. Keys already tuned on the same software are "
        "skipped unless --force. Exit status: 2 when the sweep is refused (the message names the "
        "field); with --wait, 1 when a job failed.",
    )
    submit.add_argument("file", nargs="?", metavar="FILE", help="sweep as JSON (SweepCreate); - reads stdin")
    submit.add_argument("--kernel", help="kernel name (see `tiletune kernels`)")
    submit.add_argument(
        "--shape", action="append", help="problem dims, e.g. m=1024,n=1024,k=1024; repeat for more"
    )
    submit.add_argument("--dtype", action="append", help=f"element type ({', '.join(DTYPES)}); repeat")
    submit.add_argument("--chip", action="append", help="target chip name; repeat (default: any chip)")
    submit.add_argument("--trials", type=int, help="unique valid configs to measure per job (default 40)")
    submit.add_argument("--strategy", choices=STRATEGIES, help="search strategy (default tpe)")
    submit.add_argument("--force", action="store_true", help="tune keys again even if already tuned")
    submit.add_argument("--wait", action="store_true", help="follow the sweep until every job has finished")
    submit.add_argument("--timeout", type=float, help="with --wait: give up after this many seconds (exit 1)")
    _add_client_options(submit)
    submit.set_defaults(handler=cmd_submit)


def _add_lookup_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    lookup = commands.add_parser(
        "lookup",
        help="the config a server answers for one key",
        description="Ask the server for the config of (kernel, shape, dtype, chip): the tuned best "
        "(exact), else the nearest tuned shape's (nearest), else the kernel's default (default); "
        "--match sets the loosest answer accepted. Prints the config, the match and provenance.",
    )
    lookup.add_argument("kernel", help="kernel name")
    lookup.add_argument("--shape", required=True, help="problem dims, e.g. m=1024,n=1024,k=1024")
    lookup.add_argument("--dtype", required=True, help=f"element type ({', '.join(DTYPES)})")
    lookup.add_argument("--chip", help="chip name (default: this machine's CPU chip)")
    lookup.add_argument(
        "--match", choices=MATCH_KINDS, default="default", help="loosest answer accepted (default: default)"
    )
    _add_client_options(lookup)
    lookup.set_defaults(handler=cmd_lookup)


def build_parser() -> argparse.ArgumentParser:
    """The ``tiletune`` parser: the tuner's commands and the service's."""
    parser = build_tuner_parser()
    parser.description = (
        "Measured tiling (tile sizes, buffer count, pipeline depth) for accelerator kernels: "
        "tune locally, or run a tuning service (server, worker, submit, lookup, up)."
    )
    commands = _commands(parser)
    _add_server_parsers(commands)
    _add_submit_parser(commands)
    _add_lookup_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tiletune`` console command; returns the exit status."""
    args = build_parser().parse_args(argv)
    prefix = f"tiletune {args.command}: error:"
    try:
        status = args.handler(args)
    except (InputError, DeviceUnavailableError) as error:
        print(f"{prefix} {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ServerRefusedError as error:
        print(f"{prefix} {error}", file=sys.stderr)
        return EXIT_BAD_INPUT if error.status < 500 else EXIT_FAILURE
    except (ServerUnreachableError, CommandFailedError, WorkerRejectedError) as error:
        print(f"{prefix} {error}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return int(status or 0)


if __name__ == "__main__":
    sys.exit(main())
