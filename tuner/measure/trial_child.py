"""The child side of isolated trials: a process that holds one kernel bench and answers calls on it.

:mod:`tiletune.tuner.measure.isolation` starts :func:`main` in a fresh interpreter (never a fork:
torch's thread pools and device contexts do not survive one) and sends it requests over a socket
pair, one at a time:

- :class:`Prepare` -> ``(default_verdict, default_ms)``: build the
  :class:`~tiletune.tuner.measure.bench.KernelBench` of the request (inputs and reference; kept,
  and reused while the next request names the same bench), then check the kernel's default
  config once; ``default_ms`` is the wall time of that check (constraint, one run, comparison).
- :class:`Call` -> what ``KernelBench.<method>(*args)`` returns (``evaluate``, ``check``,
  ``compare``).

Every answer is ``(True, value)``, or ``(False, "Type: message")`` when the bench raised. A
crash (a segfault in a kernel) or a hang is the parent's to notice: the process dies or stays
silent. The child ignores SIGINT (a Ctrl-C in the worker's terminal reaches the whole process
group; the worker ends its child itself), prints a crash's Python stack to stderr
(:mod:`faulthandler`), and exits when the stream closes (the worker ended).
"""

from __future__ import annotations

import faulthandler
import signal
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from tiletune.kernels.declaration import Config, Shape
from tiletune.kernels.device import get_device
from tiletune.kernels.spec import KernelSpec
from tiletune.tuner.measure.bench import BenchSettings, KernelBench

#: The bench methods a :class:`Call` may name.
CALLS = frozenset({"evaluate", "check", "compare"})


@dataclass(frozen=True)
class Prepare:
    """Build (or keep) the bench of ``spec`` for ``shape`` and ``dtype`` on a device of ``device_kind``.

    ``spec`` travels pickled: a spec class defined at a module's top level pickles by reference,
    so a kernel defined in any importable module (a plugin, a test) works without entry points.
    """

    spec: KernelSpec
    shape: Shape
    dtype: str
    device_kind: str
    backend: str | None
    settings: BenchSettings
    default: Config

    def key(self) -> tuple[object, ...]:
        """What makes two requests the same bench (the same inputs and reference)."""
        shape = tuple(sorted(self.shape.items()))
        spec = (type(self.spec).__module__, type(self.spec).__qualname__, self.spec.name, self.spec.version)
        return (*spec, shape, self.dtype, self.device_kind, self.backend, self.settings)


@dataclass(frozen=True)
class Call:
    """Call ``method`` (one of :data:`CALLS`) of the prepared bench with ``args``."""

    method: str
    args: tuple[Any, ...]


class _Child:
    """The state of one child: its current bench and the key it was prepared for."""

    def __init__(self) -> None:
        self.bench: KernelBench | None = None
        self.key: tuple[object, ...] | None = None

    def answer(self, request: object) -> object:
        """The value a request asks for; raises what the bench raises."""
        if isinstance(request, Prepare):
            return self.prepare(request)
        if isinstance(request, Call) and request.method in CALLS:
            if self.bench is None:
                raise RuntimeError("no bench prepared in the trial process")
            return getattr(self.bench, request.method)(*request.args)
        raise TypeError(f"not a trial request: {request!r}")

    def prepare(self, request: Prepare) -> tuple[object, float]:
        """Build the bench unless it is the current one; check the default once, timed."""
        key = request.key()
        if self.bench is None or self.key != key:
            self.bench, self.key = None, None  # free the previous inputs before building new ones
            device = get_device(request.device_kind)
            self.bench = KernelBench(
                request.spec, request.shape, request.dtype, device, request.backend, request.settings
            )
            self.key = key
        start = time.perf_counter()
        verdict = self.bench.check(request.default)
        return verdict, (time.perf_counter() - start) * 1e3


def serve(conn: Connection) -> None:
    """Answer requests from ``conn`` until it closes (the child's main function)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    faulthandler.enable()
    child = _Child()
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return
        try:
            reply: tuple[bool, object] = (True, child.answer(request))
        except Exception as error:  # the parent decides what a failed call means
            reply = (False, f"{type(error).__name__}: {error}")
        conn.send(reply)


def main(fd: int) -> None:
    """The child's program: :func:`serve` the connection on the socket ``fd`` the parent passed."""
    serve(Connection(fd))
