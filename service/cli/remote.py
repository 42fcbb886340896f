"""Talking to a tiletune server from the command line: the ``submit`` and ``lookup`` commands.

- ``submit``: post a sweep (from flags or a JSON file in ``SweepCreate`` form,
  :mod:`~tiletune.service.cli.sweepfile`); ``--wait`` follows it to the end with a progress
  bar on stderr (terminals only), then prints its jobs.
- ``lookup``: the config the server answers for one key, with its match and provenance.

``--server`` and ``--token`` default to ``$TILETUNE_SERVER`` and ``$TILETUNE_TOKEN``; the
token is sent as ``Authorization: Bearer``. Light: the REST client and the wire schemas
(and the progress bar, drawn when tqdm is installed), so these run on the base install.
"""

from __future__ import annotations

import argparse
import sys
import time

from tiletune.client.api import ServiceApi
from tiletune.client.calls import ServerRefusedError, ServerUnreachableError
from tiletune.client.chip import cpu_chip_name
from tiletune.client.wire import (
    DTYPES,
    LIVE_JOB_STATES,
    MATCH_KINDS,
    STRATEGIES,
    JobState,
    SweepPublic,
    SweepState,
)
from tiletune.service.cli.options import (
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    BadInputError,
    CommandFailedError,
    Commands,
    add_json_option,
    add_server_options,
    service_api,
)
from tiletune.service.cli.sweepfile import sweep_from_file, sweep_from_flags
from tiletune.service.cli.text import lookup_text, sweep_text
from tiletune.tuner.measure.progress import ProgressBar

#: Seconds between polls of a sweep under ``submit --wait``.
POLL_S = 1.0
#: How long ``submit --wait`` keeps polling a server that went away (or answers 5xx) before giving up.
SERVER_GRACE_S = 60.0


# -- submit ---------------------------------------------------------------------------------------


def _finished_jobs(sweep: SweepPublic) -> int:
    return sum(1 for job in sweep.jobs if job.state not in LIVE_JOB_STATES)


def _wait(api: ServiceApi, sweep: SweepPublic, timeout_s: float | None) -> SweepPublic:
    """Poll the sweep until it is finished, with a progress bar of finished jobs on a terminal."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    away_since: float | None = None
    with ProgressBar(total=len(sweep.jobs), label=f"sweep {sweep.id}", unit="job") as bar:
        while True:
            bar.show(_finished_jobs(sweep), ", ".join(f"{k} {v}" for k, v in sorted(sweep.counts.items())))
            if sweep.state == SweepState.FINISHED:
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
                bar.show(_finished_jobs(sweep), f"server away ({error}); retrying")


def cmd_submit(args: argparse.Namespace) -> int:
    """Submit a sweep; with ``--wait`` follow it to the end and print its jobs."""
    sweep = sweep_from_file(args) if args.file else sweep_from_flags(args)
    if args.timeout is not None and args.timeout <= 0:
        raise BadInputError("timeout", f"must be a positive number of seconds, got {args.timeout}")
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
    failed = [job.id for job in final.jobs if job.state == JobState.FAILED]
    if failed:
        print(f"tiletune submit: {len(failed)} job(s) failed: {failed}", file=sys.stderr)
        return EXIT_FAILURE
    return 0


# -- lookup ---------------------------------------------------------------------------------------


def cmd_lookup(args: argparse.Namespace) -> None:
    """Ask the server for the config of one key and print it with its provenance."""
    chip = args.chip or cpu_chip_name()
    with service_api(args) as api:
        answer = api.lookup(args.kernel, shape=args.shape, dtype=args.dtype, chip=chip, match=args.match)
    print(answer.model_dump_json(indent=2) if args.json else lookup_text(answer))


# -- parsers --------------------------------------------------------------------------------------


def add_submit_parser(commands: Commands) -> None:
    """The ``submit`` subcommand."""
    submit = commands.add_parser(
        "submit",
        help="submit a tuning sweep to a server",
        description="Submit a sweep: one job per shape x dtype (x chip) of one kernel, from flags or "
        "from FILE, a JSON object in SweepCreate form (see /docs); --trials, --max-time, --patience, "
        "--strategy, --chip, --force and --with-backward override the file's values. Keys already "
        "tuned on the same software are skipped unless --force. Exit status: 2 when the sweep is "
        "refused (the message names the field); with --wait, 1 when a job failed.",
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
    submit.add_argument(
        "--with-backward",
        action="store_true",
        help="also tune the keys each kernel's backward looks up (softmax_backward, rms_norm_backward, "
        "fused_attention_backward at the same shapes; matmul's transposed shapes), for training",
    )
    submit.add_argument("--wait", action="store_true", help="follow the sweep until every job has finished")
    submit.add_argument("--timeout", type=float, help="with --wait: give up after this many seconds (exit 1)")
    add_server_options(submit)
    add_json_option(submit)
    submit.set_defaults(handler=cmd_submit)


def add_lookup_parser(commands: Commands) -> None:
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
    add_server_options(lookup)
    add_json_option(lookup)
    lookup.set_defaults(handler=cmd_lookup)
