"""tiletune.tuner.measure: the measurement half of the tuner; runs where kernels run.

That is the worker nodes (``tiletune serve``) and the machine of a local ``tiletune tune``.

Modules:

- ``bench``: honest measurement: check against the reference, warm-up, repeated timing,
  interleaved comparison;
- ``worker``: the worker process that leases jobs from a server and measures them;
- ``registration``: what a worker tells the server about itself (chip, kernels, backends);
- ``native_prebuild``: a CPU worker's build of the native CPU kernels where it starts (cached);
- ``job_bench``: a leased job's bench, or why this worker cannot run it;
- ``job_driver``: the ask/measure/tell/validate loop of one leased job;
- ``heartbeat``: the thread that keeps a worker's lease alive;
- ``result``: bench results in the wire's terms (trial outcomes, validation results);
- ``replay_bench``: the bench of a replay worker (``--backend replay``): measurement by lookup;
- ``tune``: local tuning (``tiletune tune``): a search from :mod:`tiletune.tuner.search` driven
  on this machine;
- ``replay``: recorded tuning spaces as a device for the search benchmark (no hardware, no noise);
- ``progress``: a progress bar on terminals (silent without tqdm).

May import torch (through tiletune.kernels), tiletune.client and tiletune.tuner.search (only
``tune`` and ``replay``, which run a search locally); never tiletune.service. ``worker`` (with
``registration``, ``job_bench``, ``job_driver``), ``heartbeat``, ``result``, ``replay_bench`` and
``bench`` import no Optuna, so a worker node
needs none (a test checks it); ``progress`` imports nothing of the project (the command line
uses it on the base install).
"""
