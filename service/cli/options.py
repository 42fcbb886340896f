"""What the ``tiletune`` commands share: exit statuses, the exit-1 error, common options, the server.

Every command module of this package imports this one and nothing of the others' (the
entry point, :mod:`tiletune.service.cli.main`, imports them all). Light: the standard
library, httpx and the wire schemas only.

Exit statuses (mapped from exceptions in one place, :func:`tiletune.service.cli.main.main`):

- ``0``: success;
- :data:`EXIT_FAILURE` (1): the work could not be done (:class:`CommandFailedError`, an
  unreachable or failing server, a refused worker, a failed job);
- :data:`EXIT_BAD_INPUT` (2): bad input, here or as the server judged it (a 4xx);
- :data:`EXIT_INTERRUPTED` (130): stopped by Ctrl-C before the work was done.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, TypeAlias

import httpx

from tiletune.client.api import ServiceApi
from tiletune.client.wire import DEVICE_KINDS, DTYPES

EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130

SERVER_ENV = "TILETUNE_SERVER"
TOKEN_ENV = "TILETUNE_TOKEN"

#: The subcommands of a parser (argparse names no public type for it).
Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


class CommandFailedError(Exception):
    """The command could not do its work for a reason other than bad input (exit 1)."""


class BadInputError(ValueError):
    """Bad input found by the command line itself (exit 2); ``field`` names the option."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


def server_url(args: argparse.Namespace) -> str:
    """``--server``, else ``$TILETUNE_SERVER``; an http(s) URL or :class:`BadInputError` (field server)."""
    url = args.server or os.environ.get(SERVER_ENV)
    if not url:
        raise BadInputError("server", f"--server URL (or ${SERVER_ENV}) is required, e.g. http://tuner:8642")
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as error:
        raise BadInputError("server", f"--server {url!r} is not a URL ({error})") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise BadInputError("server", f"--server must be an http:// or https:// URL, got {url!r}")
    return url


def server_token(args: argparse.Namespace) -> str | None:
    """``--token``, else ``$TILETUNE_TOKEN``, else none."""
    token: str | None = args.token or os.environ.get(TOKEN_ENV)
    return token


def service_api(args: argparse.Namespace, transport: httpx.BaseTransport | None = None) -> ServiceApi:
    """The REST client of the server at ``--server`` with ``--token`` (see :func:`server_url`)."""
    return ServiceApi(server_url(args), server_token(args), transport=transport)


def add_server_options(parser: argparse.ArgumentParser) -> None:
    """``--server`` and ``--token``."""
    parser.add_argument("--server", help=f"server URL, e.g. http://tuner:8642 (default: ${SERVER_ENV})")
    parser.add_argument("--token", help=f"bearer token for the server (default: ${TOKEN_ENV})")


def add_json_option(parser: argparse.ArgumentParser) -> None:
    """``--json``."""
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")


def add_kernel_arguments(parser: argparse.ArgumentParser, replay_help: str | None = None) -> None:
    """KERNEL, ``--shape``, ``--dtype``, ``--backend`` (device kind) and ``--json``."""
    parser.add_argument("kernel", help="kernel name (see `tiletune kernels`)")
    parser.add_argument("--shape", help="problem dims, e.g. m=1024,n=1024,k=1024 (required)")
    parser.add_argument("--dtype", help=f"element type: {', '.join(DTYPES)} (required)")
    parser.add_argument(
        "--backend",
        default="cpu",
        help=f"device to run on: {', '.join(DEVICE_KINDS)} or auto (default: cpu)"
        + (f"; {replay_help}" if replay_help else ""),
    )
    add_json_option(parser)


def emit(args: argparse.Namespace, document: dict[str, Any], text: str) -> None:
    """``document`` as JSON under ``--json``, else ``text``, on stdout."""
    print(json.dumps(document, indent=2) if args.json else text)


def note(command: str, text: str) -> None:
    """A note for the person at the terminal, on stderr."""
    print(f"tiletune {command}: {text}", file=sys.stderr)
