"""The ``tiletune`` command: one parser, one map from what a command raised to its exit status.

The commands live beside this module: :mod:`~tiletune.service.cli.local` (``kernels``,
``tune``, ``bench``), :mod:`~tiletune.service.cli.serve` (``server``, ``worker``),
:mod:`~tiletune.service.cli.up` (``up``),
:mod:`~tiletune.service.cli.remote` (``submit``, ``lookup``), :mod:`~tiletune.service.cli.tokens`
(``token create|list|revoke``), :mod:`~tiletune.service.cli.migration` (``migrate``),
:mod:`~tiletune.service.cli.fleet` (``sweeps``, ``jobs``, ``workers``),
:mod:`~tiletune.service.cli.bundles` (``configs export|import``),
:mod:`~tiletune.service.cli.completion` (``completion bash|zsh``). Building
the parser imports none of torch, Optuna or the server's libraries, so ``tiletune --help``, ``--version``,
``submit`` and ``lookup`` run on the base install (httpx and pydantic).

Exit status (:mod:`tiletune.service.cli.options`): 0 success; 1 the server is unreachable,
answers 5xx or something that is not the API, refuses a worker, a job of a waited-for sweep
failed, a local worker/port failure, or a library the command needs is not installed (the
message names the extra to install); 2 bad input, here or as the server judged it (any
4xx: its message, which names the field, is printed); 130 interrupted. ``tiletune --help``
lists them (:data:`~tiletune.service.cli.options.EXIT_STATUSES`), every subcommand's help points there.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from tiletune.client.calls import ServerRefusedError, ServerUnreachableError, UnexpectedAnswerError
from tiletune.client.chip import package_version
from tiletune.service.cli import bundles, completion, fleet, local, migration, remote, serve, tokens, up
from tiletune.service.cli.options import (
    EXIT_BAD_INPUT,
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    BadInputError,
    CommandFailedError,
    exit_status_help,
    point_at_exit_statuses,
)

#: The top-level help's description, wrapped here (the help keeps the epilog's lines as written).
DESCRIPTION = (
    "Measured tiling (tile sizes, buffer count, pipeline depth) for accelerator kernels: tune locally,\n"
    "or run a tuning service (server, worker, submit, lookup, up) and manage it (sweeps, jobs,\n"
    "workers, configs, token)."
)


def build_parser() -> argparse.ArgumentParser:
    """The parser of every ``tiletune`` command."""
    parser = argparse.ArgumentParser(
        prog="tiletune",
        description=DESCRIPTION,
        epilog=exit_status_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version", action="version", version=f"tiletune {package_version('tiletune') or 'unknown'}"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    local.add_parsers(commands)
    serve.add_worker_parser(commands)
    serve.add_server_parser(commands)
    up.add_up_parser(commands)
    remote.add_submit_parser(commands)
    remote.add_lookup_parser(commands)
    tokens.add_token_parser(commands)
    fleet.add_sweeps_parser(commands)
    fleet.add_jobs_parser(commands)
    fleet.add_workers_parser(commands)
    bundles.add_configs_parser(commands)
    completion.add_completion_parser(commands, parser)
    migration.add_migrate_parser(commands)
    point_at_exit_statuses(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``tiletune`` console command; returns the exit status."""
    args = build_parser().parse_args(argv)
    prefix = f"tiletune {args.command}: error:"
    try:
        status = args.handler(args)
    except BadInputError as error:
        print(f"{prefix} {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ServerRefusedError as error:
        print(f"{prefix} {error}", file=sys.stderr)
        return EXIT_BAD_INPUT if error.status < 500 else EXIT_FAILURE
    except (ServerUnreachableError, UnexpectedAnswerError, CommandFailedError) as error:
        print(f"{prefix} {error}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except ModuleNotFoundError as error:
        extra = getattr(args, "extra", None)
        if extra is None or not error.name or error.name.startswith("tiletune"):
            raise
        missing = error.name.split(".")[0]
        print(
            f"{prefix} this command needs {missing}, which is not installed here"
            f" (pip install 'tiletune[{extra}]')",
            file=sys.stderr,
        )
        return EXIT_FAILURE
    return int(status or 0)
