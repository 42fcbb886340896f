"""tiletune.tuner.search: the search half of the tuner; runs in the server (and in local tuning).

Modules:

- ``search``: the search driver, Optuna ask-and-tell over a kernel's space with its constraints,
  over its parts: ``space`` (what may be searched, the valid configs), ``encoding`` (configs
  as keys and Optuna params), ``strategy`` (the strategies, ``tpe``'s options and schedule),
  ``surrogate`` (the model of which unmeasured configs are likely fast), ``neighbourhood``
  (local search around the best), ``sampler`` (Optuna's TPE, masked to usable configs),
  ``record`` (what was measured, the ranking, counts), ``trials`` (what a search hands out and
  takes back, the trials outstanding), ``outcome`` (trial outcomes in the Optuna study),
  ``budget`` (when a search stops), ``warm_start`` (seeds from the best configs of other chips);
- ``finalists``: the finalist and winner policy (local tuning and the server share it);
- ``quality``: how good a search was on a recorded space (fraction of the optimum, area under
  the best-so-far curve) and the leave-one-device-out choice of settings.

May import Optuna, numpy, threadpoolctl, tiletune.client.wire and its own modules; never torch,
tiletune.kernels, tiletune.tuner.measure or tiletune.service, so the server runs it without
the kernels' torch half (a test imports it in a fresh process and checks that no torch loads).
"""
