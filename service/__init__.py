"""tiletune.service: the FastAPI server, its database, the job lifecycle, and the ``tiletune`` command.

May import tiletune.tuner.search (the search, the finalist policy), tiletune.kernels (specs; it never
runs a kernel) and tiletune.client (wire schemas, the REST client for the command line).
Nothing imports it but its own entry points. Modules:

- ``app``: ``create_app(settings)``: builds the services, mounts the routers, maps errors;
- ``api_sweeps``, ``api_workers``, ``api_configs``, ``api_misses``: the ``/v1`` routes (each
  opens one transaction per request, or calls an operation that does);
- ``dependencies``: the routes' ``Annotated`` dependencies;
- ``settings``: ``Settings`` from arguments or ``TILETUNE_*``;
- ``database``: URLs, engines, and ``Database`` (sessions, clock, configs' generation; the
  transaction rule: repositories take a session, only operations open and commit one);
- ``models``: the SQLAlchemy rows; ``migrate``: Alembic in code;
- ``lifecycle``: the job lifecycle, one transition table, the only code assigning a job's state;
- repositories (take a session, never commit): ``fleet`` (chips, software, workers),
  ``jobs`` (sweeps and jobs), ``trials`` (trials and outcomes), ``configs`` (best configs:
  promotion, import/export, history, nearest), ``queue`` (leases), ``views`` (rows → public);
- operations (open a transaction): ``protocol`` (the worker protocol, reaping, cancelling),
  ``lookup`` (single-key lookup and its cache), ``misses`` (demand-driven tuning);
- ``searches``: each running job's search in memory, rebuilt from its trials (their one record);
- ``specs``: requests checked against the kernels' specs; ``errors``: errors with a code;
- ``failpoints``: named seams where a test makes the server crash or fail on purpose;
- ``logs``, ``request_ids``, ``tracing``: the processes' log lines (text or JSON), each request's
  id and access line, and the optional OpenTelemetry traces;
- ``cli``: the ``tiletune`` command (its own package; see its docstring).
"""
