"""Isolated trials: the worker's configs run in a warm child process with a time limit per call.

On an accelerator a bad tiling is a crash, a hang or a poisoned device context, not a slow
config. So a worker (and local tuning, ``TILETUNE_TUNE=1``) measures in a child process
(:mod:`tiletune.tuner.measure.trial_child`, a fresh interpreter: :class:`TrialProcess`) and
survives whatever a config does:

- **Warm.** One child per worker, started at the first trial and kept between trials and leases;
  its bench (inputs, reference) is built once per lease and kept while the next lease names the
  same kernel, shape, dtype, backend and bench settings.
- **A crash fails the config.** A child that dies answers the trial with
  ``error="the trial process died: signal SIGSEGV"`` (or its exit code); one silent past the
  call's limit is killed (SIGKILL) and answers ``error="timed out after X s (limit: ...)"``;
  a result whose error looks like a device error (:func:`looks_like_device_error`: CUDA's illegal
  memory access, an Ascend AI core exception, :class:`~tiletune.kernels.errors.DeviceError`)
  stands, and the child is ended, since its device context may be poisoned. The next call starts a
  fresh child. In the validation run (``compare``) such an end raises :class:`TrialProcessError`,
  which :func:`~tiletune.tuner.measure.result.validated_results` turns into each config's error.
- **The limit of a call** (:func:`trial_limit`): every fresh bench first checks the kernel's
  default once in the child, timed (``d`` ms, wall: constraint, one run, comparison). For
  ``evaluate`` and ``check`` the limit is ``max(floor_s, slowdown × (warmup_runs + min_samples + 2) ×
  d + 2 × budget_s)``: the runs a measurement makes whatever its budget (the checked run,
  warm-ups, the minimum samples, one sample past the budget) of a config ``slowdown`` times
  slower than the default, plus twice the timing budget; with ``against_default`` (the trial timed
  again beside the default, :mod:`~tiletune.tuner.measure.referenced`) plus ``(slowdown + 1) ×
  (warmup_runs + EXTRA_WARMUP_RUNS + min_samples + 1) × d + 4 × budget_s + 2 × max_samples ×
  settle_s``. For ``compare`` of ``n`` configs it is
  ``max(floor_s, n × (slowdown × (warmup_runs + EXTRA_WARMUP_RUNS + min_samples + 1) × d + 2 ×
  budget_s + max_samples × settle_s))`` with the validation run's settings
  (``BenchSettings.for_validation``). Without a default time (it was invalid or wrong) the floor is the limit.
- **The default's fault or the device's.** When a fresh child cannot run the default (it dies,
  hangs past ``start_limit_s``, 120 s by default, while building the bench and checking the
  default: the default's build is done ahead, outside it; or a device error), a fresh child runs a
  built-in kernel's default on a small shape at once (:meth:`TrialPool.health_problem`). When that
  runs, the kernel is at fault: :class:`DefaultFailedError`, and the worker releases the job as
  failed with the reason and goes on leasing. When it does not either, the device is:
  :class:`DeviceUnusableError`, and the worker releases the job as failed (``"device unusable:
  ..."``) and leases nothing until the health check passes again.

Replay devices need no isolation (nothing runs); ``tiletune tune`` and ``bench`` stay in process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from tiletune.kernels.declaration import Config, Shape
from tiletune.kernels.device import Device
from tiletune.kernels.registry import get_kernel
from tiletune.kernels.spec import KernelSpec
from tiletune.tuner.measure.bench import EXTRA_WARMUP_RUNS, BenchSettings, KernelBench
from tiletune.tuner.measure.measurement import Measurement, TrialResult
from tiletune.tuner.measure.trial_child import Call, Prepare

#: The child's program (``python -c``), given its end of the socket pair's file descriptor.
CHILD_MAIN = "import sys; from tiletune.tuner.measure.trial_child import main; main(int(sys.argv[1]))"

logger = logging.getLogger(__name__)

#: Texts of errors after which a device context is not trusted (lower case; CUDA, Ascend, ours).
DEVICE_ERROR_MARKS = (
    "deviceerror:",
    "illegal memory access",
    "illegal instruction",
    "misaligned address",
    "unspecified launch failure",
    "device-side assert",
    "cuda error: an illegal",
    "cudaerrorillegaladdress",
    "uncorrectable ecc error",
    "aicore",
    "ai core",
    "aivec error",
    "aic error",
    "ub overflow",
    "ez9999",
)
#: What the health check runs: a built-in kernel that every device kind runs, on a small shape.
HEALTH_KERNEL, HEALTH_SHAPE, HEALTH_DTYPE = "add", {"n": 4096}, "float32"


def looks_like_device_error(text: str | None) -> bool:
    """Whether an error's text says the device (not just the config) failed: see the module docstring."""
    lowered = (text or "").lower()
    return any(mark in lowered for mark in DEVICE_ERROR_MARKS)


