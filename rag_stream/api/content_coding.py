"""Request bodies are read as sent: one with a ``Content-Encoding`` gets a 415 naming it.

No route decodes a compressed body (a JSON route would fail on the first byte and call the body
"not valid JSON"; an upload would be stored as the compressed bytes), and decoding here would
need its own bounds: a few kilobytes of gzip inflate to gigabytes, past every limit that counts
the bytes on the wire. So the coding is refused before any route runs, with an
``Accept-Encoding: identity`` header saying what is accepted (RFC 7694), and the client sends
the body again uncompressed.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from rag_stream.api.error_body import error_response
from rag_stream.errors import UnsupportedMediaType


class RefuseContentCoding:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (codings := _codings(Headers(scope=scope))):
            shown = ", ".join(codings)[:80]
            response = error_response(
                UnsupportedMediaType.status_code,
                UnsupportedMediaType.code,
                f"Content-Encoding {shown!r} is not supported: send the body uncompressed",
                headers={"accept-encoding": "identity"},
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _codings(headers: Headers) -> list[str]:
    """The codings a request's body is said to carry, other than ``identity`` (no coding)."""
    found = (
        c.strip().lower() for value in headers.getlist("content-encoding") for c in value.split(",")
    )
    return [c for c in found if c and c != "identity"]
