"""tiletune.service.cli: the ``tiletune`` command, one parser in one place.

Modules (each imports only the light side at import time; torch, Optuna and the server's
libraries are imported by the handlers that need them, when they run):

- ``main``: the parser and the one map from exceptions to exit statuses (the entry point);
- ``options``: exit statuses, the exit-1 error, the options and server access the commands share;
- ``local``: ``kernels``, ``tune``, ``bench`` (no server);
- ``serve``: ``server``, ``worker`` (the processes of the service) and what ``up`` shares;
- ``up``: the embedded all-in-one (SQLite, server and worker in one process);
- ``remote``: ``submit``, ``lookup`` (talking to a server);
- ``tokens``: ``token create|list|revoke`` (an admin's);
- ``sweepfile``: a sweep from a FILE or from flags;
- ``follow``: ``up --submit``'s follower of a sweep;
- ``text``: the text the remote commands print.

May import tiletune.client, tiletune.tuner and tiletune.kernels (lazily, for the last two
beyond ``tuner.measure.progress``) and the rest of tiletune.service (lazily). ``python -m
tiletune.service.cli`` runs the command too.
"""

from tiletune.service.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
