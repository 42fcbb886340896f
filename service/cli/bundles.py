"""Config bundles from the command line: ``configs export`` and ``configs import``.

- ``configs export [--chip C] [--kernel K] -o FILE``: the bundle the server exports
  (``GET /v1/configs?chip=&kernel=``: every best config of the chip, the kernels' info, the
  checksum of the entries), written atomically (a temporary file beside ``FILE``, then a
  rename: a reader never sees half a bundle); ``-o -`` writes it on stdout. ``--chip``
  defaults to this machine's CPU chip, as ``lookup``'s does.
- ``configs import FILE [--force]`` (admins): sends a bundle file (``-``: stdin) to
  ``POST /v1/configs/import``. The file is checked here first, as the server checks it: a
  file that is not a bundle, or whose ``checksum`` is missing or does not match its entries
  (:meth:`~tiletune.client.wire.ConfigBundle.content_checksum`: changed after export), is
  refused with exit 2 and nothing is sent. The server then checks every entry against its
  kernel and chip; an entry replaces a key's best only if faster, and one measured on that
  server only with ``--force``.

The files are :class:`~tiletune.client.wire.ConfigBundle` as JSON, the format of the client's
disk cache and of ``ConfigClient.import_bundle`` (:mod:`tiletune.client.disk`).
Light: the REST client and the wire schemas only, so these run on the base install.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pydantic import ValidationError

from tiletune.client import calls
from tiletune.client.chip import cpu_chip_name
from tiletune.client.disk import write_bundle
from tiletune.client.wire import ConfigBundle
from tiletune.service.cli.options import (
    BadInputError,
    Commands,
    add_remote_options,
    emit,
    note,
    service_api,
)

#: The path that means stdout (export) or stdin (import).
STANDARD_STREAM = "-"


def read_sealed_bundle(path: str) -> ConfigBundle:
    """The bundle in the file at ``path`` (``-``: stdin) whose checksum matches its entries.

    :class:`BadInputError` naming ``file`` when it cannot be read or is no bundle, ``checksum``
    when its checksum is missing or does not match its entries.
    """
    try:
        raw = sys.stdin.buffer.read() if path == STANDARD_STREAM else Path(path).read_bytes()
    except OSError as error:
        raise BadInputError("file", f"cannot read {path!r}: {error.strerror or error}") from None
    try:
        bundle = ConfigBundle.model_validate_json(raw)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the document"
        raise BadInputError("file", f"{path!r} is not a config bundle ({where}: {first['msg']})") from None
    if bundle.checksum is None:
        raise BadInputError(
            "checksum", f"{path!r} has no checksum; export the bundle again (`tiletune configs export`)"
        )
    if bundle.checksum != bundle.content_checksum():
        raise BadInputError(
            "checksum",
            f"{path!r}: the checksum does not match the entries (the file was changed after export); "
            "nothing was imported",
        )
    return bundle


def _export(args: argparse.Namespace) -> None:
    chip = args.chip or cpu_chip_name()
    with service_api(args) as api:
        bundle = api.send(calls.configs(chip, args.kernel))
    if args.output == STANDARD_STREAM:
        print(bundle.model_dump_json(indent=1))
        note("configs", f"exported {len(bundle.configs)} config(s) of chip {chip!r}")
        return
    try:
        write_bundle(Path(args.output), bundle)
    except OSError as error:
        raise BadInputError("output", f"cannot write {args.output!r}: {error.strerror or error}") from None
    document = {
        "path": args.output,
        "chip": chip,
        "kernel": args.kernel,
        "configs": len(bundle.configs),
        "checksum": bundle.checksum,
    }
    emit(args, document, f"exported {len(bundle.configs)} config(s) of chip {chip!r} to {args.output}")


def _import(args: argparse.Namespace) -> None:
    bundle = read_sealed_bundle(args.file)
    with service_api(args) as api:
        answer = api.send(calls.import_configs(bundle, args.force))
    document = {
        "path": args.file,
        "chip": bundle.chip,
        "configs": len(bundle.configs),
        "changed": answer.changed,
    }
    emit(args, document, f"imported {args.file}: {len(bundle.configs)} config(s), {answer.changed} changed")


def cmd_configs(args: argparse.Namespace) -> None:
    """``configs export|import``."""
    if args.action == "export":
        _export(args)
    else:
        _import(args)


def add_configs_parser(commands: Commands) -> None:
    """The ``configs`` subcommand and its actions."""
    configs = commands.add_parser(
        "configs",
        help="export the server's best configs to a bundle file, or import one",
        description="Bundles of best configs (one chip, optionally one kernel; JSON with the checksum "
        "of its entries) for another server, an air-gapped cluster or a client's disk cache. Export "
        "needs a reader's token, import an admin's; a bundle changed after export is refused here "
        "before anything is sent.",
    )
    actions = configs.add_subparsers(dest="action", required=True, metavar="ACTION")
    export = actions.add_parser("export", help="write the server's bundle of a chip to a file")
    export.add_argument("--chip", help="the chip whose configs to export (default: this machine's CPU chip)")
    export.add_argument("--kernel", help="only this kernel's configs (default: every kernel)")
    export.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="FILE",
        help="where to write the bundle (atomically); - for stdout",
    )
    imports = actions.add_parser("import", help="send a bundle file to the server (admin)")
    imports.add_argument(
        "file", metavar="FILE", help="a bundle written by `tiletune configs export`; - for stdin"
    )
    imports.add_argument(
        "--force", action="store_true", help="also replace bests measured on that server (default: keep them)"
    )
    add_remote_options(export, imports)
    configs.set_defaults(handler=cmd_configs)
