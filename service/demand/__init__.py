"""Misses and demand: what clients asked for that nobody tuned, and the jobs it queues.

- ``misses``: reports counted; ``miss_keys``: a miss's key in SQL; ``miss_writer``: writes off the
  workers' path;
- ``policy``: the keys missed most queue jobs within the operator's budget; ``selected_misses``: a
  person's choice from the dashboard;
- ``key_usage``: launches per key; ``retune``: stale keys re-tuned after a software change.
"""
