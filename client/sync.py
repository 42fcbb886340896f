"""``ConfigClient``: the tiling for a kernel launch, from a tiletune server, never failing the caller.

::

    tiling = ConfigClient("http://tuner:8642")            # chip="auto": this node's chip
    tiling.prefetch()                                      # optional: one bulk request, then no HTTP
    cfg = tiling.get("fused_attention", shape, "float16")  # cfg.config, cfg.match, cfg.best

``get`` never raises and is a dict lookup once a key has been answered
(:mod:`tiletune.client.core` has the rules). Misses, and the answers served
without the server, are reported by a background thread; ``close()`` (or a ``with`` block)
reports the last ones. A client never closed reports them at interpreter exit: one ``atexit``
hook for every live client (held weakly), within :data:`EXIT_REPORT_S` in all, never raising
(:func:`register_exit_report`).
Every request goes through :class:`~tiletune.client.api.ServiceApi`.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import Protocol, TypeVar

import httpx

from tiletune.client.answers import STATS_REPORT_ATTEMPTS, stats_call
from tiletune.client.api import ServiceApi
from tiletune.client.calls import ApiError, Call
from tiletune.client.core import ClientCore, ClientSettings, MemoKey
from tiletune.client.disk import read_bundle, write_bundle
from tiletune.client.keys import key_problem, kind_of
from tiletune.client.misses import MISS_REPORT_ATTEMPTS, MISS_REPORT_TIMEOUT_S, misses_call
from tiletune.client.tiling import Tiling
from tiletune.client.wire import LookupPublic

log = logging.getLogger("tiletune.client")

R = TypeVar("R")

#: Seconds the reports at interpreter exit may take in all, every live client's together.
EXIT_REPORT_S = MISS_REPORT_TIMEOUT_S


class ExitReporter(Protocol):
    """A client that reports its pending misses and stats at exit (:func:`register_exit_report`)."""

    url: str | None

    def report_at_exit(self, until: float) -> bool:
        """Send the pending misses and stats once, by ``time.monotonic()`` ``until``; whether all went."""
        ...


#: The live clients to report at exit (weakly held: a client is still garbage collected).
_at_exit: weakref.WeakSet[ExitReporter] = weakref.WeakSet()


def register_exit_report(client: ExitReporter) -> None:
    """Have ``client`` report its pending misses and stats at interpreter exit (held weakly). A
    forked child forgets its parent's clients: what they counted is the parent's to send."""
    _at_exit.add(client)


def unregister_exit_report(client: ExitReporter) -> None:
    """Report nothing of ``client`` at exit (it was closed: its last reports are sent)."""
    _at_exit.discard(client)


def _report_all_at_exit() -> None:
    """The ``atexit`` hook: each live client reports once, all within :data:`EXIT_REPORT_S` (each
    request cut to the time left: a server down or silent never holds the exit). Never raises;
    what was not reported is logged at INFO."""
    until = time.monotonic() + EXIT_REPORT_S
    for client in list(_at_exit):
        try:
            if time.monotonic() < until and client.report_at_exit(until):
                continue
            log.info(
                "tiletune client: the last misses and stats for %s were not reported at exit", client.url
            )
        except Exception as error:  # the exit goes on whatever happens
            log.info("tiletune client: the reports at exit to %s failed: %s", client.url, error)


atexit.register(_report_all_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_at_exit.clear)


def _within(call: Call[R], until: float | None) -> Call[R]:
    """``call`` with its deadline cut to end by ``until`` (``time.monotonic()``; ``None``: as it is)."""
    if until is None:
        return call
    left_s = max(until - time.monotonic(), 0.001)
    return replace(call, timeout_s=min(call.timeout_s, left_s) if call.timeout_s is not None else left_s)


def send_misses(core: ClientCore, api: ServiceApi | None, until: float | None = None) -> bool:
    """Report ``core``'s misses counted so far through ``api`` (none: they are dropped), by ``until``
    (``time.monotonic()``; ``None``: each report within the settings' bound); ``False`` when that
    failed (kept for later, see :meth:`MissLedger.failed <tiletune.client.misses.MissLedger.failed>`)
    or the time ran out first. Never raises."""
    for _ in range(MISS_REPORT_ATTEMPTS):
        if until is not None and time.monotonic() >= until:
            return False
        misses = core.misses.take()
        if misses is None or api is None:
            return misses is None
        try:
            api.send(_within(core.report_call(misses_call(misses)), until))
        except Exception as error:  # no answer, a refusal, an answer that is not the API's, ...
            if not core.misses.failed(misses, error):
                return False
            continue  # the server refused one key: the others at once
        return True
    return False


def send_stats(core: ClientCore, api: ServiceApi | None, until: float | None = None) -> bool:
    """Report the answers ``core`` served without the server since the last report through ``api``
    (none: nothing is sent), by ``until`` as :func:`send_misses`; ``False`` when that failed (see
    :meth:`AnswerTally.failed <tiletune.client.answers.AnswerTally.failed>`) or the time ran out.
    Never raises."""
    for _ in range(STATS_REPORT_ATTEMPTS):
        if until is not None and time.monotonic() >= until:
            return False
        stats = core.answers.take() if api is not None else None
        if stats is None or api is None:
            return True
        try:
            api.send(_within(core.report_call(stats_call(stats)), until))
        except Exception as error:  # no answer, a refusal, an answer that is not the API's, ...
            if core.answers.failed(stats, error):
                continue
            return False
        return True
    return False


class ConfigClient:
    """Configs from the server at ``url`` (``None``: caches and defaults only) for ``chip``.

    ``transport`` is httpx's seam (tests pass the app's ASGI/WSGI transport).
    """

    def __init__(
        self,
        url: str | None,
        chip: str = "auto",
        *,
        token: str | None = None,
        settings: ClientSettings | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.core = ClientCore(chip, settings or ClientSettings())
        self.url = url
        self._memo = self.core.memo  # the launch path's, bound once (the core never rebinds it)
        self._api = (
            ServiceApi(url, token, transport=transport, timeout_s=self.core.settings.timeout_s)
            if url
            else None
        )
        self._stop = threading.Event()
        self._reporter: threading.Thread | None = None
        self._refresher: threading.Thread | None = None
        if self._api is not None:
            register_exit_report(self)

    @property
    def chip(self) -> str:
        """The chip configs are asked for."""
        return self.core.chip

    # -- the launch path -----------------------------------------------------------------------

    def get(self, kernel: str, shape: Mapping[str, int], dtype: str = "float32") -> Tiling:
        """The config for ``kernel`` at ``shape`` and ``dtype`` on this chip.

        Never raises, whatever it is given: a key the client cannot take (``None``, a
        list, unhashable or non-int dims, an unknown kernel, ...) is answered with the
        default (the settings' default rule, else ``{}``), logged once per kind of problem.
        A known key costs one dict lookup and one count (of the answers served, for the stats reports).
        """
        try:  # a subscript, not .get(): no call on the hit path but the count's
            found, launched = self._memo[(kernel, dtype, tuple(shape.items()))]
            next(launched)  # the answer's launches, for the stats reports: one C call
            return found
        except KeyError:  # not answered yet
            pass
        except Exception as error:  # an unhashable or unreadable key: the launch goes on
            return self.core.bad_input(kernel, shape, dtype, error)
        try:
            return self._decide(kernel, shape, dtype)
        except Exception as error:
            return self.core.bad_input(kernel, shape, dtype, error)

    def _decide(self, kernel: str, shape: Mapping[str, int], dtype: str) -> Tiling:
        core = self.core
        problem = key_problem(kernel, shape, dtype)
        if problem is not None:
            return core.bad_input(kernel, shape, dtype, problem)
        key: MemoKey = (kernel, dtype, tuple(shape.items()))
        try:
            tiling, final = self._resolve(kernel, shape, dtype)
        except Exception as error:  # the caller's launch must go on
            core.warn_once(
                ("decide", kernel, kind_of(error)),
                "tiletune client: falling back to the default for %s: %s",
                kernel,
                error,
            )
            tiling, final = core.default(kernel, shape, dtype), False
        core.misses.note(tiling.match, kernel, shape, dtype)
        self._start_reporter()
        return core.remember(key, tiling, final)

    def _resolve(self, kernel: str, shape: Mapping[str, int], dtype: str) -> tuple[Tiling, bool]:
        core = self.core
        known = core.exact_known(kernel, shape, dtype)
        if known is not None:
            return known, True
        if self._api is not None and core.server_usable():
            answer = self._ask_server(kernel, shape, dtype)
            if isinstance(answer, LookupPublic):
                tiling = core.from_server(answer, kernel, shape)
                if tiling is not None:
                    return tiling, tiling.match == "exact"
        core.load_disk()
        local = core.from_known(kernel, shape, dtype, "disk")
        tiling = local if local is not None else core.default(kernel, shape, dtype)
        return tiling, tiling.match == "exact" or core.prefetched or self._api is None

    def _ask_server(self, kernel: str, shape: Mapping[str, int], dtype: str) -> LookupPublic | bool | None:
        """The server's lookup; ``None`` when it has nothing; ``False`` when it could not be asked."""
        assert self._api is not None
        try:
            answer = self._api.send(self.core.lookup_call(kernel, shape, dtype))
        except ApiError as error:
            return False if self.core.lookup_failed(error, kernel, shape, dtype) else None
        self.core.server_up()
        return answer

    # -- bulk ----------------------------------------------------------------------------------

    def prefetch(self, kernel: str | None = None) -> int:
        """Fill the cache with every config of this chip (or one kernel) in one request.

        Afterwards launches make no HTTP call. Returns how many configs arrived. Never
        raises: 0 (logged, the server backed off as for a 5xx) when the server cannot be
        reached or answers something that is not a bundle (an HTML page, another schema,
        garbage); the disk cache serves then. The request carries ``If-None-Match`` with the
        ETag of the bundle last taken of the same scope: a ``304 Not Modified`` keeps it and
        returns 0. With ``settings.refresh_s``, a background thread prefetches again that often.
        """
        core = self.core
        if self._api is None:
            core.load_disk()
            return 0
        try:
            answer = self._api.send(core.bulk_call(kernel))
            count = core.take_answer(answer, kernel)
        except Exception as error:  # no answer, an error status, a body that is not a bundle, ...
            core.prefetch_failed(error)
            self._start_refresher()
            return 0
        if answer.bundle is not None and core.disk is not None:
            core.disk.save(answer.bundle)
        self._start_refresher()
        return count

    def export_bundle(self, path: Path) -> int:
        """Write every config known here to ``path`` (for air-gapped clusters); how many."""
        self.core.load_disk()
        bundle = self.core.known.bundle()
        write_bundle(path, bundle)
        return len(bundle.configs)

    def import_bundle(self, path: Path) -> int:
        """Take the configs of a bundle file (and keep them in the disk cache); how many were new."""
        bundle = read_bundle(path)
        changed = self.core.take_bundle(bundle)
        if self.core.disk is not None:
            self.core.disk.save(bundle)
        return changed

    def pin(self) -> None:
        """Answer from what is known now (prefetched, imported) for the rest of the run: no lookup
        and no refresh asks the server again, so every process pinned to one snapshot launches the
        same tilings; keys it lacks get the nearest known shape or the default, and are still
        reported as misses for tuning. (A prefetch pins too, until the next prefetch or refresh.)"""
        with self.core.lock:
            self.core.prefetched = True
            self.core.forget_answers()

    # -- misses and refresh, off the launch path -----------------------------------------------

    def flush_misses(self) -> bool:
        """Report the misses counted so far in one request; ``False`` when that failed (kept for
        later, see :meth:`MissLedger.failed <tiletune.client.misses.MissLedger.failed>`). Never raises."""
        return send_misses(self.core, self._api)

    def flush_stats(self) -> bool:
        """Report the answers served without the server since the last report, in one request
        (none when there are none, or reporting is off); ``False`` when that failed (see
        :meth:`AnswerTally.failed <tiletune.client.answers.AnswerTally.failed>`; a server that
        refuses the per-key counts gets the answers again at once, without them). Never raises."""
        return send_stats(self.core, self._api)

    def report_at_exit(self, until: float) -> bool:
        """At interpreter exit (:func:`register_exit_report`): stop the background threads, let a report
        under way end, then send the pending misses and stats, all by ``until``
        (``time.monotonic()``); whether everything went. Never raises."""
        self._stop.set()
        if self._reporter is not None:
            self._reporter.join(timeout=max(until - time.monotonic(), 0.0))
        misses = send_misses(self.core, self._api, until)
        return send_stats(self.core, self._api, until) and misses

    def _start_reporter(self) -> None:
        if self._reporter is None and self._api is not None and not self._stop.is_set():
            self._reporter = self._thread(self._report_loop, "tiletune-misses")

    def _report_loop(self) -> None:
        """Every ``miss_flush_s``: drop the due provisional answers, report the misses and the
        answers served. Survives any exception (logged once per kind)."""
        while not self._stop.wait(self.core.settings.miss_flush_s):
            try:
                self.core.expire()
                self.flush_misses()
                self.flush_stats()
            except Exception as error:
                self.core.warn_once(("reporter", kind_of(error)), "tiletune client: miss reporter: %s", error)

    def _start_refresher(self) -> None:
        if self._refresher is None and self.core.settings.refresh_s and not self._stop.is_set():
            self._refresher = self._thread(self._refresh_loop, "tiletune-refresh")

    def _refresh_loop(self) -> None:
        """Every ``refresh_s``: prefetch every scope prefetched again. Survives any exception."""
        refresh_s = self.core.settings.refresh_s
        assert refresh_s is not None
        while not self._stop.wait(refresh_s):
            for scope in self.core.refresh_scopes():
                try:
                    self.prefetch(scope)
                except Exception as error:
                    self.core.warn_once(("refresher", kind_of(error)), "tiletune client: refresh: %s", error)

    def _thread(self, target: Callable[[], None], name: str) -> threading.Thread | None:
        """A started daemon thread, or ``None`` (logged once) when none can be started now."""
        thread = threading.Thread(target=target, name=name, daemon=True)
        try:
            thread.start()
        except RuntimeError as error:  # no more threads: launches go on; it is tried again later
            self.core.warn_once(("thread", name), "tiletune client: cannot start %s: %s", name, error)
            return None
        return thread

    def close(self) -> None:
        """Stop the background threads, report the last misses and answers, close the connection
        (nothing more is reported at exit)."""
        unregister_exit_report(self)
        self._stop.set()
        for thread in (self._reporter, self._refresher):
            if thread is not None:
                thread.join(timeout=10)
        self.flush_misses()
        self.flush_stats()
        if self._api is not None:
            self._api.close()

    def __enter__(self) -> ConfigClient:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()
