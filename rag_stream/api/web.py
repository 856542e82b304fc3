"""The chat page: ``GET /`` (index.html) and ``GET /static/{path}`` (its ES modules and CSS).

Only the files shipped in ``rag_stream/web/static`` with a known type are served, looked up by
exact name (no path is ever joined from the request, so nothing outside the folder and no
directory listing can be reached); anything else is the usual JSON 404. Files are small and
read once. ``Cache-Control: no-cache`` with an ETag: the browser revalidates each load and gets a
304 while the file is unchanged (names carry no version, so a long max-age would serve stale
modules after an upgrade).
"""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Header
from fastapi.responses import Response

from rag_stream.errors import NotFound

router = APIRouter(include_in_schema=False)

STATIC = Path(__file__).resolve().parents[1] / "web" / "static"
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",  # ES modules need a JavaScript type
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
# The page runs its own modules only and talks to this server only.
_PAGE_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
_COMMON = {
    "Cache-Control": "no-cache",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


class _Asset:
    def __init__(self, path: Path) -> None:
        self.body = path.read_bytes()
        self.media_type = _TYPES[path.suffix]
        self.etag = '"' + hashlib.sha256(self.body).hexdigest()[:32] + '"'


@cache
def _assets() -> dict[str, _Asset]:
    return {
        path.relative_to(STATIC).as_posix(): _Asset(path)
        for path in sorted(STATIC.rglob("*"))
        if path.is_file() and path.suffix in _TYPES
    }


def _serve(name: str, if_none_match: str | None) -> Response:
    asset = _assets().get(name)
    if asset is None:
        raise NotFound(f"no file {name[:200]!r} here")
    headers = {**_COMMON, "ETag": asset.etag}
    if asset.media_type.startswith("text/html"):
        headers["Content-Security-Policy"] = _PAGE_POLICY
    if if_none_match is not None and asset.etag in {t.strip() for t in if_none_match.split(",")}:
        return Response(status_code=304, headers=headers)
    return Response(asset.body, media_type=asset.media_type, headers=headers)


IfNoneMatch = Annotated[str | None, Header(alias="If-None-Match")]


@router.get("/")
async def index(if_none_match: IfNoneMatch = None) -> Response:
    return _serve("index.html", if_none_match)


@router.get("/static/{path:path}")
async def static(path: str, if_none_match: IfNoneMatch = None) -> Response:
    return _serve(path, if_none_match)