class TrialProcessError(RuntimeError):
    """A call of the trial process ended without an answer (it died or timed out); the message says how."""


class DeviceUnusableError(RuntimeError):
    """Neither the kernel's default nor a built-in kernel's runs in a fresh trial process: the
    device is not usable now."""


class DefaultFailedError(RuntimeError):
    """A fresh trial process cannot run the kernel's default, while a built-in kernel's default runs
    on the device: the kernel's fault (its job fails), not the device's."""


@dataclass(frozen=True)
class IsolationSettings:
    """Limits of isolated trials (see the module docstring for the formula).

    ``floor_s``: the least limit of a call; ``slowdown``: how much slower than the default a config
    may be before it is a hang; ``start_limit_s``: a fresh child's start, bench build and default
    check; ``cooldown_s`` (doubling up to ``max_cooldown_s``): the wait between health checks of
    a device found unusable.
    """

    floor_s: float = 10.0
    slowdown: float = 10.0
    start_limit_s: float = 120.0
    cooldown_s: float = 30.0
    max_cooldown_s: float = 600.0


@dataclass(frozen=True)
class TrialLimit:
    """The limit of one call in seconds, and how it was derived (quoted in a timeout's error)."""

    seconds: float
    basis: str


def trial_limit(
    bench: BenchSettings, isolation: IsolationSettings, default_ms: float | None, configs: int = 0
) -> TrialLimit:
    """The limit of an ``evaluate``/``check`` call (``configs`` 0) or of a ``compare`` of ``configs``."""
    if default_ms is None:
        return TrialLimit(isolation.floor_s, f"the {isolation.floor_s:g} s floor; no default time")
    default_s = default_ms / 1e3
    if configs:  # the validation run: its settings, warm-ups that may run longer
        bench = bench.for_validation()
        runs = bench.warmup_runs + EXTRA_WARMUP_RUNS + bench.min_samples + 1
        each_s = (
            isolation.slowdown * runs * default_s + 2 * bench.budget_s + bench.max_samples * bench.settle_s
        )
        derived_s = configs * each_s
    else:
        runs = bench.warmup_runs + bench.min_samples + 2
        derived_s = isolation.slowdown * runs * default_s + 2 * bench.budget_s
        if bench.against_default:  # the run with the default: two callables, their warm-ups and settles
            paired = bench.warmup_runs + EXTRA_WARMUP_RUNS + bench.min_samples + 1
            derived_s += (isolation.slowdown + 1) * paired * default_s + 4 * bench.budget_s
            derived_s += 2 * bench.max_samples * bench.settle_s
    against = " and the run against the default" if bench.against_default and not configs else ""
    basis = (
        f"max({isolation.floor_s:g} s floor, {isolation.slowdown:g} × {runs} runs × default "
        f"{default_ms:.3g} ms + 2 × {bench.budget_s:g} s budget{f', {configs} configs' if configs else ''}"
        f"{against})"
    )
    return TrialLimit(max(isolation.floor_s, derived_s), basis)


def _exit_reason(code: int | None) -> str:
    """A child's exit status in words: ``signal SIGSEGV``, ``exit code 1``."""
    if code is not None and code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


