"""The surrogate model of the ``tpe`` strategy: which unmeasured configs are likely fast.

Contract: :class:`PairModel` is built over the enumerated valid keys of a
space; ``add`` learns a successful measurement, ``take`` marks a key measured
or outstanding (never proposed again), ``propose`` returns an available key
(Thompson sampling) or ``None`` before two measurements or when none is left,
and ``most_promising`` ranks given keys by the posterior mean. It never
measures, never touches Optuna, and is deterministic for a given ``seed``.

Imports numpy, threadpoolctl, :mod:`tiletune.tuner.search.encoding`, :mod:`tiletune.tuner.search.strategy`
(its options) and the standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from threadpoolctl import ThreadpoolController

from tiletune.tuner.search.encoding import Encoding, Key
from tiletune.tuner.search.strategy import TpeOptions

#: Successful measurements before the model clips its targets (``clip_quantile``).
CLIP_MIN_MEASUREMENTS = 32

#: Below this size a triangular inverse is LAPACK's; above it, built from two halves.
TRIANGULAR_BLOCK = 64

_blas: ThreadpoolController | None = None


class PairModel:
    """A Bayesian linear model of log time over knob values, pairs of values and trends.

    Features: one per value of each knob, one per pair of (binned) values
    of two knobs, and per knob of three or more values a linear and a
    quadratic trend over its position (values are ordered), over the
    enumerated valid configs. The value features learn what was measured;
    the trends carry it to values not measured yet (tiles twice as large as
    the best so far, when time has fallen with tile size). Learns from every
    successful measurement (failures say nothing about speed and are left
    out), so it knows which values and combinations are fast across the whole
    space. ``propose`` is Thompson sampling: draw weights from the posterior
    (noise scaled by ``temperature``) and return the unmeasured valid config
    with the lowest prediction; ``most_promising`` ranks given configs by the
    posterior mean.
    """

    def __init__(
        self,
        enc: Encoding,
        keys: Sequence[Key],
        *,
        pair_bins: int,
        pair_prior: float,
        trend_prior: float,
        temperature: float,
        seed: int | None,
        clip_quantile: float = 1.0,
    ) -> None:
        """Settings as in :class:`~tiletune.tuner.search.strategy.TpeOptions` (``model_*``)."""
        keys_array = np.asarray(keys, dtype=np.int32).reshape(len(keys), len(enc.sizes))
        columns, width, main_width = self._columns(enc, keys_array, pair_bins)
        self._features = np.stack(columns, axis=1) if columns else np.zeros((len(keys), 0), np.int32)
        self._columns_t = np.ascontiguousarray(self._features.T)
        self._trends = self._trend_columns(enc, keys_array)
        self._trend_start = width
        width += self._trends.shape[1]
        self._enc = enc
        self._floor_turns = 0
        self._volume = np.bincount(self._features.ravel(), minlength=width).astype(float)
        self._keys = list(keys)
        self._rows = {key: row for row, key in enumerate(self._keys)}
        self._available = np.ones(len(self._keys), dtype=bool)
        self._xtx = np.zeros((width, width))
        self._xty = np.zeros(width)
        self._ys: list[float] = []
        self._learned_rows: list[int] = []
        self._clip_quantile = clip_quantile
        self._prior_scale = np.ones(width)
        self._prior_scale[main_width : self._trend_start] = pair_prior
        self._prior_scale[self._trend_start :] = trend_prior
        self._temperature = temperature
        self._rng = np.random.default_rng(seed)
        self._fit: tuple[Any, Any] | None = None
        self._fitted_at = 0

    @classmethod
    def from_options(
        cls, enc: Encoding, keys: Sequence[Key], options: TpeOptions, seed: int | None
    ) -> PairModel:
        """The model with the ``model_*`` settings of ``options``."""
        return cls(
            enc,
            keys,
            pair_bins=options.model_pair_bins,
            pair_prior=options.model_pair_prior,
            trend_prior=options.model_trend_prior,
            temperature=options.model_temperature,
            seed=seed,
            clip_quantile=options.model_clip_quantile,
        )

    @staticmethod
    def _columns(enc: Encoding, keys: Any, pair_bins: int) -> tuple[list[Any], int, int]:
        """Feature index columns (main effects, then pairs), total width, width of intercept + mains."""
        columns: list[Any] = []
        width = 1  # feature 0 is the intercept
        for i in enc.free:
            columns.append(keys[:, i] + width)
            width += enc.sizes[i]
        main_width = width
        if pair_bins > 0:
            bins = {i: min(enc.sizes[i], pair_bins) for i in enc.free}
            binned = {i: keys[:, i] * bins[i] // enc.sizes[i] for i in enc.free}
            for a, i in enumerate(enc.free):
                for j in enc.free[a + 1 :]:
                    columns.append(binned[i] * bins[j] + binned[j] + width)
                    width += bins[i] * bins[j]
        return columns, width, main_width

    @staticmethod
    def _trend_columns(enc: Encoding, keys: Any) -> Any:
        """Per knob of 3+ values: its position scaled to [-1, 1], and that squared (centred)."""
        trends = []
        for i in enc.free:
            if enc.sizes[i] >= 3:
                position = keys[:, i] * (2.0 / (enc.sizes[i] - 1)) - 1.0
                trends += [position, position**2 - 1.0 / 3.0]
        if not trends:
            return np.zeros((len(keys), 0))
        return np.stack(trends, axis=1)

    def _predict(self, weights: Any, rows: Any) -> Any:
        """Predicted log time (less the intercept) of the configs at ``rows`` under ``weights``."""
        if rows.size * 4 < len(self._keys):  # a few rows: gather them
            predicted = weights[self._features[rows]].sum(axis=1)
            if self._trends.shape[1]:
                predicted = predicted + self._trends[rows] @ weights[self._trend_start :]
            return predicted
        # Most rows: one gather per feature column over every row is several times faster.
        predicted = np.zeros(len(self._keys))
        for column in self._columns_t:
            predicted += np.take(weights, column)
        if self._trends.shape[1]:
            predicted += self._trends @ weights[self._trend_start :]
        return predicted[rows]

    def take(self, key: Key) -> None:
        """Never propose ``key`` (measured or outstanding)."""
        row = self._rows.get(key)
        if row is not None:
            self._available[row] = False

    def add(self, key: Key, time_ms: float) -> None:
        """Learn a successful measurement."""
        row = self._rows.get(key)
        if row is None:
            return
        self.take(key)
        trends = self._trends[row]
        features = np.concatenate(([0], self._features[row], self._trend_start + np.arange(trends.size)))
        values = np.concatenate((np.ones(1 + self._features.shape[1]), trends))
        y = math.log(time_ms)
        self._xtx[np.ix_(features, features)] += np.outer(values, values)
        self._xty[features] += values * y
        self._ys.append(y)
        self._learned_rows.append(row)

    def propose(self, temperature_scale: float = 1.0) -> Key | None:
        """Thompson sampling: the best unmeasured valid config under a posterior draw.

        ``temperature_scale`` multiplies the model's temperature for this draw
        (above 1: explore further from what the posterior mean prefers).
        """
        rows = np.flatnonzero(self._available)
        if rows.size == 0 or len(self._ys) < 2:
            return None
        return self._draw(rows, temperature_scale)

    def propose_floor(self, share: float, temperature_scale: float = 1.0) -> Key | None:
        """A config in the region furthest below its floor (``TpeOptions.floor_share``).

        Regions are the value and pair-cell features; a region's floor is ``share`` times its
        fraction of the valid configs times the configs measured or outstanding so far. Turns
        alternate between Thompson sampling inside the region and the most promising (posterior
        mean) available one-knob neighbour, inside the region, of its best measured configs (a
        climb, so a region found only through a poor config is still climbed). ``None`` when no
        region with an available config is below its floor (or before two measurements).
        """
        if len(self._ys) < 2 or not self._available.any():
            return None
        taken = np.bincount(self._features[~self._available].ravel(), minlength=self._volume.size)
        free = self._volume - taken
        deficit = share * self._volume * (len(self._keys) - int(self._available.sum())) / len(self._keys)
        deficit -= taken
        deficit[0] = 0.0  # the intercept is no region
        deficit[free <= 0] = 0.0
        cell = int(np.argmax(deficit))
        if deficit[cell] <= 0:
            return None
        in_cell = (self._features == cell).any(axis=1)
        self._floor_turns += 1
        if self._floor_turns % 2 == 0:
            key = self._climb(in_cell)
            if key is not None:
                return key
        rows = np.flatnonzero(self._available & in_cell)
        return self._draw(rows, temperature_scale)

    def _draw(self, rows: Any, temperature_scale: float) -> Key:
        """The config at ``rows`` with the lowest prediction under one posterior draw of the weights."""
        mean, root = self._posterior()
        noise = self._temperature * temperature_scale
        weights = mean + noise * (root @ self._rng.standard_normal(len(mean)))
        predicted = self._predict(weights, rows)
        return self._keys[int(rows[int(np.argmin(predicted))])]

    def _climb(self, in_cell: Any, bases: int = 3) -> Key | None:
        """The most promising available neighbour in the region of its ``bases`` best measured configs."""
        learned = np.asarray(self._learned_rows)
        mine = learned[in_cell[learned]]
        if mine.size == 0:
            return None
        ys = np.asarray(self._ys)[in_cell[learned]]
        fresh: dict[Key, None] = {}
        for row in mine[np.argsort(ys, kind="stable")[:bases]]:
            for key in self._enc.neighbours(self._keys[int(row)]):
                near = self._rows.get(key)
                if near is not None and self._available[near] and in_cell[near]:
                    fresh[key] = None
        return self.most_promising(list(fresh)) if fresh else None

    def most_promising(self, keys: Sequence[Key]) -> Key:
        """The key with the lowest posterior-mean prediction (the first before there is data)."""
        if len(self._ys) < 2:
            return keys[0]
        mean = self._posterior()[0]
        predicted = self._predict(mean, np.asarray([self._rows[key] for key in keys]))
        return keys[int(np.argmin(predicted))]

    def _posterior(self) -> tuple[Any, Any]:
        """Posterior mean of the weights and a root ``R`` of their covariance (``R @ R.T``).

        The fit (Cholesky, cubic in the number of features) is redone after
        each new measurement early on and after every 1/16 more later, which
        keeps the cost per ask in milliseconds.
        """
        count = len(self._ys)
        if self._fit is None or count - self._fitted_at >= max(1, count // 16):
            self._fit = self._refit()
            self._fitted_at = count
        return self._fit

    def _targets(self) -> tuple[Any, Any]:
        """The log times the model fits and their products with the features (``X^T y``).

        With ``clip_quantile`` below 1, log times above that quantile of the
        measured ones are clipped to it: the model then spends its weights on
        ranking the fast configs rather than on how slow the slow ones are.
        Not before ``CLIP_MIN_MEASUREMENTS``: a quantile of a handful says little,
        and a small budget keeps the whole trend (time falling with tile size).
        """
        ys = np.asarray(self._ys)
        if self._clip_quantile >= 1.0 or ys.size < CLIP_MIN_MEASUREMENTS:
            return ys, self._xty
        ys = np.minimum(ys, np.quantile(ys, self._clip_quantile))
        rows = np.asarray(self._learned_rows)
        features = self._features[rows]
        xty = np.bincount(
            features.ravel(), weights=np.repeat(ys, features.shape[1]), minlength=self._xty.size
        ).astype(float)
        xty[0] += ys.sum()
        if self._trends.shape[1]:
            xty[self._trend_start :] += self._trends[rows].T @ ys
        return ys, xty

    def _refit(self) -> tuple[Any, Any]:
        ys, xty = self._targets()
        prior_var = max(float(ys.var()), 1e-6) * self._prior_scale
        noise_var = float(prior_var[0]) / 4.0
        precision = self._xtx / noise_var + np.diag(1.0 / prior_var)
        precision[0, 0] = self._xtx[0, 0] / noise_var + 1e-9  # a flat prior on the intercept
        rhs = (xty - float(ys.mean()) * self._xtx[0]) / noise_var
        # One BLAS thread: the fit is small, and idle BLAS threads spinning on the
        # other cores would disturb the measurement that follows on a small machine.
        with _blas_threads().limit(limits=1, user_api="blas"):
            inverse_root = lower_inverse(np.linalg.cholesky(precision))  # L^-1 where precision = L L^T
        mean = inverse_root.T @ (inverse_root @ rhs)
        return mean, inverse_root.T


def lower_inverse(lower: Any) -> Any:
    """The inverse of a lower-triangular matrix, by 2 x 2 block recursion.

    ``[[A, 0], [C, B]]^-1 = [[A^-1, 0], [-B^-1 C A^-1, B^-1]]``: matrix products only, several
    times faster than a general inverse for the model's few hundred features (17 ms -> 3 ms at 430).
    """
    size = lower.shape[0]
    if size <= TRIANGULAR_BLOCK:
        return np.linalg.inv(lower)
    half = size // 2
    top, bottom = lower_inverse(lower[:half, :half]), lower_inverse(lower[half:, half:])
    inverse = np.zeros_like(lower)
    inverse[:half, :half] = top
    inverse[half:, half:] = bottom
    inverse[half:, :half] = -(bottom @ (lower[half:, :half] @ top))
    return inverse


def _blas_threads() -> ThreadpoolController:
    """The process's BLAS thread pools, found once (finding them costs about a millisecond)."""
    global _blas  # noqa: PLW0603 (one controller per process, made on first use)
    if _blas is None:
        _blas = ThreadpoolController()
    return _blas
