"""uvicorn's HTTP/1.1 protocol (httptools) with a time limit on each request's line and headers.

uvicorn sets no such limit: its only timer is the keep-alive one, armed after a response and
cancelled by the next byte that arrives, and a new connection gets none at all. A client that
opens a connection and sends nothing, or sends a request a byte at a time, or a single ``\\r\\n``
(which starts no request), held its connection for good (measured on `rag-stream serve`: a
request line trickled at a byte a second was still open after 60 s). Here:

- a new connection gets the keep-alive timer too (``keep_alive_s``): one that never sends a
  byte is closed, as an idle connection between requests is;
- from the first byte that arrives while no request is being served (a new request, or the rest
  of a body the previous response did not wait for), the headers of the next request must be
  complete within ``head_timeout_s`` (``limits.header_timeout_s``), or the client gets a 408
  with the usual JSON error and the connection is closed.

Once the headers are in, the request is the app's: its body is bounded by ``timeouts.py``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from rag_stream.api.error_body import error_response
from rag_stream.api.timeouts import CODE

logger = logging.getLogger(__name__)


class BoundedHeadProtocol(HttpToolsProtocol):
    def __init__(self, *args: Any, head_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.head_timeout_s = head_timeout_s
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # silent from the start is idle too (uvicorn arms this only after a response)
        self.timeout_keep_alive_task = self.loop.call_later(
            self.timeout_keep_alive, self.timeout_keep_alive_handler
        )

    def data_received(self, data: bytes) -> None:
        # while a request is served its body is the app's to bound; otherwise this byte is the
        # start of the next request's head (or what is left of a body nobody read)
        serving = self.cycle is not None and not self.cycle.response_complete
        if not serving and self._head_timer is None:
            self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_timed_out)
        super().data_received(data)

    def on_headers_complete(self) -> None:
        self._cancel_head_timer()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        logger.info(
            "408 to %s: its request headers took over %g s", self.client, self.head_timeout_s
        )
        self.transport.write(self._timeout_response())
        self.transport.close()

    def _timeout_response(self) -> bytes:
        message = (
            "the request line and headers did not arrive in time (they must arrive within "
            f"{self.head_timeout_s:g} s, limits.header_timeout_s)"
        )
        response = error_response(408, CODE, message, headers={"connection": "close"})
        lines = [b"HTTP/1.1 408 Request Timeout"]
        # the server and date headers uvicorn puts on every response, then the response's own
        for name, value in [*self.server_state.default_headers, *response.raw_headers]:
            lines.append(name + b": " + value)
        return b"\r\n".join(lines) + b"\r\n\r\n" + response.body


def bounded_head_protocol(head_timeout_s: float) -> type[asyncio.Protocol]:
    """The protocol for uvicorn's ``http`` option. A partial of a module-level class, so that
    ``serve --workers N`` can hand it to the worker processes it spawns (by pickling); uvicorn
    only calls what it is given, as it would the class, so it is typed as one."""
    made = functools.partial(BoundedHeadProtocol, head_timeout_s=head_timeout_s)
    return cast("type[asyncio.Protocol]", made)
