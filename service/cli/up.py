"""``tiletune up``: the embedded all-in-one: SQLite, the server on a thread, one local CPU worker.

Migrates an SQLite database, serves the API on 127.0.0.1 (reads open: loopback) and runs one
:class:`~tiletune.tuner.measure.worker.Worker` on another thread, with a worker token and an admin
token for the person at the terminal made at each start (the previous run's revoked; the
admin token is printed in the banner). Ctrl-C (or SIGTERM) stops the worker first (it
finishes its trial and releases its lease), then the server. ``--submit FILE`` submits a
sweep once both run and prints each job as it finishes, then a summary
(:mod:`tiletune.service.cli.follow`); ``--until-done`` then stops the same way and exits 0,
or 1 when a job failed.

Built on :mod:`tiletune.service.cli.serve` (settings, migrations, binding, uvicorn, signals);
the server's libraries and torch are imported only when ``up`` runs.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tiletune.client.api import ServiceApi
from tiletune.client.wire import ANY_CHIP, Role, SweepCreate
from tiletune.service.cli.follow import SweepFollower
from tiletune.service.cli.migration import migrate, safe_url
from tiletune.service.cli.options import (
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    TOKEN_ENV,
    BadInputError,
    CommandFailedError,
    Commands,
)
from tiletune.service.cli.remote import POLL_S
from tiletune.service.cli.serve import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    bind,
    served_url,
    settings_of,
    stop_signals,
    uvicorn_server,
)
from tiletune.service.cli.sweepfile import read_sweep_file

if TYPE_CHECKING:
    import uvicorn

    from tiletune.kernels.device import Device
    from tiletune.service.settings import Settings
    from tiletune.tuner.measure.worker import Worker

#: How long ``up`` waits for its server to start, and for its worker and server to stop.
START_TIMEOUT_S = 60.0
WORKER_STOP_S = 60.0
SERVER_STOP_S = 15.0
#: Names of the tokens ``up`` makes at each start: its worker's and the person's at the terminal.
UP_WORKER_TOKEN = "tiletune up: worker"
UP_PERSON_TOKEN = "tiletune up: you"
#: How often ``up``'s main loop looks at its threads and the stop signal.
TICK_S = 0.2


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
    settings = settings_of(args.db)
    sock = bind(DEFAULT_HOST, args.port)
    migrate(settings.db_url)
    server, tokens = uvicorn_server(settings, DEFAULT_HOST, args.port, access_log=False)
    worker_token = tokens.replace(Role.WORKER, UP_WORKER_TOKEN).token
    person_token = tokens.replace(Role.ADMIN, UP_PERSON_TOKEN).token
    server_thread = _start_server_thread(server, sock)
    try:
        up = _Up(
            served_url(sock),
            settings,
            worker_token,
            person_token,
            server_thread,
            device,
            request,
            args.until_done,
        )
        return _run(up)
    finally:
        server.should_exit = True
        server_thread.join(SERVER_STOP_S)


def _run(up: _Up) -> int:
    """Run the worker (and follow the submitted sweep) until stopped or done; the exit status."""
    from tiletune.tuner.measure.worker import Worker

    failures: list[BaseException] = []
    follower: SweepFollower | None = None
    stop = threading.Event()
    name = f"{socket.gethostname()}-up-{os.getpid()}"
    worker = Worker.connect(up.url, up.worker_token, device=up.device, name=name)
    with worker, ServiceApi(up.url, up.person_token) as api:
        worker_thread = threading.Thread(target=_run_worker, args=(worker, failures), name="worker")
        worker_thread.daemon = True
        with stop_signals(stop.set, "the worker, then the server"):
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
        f"tiletune up: {up.url} (API docs {up.url}/docs; database {safe_url(up.settings.db_url)};"
        f" one worker on {up.device.chip.name}). Ctrl-C stops.",
        flush=True,
    )
    print(f"  dashboard: {up.url}/", flush=True)
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


def add_up_parser(commands: Commands) -> None:
    """The ``up`` subcommand."""
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
