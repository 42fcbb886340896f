"""tiletune.client: the runtime lookup library used at kernel launch.

``ConfigClient`` / ``AsyncConfigClient`` (same method names) answer "which
tiling for this kernel, shape and dtype on this chip" from memory, the
server, an on-disk cache or the kernel's default, and never raise on the
launch path. Also the wire schemas shared with the server (``wire``), chip
identity (``chip``) and the shape distance of the nearest-shape fallback
(``nearest``).

May import httpx, pydantic and the standard library only: never torch,
optuna, fastapi or sqlalchemy (a test checks ``sys.modules``).
"""

from tiletune.client.aio import AsyncConfigClient
from tiletune.client.core import ClientSettings, Tiling
from tiletune.client.sync import ConfigClient

__all__ = ["AsyncConfigClient", "ClientSettings", "ConfigClient", "Tiling"]
