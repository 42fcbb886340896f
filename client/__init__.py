"""tiletune.client: the light side — the runtime lookup library, the REST client, the wire schemas.

``ConfigClient`` / ``AsyncConfigClient`` (same method names) answer "which tiling for this
kernel, shape and dtype on this chip" from memory, the server, an on-disk cache or the
kernel's default, and never raise on the launch path. Modules:

- ``sync``, ``aio``: ``ConfigClient`` and ``AsyncConfigClient``;
- ``core``: what the two share: caches, fallbacks, back-off, miss counting;
- ``tiling``: the answer a launch gets (``Tiling``), from a tuned entry or the default;
- ``api``: the one REST client of ``/v1`` (``ServiceApi`` / ``AsyncServiceApi``, retries);
- ``deadline``, ``answer_body``, ``transport``: a call's bounds: its deadline in all, its answer
  read within its cap, the sync twin's transport that cuts each socket operation to the deadline;
- ``calls``: every ``/v1`` call as data, and the one set of errors a call raises;
- ``wire``: the request and response schemas and the vocabularies (states, strategies, dtypes);
- ``known``: the best configs known for a chip and the choice among them;
- ``keys``: what a launch key must be; ``knobs``: a config checked against its kernel's knobs;
- ``misses``: the misses counted and reported in batches;
- ``nearest``: the shape distance of the nearest-shape fallback (also the server's);
- ``disk``: the on-disk cache of a node; ``chip``: chip identity and software, without torch.

May import httpx, pydantic and the standard library only: never torch, optuna, fastapi,
sqlalchemy or another tiletune package (a test checks ``sys.modules``). The kernels hand
their default rule and versions over as callables (``tiletune.kernels.client_settings``).
"""

from tiletune.client.aio import AsyncConfigClient
from tiletune.client.core import ClientSettings
from tiletune.client.sync import ConfigClient
from tiletune.client.tiling import Tiling

__all__ = ["AsyncConfigClient", "ClientSettings", "ConfigClient", "Tiling"]
