"""The search's Optuna samplers: TPE masked so that it proposes only configs the search can use.

Contract: :class:`MaskedTPESampler` behaves as Optuna's ``TPESampler`` except
that, among its candidate samples, those whose key ``usable`` rejects (invalid,
measured or outstanding) never win; ``saturated`` is set when none of the
samples was usable (the caller then picks a config itself). It never raises
for an unusable sample and never changes Optuna's storage. :func:`make_sampler`
builds the sampler of a strategy.

Imports numpy, optuna, :mod:`tiletune.tuner.search.encoding` and :mod:`tiletune.tuner.search.strategy` only.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import optuna
from optuna.samplers import BaseSampler, RandomSampler, TPESampler

from tiletune.tuner.search.encoding import Encoding, Key
from tiletune.tuner.search.strategy import TpeOptions


class MaskedTPESampler(TPESampler):
    """Optuna's TPE whose acquisition never picks a candidate the search cannot use.

    Among its ``n_ei_candidates`` samples TPE picks the best ratio of the
    "good" and "bad" densities; here candidates that are invalid or already
    measured/outstanding score ``-inf``, so it proposes the most promising *new
    valid* config when it drew one, and ``saturated`` says when it drew none.
    Hooks Optuna's ``_compute_acquisition_func`` (stable since Optuna 3); were
    the hook ever not called, the search would still filter the proposals, only
    at more asks.
    """

    def __init__(
        self,
        keys: Callable[[Mapping[str, Any]], list[Key] | None],
        usable: Callable[[Key], bool],
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._keys = keys
        self._usable = usable
        self.saturated = False

    def _compute_acquisition_func(self, samples: Any, mpe_below: Any, mpe_above: Any) -> Any:
        values = super()._compute_acquisition_func(samples, mpe_below, mpe_above)
        keys = self._keys(samples)
        if keys is None or len(keys) != len(values):
            return values
        usable = np.fromiter((self._usable(key) for key in keys), dtype=bool, count=len(keys))
        self.saturated = not usable.any()
        return np.where(usable, values, -np.inf)


def make_sampler(
    strategy: str,
    enc: Encoding,
    usable: Callable[[Key], bool],
    *,
    seed: int | None,
    n_startup: int,
    options: TpeOptions,
) -> BaseSampler:
    """The Optuna sampler of a strategy: masked multivariate TPE for ``tpe``, else random."""
    if strategy != "tpe":
        return RandomSampler(seed=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return MaskedTPESampler(
            keys=enc.keys_from_samples,
            usable=usable,
            seed=seed,
            n_startup_trials=n_startup,
            n_ei_candidates=options.n_ei_candidates,
            multivariate=True,
            constant_liar=True,
        )
