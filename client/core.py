"""What the sync and async clients share: the decisions, the caches, the fallbacks, the back-off.

No network I/O here (the clients do it); the rules:

- An answer (:class:`~tiletune.client.tiling.Tiling`) is remembered in memory by (kernel, dtype,
  shape items). Exact answers, and every answer after a prefetch (the
  prefetch decides; a refresh replaces it), are kept until the next
  prefetch or import. Nearest and default answers otherwise are kept for
  ``recheck_s`` (the key may get tuned: demand-driven tuning) and at least
  until the server's back-off ends, then decided again: they sit in the same
  memory (a launch pays nothing more for them) and the client's background
  thread drops them when due (:meth:`ClientCore.expire`).
- Order of a decision: what is known in memory (exact) → the server (unless
  prefetched or backing off) → what is known from the disk cache (exact, then
  nearest) → nearest among everything known → the kernel's default.
- An entry tuned with another kernel version is never used; one tuned with
  other software is used and marked ``stale`` with the differences.
- Nearest and default answers are counted as misses, reported later in
  batches by the client, off the launch path. A key the server refused in a
  report (422 naming it) is dropped from the batch and never counted again.
- Every answer a launch gets without a server lookup (from memory, the disk cache, the
  default; a bad key's default too) is counted by match and by key (:mod:`tiletune.client.answers`:
  each remembered answer has its own counter beside it in the memo, one C call on the launch
  path) and reported with the misses, off the launch path (``POST /v1/client-stats``: the
  answers by match and the most launched keys; never again to a server without that route).
- The server is backed off after a failure (no answer, no complete answer within the
  request's bound, 5xx, an answer that is not the API's: an HTML page, another schema, a
  body that does not decode or is larger than its cap): ``backoff_s``, doubling up to
  ``max_backoff_s``; one success resets it. Every request is bounded in time (in all, not
  per read) and in the bytes of its answer (:class:`ClientSettings`), so a launch waits at
  most ``timeout_s`` for a new key whatever the server does.
- Nothing is served unchecked (:mod:`tiletune.client.knobs`): an entry of a bundle, of
  the disk cache or of a lookup is taken only if its config passes the check against the
  kernel's knobs (the bundle's :class:`~tiletune.client.wire.KernelInfo`; the lookup's
  ``knob_values`` when the server sends them); a refused one is logged once per key and
  the key is decided without it (ending at the default). A nearest entry's config is
  adapted to the asked shape (each knob snapped down to the values it allows).
- A launch never raises: a key that is not one (:func:`tiletune.client.keys.key_problem`:
  ``None``, a list, unhashable or non-int dims, ...) is answered with the default, logged
  once per kind of problem, and neither asked about nor counted as a miss; the background
  thread and tasks survive any exception (logged once per kind).
- The bulk export is conditional: ``If-None-Match`` with the ETag of the bundle held from
  the last export of the same scope; a ``304 Not Modified`` keeps it (nothing new counted).
- The default config and the kernel version this process runs come from the callables in
  :class:`ClientSettings` (``tiletune.kernels.client_settings()`` hands over the installed
  kernels'); without them the default is ``{}`` (the launcher then applies the kernel's own
  rule) and the version is the server's.

The requests are built here as :class:`~tiletune.client.calls.Call` values; the clients
send them through :mod:`tiletune.client.api`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar

from tiletune.client import calls
from tiletune.client.answers import AnswerKey, AnswerTally
from tiletune.client.calls import ApiError, BundleAnswer, Call, ServerRefusedError
from tiletune.client.chip import detect_chip, software_fingerprint
from tiletune.client.disk import DiskCache, default_cache_dir
from tiletune.client.keys import key_problem, kind_of
from tiletune.client.knobs import adapt, config_problem, structure_problem, values_problem
from tiletune.client.known import KnownConfigs
from tiletune.client.misses import MissLedger
from tiletune.client.tiling import Tiling, default_tiling, kernel_name, tiling_of
from tiletune.client.wire import (
    BestConfigPublic,
    ConfigBundle,
    LookupPublic,
    shape_text,
)

log = logging.getLogger("tiletune.client")

R = TypeVar("R")
#: A remembered answer's key: (kernel, dtype, shape items).
MemoKey = AnswerKey
#: The default config of (kernel, shape, dtype, chip name); may raise (the client falls back to ``{}``).
DefaultRule = Callable[[str, Mapping[str, int], str, str], Mapping[str, int]]
#: The version of a kernel this process runs, ``None`` when it does not know the kernel.
KernelVersion = Callable[[str], "int | None"]

#: Distinct warnings logged at most (then no more: a launch path that goes wrong in ever new
#: ways must not fill memory or the log).
MAX_WARNINGS = 10_000


@dataclass
class ClientSettings:
    """Bounds and back-off of the server, caching and miss reporting.

    Each request is bounded in all, from connecting to the last byte of its answer (not per
    read), and its answer in bytes, as decoded (a gzip body inflated), counted as it arrives;
    past either the request gives up and counts as the server being away (the launch falls
    back, the server is backed off):

    - ``timeout_s``: a lookup on the launch path (a launch waits at most this for a new key);
    - ``prefetch_timeout_s``: a bulk export (``prefetch`` and each refresh);
    - ``report_timeout_s``: a miss or stats report (off the launch path; ``close`` waits for
      the last ones);
    - ``max_answer_bytes``: a lookup's or a report's answer (a lookup answer is a few KiB);
    - ``max_bundle_bytes``: a bulk export (an entry is under 1 KiB: 256 MiB hold 250,000).

    ``cache_dir`` ``None`` turns the disk cache off. ``kernel_versions`` pins the versions this
    process runs; ``kernel_version`` and ``default_rule`` are handed over by ``tiletune.kernels``
    (``client_settings()``); see the module docstring.
    """

    timeout_s: float = 0.25
    prefetch_timeout_s: float = 30.0
    report_timeout_s: float = 5.0
    max_answer_bytes: int = calls.MAX_SMALL_ANSWER_BYTES
    max_bundle_bytes: int = calls.MAX_BUNDLE_BYTES
    backoff_s: float = 1.0
    max_backoff_s: float = 60.0
    cache_dir: Path | None = field(default_factory=default_cache_dir)
    miss_flush_s: float = 5.0
    recheck_s: float = 60.0
    refresh_s: float | None = None
    kernel_versions: Mapping[str, int] | None = None
    kernel_version: KernelVersion | None = None
    default_rule: DefaultRule | None = None


class ClientCore:
    """State and decisions shared by :class:`ConfigClient` and :class:`AsyncConfigClient`."""

    def __init__(
        self, chip: str, settings: ClientSettings, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.chip = detect_chip() if chip == "auto" else chip
        self.settings = settings
        self.clock = clock
        self.known = KnownConfigs(self.chip, on_refused=self._refused_entry)
        self.disk = DiskCache(settings.cache_dir, self.chip) if settings.cache_dir is not None else None
        self.software = software_fingerprint()
        #: The answers remembered, each with its counter of launches (:meth:`remember`); never
        #: rebound (the clients' launch paths hold it).
        self.memo: dict[MemoKey, tuple[Tiling, Iterator[None]]] = {}
        self.provisional: dict[MemoKey, float] = {}
        self.prefetched = False
        self.lock = threading.Lock()
        self._disk_loaded = False
        self._down_until = 0.0
        self._backoff_s = settings.backoff_s
        self._warned: set[object] = set()
        self.misses = MissLedger(self.chip, self.warn_once)
        self.answers = AnswerTally(self.chip, self.warn_once, self.memo)
        #: The ETag of the bundle last taken, per scope (``kernel`` of the export; ``None``: all).
        self.etags: dict[str | None, str] = {}
        #: The scopes prefetched so far, in order (what a refresh fetches again).
        self.scopes: list[str | None] = []

    # -- logging, once -------------------------------------------------------------------------

    def warn_once(self, kind: object, message: str, *args: object) -> None:
        """Log ``message`` the first time ``kind`` (hashable) is seen; never raises."""
        try:
            if kind in self._warned or len(self._warned) > MAX_WARNINGS:
                return
            self._warned.add(kind)
            if len(self._warned) > MAX_WARNINGS:
                log.warning("tiletune client: %d distinct warnings; no more are logged", MAX_WARNINGS)
                return
            log.warning(message, *args)
        except Exception:  # an unhashable kind, a failing handler: the caller goes on
            return

    def _refused_entry(self, entry: BestConfigPublic, problem: str) -> None:
        """An entry failed the check (see :class:`KnownConfigs`): logged once per key."""
        key = (entry.kernel, entry.kernel_version, entry.shape_key, entry.dtype)
        self.warn_once(
            ("entry", *key),
            "tiletune client: refusing the config %s of %s v%d %s %s: %s; the key is decided without it",
            entry.config,
            *key,
            problem,
        )

    # -- memory --------------------------------------------------------------------------------

    def remember(self, key: MemoKey, tiling: Tiling, final: bool) -> Tiling:
        """Keep ``tiling`` for ``key``: for good, or (``final`` False) for ``recheck_s`` and the back-off;
        with a new counter of its launches, which counts this one unless a server lookup gave it
        (the server counts those)."""
        counter = self.answers.counter(key, tiling.match)
        if tiling.source != "server":
            next(counter)
        self.memo[key] = (tiling, counter)
        if final:
            self.provisional.pop(key, None)
        else:
            self.provisional[key] = max(self._down_until, self.clock() + self.settings.recheck_s)
        return tiling

    def expire(self) -> int:
        """Drop the provisional answers that are due (they are decided again at their next launch)."""
        now = self.clock()
        due = [key for key, until in list(self.provisional.items()) if until <= now]
        for key in due:
            self.provisional.pop(key, None)
            self.memo.pop(key, None)
        return len(due)

    def forget_answers(self) -> None:
        """Drop remembered answers (new entries arrived)."""
        self.memo.clear()
        self.provisional.clear()

    # -- server health -------------------------------------------------------------------------

    def server_usable(self) -> bool:
        """True unless prefetched (no HTTP on launches) or backing off after a failure."""
        return not self.prefetched and self.clock() >= self._down_until

    def server_down(self, error: Exception) -> None:
        """Back off after a failed request."""
        log.warning("tiletune server unreachable (%s); retrying in %.1f s", error, self._backoff_s)
        self._down_until = self.clock() + self._backoff_s
        self._backoff_s = min(self._backoff_s * 2, self.settings.max_backoff_s)

    def server_up(self) -> None:
        """A request succeeded: no back-off."""
        self._backoff_s = self.settings.backoff_s
        self._down_until = 0.0

    # -- deciding ------------------------------------------------------------------------------

    def _version(self, kernel: str) -> int | None:
        """The kernel version this process runs (pinned, installed, or the server's)."""
        pinned = self.settings.kernel_versions
        if pinned is not None and kernel in pinned:
            return pinned[kernel]
        installed = self._installed_version(kernel)
        if installed is not None:
            return installed
        info = self.known.kernels.get(kernel)
        return info.version if info is not None else None

    def load_disk(self) -> None:
        """Read the disk cache once (on the first decision that needs it)."""
        if self._disk_loaded or self.disk is None:
            return
        self._disk_loaded = True
        self.known.add_bundle(self.disk.load())

    def from_known(self, kernel: str, shape: Mapping[str, int], dtype: str, source: str) -> Tiling | None:
        """An exact, else nearest (adapted to ``shape``), answer from the entries known in memory."""
        version = self._version(kernel)
        if version is None:
            return None
        entry = self.known.exact(kernel, version, shape, dtype)
        if entry is not None:
            return tiling_of(entry, "exact", source, self.software)
        near = self.known.nearest(kernel, version, shape, dtype)
        if near is None:
            return None
        config = adapt(near[1].config, shape, self.known.info_of(kernel, version))
        return tiling_of(near[1], "nearest", source, self.software, config) if config is not None else None

    def exact_known(self, kernel: str, shape: Mapping[str, int], dtype: str) -> Tiling | None:
        """An exact answer from the entries known in memory."""
        version = self._version(kernel)
        entry = self.known.exact(kernel, version, shape, dtype) if version is not None else None
        return tiling_of(entry, "exact", "memory", self.software) if entry is not None else None

    def from_server(self, answer: LookupPublic, kernel: str, shape: Mapping[str, int]) -> Tiling | None:
        """The server's answer to the lookup of ``kernel`` at ``shape``, unless it was tuned with
        another kernel version than ours or its config fails the check (logged once per key)."""
        best = answer.best
        if answer.match == "default" or best is None:
            return None
        version = self._version(kernel)
        if version is not None and best.kernel_version != version:
            return None
        problem = self._answer_problem(answer, best, kernel, shape)
        if problem is not None:
            self.warn_once(
                ("answer", kernel, tuple(shape.items()), answer.dtype),
                "tiletune client: refusing the server's config %s for %s %s %s: %s",
                answer.config,
                kernel,
                dict(shape),
                answer.dtype,
                problem,
            )
            return None
        self.known.add([best])
        return tiling_of(best, answer.match, "server", self.software, answer.config)

    def _answer_problem(
        self, answer: LookupPublic, best: BestConfigPublic, kernel: str, shape: Mapping[str, int]
    ) -> str | None:
        """Why a lookup's answer may not be served: another kernel's, or a config that fails the
        check (against the answer's ``knob_values``, else the kernel's info of the entry's version)."""
        if answer.kernel != kernel or best.kernel != kernel:
            return f"an answer for the kernel {answer.kernel!r}"
        if answer.knob_values is not None:
            return structure_problem(answer.config) or values_problem(answer.config, answer.knob_values)
        if kernel not in self.known.kernels:
            self.load_disk()  # the kernels' info of the last bundle this node took
        return config_problem(answer.config, shape, self.known.info_of(kernel, best.kernel_version))

    def _installed_version(self, kernel: str) -> int | None:
        rule = self.settings.kernel_version
        if rule is None:
            return None
        try:
            return rule(kernel)
        except Exception:  # never break the caller
            return None

    def default(self, kernel: str, shape: Mapping[str, int], dtype: str) -> Tiling:
        """The kernel's built-in rule for this chip: ``{}`` when no rule was handed over, it failed
        or it gave no config (logged once per kernel and kind of failure). Never raises."""
        config: dict[str, int] = {}
        rule = self.settings.default_rule
        if rule is not None:
            try:
                given = rule(kernel, shape, dtype, self.chip)
                problem = structure_problem(given)
                if problem is not None:
                    raise ValueError(problem)
                config = dict(given)
            except Exception as error:  # never break the caller: unknown kernel, bad shape, ...
                self.warn_once(
                    ("default", kernel_name(kernel), kind_of(error)),
                    "tiletune client: no default config for %s (%s: %s); using {}",
                    kernel_name(kernel),
                    kind_of(error),
                    error,
                )
        return default_tiling(kernel, config)

    def bad_input(self, kernel: object, shape: object, dtype: object, cause: str | Exception) -> Tiling:
        """The answer to a launch key the client cannot take (see the module docstring): the
        default, logged once per kind of problem (``cause``, or what raised reading the key).
        Never raises."""
        next(self.answers.counters["default"])
        try:
            problem = cause if isinstance(cause, str) else key_problem(kernel, shape, dtype) or kind_of(cause)
            self.warn_once(
                ("key", problem), "tiletune client: a bad launch key (%s); answering the default", problem
            )
            return self.default(kernel, shape, dtype)  # type: ignore[arg-type]  # the rule may refuse it
        except Exception:
            return default_tiling(kernel, {})

    # -- requests and bundles ------------------------------------------------------------------

    def lookup_call(self, kernel: str, shape: Mapping[str, int], dtype: str) -> Call[LookupPublic]:
        """The server lookup of a key: exact, else the server's nearest (adapted to the shape)."""
        return calls.lookup(
            kernel,
            shape=shape_text(dict(shape)),
            dtype=dtype,
            chip=self.chip,
            match="nearest",
            timeout_s=self.settings.timeout_s,
            max_bytes=self.settings.max_answer_bytes,
        )

    def bulk_call(self, kernel: str | None) -> Call[BundleAnswer]:
        """The bulk export of this chip's configs (optionally one kernel's), conditional on the
        ETag of the bundle last taken of that scope."""
        settings = self.settings
        etag = self.etags.get(kernel)
        return calls.configs_since(
            self.chip, kernel, settings.prefetch_timeout_s, etag, settings.max_bundle_bytes
        )

    def report_call(self, call: Call[R]) -> Call[R]:
        """A miss or stats report's ``call`` within the settings' bounds of a report."""
        settings = self.settings
        return replace(call, timeout_s=settings.report_timeout_s, max_bytes=settings.max_answer_bytes)

    def take_answer(self, answer: BundleAnswer, kernel: str | None) -> int:
        """Take a bulk export's answer: how many configs arrived (0 for a ``304``: the bundle
        held is current). Afterwards launches make no HTTP call."""
        self.server_up()
        if kernel not in self.scopes:
            self.scopes.append(kernel)
        bundle = answer.bundle
        if bundle is None:
            with self.lock:
                self.load_disk()
            self.prefetched = True
            return 0
        self.take_bundle(bundle)
        if answer.etag is not None:
            self.etags[kernel] = answer.etag
        else:
            self.etags.pop(kernel, None)
        self.prefetched = True
        return len(bundle.configs)

    def prefetch_failed(self, error: Exception) -> None:
        """A bulk export failed (no answer, an error, a body that is not a bundle): back off,
        and serve from the disk cache."""
        self.server_down(error)
        try:
            self.load_disk()
        except Exception as failure:  # the disk's contract is never to raise; still, go on
            self.warn_once(("disk", kind_of(failure)), "tiletune client: disk cache: %s", failure)

    def refresh_scopes(self) -> list[str | None]:
        """What a refresh fetches again: every scope prefetched (all of them when one was the chip's)."""
        return [None] if None in self.scopes or not self.scopes else list(self.scopes)

    def lookup_failed(self, error: ApiError, kernel: str, shape: Mapping[str, int], dtype: str) -> bool:
        """Account for a failed lookup: ``True`` when the server is away (backed off), ``False`` when
        it answered that it has nothing (a 4xx: not tuned, or a kernel it does not know). A key the
        server refuses (422: a kernel, shape or dtype it does not take) is never counted as a miss."""
        if isinstance(error, ServerRefusedError) and error.status < 500:
            self.server_up()
            if error.status == 422:
                self.misses.refuse((kernel, tuple(shape.items()), dtype))
            return False
        self.server_down(error)
        return True

    def take_bundle(self, bundle: ConfigBundle) -> int:
        """Add a bundle's entries to what is known (the disk's first) and drop remembered answers."""
        with self.lock:
            self.load_disk()
            changed = self.known.add_bundle(bundle)
            self.forget_answers()
        return changed
