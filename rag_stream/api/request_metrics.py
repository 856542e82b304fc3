"""Count HTTP requests by route, method and status (pure ASGI).

Counted when the response starts, so a stream counts once, at its start. Pure ASGI rather than
``@app.middleware("http")``: that one runs every chunk of a streaming response through an extra
task and memory channel, which costs more CPU per SSE event than the rest of the path. The
wrapped ``send`` is a plain function that returns the next one's awaitable, so the chunks of a
stream pass through it without a coroutine of its own each.
"""

from __future__ import annotations

from collections.abc import Awaitable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rag_stream.metrics import Metrics


class RequestMetrics:
    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        def counting_send(message: Message) -> Awaitable[None]:
            if message["type"] == "http.response.start":
                route = scope.get("route")
                path = getattr(route, "path", "unmatched")
                status = str(message["status"])
                self.metrics.requests.labels(path, scope["method"], status).inc()
            return send(message)  # (returned, not awaited here: see module docstring)

        await self.app(scope, receive, counting_send)
