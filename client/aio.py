"""``AsyncConfigClient``: :class:`~tiletune.client.sync.ConfigClient` for asyncio code, same method names.

``await client.get(...)`` answers from memory without touching the event
loop's I/O once a key is known; misses and the answers served without the server are
reported by a background task of the running loop; ``await client.close()`` reports the last ones. The rules
are the sync client's (:mod:`tiletune.client.core`).

A client never closed reports its last misses and answers at interpreter exit, as the sync one does
(:func:`~tiletune.client.sync.register_exit_report`), but over a new sync connection to its server
with its token: its event loop, and the connections it holds, are most likely gone by then. A client
given its own ``transport`` reports nothing at exit (that transport is the caller's, maybe an app's
in process).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

import httpx

from tiletune.client.answers import STATS_REPORT_ATTEMPTS, stats_call
from tiletune.client.api import AsyncServiceApi, ServiceApi
from tiletune.client.calls import ApiError
from tiletune.client.core import ClientCore, ClientSettings, MemoKey
from tiletune.client.disk import read_bundle, write_bundle
from tiletune.client.keys import key_problem, kind_of
from tiletune.client.misses import MISS_REPORT_ATTEMPTS, misses_call
from tiletune.client.sync import register_exit_report, send_misses, send_stats, unregister_exit_report
from tiletune.client.tiling import Tiling
from tiletune.client.wire import LookupPublic

log = logging.getLogger("tiletune.client")


class AsyncConfigClient:
    """Configs from the server at ``url`` (``None``: caches and defaults only) for ``chip``."""

    def __init__(
        self,
        url: str | None,
        chip: str = "auto",
        *,
        token: str | None = None,
        settings: ClientSettings | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.core = ClientCore(chip, settings or ClientSettings())
        self.url = url
        self._memo = self.core.memo  # the launch path's, bound once (the core never rebinds it)
        self._api = (
            AsyncServiceApi(url, token, transport=transport, timeout_s=self.core.settings.timeout_s)
            if url
            else None
        )
        self._tasks: list[asyncio.Task[None]] = []
        self._reporting = False
        self._closed = False
        self._token = token
        if self._api is not None and transport is None:
            register_exit_report(self)

    @property
    def chip(self) -> str:
        """The chip configs are asked for."""
        return self.core.chip

    async def get(self, kernel: str, shape: Mapping[str, int], dtype: str = "float32") -> Tiling:
        """The config for ``kernel`` at ``shape`` and ``dtype`` on this chip.

        Never raises, whatever it is given (as the sync client's ``get``); a known key costs
        one dict lookup and one count.
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
            return await self._decide(kernel, shape, dtype)
        except Exception as error:
            return self.core.bad_input(kernel, shape, dtype, error)

    async def _decide(self, kernel: str, shape: Mapping[str, int], dtype: str) -> Tiling:
        core = self.core
        problem = key_problem(kernel, shape, dtype)
        if problem is not None:
            return core.bad_input(kernel, shape, dtype, problem)
        key: MemoKey = (kernel, dtype, tuple(shape.items()))
        try:
            tiling, final = await self._resolve(kernel, shape, dtype)
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

    async def _resolve(self, kernel: str, shape: Mapping[str, int], dtype: str) -> tuple[Tiling, bool]:
        core = self.core
        known = core.exact_known(kernel, shape, dtype)
        if known is not None:
            return known, True
        if self._api is not None and core.server_usable():
            answer = await self._ask_server(kernel, shape, dtype)
            if answer is not None:
                tiling = core.from_server(answer, kernel, shape)
                if tiling is not None:
                    return tiling, tiling.match == "exact"
        core.load_disk()
        local = core.from_known(kernel, shape, dtype, "disk")
        tiling = local if local is not None else core.default(kernel, shape, dtype)
        return tiling, tiling.match == "exact" or core.prefetched or self._api is None

    async def _ask_server(self, kernel: str, shape: Mapping[str, int], dtype: str) -> LookupPublic | None:
        assert self._api is not None
        try:
            answer = await self._api.send(self.core.lookup_call(kernel, shape, dtype))
        except ApiError as error:
            self.core.lookup_failed(error, kernel, shape, dtype)
            return None
        self.core.server_up()
        return answer

    async def prefetch(self, kernel: str | None = None) -> int:
        """Fill the cache with every config of this chip (or one kernel) in one request.

        As the sync client's: how many configs arrived; never raises (0, logged, the server
        backed off, for an answer that is not a bundle); conditional on the ETag held (a
        ``304`` keeps the bundle and returns 0); with ``refresh_s``, a task refreshes.
        """
        core = self.core
        if self._api is None:
            core.load_disk()
            return 0
        try:
            answer = await self._api.send(core.bulk_call(kernel))
            count = core.take_answer(answer, kernel)
        except Exception as error:  # no answer, an error status, a body that is not a bundle, ...
            core.prefetch_failed(error)
            self._start_refresher()
            return 0
        if answer.bundle is not None and core.disk is not None:
            await asyncio.to_thread(core.disk.save, answer.bundle)
        self._start_refresher()
        return count

    async def export_bundle(self, path: Path) -> int:
        """Write every config known here to ``path``; how many."""
        self.core.load_disk()
        bundle = self.core.known.bundle()
        await asyncio.to_thread(write_bundle, path, bundle)
        return len(bundle.configs)

    async def import_bundle(self, path: Path) -> int:
        """Take the configs of a bundle file (and keep them in the disk cache); how many were new."""
        bundle = await asyncio.to_thread(read_bundle, path)
        changed = self.core.take_bundle(bundle)
        if self.core.disk is not None:
            await asyncio.to_thread(self.core.disk.save, bundle)
        return changed

    async def flush_misses(self) -> bool:
        """Report the misses counted so far in one request; ``False`` when that failed (kept for
        later). Never raises."""
        for _ in range(MISS_REPORT_ATTEMPTS):
            misses = self.core.misses.take()
            if misses is None or self._api is None:
                return misses is None
            try:
                await self._api.send(self.core.report_call(misses_call(misses)))
            except Exception as error:  # no answer, a refusal, an answer that is not the API's, ...
                if not self.core.misses.failed(misses, error):
                    return False
                continue  # the server refused one key: the others at once
            return True
        return False

    async def flush_stats(self) -> bool:
        """Report the answers served without the server since the last report, in one request
        (none when there are none, or reporting is off); ``False`` when that failed (a server that
        refuses the per-key counts gets the answers again at once, without them). Never raises."""
        for _ in range(STATS_REPORT_ATTEMPTS):
            stats = self.core.answers.take() if self._api is not None else None
            if stats is None or self._api is None:
                return True
            try:
                await self._api.send(self.core.report_call(stats_call(stats)))
            except Exception as error:  # no answer, a refusal, an answer that is not the API's, ...
                if self.core.answers.failed(stats, error):
                    continue
                return False
            return True
        return False

    def _start_reporter(self) -> None:
        if self._reporting or self._api is None or self._closed:
            return
        self._reporting = True
        self._tasks.append(
            asyncio.get_running_loop().create_task(self._every(self.core.settings.miss_flush_s))
        )

    def _start_refresher(self) -> None:
        refresh_s = self.core.settings.refresh_s
        if refresh_s and not self._closed and not any(t.get_name() == "refresh" for t in self._tasks):
            self._tasks.append(
                asyncio.get_running_loop().create_task(self._every(refresh_s, True), name="refresh")
            )

    async def _every(self, period_s: float, refresh: bool = False) -> None:
        """Every ``period_s``: refresh every scope prefetched, or report the misses and answers. Survives any
        exception (logged once per kind); ends when cancelled."""
        while True:
            await asyncio.sleep(period_s)
            try:
                if refresh:
                    for scope in self.core.refresh_scopes():
                        await self.prefetch(scope)
                else:
                    self.core.expire()
                    await self.flush_misses()
                    await self.flush_stats()
            except Exception as error:
                name = "refresher" if refresh else "reporter"
                self.core.warn_once((name, kind_of(error)), "tiletune client: %s: %s", name, error)

    def report_at_exit(self, until: float) -> bool:
        """At interpreter exit (see the module docstring): the pending misses and answers over a new
        sync connection, by ``until`` (``time.monotonic()``); whether everything went. The reports never
        raise; the exit hook logs anything else that does."""
        if self._closed or self.url is None:
            return True
        with ServiceApi(self.url, self._token, timeout_s=self.core.settings.report_timeout_s) as api:
            misses = send_misses(self.core, api, until)
            return send_stats(self.core, api, until) and misses

    async def close(self) -> None:
        """Stop the background tasks, report the last misses and answers, close the connection
        (nothing more is reported at exit)."""
        unregister_exit_report(self)
        self._closed = True
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.flush_misses()
        await self.flush_stats()
        if self._api is not None:
            await self._api.close()

    async def __aenter__(self) -> AsyncConfigClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        await self.close()
