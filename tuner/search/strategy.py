"""The strategies a search may follow, the ``tpe`` strategy's options and its schedule.

``grid`` measures every valid config once (the ground truth); ``random`` is
plain random search, Optuna's ``RandomSampler`` with invalid and repeated
proposals rejected (what we compare against); ``tpe`` (default) is ours, see
:class:`TpeOptions`: after the seeds and a few random configs it interleaves
three sources of proposals, all recorded as trials of one study:

- a *model* (:mod:`tiletune.tuner.search.surrogate`): a Bayesian linear model of log
  time over knob values and pairs of values, fit on every measurement;
  Thompson sampling from it picks the best unmeasured valid config of the
  whole space (finds the good regions, not only the basin of the best config so far);
- *local search*: the most promising (by the model) unmeasured valid neighbour
  (one knob changed) of the best local optima so far (finishes a region off);
- Optuna's multivariate TPE (constant liar; its acquisition is masked so that
  it proposes new valid configs only, :mod:`tiletune.tuner.search.sampler`).

Contract: :class:`TpeOptions` validates itself on construction (``ValueError``
naming the options); :class:`Schedule` is deterministic: each turn lists every
source, the one with the most accumulated share first, so over many turns each
source leads in proportion to its share.

Imports the standard library and the wire's vocabulary (``STRATEGIES``) only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from tiletune.client.wire import STRATEGIES

__all__ = ["STRATEGIES", "Schedule", "TpeOptions"]


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
    - ``n_ei_candidates``: samples TPE draws per proposal (Optuna's option);
    - ``random_share``: fraction of the later asks given to uniform random valid
      configs (a floor of diversity that no model can take away);
    - ``model_clip_quantile``: the model fits log times clipped at this quantile of
      the measured ones (1 = not clipped), so it ranks the fast configs rather
      than modelling how slow the slow ones are;
    - ``stall_patience``: after each this many measurements in a row without a
      new best, the model's temperature grows by its base value (1x, 2x, 3x, ...)
      until the best improves (0 = never): a stalled search explores further;
    - ``local_niches``: local search also climbs from the best config of each
      knob value (after the ``local_top`` best), so once the best basin is
      exhausted it climbs the next one instead of giving its turns away;
    - ``floor_share``: a floor of diversity over regions (0 = off). A region is one
      value of a knob or one cell of a pair of (binned) knob values; once the search
      has gone ``floor_patience`` measurements without a new best, the model's turns
      go to the region furthest below ``floor_share`` times its share of the valid
      space in measurements (a region holding 10 % of the configs is owed
      ``floor_share`` x 10 % of them), and there, turn about, to the config a
      Thompson draw prefers and to the most promising neighbour (inside the region)
      of its best measured configs: a region the model wrote off from a few bad
      configs is still looked at and climbed, so a needle in a slow region is not
      left out for good;
    - ``local_optima``: local search climbs from the best *local optima* of what was
      measured (configs no measured one-knob neighbour beats), not from the best configs
      overall: a flat basin of near-equal configs is one base, not ``local_top`` of them,
      so the turns go to other basins too (:mod:`tiletune.tuner.search.neighbourhood`);
    - ``local_pairs``: once the best config is a local optimum of one-knob moves (its
      neighbours are all measured), the model's local turns also rank its two-knob
      neighbours, so a better config two knobs away is reached without a slower one between
      (on by default: leave-one-device-out chose it for every device, see the README).

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
    random_share: float = 0.0
    model_clip_quantile: float = 0.5
    stall_patience: int = 0
    local_niches: bool = False
    floor_share: float = 1.0
    floor_patience: int = 10
    local_optima: bool = True
    local_pairs: bool = True

    def __post_init__(self) -> None:
        shares = (self.model_share, self.local_share, self.random_share)
        if any(not 0.0 <= share <= 1.0 for share in shares) or sum(shares) > 1.0 + 1e-9:
            raise ValueError(
                "options: model_share, local_share and random_share must be in [0, 1] and sum to at most 1"
            )
        if not 0.0 < self.model_clip_quantile <= 1.0 or self.stall_patience < 0:
            raise ValueError("options: model_clip_quantile must be in (0, 1] and stall_patience >= 0")
        if not 0.0 <= self.floor_share <= 1.0 or self.floor_patience < 0:
            raise ValueError("options: floor_share must be in [0, 1] and floor_patience >= 0")
        if self.n_startup < 0 or self.local_top < 1 or self.model_pair_bins < 0 or self.n_ei_candidates < 1:
            raise ValueError(
                "options: n_startup >= 0, local_top >= 1, model_pair_bins >= 0, n_ei_candidates >= 1"
            )
        if self.model_temperature < 0 or self.model_pair_prior <= 0 or self.model_trend_prior <= 0:
            raise ValueError(
                "options: model_temperature >= 0, model_pair_prior > 0 and model_trend_prior > 0"
            )

    def shares(self, has_model: bool) -> dict[str, float]:
        """The sources and their shares of the later asks (without a model, its share goes to TPE)."""
        shares = {"model": self.model_share if has_model else 0.0, "local": self.local_share}
        if self.random_share > 0:
            shares["random"] = self.random_share
        return {**shares, "tpe": 1.0 - sum(shares.values())}

    def temperature_scale(self, since_improvement: int) -> float:
        """How much hotter the model's draws are after ``since_improvement`` asks without a new best."""
        return 1.0 + (since_improvement // self.stall_patience if self.stall_patience else 0)


class Schedule:
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
