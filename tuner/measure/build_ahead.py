"""Building the configs a worker is about to measure, ahead of measuring them, on a small pool.

A kernel whose configs are builds (build-time knobs, :mod:`tiletune.kernels.build_cache`) costs a
compile per config, about a second for a small C++ file and minutes for some accelerator toolchains.
The job driver hands :class:`BuildAhead` each batch of configs as soon as the server names them (the
batch asked ahead while the previous one is measured, then the validation's configs), and the pool
builds them in parallel through the kernel's build cache while the measuring goes on. Before a
config is measured, :meth:`BuildAhead.ready` waits for its build (building it there when nobody
has), so the timed runs never include a compile; the seconds so spent are :attr:`AheadStats.waited_s`,
what the measuring lost to builds. A worker builds a job's default before its trial process checks it,
timed (:meth:`BuildAhead.ready_default`: the trials' time limits derive from that time), and local
tuning asks the search :meth:`BuildAhead.depth` trials ahead of the one measured and builds them.

Contract:

- only kernels whose spec builds per config (:class:`~tiletune.kernels.build_cache.BuiltPerConfig`
  with build knobs) are built; any other kernel costs nothing (no thread is started);
- each build (kernel, build-time values, cache root) is submitted once per process (remembered up to
  :data:`MAX_REMEMBERED`); configs that differ in run-time knobs alone share it;
- a config outside the space or invalid on the chip is not built (the bench rejects it unrun);
- a failed build never raises here: it is published in the cache, and the bench's run of the config
  raises it there, so it is that trial's error with the compiler's message;
- the pool holds ``workers`` threads (default :func:`default_workers`: the cores but one, at least
  one; ``$TILETUNE_BUILD_WORKERS`` overrides, ``0`` builds each config only when it is measured);
- its threads, and the compilers they start, run at the lowest priority (nice :data:`BUILD_NICENESS`,
  Linux: a thread's own): a config measured on every core (``block_dim`` = cores) is timed while the
  builds take only the CPU time it leaves, so building ahead never slows what is measured.

The builds land in the cache on disk, which is what a measuring child process reads (its spec's
``run`` finds them there): nothing but the cache is shared between the two.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tiletune.client.space import DeviceLimits, is_vendor
from tiletune.kernels.build_cache import BuiltPerConfig, build_root
from tiletune.kernels.declaration import Config, Shape
from tiletune.kernels.errors import InputError
from tiletune.kernels.spec import KernelSpec
from tiletune.tuner.measure.bench import KernelBench
from tiletune.tuner.measure.measurement import TrialResult

logger = logging.getLogger(__name__)

#: Threads building ahead (``0``: none, each config is built when it is measured).
BUILD_WORKERS_ENV = "TILETUNE_BUILD_WORKERS"

#: Builds remembered before the finished ones are forgotten (a later config of one finds it on disk).
MAX_REMEMBERED = 4096
#: The nice value of the pool's threads and their compilers (the lowest priority).
BUILD_NICENESS = 19

BuildKey = tuple[str, tuple[tuple[str, int], ...], Path]


def default_workers() -> int:
    """``$TILETUNE_BUILD_WORKERS`` when set, else the cores this process may use but one (at least one):
    the measuring keeps a core of its own."""
    configured = os.environ.get(BUILD_WORKERS_ENV, "").strip()
    if configured:
        return max(0, int(configured))
    return max(1, len(os.sched_getaffinity(0)) - 1)


@dataclass
class AheadStats:
    """What building ahead did in this process: builds ``submitted`` to the pool, configs whose build
    was ``ready`` when their measuring began, ``waits`` where the measuring waited for one (built there,
    or still building), and ``waited_s``, the seconds it waited."""

    submitted: int = 0
    ready: int = 0
    waits: int = 0
    waited_s: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, *, submitted: int = 0, ready: int = 0, waits: int = 0, waited_s: float = 0.0) -> None:
        """Count (thread-safe)."""
        with self._lock:
            self.submitted += submitted
            self.ready += ready
            self.waits += waits
            self.waited_s += waited_s

    def as_dict(self) -> dict[str, float]:
        """JSON-ready counts."""
        return {
            "submitted": self.submitted,
            "ready": self.ready,
            "waits": self.waits,
            "waited_s": self.waited_s,
        }


class BuildAhead:
    """Builds configs ahead of their measuring on a pool of ``workers`` threads (see the module docstring)."""

    def __init__(self, workers: int | None = None) -> None:
        self.workers = default_workers() if workers is None else workers
        self.stats = AheadStats()
        self._pool: ThreadPoolExecutor | None = None
        self._builds: dict[BuildKey, Future[Path | None]] = {}
        self._lock = threading.Lock()

    def depth(self, spec: KernelSpec) -> int:
        """How many trials a sequential search should ask ahead of the one it measures, so that each
        of the pool's threads has a build going: its ``workers``, or 0 when nothing is built ahead."""
        return self.workers if _builds_per_config(spec) else 0

    def submit(self, bench: KernelBench, configs: Iterable[Mapping[str, object]]) -> int:
        """Start building ``configs`` of ``bench``'s kernel (raw, as the server sent them); returns how
        many builds were started (0 for a kernel without build-time knobs, or without a pool)."""
        return self.submit_for(bench.spec, bench.shape, bench.dtype, bench.device.chip.limits, configs)

    def submit_for(
        self,
        spec: KernelSpec,
        shape: Shape,
        dtype: str,
        limits: DeviceLimits,
        configs: Iterable[Mapping[str, object]],
    ) -> int:
        """:meth:`submit` before a bench exists (a job's first configs, while its bench is readied)."""
        if not isinstance(spec, BuiltPerConfig) or not _builds_per_config(spec) or self.workers < 1:
            return 0
        started = 0
        for raw in configs:
            config = self._buildable(spec, shape, dtype, limits, raw)
            if config is None:
                continue
            key = _key(spec, config)
            with self._lock:
                if key in self._builds:
                    continue
                if len(self._builds) >= MAX_REMEMBERED:
                    self._forget_done()
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(
                        self.workers, thread_name_prefix="build-ahead", initializer=_yield_to_measuring
                    )
                self._builds[key] = self._pool.submit(_build, spec, config)
            started += 1
        if started:
            logger.debug("%s: %d build(s) submitted ahead", spec.name, started)
        self.stats.add(submitted=started)
        return started

    def ready(self, bench: KernelBench, config: Mapping[str, object]) -> None:
        """Return once ``config``'s build is in the cache (or failed there): waiting for the pool's
        build of it, or building it now when none was started. A no-op for kernels without builds, and
        for a config outside the space or invalid on the chip (the bench rejects it unrun)."""
        if not _builds_per_config(bench.spec):
            return
        parsed = self._buildable(bench.spec, bench.shape, bench.dtype, bench.device.chip.limits, config)
        if parsed is not None:
            self.ready_config(bench.spec, parsed)

    def evaluate(self, bench: KernelBench, config: Config, best_known_ms: float | None = None) -> TrialResult:
        """``bench.evaluate(config, best_known_ms)`` once ``config``'s build is ready (:meth:`ready`):
        its check and timed runs never include a compile."""
        self.ready(bench, config)
        return bench.evaluate(config, best_known_ms)

    def ready_config(self, spec: KernelSpec, config: Mapping[str, int]) -> None:
        """:meth:`ready` for a parsed config of ``spec`` (its build-time values are what is built)."""
        if not isinstance(spec, BuiltPerConfig) or not _builds_per_config(spec):
            return
        with self._lock:
            future = self._builds.get(_key(spec, dict(config)))
        if future is not None and future.done():
            self.stats.add(ready=1)
            return
        started = time.monotonic()
        if future is not None:
            future.result()
        else:
            _build(spec, dict(config))
        waited_s = time.monotonic() - started
        logger.debug("%s: waited %.3f s for the build of %s", spec.name, waited_s, dict(config))
        self.stats.add(waits=1, waited_s=waited_s)

    def ready_default(self, spec: KernelSpec, shape: Shape, dtype: str, limits: DeviceLimits) -> None:
        """Build ``spec``'s default config for ``shape`` and ``dtype`` now (or wait for its build) unless
        it is invalid there: an isolated bench's trial process checks it first, timed, and derives the
        trials' time limits from that time, which must not include a compile."""
        default = spec.default_config(shape, dtype, limits)
        if self._buildable(spec, shape, dtype, limits, default) is not None:
            self.ready_config(spec, default)

    def ready_all(self, bench: KernelBench, configs: Iterable[Mapping[str, object]]) -> None:
        """:meth:`submit` then :meth:`ready` for each of ``configs``."""
        listed = list(configs)
        self.submit(bench, listed)
        for config in listed:
            self.ready(bench, config)

    def close(self) -> None:
        """Stop the pool after the builds under way (those not started are dropped)."""
        with self._lock:
            pool, self._pool = self._pool, None
            self._builds.clear()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def _forget_done(self) -> None:
        """Drop the finished builds from memory (under the lock; the cache on disk keeps them)."""
        self._builds = {key: future for key, future in self._builds.items() if not future.done()}

    @staticmethod
    def _buildable(
        spec: KernelSpec, shape: Shape, dtype: str, limits: DeviceLimits, raw: Mapping[str, object]
    ) -> dict[str, int] | None:
        """``raw`` parsed for ``shape`` and the chip, or None when it is outside the space or invalid."""
        try:
            config = spec.parse_config(raw, shape, limits)
        except InputError:
            return None
        if is_vendor(config) or spec.config_problem(config, shape, dtype, limits) is not None:
            return None  # torch's op is no build
        return config


