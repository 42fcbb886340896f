"""The search driver: Optuna ask-and-tell over a declarative space with constraints.

A :class:`SearchSpace` is a set of integer knobs with ordered candidate values
(order = adjacency), a constraint (``invalid_reason``) and seed configs. A
:class:`Search` proposes configs to measure (``ask``) and takes their results
(``tell``); it never runs anything itself, so the same object drives a local
tuning loop, a replay benchmark, or (later) the server's worker protocol.

Contract of :class:`Search`:

- ``ask(n)`` returns up to ``n`` configs to measure now, each with a
  ``trial_id``: never an invalid config (the constraint says why), never a config
  already measured or outstanding. It returns ``[]`` when the search is done or
  every remaining valid config is outstanding. Several candidates may be
  outstanding at once (parallel workers; TPE runs with Optuna's constant liar).
- ``tell(trial_id, time_ms)`` records a measurement; ``tell(trial_id, None,
  error)`` a measured failure (crash, wrong result). Telling a trial again is a
  no-op; telling a trial that was never asked raises ``ValueError``.
- Seeds are measured first, in order. Configs the sampler proposes that are
  invalid are told to Optuna as infeasible (so TPE steers away) and counted
  ``invalid``; configs already measured are answered from the record and counted
  ``duplicate``; measured failures are counted ``failed``.
- Budgets: ``max_trials`` unique valid measurements (failures included),
  ``max_time_s`` by the injected ``clock``, ``patience`` consecutive
  measurements without improving the best by more than ``min_improvement``
  (relative), and exhaustion of the valid space. ``stop_reason`` says which.

Strategies: ``grid`` measures every valid config once (the ground truth);
``random`` is plain random search, Optuna's ``RandomSampler`` with invalid and
repeated proposals rejected (what we compare against); ``tpe`` (default) is
ours, see :class:`TpeOptions`: after the seeds and a few random configs it
interleaves three sources of proposals, all recorded as trials of one study:

- a *model*: a Bayesian linear model of log time over knob values and pairs of
  values, fit on every measurement; Thompson sampling from it picks the best
  unmeasured valid config of the whole space (finds the good regions, not only
  the basin of the best config so far);
- *local search*: the most promising (by the model) unmeasured valid neighbour
  (one knob changed) of the best configs so far (finishes a region off);
- Optuna's multivariate TPE (constant liar; its acquisition is masked so that
  it proposes new valid configs only).

The state of a search lives in its Optuna study (user attributes mark each
trial ``measured``, ``failed``, ``invalid`` or ``duplicate``), so a ``Search``
built over an existing study resumes it. One ``Search`` object per study at a
time: it is not safe for concurrent use.

Imports optuna, numpy, threadpoolctl and the standard library only (never torch or
tiletune.kernels): the server runs this module without kernels.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, IntDistribution
from optuna.samplers import BaseSampler, RandomSampler, TPESampler
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, Trial, TrialState
from threadpoolctl import threadpool_limits

Config = dict[str, int]
#: A config as the tuple of its value indices, in knob order (the internal form).
Key = tuple[int, ...]

STRATEGIES = ("tpe", "random", "grid")

#: Spaces whose knob product is at most this are enumerated once (valid set, model, exhaustion).
ENUMERATE_LIMIT = 100_000

#: Consecutive sampler proposals that bring nothing new before a uniform random pick replaces them.
MAX_SAMPLER_REJECTIONS = 16

#: Random draws from a product too large to enumerate before the space is declared exhausted.
MAX_BLIND_DRAWS = 20_000

_KIND = "tiletune_kind"
_REASON = "tiletune_reason"
_CONSTRAINT = "valid"


@dataclass(frozen=True)
class SearchSpace:
    """What may be searched: knobs, a constraint and the configs to measure first.

    ``knobs`` maps each knob to its candidate values (ints, distinct, ordered:
    neighbouring values are adjacent). ``invalid_reason`` returns why a config
    must never be measured, or ``None`` when it is valid. ``seeds`` are
    measured first, in order (the kernel's default config; later the best
    configs of neighbouring shapes); invalid or repeated seeds are skipped.
    """

    knobs: Mapping[str, Sequence[int]]
    invalid_reason: Callable[[Config], str | None]
    seeds: Sequence[Config] = ()


@dataclass(frozen=True)
class Candidate:
    """A config to measure, and the id to tell its result under."""

    trial_id: int
    config: Config


@dataclass(frozen=True)
class SearchCounts:
    """Trials by outcome: ``completed`` and ``failed`` are unique measurements."""

    completed: int = 0
    invalid: int = 0
    duplicate: int = 0
    failed: int = 0

    @property
    def measured(self) -> int:
        """Unique valid configs measured (successes and failures): what budgets count."""
        return self.completed + self.failed

    def as_dict(self) -> dict[str, int]:
        """The counts as a JSON-ready dict."""
        return {
            "completed": self.completed,
            "invalid": self.invalid,
            "duplicate": self.duplicate,
            "failed": self.failed,
        }


@dataclass(frozen=True)
class TpeOptions:
    """How the ``tpe`` strategy mixes its sources; defaults chosen on the replay benchmark.

    - ``n_startup``: uniform random valid configs measured after the seeds, at
      most a quarter of ``max_trials`` when the search has one (a small budget
      goes to guided search, not to random draws);
    - ``model_share`` / ``local_share``: fractions of the later asks given to
      the model (Thompson sampling) and to local search; TPE gets the rest;
    - ``local_top``: local search looks at the neighbours of this many best configs;
    - ``model_temperature``: scale of the posterior noise in Thompson sampling
      (1 = plain Thompson sampling; lower exploits more);
    - ``model_pair_prior``: prior variance of a pair-of-values weight relative to a
      single value's; ``model_pair_bins``: knobs with more values are binned (by
      adjacent values) into this many for pair features, which bounds the cost;
    - ``model_trend_prior``: prior variance of a trend weight (linear or
      quadratic in a knob's position) relative to a single value's;
    - ``n_ei_candidates``: samples TPE draws per proposal (Optuna's option).

    The model needs the valid space enumerated (knob product at most
    ``ENUMERATE_LIMIT``); without it, its share goes to TPE and local search
    takes neighbours in order.
    """

    n_startup: int = 10
    model_share: float = 0.45
    local_share: float = 0.45
    local_top: int = 8
    model_temperature: float = 0.35
    model_pair_prior: float = 0.5
    model_pair_bins: int = 16
    model_trend_prior: float = 16.0
    n_ei_candidates: int = 24

    def __post_init__(self) -> None:
        shares = (self.model_share, self.local_share)
        if any(not 0.0 <= share <= 1.0 for share in shares) or sum(shares) > 1.0 + 1e-9:
            raise ValueError("options: model_share and local_share must be in [0, 1] and sum to at most 1")
        if self.n_startup < 0 or self.local_top < 1 or self.model_pair_bins < 0 or self.n_ei_candidates < 1:
            raise ValueError(
                "options: n_startup >= 0, local_top >= 1, model_pair_bins >= 0, n_ei_candidates >= 1"
            )
        if self.model_temperature < 0 or self.model_pair_prior <= 0 or self.model_trend_prior <= 0:
            raise ValueError(
                "options: model_temperature >= 0, model_pair_prior > 0 and model_trend_prior > 0"
            )


class _Encoding:
    """Maps configs to keys (tuples of value indices in knob order) and to Optuna params."""

    def __init__(self, knobs: Mapping[str, Sequence[int]]) -> None:
        if not knobs:
            raise ValueError("knobs: the search space has no knobs")
        self.names = list(knobs)
        self.values = [tuple(knobs[name]) for name in self.names]
        for name, values in zip(self.names, self.values, strict=True):
            _check_knob(name, values)
        self.sizes = [len(values) for values in self.values]
        self.index = [{value: i for i, value in enumerate(values)} for values in self.values]
        self.free = [i for i, size in enumerate(self.sizes) if size > 1]
        self.distributions: dict[str, BaseDistribution] = {
            self.names[i]: IntDistribution(0, self.sizes[i] - 1) for i in self.free
        }
        self.product_size = math.prod(self.sizes)

    def config(self, key: Key) -> Config:
        return {name: values[i] for name, values, i in zip(self.names, self.values, key, strict=True)}

    def key(self, config: Mapping[str, int]) -> Key:
        """The key of a config; raises ``ValueError`` for a missing knob or an unknown value."""
        try:
            return tuple(index[config[name]] for name, index in zip(self.names, self.index, strict=True))
        except (KeyError, TypeError):
            raise ValueError(f"config {dict(config)} is outside the space's knobs and values") from None

    def params(self, key: Key) -> dict[str, int]:
        return {self.names[i]: key[i] for i in self.free}

    def key_from_params(self, params: Mapping[str, Any]) -> Key:
        return tuple(int(params.get(name, 0)) for name in self.names)

    def keys_from_samples(self, samples: Mapping[str, Any]) -> list[Key] | None:
        """Keys of TPE's candidate samples (internal repr: an index per free knob), if complete."""
        if not self.free or any(self.names[i] not in samples for i in self.free):
            return None
        count = len(samples[self.names[self.free[0]]])
        columns = [
            np.rint(samples[name]).astype(int).tolist() if name in samples else [0] * count
            for name in self.names
        ]
        return list(zip(*columns, strict=True))

    def all_keys(self) -> Iterator[Key]:
        return itertools.product(*(range(size) for size in self.sizes))

    def neighbours(self, key: Key) -> Iterator[Key]:
        """Keys that differ from ``key`` in one knob, nearest values first."""
        radius = max((self.sizes[i] for i in self.free), default=0)
        for distance in range(1, radius):
            for i in self.free:
                for position in (key[i] - distance, key[i] + distance):
                    if 0 <= position < self.sizes[i]:
                        yield (*key[:i], position, *key[i + 1 :])


def _check_knob(name: str, values: Sequence[int]) -> None:
    if not values:
        raise ValueError(f"knobs: knob {name!r} has no values")
    if any(isinstance(value, bool) or not isinstance(value, int) for value in values):
        raise ValueError(f"knobs: knob {name!r} has a non-integer value")
    if len(set(values)) != len(values):
        raise ValueError(f"knobs: knob {name!r} repeats a value")


class _MaskedTPESampler(TPESampler):
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


class _PairModel:
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

    def __init__(self, enc: _Encoding, keys: Sequence[Key], options: TpeOptions, seed: int | None) -> None:
        keys_array = np.asarray(keys, dtype=np.int32).reshape(len(keys), len(enc.sizes))
        columns, width, main_width = self._columns(enc, keys_array, options.model_pair_bins)
        self._features = np.stack(columns, axis=1) if columns else np.zeros((len(keys), 0), np.int32)
        self._trends = self._trend_columns(enc, keys_array)
        self._trend_start = width
        width += self._trends.shape[1]
        self._keys = list(keys)
        self._rows = {key: row for row, key in enumerate(self._keys)}
        self._available = np.ones(len(self._keys), dtype=bool)
        self._xtx = np.zeros((width, width))
        self._xty = np.zeros(width)
        self._ys: list[float] = []
        self._prior_scale = np.ones(width)
        self._prior_scale[main_width : self._trend_start] = options.model_pair_prior
        self._prior_scale[self._trend_start :] = options.model_trend_prior
        self._temperature = options.model_temperature
        self._rng = np.random.default_rng(seed)
        self._fit: tuple[Any, Any] | None = None
        self._fitted_at = 0

    @staticmethod
    def _columns(enc: _Encoding, keys: Any, pair_bins: int) -> tuple[list[Any], int, int]:
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
    def _trend_columns(enc: _Encoding, keys: Any) -> Any:
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
        predicted = weights[self._features[rows]].sum(axis=1)
        if self._trends.shape[1]:
            predicted = predicted + self._trends[rows] @ weights[self._trend_start :]
        return predicted

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

    def propose(self) -> Key | None:
        """Thompson sampling: the best unmeasured valid config under a posterior draw."""
        rows = np.flatnonzero(self._available)
        if rows.size == 0 or len(self._ys) < 2:
            return None
        mean, root = self._posterior()
        weights = mean + self._temperature * (root @ self._rng.standard_normal(len(mean)))
        predicted = self._predict(weights, rows)
        return self._keys[int(rows[int(np.argmin(predicted))])]

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

    def _refit(self) -> tuple[Any, Any]:
        ys = np.asarray(self._ys)
        prior_var = max(float(ys.var()), 1e-6) * self._prior_scale
        noise_var = float(prior_var[0]) / 4.0
        precision = self._xtx / noise_var + np.diag(1.0 / prior_var)
        precision[0, 0] = self._xtx[0, 0] / noise_var + 1e-9  # a flat prior on the intercept
        rhs = (self._xty - float(ys.mean()) * self._xtx[0]) / noise_var
        # One BLAS thread: the fit is small, and idle BLAS threads spinning on the
        # other cores would disturb the measurement that follows on a small machine.
        with threadpool_limits(limits=1, user_api="blas"):
            inverse_root = np.linalg.inv(np.linalg.cholesky(precision))  # L^-1 where precision = L L^T
        mean = inverse_root.T @ (inverse_root @ rhs)
        return mean, inverse_root.T


class _Schedule:
    """Interleaves sources by share: each turn, the sources in order of accumulated credit."""

    def __init__(self, shares: Mapping[str, float]) -> None:
        self._shares = dict(shares)
        self._credit = dict.fromkeys(shares, 0.0)

    def turn(self) -> list[str]:
        for name, share in self._shares.items():
            self._credit[name] += share
        order = sorted(self._credit, key=lambda name: -self._credit[name])
        self._credit[order[0]] -= 1.0
        return order


@dataclass
class _Pending:
    trial: Trial
    key: Key


class Search:
    """Ask-and-tell search over a :class:`SearchSpace`; see the module docstring for the contract."""

    def __init__(  # noqa: PLR0917 (the positional order is the public API)
        self,
        space: SearchSpace,
        strategy: str = "tpe",
        seed: int | None = None,
        max_trials: int | None = None,
        max_time_s: float | None = None,
        patience: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        *,
        min_improvement: float = 0.005,
        storage: str | BaseStorage | None = None,
        study_name: str | None = None,
        options: TpeOptions | None = None,
    ) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(
                f"strategy: unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}"
            )
        for name, value in (("max_trials", max_trials), ("max_time_s", max_time_s), ("patience", patience)):
            if value is not None and not value > 0:
                raise ValueError(f"{name}: must be positive when given, got {value!r}")
        self.strategy = strategy
        self._space = space
        self._enc = _Encoding(space.knobs)
        self._options = options or TpeOptions()
        self._startup = self._options.n_startup
        if max_trials is not None:
            self._startup = min(self._startup, max_trials // 4)
        self._rng = random.Random(seed)
        self._max_trials = max_trials
        self._max_time_s = max_time_s
        self._patience = patience
        self._min_improvement = min_improvement
        self._clock = clock
        self._started_s = clock()
        self._validity: dict[Key, str | None] = {}
        self._valid_keys = self._enumerate_valid()
        self._grid = self._grid_keys() if strategy == "grid" else iter(())
        self._model = self._make_model(seed)
        self._schedule = _Schedule(
            {
                "model": self._options.model_share if self._model is not None else 0.0,
                "local": self._options.local_share,
                "tpe": 1.0 - self._options.local_share - (self._options.model_share if self._model else 0.0),
            }
        )
        self._record: dict[Key, float | str] = {}
        self._ranked: list[tuple[float, int, Key]] = []
        self._explored: set[Key] = set()
        self._pending: dict[int, _Pending] = {}
        self._pending_keys: set[Key] = set()
        self._told: set[int] = set()
        self._counts = {"completed": 0, "invalid": 0, "duplicate": 0, "failed": 0}
        self._history: list[float] = []
        self._since_improvement = 0
        self._rejections = 0
        self._local_turns = 0
        self._exhausted = False
        self._stop_reason: str | None = None
        self._study = optuna.create_study(
            storage=storage,
            study_name=study_name,
            sampler=self._make_sampler(seed),
            direction="minimize",
            load_if_exists=True,
        )
        self._seeds: list[Key] = []
        self._trials_seen = 0
        if not self._restore():
            self._seeds = self._seed_keys()

    # -- public API -------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        """True once a budget is spent, the search converged, or every valid config is measured."""
        return self.stop_reason is not None

    @property
    def stop_reason(self) -> str | None:
        """``max_trials``, ``max_time``, ``patience``, ``exhausted``, or ``None`` while running."""
        if self._stop_reason is None:
            self._stop_reason = self._check_stop()
        return self._stop_reason

    @property
    def counts(self) -> SearchCounts:
        """Trials so far by outcome."""
        return SearchCounts(**self._counts)

    @property
    def outstanding(self) -> int:
        """Candidates asked and not yet told."""
        return len(self._pending)

    @property
    def space_size(self) -> int | None:
        """How many valid configs the space holds, when it was small enough to enumerate."""
        return len(self._valid_keys) if self._valid_keys is not None else None

    @property
    def history(self) -> list[float]:
        """Best time so far after each unique valid measurement (``inf`` until one succeeds)."""
        return list(self._history)

    @property
    def study(self) -> optuna.Study:
        """The Optuna study holding every trial (measured, failed, invalid, duplicate)."""
        return self._study

    def best(self, k: int = 1) -> list[tuple[Config, float]]:
        """The ``k`` fastest measured configs with their times in ms, fastest first."""
        return [(self._enc.config(key), time_ms) for time_ms, _, key in self._ranked[:k]]

    def ask(self, n: int = 1) -> list[Candidate]:
        """Up to ``n`` new valid configs to measure now; ``[]`` when done or nothing is left to ask."""
        if n < 1:
            raise ValueError(f"n: must be at least 1, got {n}")
        candidates: list[Candidate] = []
        while len(candidates) < n and self._room() > 0:
            candidate = self._propose()
            if candidate is None:
                break
            candidates.append(candidate)
        return candidates

    def tell(self, trial_id: int, time_ms: float | None, error: str | None = None) -> None:
        """Record the outcome of an asked candidate: a time in ms, or ``None`` and the error.

        A time must be finite and positive; an ``error`` marks the trial failed
        whatever the time. Telling the same trial again does nothing.
        """
        if trial_id in self._told:
            return
        pending = self._pending.get(trial_id)
        if pending is None:
            raise ValueError(f"trial_id: no outstanding trial {trial_id}")
        if error is None and (time_ms is None or not math.isfinite(time_ms) or time_ms <= 0):
            raise ValueError(f"time_ms: a measurement must be a positive finite time, got {time_ms!r}")
        del self._pending[trial_id]
        self._pending_keys.discard(pending.key)
        self._told.add(trial_id)
        if error is not None:
            self._tell_infeasible(pending.trial, "failed", error)
            self._record_failure(pending.key, error)
        else:
            assert time_ms is not None
            self._tell_measured(pending.trial, float(time_ms))
            self._record_time(pending.key, float(time_ms))

    def abandon(self, trial_id: int, reason: str = "abandoned") -> None:
        """Give an asked candidate back unmeasured (its worker went away): it is asked again first.

        The Optuna trial is failed (it counts in no budget) and its config goes
        to the front of the queue. Abandoning a told or abandoned trial does
        nothing; one that was never asked raises ``ValueError``.
        """
        if trial_id in self._told:
            return
        pending = self._pending.pop(trial_id, None)
        if pending is None:
            raise ValueError(f"trial_id: no outstanding trial {trial_id}")
        self._pending_keys.discard(pending.key)
        self._told.add(trial_id)
        pending.trial.set_user_attr(_KIND, "abandoned")
        pending.trial.set_user_attr(_REASON, reason)
        self._study.tell(pending.trial, state=TrialState.FAIL)
        self._seeds.insert(0, pending.key)
        self._stop_reason = None

    @property
    def trials_seen(self) -> int:
        """Trials of the study this object created or took up.

        Fewer than the study holds means another process added some: this
        object is stale, and a new ``Search`` over the study resumes it.
        """
        return self._trials_seen

    @property
    def outstanding_ids(self) -> list[int]:
        """Trial ids asked and not yet told or abandoned."""
        return list(self._pending)

    # -- proposing --------------------------------------------------------------------------

    def _room(self) -> int:
        """How many more candidates may be outstanding now."""
        if self.done or self._exhausted:
            return 0
        in_flight = self._measured() + len(self._pending)
        room = math.inf if self._max_trials is None else self._max_trials - in_flight
        if self._valid_keys is not None:
            room = min(room, len(self._valid_keys) - in_flight)
        return int(max(0, min(room, 1 << 30)))

    def _propose(self) -> Candidate | None:
        """The next new valid config as an asked trial, or ``None`` when none can be found now."""
        while True:
            key = self._planned_key()
            if key is not None:
                return self._start_fixed(key)
            if self._rejections >= MAX_SAMPLER_REJECTIONS or self._sampler_saturated():
                self._rejections = 0
                key = self._random_new_key()
                return self._start_fixed(key) if key is not None else None
            candidate = self._start_sampled()
            if candidate is not None:
                return candidate

    def _planned_key(self) -> Key | None:
        """A config chosen here rather than by the sampler (``None``: ask the sampler)."""
        while self._seeds:
            key = self._seeds.pop(0)
            if self._is_new(key):
                return key
        if self.strategy == "grid":
            return self._next_grid_key()
        if self.strategy == "random":
            return None
        if self._measured() + len(self._pending) < self._startup:
            return self._random_new_key()
        for source in self._schedule.turn():
            if source == "tpe":
                return None
            proposed = self._model.propose() if source == "model" and self._model else self._local_key()
            if proposed is not None:
                return proposed
        return None

    def _next_grid_key(self) -> Key | None:
        for key in self._grid:
            if self._is_new(key):
                return key
        self._exhausted = True
        return None

    def _random_new_key(self) -> Key | None:
        """A uniformly random valid config neither measured nor outstanding."""
        if self._valid_keys is None:
            return self._blind_new_key()
        for _ in range(64):
            key = self._rng.choice(self._valid_keys)
            if self._is_new(key):
                return key
        remaining = [key for key in self._valid_keys if self._is_new(key)]
        return self._rng.choice(remaining) if remaining else None

    def _blind_new_key(self) -> Key | None:
        """Random draws from a product too large to enumerate; marks exhaustion when all fail."""
        for _ in range(MAX_BLIND_DRAWS):
            key = tuple(self._rng.randrange(size) for size in self._enc.sizes)
            if self._is_new(key) and self._is_valid(key):
                return key
        self._exhausted = True
        return None

    def _local_key(self) -> Key | None:
        """An unmeasured valid neighbour of the ``local_top`` best configs.

        Turns alternate between a sweep (the nearest fresh neighbour of the best
        config that has one, so no direct improvement of the best is ever left
        out) and, with a model, the most promising fresh neighbour of any of them.
        """
        self._local_turns += 1
        guided = self._model is not None and self._local_turns % 2 == 0
        fresh: dict[Key, None] = {}
        for _, _, base in self._ranked[: self._options.local_top]:
            if base in self._explored:
                continue
            mine = [key for key in self._enc.neighbours(base) if self._is_new(key) and self._is_valid(key)]
            if not mine:
                self._explored.add(base)
            elif not guided:
                return mine[0]
            fresh.update(dict.fromkeys(mine))
        if not fresh or self._model is None:
            return None
        return self._model.most_promising(list(fresh))

    def _sampler_saturated(self) -> bool:
        """True (once) when TPE's last samples held no new valid config: asking again would repeat."""
        sampler = self._study.sampler
        if isinstance(sampler, _MaskedTPESampler) and sampler.saturated:
            sampler.saturated = False
            return True
        return False

    def _start_fixed(self, key: Key) -> Candidate:
        """Ask Optuna for a trial with the given config (``enqueue_trial``)."""
        self._study.enqueue_trial(self._enc.params(key))
        trial = self._study.ask(self._enc.distributions)
        self._trials_seen += 1
        return self._register(trial, self._enc.key_from_params(trial.params))

    def _start_sampled(self) -> Candidate | None:
        """Ask the sampler; an invalid or repeated proposal is answered at once (``None``)."""
        trial = self._study.ask(self._enc.distributions)
        self._trials_seen += 1
        key = self._enc.key_from_params(trial.params)
        reason = self._invalid_reason(key)
        if reason is not None:
            self._rejections += 1
            self._counts["invalid"] += 1
            self._tell_infeasible(trial, "invalid", reason)
        elif key in self._record or key in self._pending_keys:
            self._rejections += 1
            self._counts["duplicate"] += 1
            self._tell_duplicate(trial, key)
        else:
            self._rejections = 0
            return self._register(trial, key)
        return None

    def _register(self, trial: Trial, key: Key) -> Candidate:
        self._pending[trial.number] = _Pending(trial, key)
        self._pending_keys.add(key)
        if self._model is not None:
            self._model.take(key)
        return Candidate(trial_id=trial.number, config=self._enc.config(key))

    # -- telling Optuna ---------------------------------------------------------------------

    def _tell_measured(self, trial: Trial, time_ms: float) -> None:
        trial.set_user_attr(_KIND, "measured")
        self._study.tell(trial, time_ms)

    def _tell_infeasible(self, trial: Trial, kind: str, reason: str) -> None:
        """Invalid or failed: pruned with a violated constraint, which TPE ranks below every result."""
        trial.set_user_attr(_KIND, kind)
        trial.set_user_attr(_REASON, reason)
        trial.set_constraint(_CONSTRAINT, 1.0)
        self._study.tell(trial, state=TrialState.PRUNED)

    def _tell_duplicate(self, trial: Trial, key: Key) -> None:
        """Answer a repeated proposal from the record; a repeat of an outstanding one fails."""
        recorded = self._record.get(key)
        trial.set_user_attr(_KIND, "duplicate")
        if isinstance(recorded, float):
            self._study.tell(trial, recorded)
        elif isinstance(recorded, str):
            trial.set_user_attr(_REASON, recorded)
            trial.set_constraint(_CONSTRAINT, 1.0)
            self._study.tell(trial, state=TrialState.PRUNED)
        else:
            self._study.tell(trial, state=TrialState.FAIL)

    # -- bookkeeping ------------------------------------------------------------------------

    def _record_time(self, key: Key, time_ms: float) -> None:
        best = self._ranked[0][0] if self._ranked else math.inf
        self._record[key] = time_ms
        self._counts["completed"] += 1
        bisect.insort(self._ranked, (time_ms, len(self._record), key))
        if self._model is not None:
            self._model.add(key, time_ms)
        self._after_measurement(improved=time_ms < best * (1.0 - self._min_improvement))

    def _record_failure(self, key: Key, error: str) -> None:
        self._record[key] = error
        self._counts["failed"] += 1
        if self._model is not None:
            self._model.take(key)
        self._after_measurement(improved=False)

    def _after_measurement(self, improved: bool) -> None:
        self._history.append(self._ranked[0][0] if self._ranked else math.inf)
        self._since_improvement = 0 if improved else self._since_improvement + 1

    def _measured(self) -> int:
        return self._counts["completed"] + self._counts["failed"]

    def _check_stop(self) -> str | None:
        if self._max_trials is not None and self._measured() >= self._max_trials:
            return "max_trials"
        if self._max_time_s is not None and self._clock() - self._started_s >= self._max_time_s:
            return "max_time"
        if self._patience is not None and self._since_improvement >= self._patience:
            return "patience"
        if not self._pending and self._is_exhausted():
            return "exhausted"
        return None

    def _is_exhausted(self) -> bool:
        if self._valid_keys is not None:
            return self._measured() >= len(self._valid_keys)
        return self._exhausted

    def _is_new(self, key: Key) -> bool:
        return key not in self._record and key not in self._pending_keys

    def _is_valid(self, key: Key) -> bool:
        return self._invalid_reason(key) is None

    def _invalid_reason(self, key: Key) -> str | None:
        if key not in self._validity:
            self._validity[key] = self._space.invalid_reason(self._enc.config(key))
        return self._validity[key]

    # -- construction -----------------------------------------------------------------------

    def _enumerate_valid(self) -> list[Key] | None:
        if self._enc.product_size > ENUMERATE_LIMIT:
            return None
        return [key for key in self._enc.all_keys() if self._is_valid(key)]

    def _grid_keys(self) -> Iterator[Key]:
        """Every valid config in knob-product order (lazily when the product is not enumerated)."""
        if self._valid_keys is not None:
            return iter(self._valid_keys)
        return (key for key in self._enc.all_keys() if self._is_valid(key))

    def _make_model(self, seed: int | None) -> _PairModel | None:
        if self.strategy != "tpe" or self._valid_keys is None or self._options.model_share <= 0:
            return None
        return _PairModel(self._enc, self._valid_keys, self._options, seed)

    def _make_sampler(self, seed: int | None) -> BaseSampler:
        if self.strategy != "tpe":
            return RandomSampler(seed=seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return _MaskedTPESampler(
                keys=self._enc.keys_from_samples,
                usable=lambda key: self._is_new(key) and self._is_valid(key),
                seed=seed,
                n_startup_trials=self._startup,
                n_ei_candidates=self._options.n_ei_candidates,
                multivariate=True,
                constant_liar=True,
            )

    def _seed_keys(self) -> list[Key]:
        keys: list[Key] = []
        for config in self._space.seeds:
            key = self._enc.key(config)
            if self._invalid_reason(key) is not None:
                self._counts["invalid"] += 1
            elif key not in keys:
                keys.append(key)
        return keys

    def _restore(self) -> bool:
        """Take up an existing study's trials (a resumed job); ``False`` when the study is new."""
        trials = self._study.get_trials(deepcopy=False)
        self._trials_seen = len(trials)
        for frozen in trials:
            self._restore_trial(frozen)
        return bool(trials)

    def _restore_trial(self, frozen: FrozenTrial) -> None:
        kind = frozen.user_attrs.get(_KIND)
        key = self._enc.key_from_params(frozen.params)
        if frozen.state == TrialState.RUNNING:
            self._register(Trial(self._study, frozen._trial_id), key)
            return
        self._told.add(frozen.number)
        if kind == "measured" and frozen.value is not None:
            self._record_time(key, frozen.value)
        elif kind == "failed":
            self._record_failure(key, str(frozen.user_attrs.get(_REASON, "failed")))
        elif kind in ("invalid", "duplicate"):
            self._counts[kind] += 1
        elif kind == "abandoned" and key not in self._record:
            self._seeds.append(key)
