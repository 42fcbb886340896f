"""Building the native CPU kernels where a CPU worker starts (``tiletune worker --build-native``).

The native kernels are compiled with ``-march=native``, so they are built on the machine that runs
them, by the worker itself before it registers: :func:`prebuild_native` builds them once into the
cache of :mod:`tiletune.kernels.native.build` (``$TILETUNE_NATIVE_DIR``, a volume in the images and
units), so a restart finds the build and compiles nothing.

Contract of :func:`prebuild_native`:

- never raises: a build that fails (no compiler, a compile error, an unwritable cache) is logged
  with its reason and the worker goes on without the ``native_*`` kernels. Whether it registers
  them is :func:`~tiletune.kernels.native.build.native_status`'s answer after the build, the same
  answer registration reads;
- workers that start together on one cache (several replicas on one volume) build one at a time:
  an exclusive ``flock`` on ``build.lock`` in the cache, which the kernel releases when its holder
  dies. Under that lock a builder that was killed midway is recognised (torch's own lock file
  left in the build directory, which would make the next build wait for ever) and its leftovers
  are removed before building again.
"""

from __future__ import annotations

import fcntl
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tiletune.kernels.native.build import NativeStatus, build, build_dir, cache_root, native_status

logger = logging.getLogger(__name__)

#: The file whose ``flock`` serialises builds by the workers sharing one cache.
LOCK_NAME = "build.lock"
#: The lock file ``torch.utils.cpp_extension`` keeps in a build directory while it builds there.
TORCH_BUILD_LOCK = "lock"


@contextmanager
def _exclusive(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if absent) for the block."""
    with path.open("a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _drop_abandoned_build_lock() -> None:
    """Remove torch's lock file left by a builder that died (only called under our own lock)."""
    stale = build_dir() / TORCH_BUILD_LOCK
    if stale.exists():
        logger.warning("native CPU kernels: removing %s, left by a build that was stopped midway", stale)
        stale.unlink(missing_ok=True)


def prebuild_native() -> NativeStatus:
    """Build the native CPU kernels for this torch and CPU unless the cache has them; never raises.

    Returns the status registration will read: available, or why not (logged as a warning).
    """
    root = cache_root()
    logger.info("native CPU kernels: looking for a build in %s (a first build takes minutes)", root)
    started = time.monotonic()
    try:
        root.mkdir(parents=True, exist_ok=True)
        with _exclusive(root / LOCK_NAME):
            _drop_abandoned_build_lock()
            library = build()
    except Exception as error:  # a failed build must never stop the worker
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        logger.warning(
            "native CPU kernels unavailable, this worker registers without the native_* kernels: %s", reason
        )
        return NativeStatus(False, reason)
    status = native_status()
    if status.available:
        logger.info("native CPU kernels ready: %s (%.0f s)", library, time.monotonic() - started)
    else:
        logger.warning(
            "native CPU kernels built but unusable, this worker registers without them: %s", status.reason
        )
    return status