def _yield_to_measuring() -> None:
    """Lower the calling thread's priority to :data:`BUILD_NICENESS` (on Linux the nice value is a
    thread's, and the processes it starts inherit it); where that is not possible, nothing changes."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BUILD_NICENESS)
    except (AttributeError, OSError) as error:
        logger.debug("build-ahead threads keep their priority: %s", error)


def _builds_per_config(spec: KernelSpec) -> bool:
    return bool(spec.build_knobs) and isinstance(spec, BuiltPerConfig)


def _key(spec: KernelSpec, config: Mapping[str, int]) -> BuildKey:
    values = spec.build_values(dict(config))
    return spec.name, tuple(values.items()), build_root()


def _build(spec: BuiltPerConfig, config: dict[str, int]) -> Path | None:
    """Build ``config`` through the spec's cache; a failure is logged, published and left to the bench."""
    started = time.monotonic()
    try:
        path = spec.build_config(config)
    except Exception as error:  # the bench's run raises it again from the cache, as the trial's error
        logger.info("building %s failed: %s", config, str(error).splitlines()[0] if str(error) else error)
        return None
    logger.debug("built %s in %.3f s", config, time.monotonic() - started)
    return path


_shared: dict[int, BuildAhead] = {}
_shared_lock = threading.Lock()


def shared_build_ahead() -> BuildAhead:
    """The process's :class:`BuildAhead` of :func:`default_workers` threads (read now), shared by the job
    drivers of a process so its pool and its :attr:`~BuildAhead.stats` are one."""
    workers = default_workers()
    with _shared_lock:
        if workers not in _shared:
            _shared[workers] = BuildAhead(workers)
        return _shared[workers]
