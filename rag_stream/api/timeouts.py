"""Time limits on reading request bodies (pure ASGI, so it sees every ``receive``).

A client that sends its headers, promises a body (``Content-Length: 100``) and then stalls
would hold the connection for as long as it likes: the server waits for the rest of a body
that never comes. Two limits bound that wait:

- each wait for the next piece of the body (``timeout_s``, ``limits.body_read_timeout_s``): a
  body that stops coming;
- the whole body, from the app's first read of it (``deadline_s``, ``limits.body_deadline_s``):
  a body that keeps coming a byte at a time, each piece well within the first limit. The clock
  starts at the first read, not at the headers, so time the service spends before reading (a
  database lookup under load) is not charged to the client.

When either runs out, and no response has started, the client gets a 408 with the usual JSON
error naming the limit, and the connection is closed. The app itself sees ``http.disconnect``,
as if the client had left, and whatever it does after that is not sent.

Only waits for the body are bounded: once the last piece has arrived, ``receive`` is passed
through untouched (an SSE response waits on it for the client's disconnect for minutes). The
request line and headers come before any ASGI app runs: ``http_protocol.py`` bounds those.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable

import anyio
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rag_stream.api.error_body import error_response

logger = logging.getLogger(__name__)

CODE = "request_timeout"


class BodyReadTimeout:
    def __init__(self, app: ASGIApp, timeout_s: float, deadline_s: float) -> None:
        self.app = app
        self.timeout_s = timeout_s
        self.deadline_s = deadline_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body_done = False
        deadline: float | None = None  # set at the first read of the body
        response_started = False
        answered = False  # the 408 went out: nothing the app sends afterwards may follow it

        async def timed_receive() -> Message:
            nonlocal body_done, deadline, answered
            if body_done:
                return await receive()
            now = anyio.current_time()
            if deadline is None:
                deadline = now + self.deadline_s
            # a wait past the deadline is cut at it; what has already arrived is still taken
            # (uvicorn hands over a buffered piece without suspending, so nothing cancels it)
            wait_s = min(self.timeout_s, deadline - now)
            with anyio.move_on_after(max(wait_s, 0.0)):
                message = await receive()
                if message["type"] != "http.request" or not message.get("more_body", False):
                    body_done = True
                return message
            body_done = True
            if not response_started:
                answered = True
                whole = wait_s < self.timeout_s
                await self._timed_out(whole)(scope, receive, send)
            return {"type": "http.disconnect"}

        def guarded_send(message: Message) -> Awaitable[None]:  # (as request_metrics.py's)
            nonlocal response_started
            if answered:
                return _dropped()
            if message["type"] == "http.response.start":
                response_started = True
            return send(message)

        try:
            await self.app(scope, timed_receive, guarded_send)
        except Exception:
            if not answered:
                raise
            # the app failed on the body that never came (its reader saw a disconnect): the
            # client already has its answer
            logger.debug("request body timed out; the app then failed", exc_info=True)

    def _timed_out(self, whole: bool) -> JSONResponse:
        if whole:
            message = (
                "the request body did not arrive in time (the whole body must arrive within "
                f"{self.deadline_s:g} s, limits.body_deadline_s)"
            )
        else:
            message = (
                "the request body did not arrive in time (waited "
                f"{self.timeout_s:g} s for more of it, limits.body_read_timeout_s)"
            )
        # the rest of the body may still come: the connection cannot carry another request
        return error_response(408, CODE, message, headers={"connection": "close"})


async def _dropped() -> None:
    """What the app sends after the 408 went out: nothing."""
