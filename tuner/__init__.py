"""tiletune.tuner: the search and measurement, in two subpackages that say where they run.

- ``search`` (:mod:`tiletune.tuner.search`) runs in the server (and in local tuning): the
  search driver over a kernel's space, its parts, the finalist policy, seeds from other chips
  and the search's quality measures. Optuna and numpy; never torch or tiletune.kernels.
- ``measure`` (:mod:`tiletune.tuner.measure`) runs where kernels are measured, on the worker
  nodes and on the machine of ``tiletune tune``: the bench, the worker and its heartbeat, local
  tuning, replay devices and the progress bar. Torch (through tiletune.kernels); never Optuna
  except through ``tune``, which drives a search locally.

The halves never import each other, except ``measure.tune`` and ``measure.replay``, which run a
search on this machine. Both may import tiletune.client (wire schemas, the REST client); neither
imports tiletune.service.
"""
