"""The page's files, read once from the package (ragserve/server/page/static/) and served from
memory under fixed names: nothing from a CDN, no build step, no path taken from the request.

Every answer of the page carries a strict Content-Security-Policy: scripts, styles, images and
connections from this origin only, no inline script or style, no framing, no form posts."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

from starlette.requests import Request
from starlette.responses import Response

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-resource-policy": "same-origin",
}
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}


@dataclass(frozen=True)
class Asset:
    body: bytes
    media_type: str


def load_assets() -> dict[str, Asset]:
    """Every file in static/ by name (one folder, no subfolders)."""
    folder = resources.files("ragserve.server.page") / "static"
    found = {}
    for entry in folder.iterdir():
        suffix = "." + entry.name.rpartition(".")[2]
        if entry.is_file() and suffix in _TYPES:
            found[entry.name] = Asset(entry.read_bytes(), _TYPES[suffix])
    return found


class AssetEndpoint:
    """GET /ui/ (index.html) and /ui/static/NAME; anything else 404."""

    def __init__(self, assets: dict[str, Asset]) -> None:
        self._assets = assets

    async def serve(self, request: Request) -> Response:
        name = request.path_params.get("name", "index.html")
        asset = self._assets.get(name)
        if asset is None:
            return Response(b"not found", 404, SECURITY_HEADERS, media_type="text/plain")
        # Revalidated on each load: a new release's page never runs beside an old script.
        return Response(asset.body, 200, {**SECURITY_HEADERS, "cache-control": "no-cache"}, asset.media_type)
