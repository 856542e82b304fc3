"""A 405 says which methods its path allows (``Allow``, as RFC 9110 requires of a 405).

Starlette answers a method no route of a path serves (``TRACE``, ``PUT /v1/kbs``...) with 405,
but the error renders without its ``Allow``, and Starlette's would name only the first route of
the path (``GET /v1/kbs`` and ``POST /v1/kbs`` are two). This middleware sets ``Allow`` on any
405 to every method the path's routes serve; other responses pass untouched.
"""

from __future__ import annotations

from collections.abc import Awaitable

from starlette._utils import get_route_path
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send


def allowed_methods(routes: list[BaseRoute], scope: Scope) -> list[str]:
    path = get_route_path(scope)
    found: set[str] = set()
    for route in routes:
        regex, methods = getattr(route, "path_regex", None), getattr(route, "methods", None)
        if regex is not None and methods and regex.match(path):
            found |= methods
    return sorted(found)


class AllowHeader:
    def __init__(self, app: ASGIApp, routes: list[BaseRoute]) -> None:
        self.app = app
        self.routes = routes  # the app's, read when a 405 goes out (routes are added later)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        def send_allow(message: Message) -> Awaitable[None]:  # (as request_metrics.py's)
            if message["type"] == "http.response.start" and message["status"] == 405:
                allow = ", ".join(allowed_methods(self.routes, scope)).encode()
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"allow"]
                message = {**message, "headers": [*headers, (b"allow", allow)]}
            return send(message)

        await self.app(scope, receive, send_allow)
