"""Requests a web page could make a visitor's browser send, refused before any route runs.

- ``Host`` must be one of the trusted host names (``security.trusted_hosts``; by default the
  loopback names when the server listens on a loopback address): a page on another site that
  points its own DNS name at 127.0.0.1 (DNS rebinding) gets a 400.
- A state-changing request (POST, PUT, PATCH, DELETE) that carries an ``Origin`` must come from
  the server's own origin or from one listed in ``security.cors_origins``: otherwise a page
  elsewhere could upload documents or cancel streams with "simple" requests that need no CORS
  preflight. Requests without ``Origin`` (curl, SDKs, servers) are not browsers' and pass.

Allowed origins also get CORS headers (Starlette's ``CORSMiddleware``, set up in ``app.py``).
"""

from __future__ import annotations

import ipaddress
import logging
import re
from collections.abc import Collection
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from rag_stream.api.error_body import error_response

logger = logging.getLogger(__name__)

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
_STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# RFC 9110 Host: a name or a bracketed IPv6 address, then an optional port.
_HOST = re.compile(r"(?:\[(?P<ip6>[0-9a-f:.]+)\]|(?P<name>[^\s:/?#@\[\]\\]+))(?::[0-9]*)?")


def host_name(host_header: str) -> str:
    """``example.com:8000`` -> ``example.com``; ``[::1]:8000`` -> ``::1``. A header that is not
    a host and an optional port (``localhost:80@evil.example``, ``[::1]evil``, a bare IPv6
    address) gives "", which no trusted name matches: a trusted prefix is not a trusted host."""
    found = _HOST.fullmatch(host_header.strip().lower())
    if found is None:
        return ""
    return found["ip6"] or found["name"]


def is_loopback(host: str) -> bool:
    """Whether a host (a name or an address, IPv6 possibly in brackets) is this machine."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def default_trusted_hosts(listen_host: str) -> list[str] | None:
    """The loopback names for a server on a loopback address; None (any name) otherwise."""
    return list(LOOPBACK_NAMES) if is_loopback(listen_host) else None


class BrowserGuard:
    def __init__(
        self, app: ASGIApp, trusted_hosts: Collection[str] | None, cors_origins: Collection[str]
    ) -> None:
        self.app = app
        self.trusted = None if trusted_hosts is None else {h.lower() for h in trusted_hosts}
        self.origins = {o.rstrip("/").lower() for o in cors_origins}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        host = headers.get("host", "")
        if self.trusted is not None and host_name(host) not in self.trusted:
            shown = host[:80] or "(none)"
            response = error_response(
                400,
                "untrusted_host",
                f"Host {shown!r} is not one this server answers to (security.trusted_hosts)",
            )
            await response(scope, receive, send)
            return
        origin = headers.get("origin")
        if (
            origin is not None
            and scope["method"] in _STATE_CHANGING
            and not self._allowed(origin, host, scope.get("scheme", "http"))
        ):
            logger.warning("refused a cross-origin %s from %.80s", scope["method"], origin)
            response = error_response(
                403,
                "forbidden_origin",
                f"a {scope['method']} from the web page at {origin[:80]!r} is not allowed: "
                "add its origin to security.cors_origins to allow it",
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _allowed(self, origin: str, host: str, scheme: str) -> bool:
        wanted = origin.rstrip("/").lower()
        if wanted in self.origins or "*" in self.origins:
            return True
        parts = urlsplit(wanted)  # the server's own pages: same scheme, host and port
        return parts.netloc == host.strip().lower() and parts.scheme == scheme
