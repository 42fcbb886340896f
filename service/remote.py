"""Talking to a tiletune server from the command line: the ``submit`` and ``lookup`` commands.

Owns :class:`ServiceApi` (the REST calls these commands make) and the errors its calls
raise, reading a sweep FILE (:func:`read_sweep_file`, also used by ``up --submit``), the
two commands with their options, and the text they print.

- ``submit``: post a sweep (from flags or a JSON file in ``SweepCreate`` form); ``--wait``
  follows it to the end with a progress bar on stderr (terminals only), then prints its jobs.
- ``lookup``: the config the server answers for one key, with its match and provenance.

``--server`` and ``--token`` default to ``$TILETUNE_SERVER`` and ``$TILETUNE_TOKEN``; the
token is sent as ``Authorization: Bearer``. Client side only: httpx and pydantic, never the
server's libraries, so a worker node without the server extras runs these.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

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
from tiletune.kernels.errors import InputError
from tiletune.kernels.spec import DTYPES, parse_dims
from tiletune.service.exits import EXIT_FAILURE, EXIT_INTERRUPTED, CommandFailedError
from tiletune.tuner.cli import SERVER_ENV, TOKEN_ENV, server_url

#: Seconds between polls of a sweep under ``submit --wait``.
POLL_S = 1.0
#: How long ``submit --wait`` keeps polling a server that went away (or answers 5xx) before giving up.
SERVER_GRACE_S = 60.0
FINISHED_SWEEP = "finished"
#: Job states of a job still in the works; every other state is final.
LIVE_JOB_STATES = ("queued", "running", "validating")
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


# -- the REST API as the commands use it ------------------------------------------------------------


class ServiceApi:
    """The calls ``submit``, ``lookup`` and ``up --submit`` make; errors become the exceptions above.

    A non-2xx answer raises :class:`ServerRefusedError`, no answer :class:`ServerUnreachableError`,
    an answer that is not the expected document :class:`CommandFailedError`.
    """

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
    return ServiceApi(server_url(args), args.token or os.environ.get(TOKEN_ENV), transport)


def _input_error(error: ValidationError, where: str = "") -> InputError:
    """The first problem pydantic found, as an :class:`InputError` naming its field."""
    first = error.errors()[0]
    field = ".".join(str(part) for part in first["loc"]) or "sweep"
    return InputError(f"{where}{field}", str(first["msg"]))


# -- sweeps from a file or from flags ---------------------------------------------------------------


def read_sweep_file(file: str, overrides: Mapping[str, Any] | None = None) -> SweepCreate:
    """The sweep in ``file`` (``-``: stdin), a JSON object in ``SweepCreate`` form, ``overrides`` over it.

    Raises :class:`InputError`: field ``file`` when it cannot be read or holds no JSON object,
    else ``FILE: FIELD`` for the first field pydantic refuses (e.g. ``sweep.json: trials``).
    """
    try:
        text = sys.stdin.read() if file == "-" else Path(file).read_text()
    except OSError as error:
        raise InputError("file", f"cannot read {file}: {error.strerror}") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise InputError("file", f"{file} is not JSON ({error.msg}, line {error.lineno})") from None
    if not isinstance(document, dict):
        raise InputError("file", f"{file} must hold a JSON object in SweepCreate form")
    document.update(overrides or {})
    try:
        return SweepCreate.model_validate(document)
    except ValidationError as error:
        raise _input_error(error, where=f"{file}: ") from None


def _sweep_from_file(args: argparse.Namespace) -> SweepCreate:
    clashing = [f"--{name}" for name in ("kernel", "shape", "dtype") if getattr(args, name)]
    if clashing:
        raise InputError("file", f"give either FILE or {', '.join(clashing)}, not both")
    overrides = {**_search_flags(args), "chips": args.chip or None, "force": True if args.force else None}
    return read_sweep_file(args.file, {key: value for key, value in overrides.items() if value is not None})


def _search_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The search settings given as flags (budgets, strategy); ``None`` where not given."""
    return {
        "trials": args.trials,
        "max_time_s": args.max_time,
        "patience": args.patience,
        "strategy": args.strategy,
    }


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
    document.update({key: value for key, value in _search_flags(args).items() if value is not None})
    try:
        return SweepCreate.model_validate(document)
    except ValidationError as error:
        raise _input_error(error) from None


# -- text output ----------------------------------------------------------------------------------


def ms_text(value: float | None) -> str:
    """Milliseconds with four decimals, ``-`` for none."""
    return f"{value:.4f}" if value is not None else "-"


def _config_text(config: dict[str, int] | None) -> str:
    return " ".join(f"{k}={v}" for k, v in config.items()) if config else "-"


