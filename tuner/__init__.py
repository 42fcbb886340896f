"""tiletune.tuner: measurement, search and local tuning.

Owns the bench harness (``bench``: check against the reference, warm-up,
repeated timing, interleaved comparison), the search (``search``: Optuna
ask-and-tell over a kernel's space with its constraints, the driver over
``space``, ``encoding``, ``strategy``, ``surrogate``, ``neighbourhood``,
``sampler``, ``record``, ``outcome`` and ``budget``; seeds from other chips in
``warm_start``), the replay device (``replay``: recorded tuning spaces; how good
a search was on one, and leave-one-device-out choice, in ``quality``), local
tuning (``tune``) and the ``tiletune`` command line (``cli``). Imports
tiletune.kernels (and, later, tiletune.client's wire schemas); never
tiletune.service.
"""
