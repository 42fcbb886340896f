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
- ``scheduling/`` (the queue and leases): sweeps and jobs, the lifecycle, leases, the worker
  protocol, searches, trials, verdicts and their confirmation, the store's clock;
- ``access/`` (auth and limits): tokens, roles, rate limits, request bodies;
- ``demand/`` (misses and demand): misses reported, the jobs they queue, re-tuning;
- repositories (take a session, never commit): ``fleet`` (chips, software, workers),
  ``configs`` (best configs: promotion, import/export, history, nearest), ``views`` (rows →
  public); ``lookup`` (single-key lookup and its cache), ``index`` (its ``entries``) and
  ``exports`` (what the read routes serve from memory);
- ``specs``: requests checked against the kernels' specs; ``errors``: errors with a code;
- ``failpoints``: named seams where a test makes the server crash or fail on purpose;
- ``logs``, ``request_ids``, ``tracing``: the processes' log lines (text or JSON), each request's
  id and access line, and the optional OpenTelemetry traces;
- ``cli``: the ``tiletune`` command (its own package; see its docstring).
"""
