"""The ``token`` command: create, list and revoke the server's tokens (an admin token is needed).

``tiletune token create --role R [--name N] [--chip C]`` prints the new token once (it is not
stored, only its digest); ``--chip`` binds a worker token to that chip (else its first
registration binds it; ``*``: every chip); ``list`` shows every token and its chip without
secrets; ``revoke ID`` ends one for good.
Light: the REST client only, so it runs on the base install.
"""

from __future__ import annotations

import argparse

from pydantic import ValidationError

from tiletune.client import calls
from tiletune.client.wire import Role, TokenCreate, TokenPublic
from tiletune.service.cli.options import (
    BadInputError,
    Commands,
    add_remote_options,
    emit,
    note,
    service_api,
)
from tiletune.service.cli.text import format_table


def _row(token: TokenPublic) -> list[str]:
    revoked = token.revoked_at.isoformat(timespec="seconds") if token.revoked_at else "-"
    created = token.created_at.isoformat(timespec="seconds")
    return [str(token.id), token.role, token.name, created, revoked, token.chip or "-"]


def _create_request(args: argparse.Namespace) -> TokenCreate:
    """The request ``token create`` sends; :class:`BadInputError` naming the option at fault."""
    try:
        return TokenCreate(role=Role(args.role), name=args.name, chip=args.chip)
    except ValidationError as error:
        first = error.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "token"
        raise BadInputError(field, first["msg"]) from None


def cmd_token(args: argparse.Namespace) -> None:
    """Create, list or revoke tokens."""
    with service_api(args) as api:
        if args.action == "create":
            created = api.send(calls.create_token(_create_request(args)))
            if not args.json:
                note("token", f"created token {created.id} ({created.role}); it is shown once, here:")
            emit(args, created.model_dump(mode="json"), created.token)
        elif args.action == "list":
            listed = api.send(calls.tokens())
            header = ["id", "role", "name", "created", "revoked", "chip"]
            emit(
                args,
                {"tokens": [token.model_dump(mode="json") for token in listed]},
                format_table(header, [_row(token) for token in listed]),
            )
        else:
            revoked = api.send(calls.revoke_token(args.id))
            emit(args, revoked.model_dump(mode="json"), f"revoked token {revoked.id} ({revoked.name})")


def add_token_parser(commands: Commands) -> None:
    """The ``token`` subcommand and its actions."""
    token = commands.add_parser(
        "token",
        help="create, list or revoke the server's tokens (admin)",
        description="Manage bearer tokens (needs an admin token: --token or $TILETUNE_TOKEN). Roles: "
        "admin (everything), submitter (sweeps; cancels its own), worker (registers workers, writes "
        "through its own leases), reader (lookups, exports, history). A created token is printed "
        "once; the server keeps only its digest.",
    )
    actions = token.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = actions.add_parser("create", help="create a token and print it once")
    create.add_argument("--role", required=True, choices=[role.value for role in Role], help="what it may do")
    create.add_argument("--name", default="token", help="a name to recognise it by (default: token)")
    create.add_argument(
        "--chip",
        help="worker tokens: the only chip it may register and lease for (default: the chip of its "
        "first registration; '*': every chip, for a fleet of several chips sharing one token)",
    )
    listing = actions.add_parser("list", help="every token (never a secret)")
    revoke = actions.add_parser("revoke", help="revoke a token for good")
    revoke.add_argument("id", type=int, help="the token's id (see `tiletune token list`)")
    add_remote_options(create, listing, revoke)
    token.set_defaults(handler=cmd_token)
