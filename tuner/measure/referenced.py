"""Search trials timed against the kernel's default, so the drift of a shared machine cancels.

On the 2-core VM a kernel's speed moves by 10-30 % over seconds (another tenant, the clocks): a
trial timed alone at a slow moment ranks a good config behind worse ones, the search never takes it
to its finalists, and its answer ends up to 1.34× slower than the space's best (``tuning_quality
--quick``). So a trial that its plain measurement did not prune is timed again interleaved with the
kernel's default (A B A B ..., one run, :func:`~tiletune.tuner.measure.bench.measure_interleaved`),
and reported as its median over the default's in that run times the *anchor*: the default's median
in the bench's first such run (or its own trial). Every trial of one bench is then in one unit, the
default's time at one moment; the ratio, not the moment, ranks the configs.

Contract of :meth:`DefaultReference.rescale`: the measurement is returned unchanged for the default
itself (its first time becomes the anchor), when the default is invalid for the shape and chip, or
when the run with it fails (the default is checked as the search's first trial; a later failure
leaves the plain time). Otherwise its median, p10, p90 and min are the run's, scaled by
``anchor / the default's median in the run``; its samples and launches are the run's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from tiletune.kernels.declaration import Config
from tiletune.tuner.measure.measurement import Measurement

#: Times ``(config, default)`` interleaved in one run: their measurements, in that order.
TimedWith = Callable[[Config, Config], list[Measurement]]


class DefaultReference:
    """The anchor of one bench's trials (see the module docstring); one per
    :class:`~tiletune.tuner.measure.bench.KernelBench`. ``default``: the kernel's default for the
    bench's shape and chip, None when it is invalid there; ``timed_with`` times a config with it."""

    def __init__(self, default: Config | None, timed_with: TimedWith) -> None:
        self.default = dict(default) if default is not None else None
        self.anchor_ms: float | None = None
        self._timed_with = timed_with

    def rescale(self, config: Config, plain: Measurement) -> Measurement:
        """``plain`` (``config``'s own measurement) in the anchor's units."""
        if self.default is None:
            return plain
        if dict(config) == self.default:
            if self.anchor_ms is None:
                self.anchor_ms = plain.median_ms
            return plain
        try:
            timed, reference = self._timed_with(config, self.default)
        except Exception:  # the default failed here: the plain time stands
            return plain
        if reference.median_ms <= 0 or timed.median_ms <= 0:
            return plain
        if self.anchor_ms is None:
            self.anchor_ms = reference.median_ms
        scale = self.anchor_ms / reference.median_ms
        return dataclasses.replace(
            timed,
            median_ms=timed.median_ms * scale,
            p10_ms=timed.p10_ms * scale,
            p90_ms=timed.p90_ms * scale,
            min_ms=timed.min_ms * scale,
        )
