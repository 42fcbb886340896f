"""The ``tiletune`` console command: the tuner's commands plus ``server``, ``up``, ``submit``, ``lookup``.

This module is the entry point only: it extends the tuner's parser (``kernels``, ``tune``,
``bench``, ``worker``; see :mod:`tiletune.tuner.cli`) with the service's commands, runs the
chosen one and turns what it raised into the exit status. The commands live in:

- :mod:`tiletune.service.serve`: ``server`` and ``up`` (uvicorn, binding, migrations,
  signals; ``up --submit FILE [--until-done]`` with :mod:`tiletune.service.follow`);
- :mod:`tiletune.service.remote`: ``submit`` and ``lookup`` (the REST client, its errors,
  sweep files, the text they print).

Exit status (:mod:`tiletune.service.exits`): 0 success; 1 the server is unreachable,
answers 5xx or something that is not the API, a job of a waited-for sweep failed, or a
local worker/port failure; 2 bad input, here or as the server judged it (any 4xx: its
message, which names the field, is printed); 130 interrupted.

FastAPI, uvicorn, SQLAlchemy, Alembic and Optuna are imported only when ``server`` or
``up`` runs: a worker node without the server extras runs ``worker``, ``submit`` and
``lookup``. ``python -m tiletune.service.cli`` runs this command too.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from tiletune.kernels.errors import DeviceUnavailableError, InputError
from tiletune.service.exits import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_INTERRUPTED, CommandFailedError
from tiletune.service.remote import (
    ServerRefusedError,
    ServerUnreachableError,
    add_lookup_parser,
    add_submit_parser,
)
from tiletune.service.serve import add_server_parsers
from tiletune.tuner.cli import build_parser as build_tuner_parser
from tiletune.tuner.worker import WorkerRejectedError


def _commands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    """The subcommands action of the tuner's parser, to add the service's commands to.

    :func:`tiletune.tuner.cli.build_parser` returns only the parser, and argparse has no
    public accessor for an existing ``add_subparsers`` action (calling it again is an
    error), so this reads the private ``_actions`` list. It is the one place that does.
    """
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    raise RuntimeError("the tuner's parser has no subcommands")


def build_parser() -> argparse.ArgumentParser:
    """The ``tiletune`` parser: the tuner's commands and the service's."""
    parser = build_tuner_parser()
    parser.description = (
        "Measured tiling (tile sizes, buffer count, pipeline depth) for accelerator kernels: "
        "tune locally, or run a tuning service (server, worker, submit, lookup, up)."
    )
    commands = _commands(parser)
    add_server_parsers(commands)
    add_submit_parser(commands)
    add_lookup_parser(commands)
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
