"""The queue and leases: jobs from sweeps to verdicts, as workers lease and run them.

- ``jobs``: sweeps and jobs (a repository); ``lifecycle``: the one transition table;
- ``queue``: leases in SQL, fenced by tokens; ``store_clock``: the database's clock every replica uses;
- ``protocol``: the worker protocol (register, lease, heartbeat, ask, tell, complete, release;
  reaping, cancelling); ``backends``: which implementation a job runs;
- ``searches``: each running job's search in memory; ``warm_start``: the configs that seed it;
- ``trials``: outcomes recorded; ``plausibility``: times no chip can reach, refused;
- ``verdicts``: a validation run judged and its winner promoted, once ``confirmation`` (another
  worker of the chip) agrees.
"""
