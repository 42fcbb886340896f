"""The search driver: Optuna ask-and-tell over a declarative space with constraints.

A :class:`SearchSpace` is a set of integer knobs with ordered candidate values
(order = adjacency), a constraint (``invalid_reason``) and seed configs. A
:class:`Search` proposes configs to measure (``ask``) and takes their results
(``tell``); it never runs anything itself, so the same object drives a local
tuning loop, a replay benchmark, or the server's worker protocol.

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

Strategies (``tpe``, ``random``, ``grid``): see :mod:`tiletune.tuner.search.strategy`.

Trial ids are the search's own, counted from 0 over the candidates it hands out (the
Optuna study behind it also holds the proposals it answered at once). A search lives in
memory; one built with ``past`` (:class:`~tiletune.tuner.search.trials.PastTrial`: the
trials an earlier search handed out, with what became of them) resumes it: measurements
and failures are taken up, outstanding trials stay outstanding under their ids, abandoned
configs are asked again first, and new ids continue after the largest past one. So the
record of a search can be kept elsewhere (the server's trials table) and a search rebuilt
from it at any time. A ``Search`` is not safe for concurrent use.

Re-exports the names other code imports from here (``Config``, ``STRATEGIES``,
``TpeOptions``, ``SearchCounts``, ``ENUMERATE_LIMIT``). Imports optuna, the
search's own ``tiletune.tuner.search`` modules and the standard library only (never
torch or tiletune.kernels): the server runs it without kernels.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence

import optuna
from optuna.trial import Trial

from tiletune.tuner.search.budget import Budget
from tiletune.tuner.search.encoding import Config, Encoding, Key
from tiletune.tuner.search.neighbourhood import LocalSearch
from tiletune.tuner.search.outcome import (
    finished_trial,
    tell_abandoned,
    tell_duplicate,
    tell_infeasible,
    tell_measured,
)
from tiletune.tuner.search.record import Record, SearchCounts
from tiletune.tuner.search.sampler import MaskedTPESampler, make_sampler
from tiletune.tuner.search.space import ENUMERATE_LIMIT, SearchSpace, ValidSet
from tiletune.tuner.search.strategy import STRATEGIES, Schedule, TpeOptions
from tiletune.tuner.search.surrogate import PairModel
from tiletune.tuner.search.trials import Candidate, Outstanding, PastTrial

__all__ = [
    "ENUMERATE_LIMIT",
    "STRATEGIES",
    "Config",
    "Search",
    "SearchCounts",
    "SearchSpace",
    "TpeOptions",
]

#: Consecutive sampler proposals that bring nothing new before a uniform random pick replaces them.
MAX_SAMPLER_REJECTIONS = 16


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
        options: TpeOptions | None = None,
        past: Sequence[PastTrial] = (),
    ) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(
                f"strategy: unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}"
            )
        self._budget = Budget(max_trials, max_time_s, patience, clock)
        self.strategy = strategy
        self._space = space
        self._enc = Encoding(space.knobs)
        self._options = options or TpeOptions()
        self._startup = self._options.n_startup
        if max_trials is not None:
            self._startup = min(self._startup, max_trials // 4)
        self._rng = random.Random(seed)
        self._valid = ValidSet(space, self._enc)
        self._valid_keys = self._valid.keys
        self._grid = self._valid.grid() if strategy == "grid" else iter(())
        self._model = self._make_model(seed)
        self._schedule = Schedule(self._options.shares(has_model=self._model is not None))
        self._record = Record(min_improvement)
        self._local = LocalSearch(
            self._enc,
            self._options.local_top,
            optima=self._options.local_optima,
            pairs=self._options.local_pairs,
        )
        self._trials = Outstanding()
        self._rejections = 0
        self._exhausted = False
        self._stop_reason: str | None = None
        self._study = self._make_study(seed)
        self._seeds: list[Key] = []
        if past:
            self._resume(past)
        else:
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
        return self._record.counts

    @property
    def outstanding(self) -> int:
        """Candidates asked and not yet told."""
        return len(self._trials)

    @property
    def space_size(self) -> int | None:
        """How many valid configs the space holds, when it was small enough to enumerate."""
        return len(self._valid_keys) if self._valid_keys is not None else None

    @property
    def history(self) -> list[float]:
        """Best time so far after each unique valid measurement (``inf`` until one succeeds)."""
        return list(self._record.history)

    @property
    def study(self) -> optuna.Study:
        """The Optuna study holding every trial (measured, failed, invalid, duplicate)."""
        return self._study

    def best(self, k: int = 1) -> list[tuple[Config, float]]:
        """The ``k`` fastest measured configs with their times in ms, fastest first."""
        return [(self._enc.config(key), time_ms) for time_ms, _, key in self._record.ranked[:k]]

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
        if self._trials.is_settled(trial_id):
            return
        self._trials.get(trial_id)  # ValueError when it was never asked
        if error is None and (time_ms is None or not math.isfinite(time_ms) or time_ms <= 0):
            raise ValueError(f"time_ms: a measurement must be a positive finite time, got {time_ms!r}")
        pending = self._trials.settle(trial_id)
        if error is not None:
            tell_infeasible(self._study, pending.trial, "failed", error)
            self._record_failure(pending.key, error)
        else:
            assert time_ms is not None
            tell_measured(self._study, pending.trial, float(time_ms))
            self._record_time(pending.key, float(time_ms))

    def abandon(self, trial_id: int, reason: str = "abandoned") -> None:
        """Give an asked candidate back unmeasured (its worker went away): it is asked again first.

        The Optuna trial is failed (it counts in no budget) and its config goes
        to the front of the queue. Abandoning a told or abandoned trial does
        nothing; one that was never asked raises ``ValueError``.
        """
        if self._trials.is_settled(trial_id):
            return
        pending = self._trials.settle(trial_id)
        tell_abandoned(self._study, pending.trial, reason)
        self._seeds.insert(0, pending.key)
        self._stop_reason = None

    @property
    def outstanding_ids(self) -> list[int]:
        """Trial ids asked and not yet told or abandoned."""
        return self._trials.ids()

    # -- proposing --------------------------------------------------------------------------

    def _room(self) -> int:
        """How many more candidates may be outstanding now."""
        if self.done or self._exhausted:
            return 0
        in_flight = self._record.measured + len(self._trials)
        return self._budget.room(in_flight, self.space_size)

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
        if self._record.measured + len(self._trials) < self._startup:
            return self._random_new_key()
        for source in self._schedule.turn():
            if source == "tpe":
                return None
            proposed = self._source_key(source)
            if proposed is not None:
                return proposed
        return None

    def _source_key(self, source: str) -> Key | None:
        """A proposal of one of the ``tpe`` strategy's own sources (``None``: it has none now)."""
        if source == "model" and self._model is not None:
            scale = self._options.temperature_scale(self._record.since_improvement)
            stalled = self._record.since_improvement >= self._options.floor_patience
            if self._options.floor_share > 0 and stalled:
                key = self._model.propose_floor(self._options.floor_share, scale)
                if key is not None:
                    return key
            return self._model.propose(scale)
        if source == "random":
            return self._random_new_key()
        return self._local_key()

    def _next_grid_key(self) -> Key | None:
        for key in self._grid:
            if self._is_new(key):
                return key
        self._exhausted = True
        return None

    def _random_new_key(self) -> Key | None:
        """A uniformly random valid config neither measured nor outstanding."""
        key = self._valid.random_key(self._rng, self._is_new)
        if key is None and self._valid_keys is None:
            self._exhausted = True  # blind draws from a product too large to enumerate all failed
        return key

    def _local_key(self) -> Key | None:
        """An unmeasured valid neighbour of the ``local_top`` best configs (:mod:`neighbourhood`)."""
        niches = self._record.niche_bases() if self._options.local_niches else ()
        return self._local.propose(self._record.ranked, self._is_usable, self._model, niches)

    def _sampler_saturated(self) -> bool:
        """True (once) when TPE's last samples held no new valid config: asking again would repeat."""
        sampler = self._study.sampler
        if isinstance(sampler, MaskedTPESampler) and sampler.saturated:
            sampler.saturated = False
            return True
        return False

    def _start_fixed(self, key: Key) -> Candidate:
        """Ask Optuna for a trial with the given config (``enqueue_trial``)."""
        self._study.enqueue_trial(self._enc.params(key))
        trial = self._study.ask(self._enc.distributions)
        return self._register(trial, self._enc.key_from_params(trial.params))

    def _start_sampled(self) -> Candidate | None:
        """Ask the sampler; an invalid or repeated proposal is answered at once (``None``)."""
        trial = self._study.ask(self._enc.distributions)
        key = self._enc.key_from_params(trial.params)
        reason = self._valid.reason(key)
        if reason is not None:
            self._rejections += 1
            self._record.count("invalid")
            tell_infeasible(self._study, trial, "invalid", reason)
        elif key in self._record or self._trials.holds(key):
            self._rejections += 1
            self._record.count("duplicate")
            tell_duplicate(self._study, trial, self._record.outcomes.get(key))
        else:
            self._rejections = 0
            return self._register(trial, key)
        return None

    def _register(self, trial: Trial, key: Key, trial_id: int | None = None) -> Candidate:
        trial_id = self._trials.add(trial, key, trial_id)
        if self._model is not None:
            self._model.take(key)
        return Candidate(trial_id=trial_id, config=self._enc.config(key))

    # -- bookkeeping ------------------------------------------------------------------------

    def _record_time(self, key: Key, time_ms: float) -> None:
        self._record.add_time(key, time_ms)
        self._local.learn(key, self._record.outcomes)
        if self._model is not None:
            self._model.add(key, time_ms)

    def _record_failure(self, key: Key, error: str) -> None:
        self._record.add_failure(key, error)
        if self._model is not None:
            self._model.take(key)

    def _check_stop(self) -> str | None:
        exhausted = not self._trials and self._is_exhausted()
        return self._budget.stop_reason(self._record.measured, self._record.since_improvement, exhausted)

    def _is_exhausted(self) -> bool:
        if self._valid_keys is not None:
            return self._record.measured >= len(self._valid_keys)
        return self._exhausted

    def _is_new(self, key: Key) -> bool:
        return key not in self._record and not self._trials.holds(key)

    def _is_usable(self, key: Key) -> bool:
        return self._is_new(key) and self._valid.is_valid(key)

    # -- construction -----------------------------------------------------------------------

    def _make_study(self, seed: int | None) -> optuna.Study:
        """The Optuna study of the search, with the strategy's sampler."""
        sampler = make_sampler(
            self.strategy,
            self._enc,
            self._is_usable,
            seed=seed,
            n_startup=self._startup,
            options=self._options,
        )
        return optuna.create_study(sampler=sampler, direction="minimize")

    def _make_model(self, seed: int | None) -> PairModel | None:
        if self.strategy != "tpe" or self._valid_keys is None or self._options.model_share <= 0:
            return None
        return PairModel.from_options(self._enc, self._valid_keys, self._options, seed)

    def _seed_keys(self) -> list[Key]:
        keys: list[Key] = []
        for config in self._space.seeds:
            key = self._enc.key(config)
            if self._valid.reason(key) is not None:
                self._record.count("invalid")
            elif key not in keys:
                keys.append(key)
        return keys

    def _resume(self, past: Sequence[PastTrial]) -> None:
        """Take up the trials of an earlier search (see the module docstring)."""
        abandoned: list[Key] = []
        for trial in sorted(past, key=lambda t: t.trial_id):
            key = self._enc.key(trial.config)
            if trial.outcome == "outstanding":
                self._study.enqueue_trial(self._enc.params(key))
                self._register(self._study.ask(self._enc.distributions), key, trial.trial_id)
                continue
            self._trials.settled_before(trial.trial_id)
            if key in self._record:
                continue  # measured under an earlier id already (a config asked again)
            params = self._enc.params(key)
            reason = trial.reason or trial.outcome
            if trial.outcome == "measured" and trial.time_ms is not None:
                self._study.add_trial(
                    finished_trial("measured", params, self._enc.distributions, trial.time_ms)
                )
                self._record_time(key, trial.time_ms)
            elif trial.outcome == "failed":
                self._study.add_trial(
                    finished_trial("failed", params, self._enc.distributions, reason=reason)
                )
                self._record_failure(key, reason)
            else:
                self._study.add_trial(
                    finished_trial("abandoned", params, self._enc.distributions, reason=reason)
                )
                abandoned.append(key)
        self._seeds = list(dict.fromkeys(key for key in abandoned if self._is_new(key)))
