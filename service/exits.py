"""The ``tiletune`` command's exit statuses, and the exception every command raises for status 1.

Shared by the command modules (:mod:`tiletune.service.remote`, :mod:`tiletune.service.serve`)
and the entry point (:mod:`tiletune.service.cli`, which maps exceptions to statuses); it
imports nothing of theirs, so none of them has to import another for these.

- ``0``: success;
- :data:`EXIT_FAILURE` (1): the work could not be done (:class:`CommandFailedError`, an
  unreachable or failing server, a failed job);
- :data:`EXIT_BAD_INPUT` (2): bad input, here or as the server judged it;
- :data:`EXIT_INTERRUPTED` (130): stopped by Ctrl-C before the work was done.
"""

from __future__ import annotations

from tiletune.tuner.cli import EXIT_BAD_INPUT, EXIT_FAILURE

__all__ = ["EXIT_BAD_INPUT", "EXIT_FAILURE", "EXIT_INTERRUPTED", "CommandFailedError"]

EXIT_INTERRUPTED = 130


class CommandFailedError(Exception):
    """The command could not do its work for a reason other than bad input (exit 1)."""
