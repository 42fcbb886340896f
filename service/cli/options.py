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

:data:`EXIT_STATUSES` says so in ``tiletune --help`` (:func:`exit_status_help`); every
subcommand's help points there (:func:`point_at_exit_statuses`).

The bearer token (:func:`server_token`): ``--token-file PATH``, else ``--token``, else
``$TILETUNE_TOKEN_FILE``, else ``$TILETUNE_TOKEN``. A file keeps the secret off the command
line, where any user of the machine sees it (``ps``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from pathlib import Path
from typing import Any, TypeAlias

import httpx

from tiletune.client.api import ServiceApi
from tiletune.client.wire import DEVICE_KINDS, DTYPES

EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130

#: What each exit status means, for ``tiletune --help`` (the one place it is written).
EXIT_STATUSES: tuple[tuple[int, str], ...] = (
    (0, "success"),
    (
        EXIT_FAILURE,
        "the work could not be done: the server is unreachable, answers 5xx or something that is "
        "not the API, refuses a worker, a job of a waited-for sweep failed, a local worker or port "
        "failure, or a library the command needs is not installed (the message names the extra)",
    ),
    (
        EXIT_BAD_INPUT,
        "bad input, here or as the server judged it (any 4xx: its message names the field); "
        "nothing was changed",
    ),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C) before the work was done"),
)
#: The help's pointer from every subcommand to :data:`EXIT_STATUSES`.
EXIT_STATUS_POINTER = "Exit statuses: see `tiletune --help`."

SERVER_ENV = "TILETUNE_SERVER"
TOKEN_ENV = "TILETUNE_TOKEN"
TOKEN_FILE_ENV = "TILETUNE_TOKEN_FILE"
#: The most bytes a token file may hold (a token is under 100 characters).
MAX_TOKEN_FILE_BYTES = 4096

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


def exit_status_help(width: int = 78) -> str:
    """The exit statuses and what each means, one indented entry each, for an epilog."""
    lines = ["exit status:"]
    for status, meaning in EXIT_STATUSES:
        entry = textwrap.wrap(meaning, width - 10) or [""]
        lines.append(f"  {status:<6}{entry[0]}")
        lines += [" " * 8 + rest for rest in entry[1:]]
    return "\n".join(lines)


def point_at_exit_statuses(parser: argparse.ArgumentParser) -> None:
    """Append :data:`EXIT_STATUS_POINTER` to the epilog of every subcommand under ``parser``."""
    for action in parser._actions:  # argparse keeps its subcommands only here
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):  # an alias maps to the same parser
                sub.epilog = f"{sub.epilog} {EXIT_STATUS_POINTER}" if sub.epilog else EXIT_STATUS_POINTER
                point_at_exit_statuses(sub)


def read_token_file(path: str) -> str:
    """The token in the file at ``path``, whitespace around it stripped; :class:`BadInputError`
    (field ``token-file``) when it cannot be read, is empty, too large or more than one word."""
    try:
        with Path(path).open("rb") as handle:
            raw = handle.read(MAX_TOKEN_FILE_BYTES + 1)
    except OSError as error:
        raise BadInputError("token-file", f"cannot read {path!r}: {error.strerror or error}") from None
    if len(raw) > MAX_TOKEN_FILE_BYTES:
        raise BadInputError(
            "token-file", f"{path!r} holds more than {MAX_TOKEN_FILE_BYTES} bytes: not a token"
        )
    try:
        token = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise BadInputError("token-file", f"{path!r} is not UTF-8 text") from None
    if not token:
        raise BadInputError("token-file", f"{path!r} is empty")
    if any(char.isspace() or not char.isprintable() for char in token):
        raise BadInputError("token-file", f"{path!r} must hold one token (no spaces or line breaks inside)")
    return token


def server_token(args: argparse.Namespace) -> str | None:
    """``--token-file``, else ``--token``, else ``$TILETUNE_TOKEN_FILE``, else ``$TILETUNE_TOKEN``,
    else none; a token file as :func:`read_token_file` reads it."""
    token_file: str | None = getattr(args, "token_file", None)
    if token_file:
        return read_token_file(token_file)
    if getattr(args, "token", None):
        flag: str = args.token
        return flag
    if os.environ.get(TOKEN_FILE_ENV):
        return read_token_file(os.environ[TOKEN_FILE_ENV])
    return os.environ.get(TOKEN_ENV) or None


def service_api(args: argparse.Namespace, transport: httpx.BaseTransport | None = None) -> ServiceApi:
    """The REST client of the server at ``--server`` with the token :func:`server_token` finds (see
    :func:`server_url`)."""
    return ServiceApi(server_url(args), server_token(args), transport=transport)


def add_server_options(parser: argparse.ArgumentParser) -> None:
    """``--server``, ``--token-file`` and ``--token`` (see :func:`server_token`)."""
    parser.add_argument("--server", help=f"server URL, e.g. http://tuner:8642 (default: ${SERVER_ENV})")
    parser.add_argument(
        "--token-file",
        metavar="PATH",
        help=f"read the bearer token from this file (default: ${TOKEN_FILE_ENV}, else ${TOKEN_ENV})",
    )
    parser.add_argument(
        "--token",
        help="bearer token for the server; visible to every user of this machine (ps): prefer "
        f"--token-file, ${TOKEN_FILE_ENV} or ${TOKEN_ENV}",
    )


def add_json_option(parser: argparse.ArgumentParser) -> None:
    """``--json``."""
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")


def add_remote_options(*parsers: argparse.ArgumentParser) -> None:
    """:func:`add_server_options` and :func:`add_json_option` on each of ``parsers`` (the actions of a
    command that asks the server and prints its answer)."""
    for parser in parsers:
        add_server_options(parser)
        add_json_option(parser)


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