def counts_text(sweep: SweepPublic) -> str:
    """The sweep's jobs by state, e.g. ``done 2, failed 1``."""
    return ", ".join(f"{state} {n}" for state, n in sorted(sweep.counts.items()))


def kernels_text(sweep: SweepPublic) -> str:
    """The kernels of the sweep's jobs, in job order, comma-separated."""
    return ", ".join(dict.fromkeys(job.kernel for job in sweep.jobs))


def _job_row(job: JobPublic) -> list[str]:
    progress = job.progress
    speedup = f"{progress.speedup_vs_default:.2f}x" if progress.speedup_vs_default else "-"
    return [
        str(job.id),
        job.shape_key,
        job.dtype,
        job.state,
        f"{progress.completed}/{job.trials}",
        ms_text(progress.best_ms),
        ms_text(progress.default_ms),
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
    chips = sorted({"any" if job.chip == ANY_CHIP else job.chip for job in sweep.jobs})
    heading = (
        f"sweep {sweep.id} ({kernels_text(sweep)}): {sweep.state}; jobs: {counts_text(sweep)};"
        f" chip: {', '.join(chips)}"
    )
    header = ["job", "shape", "dtype", "state", "trials", "best_ms", "default_ms", "speedup", "best config"]
    return heading + "\n" + format_table(header, [_job_row(job) for job in sweep.jobs])


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
        f" (default {ms_text(best.default_ms)} ms{speedup})",
        f"source:   job {best.job_id if best.job_id is not None else '-'},"
        f" promoted {best.promoted_at.isoformat(timespec='seconds')}",
        "software: " + (", ".join(f"{k} {v}" for k, v in best.software.items() if v) or "-"),
    ]
    return "\n".join(lines)


# -- submit ---------------------------------------------------------------------------------------


def _finished_jobs(sweep: SweepPublic) -> int:
    return sum(1 for job in sweep.jobs if job.state not in LIVE_JOB_STATES)


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


def cmd_lookup(args: argparse.Namespace) -> None:
    """Ask the server for the config of one key and print it with its provenance."""
    chip = args.chip or get_device("cpu").chip.name
    with service_api(args) as api:
        answer = api.lookup(args.kernel, shape=args.shape, dtype=args.dtype, chip=chip, match=args.match)
    print(answer.model_dump_json(indent=2) if args.json else lookup_text(answer))


# -- parsers --------------------------------------------------------------------------------------


def _add_client_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--server", help=f"server URL, e.g. http://tuner:8642 (default: ${SERVER_ENV})")
    parser.add_argument("--token", help=f"bearer token for the server (default: ${TOKEN_ENV})")
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")


def add_submit_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``submit`` subcommand."""
    submit = commands.add_parser(
        "submit",
        help="submit a tuning sweep to a server",
        description="Submit a sweep: one job per shape x dtype (x chip) of one kernel, from flags or "
        "from FILE, a JSON object in SweepCreate form (see /docs); --trials, --max-time, --patience, "
        "--strategy, --chip and --force override the file's values. Keys already tuned on the same "
        "software are skipped unless --force. Exit status: 2 when the sweep is refused (the message "
        "names the field); with --wait, 1 when a job failed.",
    )
    submit.add_argument("file", nargs="?", metavar="FILE", help="sweep as JSON (SweepCreate); - reads stdin")
    submit.add_argument("--kernel", help="kernel name (see `tiletune kernels`)")
    submit.add_argument(
        "--shape", action="append", help="problem dims, e.g. m=1024,n=1024,k=1024; repeat for more"
    )
    submit.add_argument("--dtype", action="append", help=f"element type ({', '.join(DTYPES)}); repeat")
    submit.add_argument("--chip", action="append", help="target chip name; repeat (default: any chip)")
    submit.add_argument("--trials", type=int, help="unique valid configs to measure per job (default 40)")
    submit.add_argument(
        "--max-time", type=float, metavar="SECONDS", help="time budget per job (default: none)"
    )
    submit.add_argument(
        "--patience",
        type=int,
        help="end a job after this many measurements without a better config (default: none)",
    )
    submit.add_argument("--strategy", choices=STRATEGIES, help="search strategy (default tpe)")
    submit.add_argument("--force", action="store_true", help="tune keys again even if already tuned")
    submit.add_argument("--wait", action="store_true", help="follow the sweep until every job has finished")
    submit.add_argument("--timeout", type=float, help="with --wait: give up after this many seconds (exit 1)")
    _add_client_options(submit)
    submit.set_defaults(handler=cmd_submit)


def add_lookup_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """The ``lookup`` subcommand."""
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
