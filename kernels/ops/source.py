"""Where the operators' configs come from: one process-wide source, or none (untuned calls).

An operator call with no measured answer runs torch's op, or the kernel's rule where that measured
faster (:func:`tiletune.kernels.vendor.untuned_runs_vendor`); "the kernels' rules" below are what a
source answers for such keys, and what ``launch``'s callers that run their own tiles get.

- With nothing configured, the first operator call reads ``$TILETUNE_URL`` (and ``$TILETUNE_TOKEN``,
  ``$TILETUNE_CHIP``); without it, an operator runs the kernel's default rule (its hand-written
  tiling): no server, no network call, never an error. Importing makes no call either.
- :func:`configure` sets the process's source: a ``ConfigClient`` for a server's URL (with its
  token, chip and the kernels' rules as its defaults), or any object with the launcher's
  ``get(kernel, shape, dtype=...)`` (a pinned bundle, a test's stand-in). ``configure()``
  with no argument reads ``$TILETUNE_URL`` / ``$TILETUNE_TOKEN``, and goes back to the rules
  when the URL is unset.
- ``TILETUNE_PIN`` (or ``configure(pin=...)``) pins a run to one snapshot of configs: ``server``
  (the server's, fetched once at start) or a bundle file; every rank launches the same tilings.
- ``TILETUNE_TUNE=1`` (or ``configure(tune=True)``) tunes each key the run meets on this machine,
  with no server, into a bundle file that later runs pin to
  (:mod:`tiletune.tuner.measure.tuning_source`); it takes precedence over a URL and a pin.
- :func:`using_source` overrides the source for the calls inside a ``with`` block of this thread
  or task (``launch(..., client=...)`` runs the operator under it).

The source is read when an operator *runs*, never when a graph is traced, so a compiled model
looks up the key of every shape it meets.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from tiletune.kernels.launcher import ConfigSource

#: The environment a bare :func:`configure` reads.
URL_ENV = "TILETUNE_URL"
TOKEN_ENV = "TILETUNE_TOKEN"
CHIP_ENV = "TILETUNE_CHIP"
PIN_ENV = "TILETUNE_PIN"
TUNE_ENV = "TILETUNE_TUNE"
#: ``TILETUNE_PIN`` 's value for "the server's configs as of now".
PIN_SERVER = "server"

logger = logging.getLogger(__name__)

_lock = threading.Lock()


@dataclass
class _ProcessSource:
    """The process's source, as :func:`configure` last set it; ``configured`` once it was (the first
    operator call configures from the environment when nobody did)."""

    source: ConfigSource | None = None
    configured: bool = False


_process = _ProcessSource()
_scoped: contextvars.ContextVar[ConfigSource | None] = contextvars.ContextVar("tiletune_source", default=None)


def configure(
    source: ConfigSource | None = None,
    *,
    url: str | None = None,
    token: str | None = None,
    chip: str = "auto",
    pin: str | None = None,
    tune: bool | None = None,
) -> ConfigSource | None:
    """Set the process's config source and return it (``None``: the kernels' rules).

    ``source`` is used as given. Else a ``ConfigClient`` is made for ``url`` (default
    ``$TILETUNE_URL``) with ``token`` (default ``$TILETUNE_TOKEN``) and ``chip`` (default
    ``$TILETUNE_CHIP``, else ``auto``: this machine's), whose defaults are the kernels' rules;
    with no URL at all the operators run the rules. Making a client calls no server: it asks on a
    key's first call and answers from its cache after, falling back to the rules.

    ``pin`` (default ``$TILETUNE_PIN``) pins the whole run to one snapshot, so that every rank of a
    job launches the same tilings: ``"server"`` fetches the server's configs for the chip once, now;
    a path imports a bundle file (``tiletune`` exports one: ``GET /v1/configs``). Either is logged
    once (configs, ETag or checksum); no lookup asks the server afterwards, and keys the snapshot
    lacks are still reported as misses.

    ``tune`` (default ``$TILETUNE_TUNE``, unless ``url`` or ``pin`` is given) tunes each key the run
    meets here, with no server, into ``$TILETUNE_TUNE_FILE`` (default ``tiletune_configs.json``),
    answering the keys the file holds from it (:mod:`tiletune.tuner.measure.tuning_source`). A bad
    ``TILETUNE_TUNE*`` value raises ``ValueError`` naming the variable.
    """
    if source is None and _tuning_asked(tune, explicit=url is not None or pin is not None):
        source = _tuning_source()
    elif source is None:
        url = url or os.environ.get(URL_ENV) or None
        pin = pin or os.environ.get(PIN_ENV) or None
        if url is not None or pin is not None:
            token = token or os.environ.get(TOKEN_ENV) or None
            source = _client(url, token, os.environ.get(CHIP_ENV, chip), pin)
    with _lock:
        _process.source = source
        _process.configured = True
    return source


def _tuning_asked(tune: bool | None, *, explicit: bool) -> bool:
    """Whether the one switch is on: ``tune`` when given; else ``$TILETUNE_TUNE``, unless the caller
    named a URL or a pin (``explicit``: an argument beats the environment)."""
    if tune is not None:
        return tune
    if explicit or not os.environ.get(TUNE_ENV):
        return False  # unset: nothing imported
    from tiletune.tuner.measure.tuning_source import switch_is_on

    return switch_is_on()


def _tuning_source() -> ConfigSource:
    """The source that tunes each key it meets (the settings ``$TILETUNE_TUNE_*`` give)."""
    from tiletune.tuner.measure.tuning_source import source_from_env

    return source_from_env()


def _client(url: str | None, token: str | None, chip: str, pin: str | None) -> ConfigSource:
    """A ``ConfigClient`` of ``url`` whose defaults are the kernels' rules, pinned to ``pin``'s
    snapshot when given (with no disk cache: what other runs cached must not differ by rank)."""
    from pathlib import Path

    from tiletune.client import ConfigClient
    from tiletune.kernels.defaults import client_settings

    if pin is None:
        return ConfigClient(url, chip=chip, token=token, settings=client_settings())
    client = ConfigClient(url, chip=chip, token=token, settings=client_settings(cache_dir=None))
    if pin == PIN_SERVER:
        count = client.prefetch()
        etags = ", ".join(f"{scope or 'chip'}={etag}" for scope, etag in client.core.etags.items()) or "none"
        logger.info(
            "tiletune: pinned to the server's %d configs of %s as of now (ETag %s)", count, chip, etags
        )
    else:
        count = client.import_bundle(Path(pin))
        logger.info("tiletune: pinned to the %d configs of bundle %s", count, pin)
    client.pin()
    return client


def current_source() -> ConfigSource | None:
    """The source an operator call asks now: the innermost :func:`using_source`, else the process's
    (:func:`configure`); ``None`` means the kernels' rules."""
    scoped = _scoped.get()
    if scoped is not None:
        return scoped
    if not _process.configured:
        configure()  # from the environment; no URL there: the rules
    return _process.source


@contextlib.contextmanager
def using_source(source: ConfigSource | None) -> Iterator[None]:
    """Calls inside the block (this thread or task) ask ``source`` (``None``: no override)."""
    token = _scoped.set(source)
    try:
        yield
    finally:
        _scoped.reset(token)