class TrialProcess:
    """One child (:mod:`~tiletune.tuner.measure.trial_child`), started on the first call.

    The child is a fresh interpreter (``python -c``, :func:`~tiletune.tuner.measure.trial_child.main`)
    holding one end of a socket pair: never a fork (torch's thread pools and device contexts do not
    survive one) and never multiprocessing's spawn, which runs the parent's main script again in the
    child (a user's ``train.py`` without a ``__main__`` guard would train there). It sees the
    parent's ``sys.path``, so a spec of any importable module pickles by reference.

    :meth:`call` sends one request and waits up to a limit; a child that dies or stays silent is
    ended and :class:`TrialProcessError` raised, and the next call starts a fresh one.
    """

    def __init__(self) -> None:
        self._process: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        #: The bench the live child holds, and its default's check (verdict, ms).
        self.prepared: tuple[tuple[object, ...], tuple[TrialResult | None, float]] | None = None
        self.started = 0

    @property
    def pid(self) -> int | None:
        """The live child's process id, or None."""
        return self._process.pid if self._process is not None and self._process.poll() is None else None

    @property
    def alive(self) -> bool:
        """Whether a child is running."""
        return self.pid is not None

    def start(self) -> None:
        """Start a child now unless one runs: its imports overlap with what the caller does next."""
        if not self.alive:
            self.end()
            self._start()

    def _start(self) -> tuple[subprocess.Popen[bytes], Connection]:
        parent, child = socket.socketpair()
        environment = {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in sys.path if path)}
        try:
            process = subprocess.Popen(
                [sys.executable, "-c", CHILD_MAIN, str(child.fileno())],
                pass_fds=(child.fileno(),),
                env=environment,
                stdin=subprocess.DEVNULL,
            )
        finally:
            child.close()
        conn = Connection(parent.detach())
        self._process, self._conn, self.prepared = process, conn, None
        self.started += 1
        logger.info("trial process %d started", process.pid)
        return process, conn

    def call(self, request: Prepare | Call, limit: TrialLimit) -> tuple[bool, Any]:
        """Send ``request`` and wait up to ``limit`` for ``(ok, value)``; see the class docstring."""
        if self._process is None or self._conn is None or self._process.poll() is not None:
            self.end()
            process, conn = self._start()
        else:
            process, conn = self._process, self._conn
        timed_out = False
        try:
            conn.send(request)
            if conn.poll(limit.seconds):  # an answer, or the end of the stream: the child died
                reply: tuple[bool, Any] = conn.recv()
                return reply
            timed_out = True
        except (EOFError, OSError):
            pass  # the stream closed: the child died
        if timed_out:
            process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(10.0)
        reason = (
            f"timed out after {limit.seconds:.3g} s (limit: {limit.basis})"
            if timed_out
            else f"the trial process died: {_exit_reason(process.returncode)}"
        )
        logger.warning("trial process %s: %s", process.pid, reason)
        self.end()
        raise TrialProcessError(reason)

    def end(self) -> None:
        """End the child (if any): close its stream, let it exit, kill it if it does not."""
        process, conn = self._process, self._conn
        self._process, self._conn, self.prepared = None, None, None
        if conn is not None:
            conn.close()
        if process is not None:
            try:
                process.wait(1.0)
            except subprocess.TimeoutExpired:
                process.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(5.0)


class TrialPool:
    """The worker's isolated trials: one warm :class:`TrialProcess`, benches on it, health checks."""

    def __init__(self, settings: IsolationSettings | None = None) -> None:
        self.settings = settings or IsolationSettings()
        self.process = TrialProcess()
        self._checking_health = False

    def close(self) -> None:
        """End the child process."""
        self.process.end()

    def bench(
        self,
        spec: KernelSpec,
        shape: Shape,
        dtype: str,
        device: Device,
        *,
        backend: str | None,
        settings: BenchSettings,
    ) -> IsolatedBench:
        """An isolated bench of this lease; prepared in the child (raises :class:`DefaultFailedError`
        or :class:`DeviceUnusableError` when a fresh child cannot run the default)."""
        default = spec.default_config(shape, dtype, device.chip.limits)
        prepare = Prepare(spec, shape, dtype, device.kind, backend, settings, default)
        bench = IsolatedBench(self, prepare, device)
        bench.prepare()
        return bench

    def health_problem(self, device: Device) -> str | None:
        """Why a fresh child cannot run a small built-in kernel's default on ``device``, or None."""
        self.process.end()
        spec = get_kernel(HEALTH_KERNEL)
        shape = spec.parse_shape(HEALTH_SHAPE)
        self._checking_health = True
        try:
            self.bench(spec, shape, HEALTH_DTYPE, device, backend=None, settings=BenchSettings())
        except DeviceUnusableError as error:
            return str(error)
        finally:
            self._checking_health = False
        return None

    def blame(self, default: Config, failure: str, device: Device) -> Exception:
        """The error of a fresh child that could not run ``default``: the kernel's
        (:class:`DefaultFailedError`) when the health check passes, else the device's."""
        said = f"the default config {default}: {failure}"
        if self._checking_health:
            return DeviceUnusableError(said)
        problem = self.health_problem(device)
        if problem is None:
            return DefaultFailedError(f"{said}; a built-in kernel runs here: the kernel's fault")
        return DeviceUnusableError(f"{said}; a built-in kernel cannot run either: {problem}")


