"""How the ``server`` and ``worker`` processes log: a level, and lines as text or JSON.

:func:`configure_logging` installs one handler on the root logger, writing to stderr; uvicorn's
loggers and the access log (``tiletune.access``, written by
:class:`~tiletune.service.request_ids.RequestIds`) go through it too. A repeated call replaces
the handler it installed (never another's).

- **level**: the argument (``--log-level``), else ``$TILETUNE_LOG_LEVEL``, else ``INFO``; one of
  :data:`LEVELS`, any case. The lines of :data:`QUIET_LOGGERS` are shown from ``WARNING`` up.
- **format**: the argument (``--log-format``), else ``$TILETUNE_LOG_FORMAT``, else ``text``:

  - ``text``: ``2026-01-01 12:00:00,123 INFO tiletune.service.app: message`` and, for a line
    logged while a request was handled, `` request_id=ID`` after the message; an exception's
    traceback on the lines after.
  - ``json``: one object per line: ``ts`` (ISO-8601, UTC, milliseconds, ``Z``), ``level``,
    ``logger``, ``message``, ``request_id`` (when the line was logged while a request was
    handled), the access fields of an access line (:data:`ACCESS_FIELDS`), ``exception`` (the
    traceback's text, when there is one).

A bad level or format is :class:`LogSettingError` naming the setting and where it came from.
Nothing here logs a header; as a last guard, a ``Bearer`` credential in a message is replaced
by ``[redacted]`` in both formats.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

from tiletune.service.request_ids import ACCESS_FIELDS, ACCESS_LOGGER, RequestIdFilter

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
FORMATS = ("text", "json")
DEFAULT_LEVEL = "INFO"
DEFAULT_FORMAT = "text"
LEVEL_ENV = "TILETUNE_LOG_LEVEL"
FORMAT_ENV = "TILETUNE_LOG_FORMAT"

#: The text format's line before the request id (the look these processes always had).
TEXT_LINE = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: The loggers of uvicorn, sent to the root logger's handler instead of their own.
UVICORN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.asgi", "uvicorn.access")
#: Loggers whose INFO lines are noise here (httpx's calls; Alembic's plugins at each migration).
QUIET_LOGGERS = ("httpx", "alembic.runtime.plugins")
#: A bearer credential as it would appear in a message: the scheme, then a secret's characters.
_BEARER = re.compile(r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=-]{16,}")


class LogSettingError(ValueError):
    """A log level or format that is not one of the choices; ``field`` names the setting."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


def log_level(given: str | None = None) -> int:
    """The level ``given`` names, else ``$TILETUNE_LOG_LEVEL``'s, else INFO (see the module docstring)."""
    name, source = _setting(given, LEVEL_ENV, DEFAULT_LEVEL, "--log-level")
    if name.upper() not in LEVELS:
        raise LogSettingError("log_level", f"{name!r} is not one of {', '.join(LEVELS)} (from {source})")
    return int(logging.getLevelName(name.upper()))


def log_format(given: str | None = None) -> str:
    """The format ``given`` names, else ``$TILETUNE_LOG_FORMAT``'s, else text."""
    name, source = _setting(given, FORMAT_ENV, DEFAULT_FORMAT, "--log-format")
    if name.lower() not in FORMATS:
        raise LogSettingError("log_format", f"{name!r} is not one of {', '.join(FORMATS)} (from {source})")
    return name.lower()


def _setting(given: str | None, env: str, default: str, option: str) -> tuple[str, str]:
    """The value of a setting and where it came from: the option, the environment, the default."""
    if given is not None:
        return given.strip(), option
    from_env = os.environ.get(env, "").strip()
    if from_env:
        return from_env, f"${env}"
    return default, "the default"


class _Handler(logging.StreamHandler[TextIO]):
    """The handler :func:`configure_logging` installs (so that it replaces only its own)."""


def add_log_options(parser: argparse.ArgumentParser) -> None:
    """``--log-level`` and ``--log-format`` (their defaults: the environment's, see the module docstring)."""
    parser.add_argument(
        "--log-level",
        metavar="LEVEL",
        help=f"least severe log lines shown: {', '.join(LEVELS)} "
        f"(default: ${LEVEL_ENV}, else {DEFAULT_LEVEL})",
    )
    parser.add_argument(
        "--log-format",
        metavar="FORMAT",
        help=f"log lines as text or json, one object a line (default: ${FORMAT_ENV}, else {DEFAULT_FORMAT})",
    )


def configure_logging(level: str | None = None, fmt: str | None = None, stream: TextIO | None = None) -> None:
    """Log at ``level`` in ``fmt`` (each else from the environment) to ``stream`` (default stderr).

    :class:`LogSettingError` for a bad level or format, before anything is changed.
    """
    resolved_level, resolved_format = log_level(level), log_format(fmt)
    handler = _Handler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if resolved_format == "json" else TextFormatter(TEXT_LINE))
    handler.addFilter(RequestIdFilter())
    root = logging.getLogger()
    for old in [each for each in root.handlers if isinstance(each, _Handler)]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(resolved_level)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(max(resolved_level, logging.WARNING))
    for name in UVICORN_LOGGERS:
        uvicorn_logger = logging.getLogger(name)
        uvicorn_logger.handlers.clear()
        uvicorn_logger.setLevel(logging.NOTSET)
        uvicorn_logger.propagate = name != "uvicorn.access"  # ours is tiletune.access
    logging.getLogger(ACCESS_LOGGER).propagate = True


def logging_configured() -> bool:
    """Whether :func:`configure_logging` ran in this process."""
    return any(isinstance(each, _Handler) for each in logging.getLogger().handlers)


def redacted(message: str) -> str:
    """``message`` with any bearer credential replaced by ``[redacted]``."""
    return _BEARER.sub(r"\1[redacted]", message) if "earer" in message else message


class TextFormatter(logging.Formatter):
    """The text format: :data:`TEXT_LINE`, then `` request_id=ID`` when the record has one."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        line = redacted(super().formatMessage(record))
        request_id = getattr(record, "request_id", None)
        return f"{line} request_id={request_id}" if request_id else line


class JsonFormatter(logging.Formatter):
    """The JSON format: one object per record (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")[:-6] + "Z",
            "level": record.levelname,
            "logger": record.name,
            "message": redacted(record.getMessage()),
        }
        request_id = getattr(record, "request_id", None)
        if request_id:
            document["request_id"] = request_id
        for field in ACCESS_FIELDS:
            if field in record.__dict__:
                document[field] = record.__dict__[field]
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            document["exception"] = record.exc_text
        if record.stack_info:
            document["stack"] = self.formatStack(record.stack_info)
        return json.dumps(document, ensure_ascii=False, default=str)
