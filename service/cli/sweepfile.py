"""Sweeps from the command line: a JSON FILE in ``SweepCreate`` form, or flags, with flags over a file.

Used by ``submit`` and ``up --submit``. Refusals are
:class:`~tiletune.service.cli.options.BadInputError` naming the field (``sweep.json: trials``);
nothing is sent before the sweep is known to be well formed.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from tiletune.client.wire import ShapeTextError, SweepCreate, parse_dims
from tiletune.service.cli.options import BadInputError


def _input_error(error: ValidationError, where: str = "") -> BadInputError:
    """The first problem pydantic found, as a :class:`BadInputError` naming its field."""
    first = error.errors()[0]
    field = ".".join(str(part) for part in first["loc"]) or "sweep"
    return BadInputError(f"{where}{field}", str(first["msg"]))


def read_sweep_file(file: str, overrides: Mapping[str, Any] | None = None) -> SweepCreate:
    """The sweep in ``file`` (``-``: stdin), a JSON object in ``SweepCreate`` form, ``overrides`` over it.

    Raises :class:`BadInputError`: field ``file`` when it cannot be read or holds no JSON object,
    else ``FILE: FIELD`` for the first field pydantic refuses (e.g. ``sweep.json: trials``).
    """
    try:
        text = sys.stdin.read() if file == "-" else Path(file).read_text()
    except OSError as error:
        raise BadInputError("file", f"cannot read {file}: {error.strerror}") from None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise BadInputError("file", f"{file} is not JSON ({error.msg}, line {error.lineno})") from None
    if not isinstance(document, dict):
        raise BadInputError("file", f"{file} must hold a JSON object in SweepCreate form")
    document.update(overrides or {})
    try:
        return SweepCreate.model_validate(document)
    except ValidationError as error:
        raise _input_error(error, where=f"{file}: ") from None


def _dims(text: str) -> dict[str, object]:
    try:
        return parse_dims(text)
    except ShapeTextError as error:
        raise BadInputError(error.field, error.reason) from None


def sweep_from_file(args: argparse.Namespace) -> SweepCreate:
    """The sweep of ``submit FILE``, with the search flags, ``--chip``, ``--force`` and
    ``--with-backward`` over the file's."""
    clashing = [f"--{name}" for name in ("kernel", "shape", "dtype") if getattr(args, name)]
    if clashing:
        raise BadInputError("file", f"give either FILE or {', '.join(clashing)}, not both")
    overrides = {
        **_search_flags(args),
        "chips": args.chip or None,
        "force": True if args.force else None,
        "with_backward": True if args.with_backward else None,
    }
    return read_sweep_file(args.file, {key: value for key, value in overrides.items() if value is not None})


def _search_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The search settings given as flags (budgets, strategy); ``None`` where not given."""
    return {
        "trials": args.trials,
        "max_time_s": args.max_time,
        "patience": args.patience,
        "strategy": args.strategy,
    }


def sweep_from_flags(args: argparse.Namespace) -> SweepCreate:
    """The sweep of ``submit --kernel K --shape DIMS ... --dtype D``."""
    for name in ("kernel", "shape", "dtype"):
        if not getattr(args, name):
            raise BadInputError(name, f"--{name} is required (or give a sweep FILE)")
    document: dict[str, Any] = {
        "kernel": args.kernel,
        "shapes": [_dims(text) for text in args.shape],
        "dtypes": args.dtype,
        "chips": args.chip or [],
        "force": args.force,
        "with_backward": args.with_backward,
    }
    document.update({key: value for key, value in _search_flags(args).items() if value is not None})
    try:
        return SweepCreate.model_validate(document)
    except ValidationError as error:
        raise _input_error(error) from None