class IsolatedBench(KernelBench):
    """A :class:`KernelBench` whose calls run in the pool's child process (see the module docstring).

    ``spec``, ``shape``, ``dtype``, ``device``, ``backend`` and ``settings`` are the bench's, as the
    job driver reads them; nothing runs in this process (:meth:`runner` raises).
    """

    def __init__(self, pool: TrialPool, prepare: Prepare, device: Device) -> None:
        self.spec, self.shape, self.dtype, self.device = prepare.spec, prepare.shape, prepare.dtype, device
        self.backend, self.settings, self.seed = prepare.backend, prepare.settings, 0
        self.implementation = prepare.backend or ""
        self._pool, self._prepare = pool, prepare
        self.default_ms: float | None = None

    def runner(self, config: Config) -> Any:
        """Raises ``RuntimeError``: an isolated bench runs nothing in this process."""
        raise RuntimeError("an isolated bench runs its configs in its trial process")

    def prepare(self) -> None:
        """Make the child hold this bench and time its default (starting a fresh child if needed).

        Raises :class:`DeviceUnusableError` when a fresh child cannot run the default; a warm child
        that cannot is replaced by a fresh one first.
        """
        process = self._pool.process
        if not self._held() and not self._prepared_in_child():
            self._prepared_in_child()
        assert process.prepared is not None
        verdict, default_ms = process.prepared[1]
        if verdict is not None:
            logger.warning("the default config cannot be timed (%s); trial limits are the floor", verdict)
        self.default_ms = default_ms if verdict is None else None

    def _held(self) -> bool:
        """Whether the live child holds this bench."""
        prepared = self._pool.process.prepared
        return self._pool.process.alive and prepared is not None and prepared[0] == self._prepare.key()

    def _prepared_in_child(self) -> bool:
        """Prepare the bench in the child; False when a warm child failed (it is ended)."""
        process = self._pool.process
        fresh = not process.alive
        start = TrialLimit(self._pool.settings.start_limit_s, "a trial process's start")
        try:
            ok, value = process.call(self._prepare, start)
        except TrialProcessError as error:
            failure = str(error)
        else:
            if not ok:  # the bench could not be built: a kernel's problem, not the device's
                raise RuntimeError(f"could not build the bench: {value}")
            verdict, _default_ms = value
            failure = verdict.error if verdict is not None else ""
            if not looks_like_device_error(failure):
                process.prepared = (self._prepare.key(), value)
                return True
            process.end()
        if fresh:
            raise self._pool.blame(self._prepare.default, failure, self.device)
        logger.warning("the warm trial process failed the default (%s); starting a fresh one", failure)
        return False

    def _limit(self, configs: int = 0) -> TrialLimit:
        return trial_limit(self.settings, self._pool.settings, self.default_ms, configs)

    def _call(self, method: str, args: tuple[Any, ...], limit: TrialLimit) -> tuple[bool, Any]:
        """One call in the child (prepared first when it is fresh); raises :class:`TrialProcessError`."""
        process = self._pool.process
        if not self._held():
            self.prepare()
        return process.call(Call(method, args), limit)

    def _result(self, config: Config, method: str, args: tuple[Any, ...]) -> TrialResult | None:
        try:
            ok, value = self._call(method, args, self._limit())
        except TrialProcessError as error:
            return TrialResult(config, error=str(error))
        if not ok:
            value = TrialResult(config, error=str(value))
        if value is not None and looks_like_device_error(value.error):
            logger.warning("device error on %s (%s); replacing the trial process", config, value.error)
            self._pool.process.end()
        result: TrialResult | None = value
        return result

    def check(self, config: Config) -> TrialResult | None:
        """:meth:`KernelBench.check` in the child; a crash or a timeout is the config's error."""
        return self._result(config, "check", (config,))

    def evaluate(self, config: Config, best_known_ms: float | None = None) -> TrialResult:
        """:meth:`KernelBench.evaluate` in the child; a crash or a timeout is the config's error."""
        result = self._result(config, "evaluate", (config, best_known_ms))
        assert result is not None
        return result

    def compare(self, configs: Sequence[Config]) -> list[Measurement]:
        """:meth:`KernelBench.compare` in the child; raises :class:`TrialProcessError` on its crash,
        timeout or error (a device error also replaces the child)."""
        ok, value = self._call("compare", (list(configs),), self._limit(len(configs)))
        if not ok:
            if looks_like_device_error(str(value)):
                self._pool.process.end()
            raise TrialProcessError(f"the interleaved run failed: {value}")
        measurements: list[Measurement] = value
        return measurements
