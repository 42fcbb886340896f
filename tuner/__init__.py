"""tiletune.tuner: measurement, search, local tuning and the worker.

Modules:

- ``bench``: honest measurement: check against the reference, warm-up, repeated timing,
  interleaved comparison;
- ``search``: the search driver, Optuna ask-and-tell over a kernel's space with its constraints,
  over its parts: ``space`` (what may be searched, the valid configs), ``encoding`` (configs
  as keys and Optuna params), ``strategy`` (the strategies, ``tpe``'s options and schedule),
  ``surrogate`` (the model of which unmeasured configs are likely fast), ``neighbourhood``
  (local search around the best), ``sampler`` (Optuna's TPE, masked to usable configs),
  ``record`` (what was measured, the ranking, counts), ``outcome`` (trial outcomes in the
  Optuna study), ``budget`` (when a search stops), ``warm_start`` (seeds from the best configs
  of other chips);
- ``finalists``: the finalist and winner policy (local tuning and the server share it);
- ``tune``: local tuning (``tiletune tune``);
- ``replay``: recorded tuning spaces as a device (no hardware, no noise);
- ``replay_bench``: the bench of a replay worker (``--backend replay``): measurement by lookup;
- ``quality``: how good a search was on a recorded space (fraction of the optimum, area under
  the best-so-far curve) and the leave-one-device-out choice of settings;
- ``worker``: the worker process that leases jobs from a server and measures them;
- ``heartbeat``: the thread that keeps a worker's lease alive;
- ``result``: bench results in the wire's terms (trial outcomes, validation results);
- ``progress``: a progress bar on terminals (silent without tqdm).

May import tiletune.kernels and tiletune.client (wire schemas, the REST client); never
tiletune.service. ``worker``, ``heartbeat``, ``result`` and ``bench`` import no Optuna, so
a worker node needs none; ``progress`` imports nothing of the project (the command line uses
it on the base install).
"""
