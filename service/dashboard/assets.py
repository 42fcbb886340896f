"""Static files served from our own origin: the dashboard's, Plotly.js, Swagger UI and ReDoc.

Nothing a page loads comes from another origin (GPU and NPU clusters are often offline), and no
file is read from another package's private folder: every asset is a file of ``static/``,

- the dashboard's own (its CSS, script and icon);
- vendored from npm, each beside its licence and recorded (package, version, SHA-256) in
  ``static/VENDORED.md``: htmx, Plotly.js (``plotly.js-dist-min``: the charts include heatmaps and
  parallel coordinates, beyond the basic bundle), Swagger UI (``swagger-ui-dist``) and ReDoc
  (``redoc``). ReDoc's sidebar logo is an image on ReDoc's CDN, so the copy served points it at
  our icon (:data:`REWRITES`).

Each asset is a fixed name (no path from the request reaches the file system), read once and
kept in memory with its gzip form. Pages link ``/static/NAME?v=DIGEST``; the answer is cached
by browsers for a year (``immutable``), and a new file has a new digest, hence a new URL.
"""

from __future__ import annotations

import gzip
import hashlib
import threading
from dataclasses import dataclass
from pathlib import Path

from fastapi import APIRouter, Request, Response

from tiletune.service.errors import NotFoundError
from tiletune.service.exports import accepts_gzip

router = APIRouter(include_in_schema=False)

HERE = Path(__file__).parent / "static"
#: Browsers keep an asset a year: its URL names its digest, so a changed file is a new URL.
CACHE_CONTROL = "public, max-age=31536000, immutable"


#: Asset name -> (text, replacement) applied to the file's bytes when it is read.
REWRITES: dict[str, tuple[tuple[bytes, bytes], ...]] = {
    "redoc.standalone.js": ((b"https://cdn.redoc.ly/redoc/logo-mini.svg", b"/static/favicon.png"),),
}


#: Asset name -> media type; each is the file of that name in ``static/``.
MEDIA_TYPES: dict[str, str] = {
    "dashboard.css": "text/css; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
    "favicon.png": "image/png",
    "htmx.min.js": "text/javascript; charset=utf-8",
    "plotly.min.js": "text/javascript; charset=utf-8",
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "redoc.standalone.js": "text/javascript; charset=utf-8",
}


def _sources() -> dict[str, tuple[Path, str]]:
    """Asset name -> (file, media type)."""
    return {name: (HERE / name, media_type) for name, media_type in MEDIA_TYPES.items()}


@dataclass(frozen=True)
class Asset:
    """One static file in memory: its bytes, gzip form, media type and digest."""

    body: bytes
    gzipped: bytes
    media_type: str
    digest: str


class Assets:
    """The static files by name, each read on first use and then kept (thread-safe)."""

    def __init__(self) -> None:
        self._sources = _sources()
        self._loaded: dict[str, Asset] = {}
        self._lock = threading.Lock()

    def names(self) -> list[str]:
        """Every asset's name."""
        return sorted(self._sources)

    def get(self, name: str) -> Asset:
        """The asset ``name``; :class:`NotFoundError` for a name that is not one."""
        found = self._loaded.get(name)
        if found is not None:
            return found
        if name not in self._sources:
            raise NotFoundError(f"no static file {name!r}", field="name")
        path, media_type = self._sources[name]
        body = path.read_bytes()
        for text, replacement in REWRITES.get(name, ()):
            body = body.replace(text, replacement)
        asset = Asset(body, gzip.compress(body, 6), media_type, hashlib.sha256(body).hexdigest()[:16])
        with self._lock:
            self._loaded[name] = asset
        return asset

    def url(self, name: str) -> str:
        """The URL pages use for ``name`` (it changes when the file does)."""
        return f"/static/{name}?v={self.get(name).digest}"


def assets_of(request: Request) -> Assets:
    """The app's assets (made by :func:`tiletune.service.dashboard.mount`)."""
    assets: Assets = request.app.state.assets
    return assets


@router.get("/static/{name}")
async def static_file(name: str, request: Request) -> Response:
    """One asset, gzip-compressed when accepted, cached by browsers for a year."""
    asset = assets_of(request).get(name)
    headers = {"Cache-Control": CACHE_CONTROL, "ETag": f'"{asset.digest}"', "Vary": "Accept-Encoding"}
    if request.headers.get("if-none-match") == headers["ETag"]:
        return Response(status_code=304, headers=headers)
    if accepts_gzip(request.headers.get("accept-encoding", "")):
        headers["Content-Encoding"] = "gzip"
        return Response(asset.gzipped, media_type=asset.media_type, headers=headers)
    return Response(asset.body, media_type=asset.media_type, headers=headers)
