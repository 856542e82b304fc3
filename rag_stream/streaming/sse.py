"""The one place events become SSE frames.

A frame is ``id:``, ``event:`` and one ``data:`` line holding the event as JSON (JSON never
contains a raw newline). Events that are ready together go out as one chunk: one write to the
socket instead of one per event.

Every send has a time limit (``SEND_TIMEOUT_S``): a client that stops reading fills the
socket's buffers, and its send would then wait for good. sse-starlette bounds each send with a
cancel scope of its own, about 10 µs of Python for every chunk, a token's included.
``_Response`` keeps the same limit with one timer a response instead (armed while a send is in
flight, so it fires about once a limit), and a send past it raises sse-starlette's
``SendTimeoutError`` as the library's own check does.

A stream's events reach the socket with no layer between the reader and the send loop: the
response renders each batch the reader yields itself (``event_stream_response``), where a
generator turning batches into bytes would be resumed once more for every token.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

import anyio
from sse_starlette import EventSourceResponse, ServerSentEvent
from sse_starlette.sse import SendTimeoutError
from starlette.types import Message, Receive, Scope, Send

from rag_stream.schemas.events import Event, TransientError

logger = logging.getLogger(__name__)

SSE_HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
SEND_TIMEOUT_S = 30.0  # a send that waits longer for the client to read ends its response


class _KeepAlive(ServerSentEvent):
    """A comment line with no blank line after it: bytes on a quiet connection (for proxies)
    that no parser turns into an event. A whole comment block (``: ping`` and a blank line) is
    an event with empty data to parsers that carry the last id over, and the ``openai`` SDK
    fails on it (it parses every event's data as JSON); a lone comment line is skipped by all."""

    def encode(self) -> bytes:
        return b": keep-alive\n"


_KEEP_ALIVE = _KeepAlive()


class _Response(EventSourceResponse):
    """sse-starlette's response, its limit on each send kept by one timer (module docstring),
    its items turned into bytes by ``render`` (None: they are bytes already).

    A send notes when it began, by task: the response's stream and its keep-alive pings send
    from tasks of their own. The timer, armed by a send when none is, cancels every send older
    than the limit, then re-arms itself for the oldest still in flight."""

    def __init__(
        self, items: AsyncIterator[Any], render: Callable[[Any], bytes] | None, **kwargs: Any
    ) -> None:
        super().__init__(items, **kwargs)
        self._render = render
        self._sending: dict[asyncio.Task[object], float] = {}  # task: when its send began
        self._expired: set[asyncio.Task[object]] = set()  # sends the timer cancelled
        self._watch: asyncio.TimerHandle | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self._watch is not None:
                self._watch.cancel()
                self._watch = None

    async def _stream_response(self, send: Send) -> None:
        """sse-starlette's loop (the start, each item as a body chunk, the end), with the item
        rendered here and no per-chunk conversion or debug log: the path every token takes."""
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        self._response_started = True
        render = self._render
        items = self.body_iterator
        task = asyncio.current_task()  # (once: a Python function on 3.11, not free a chunk)
        async for item in items:
            try:
                chunk = item if render is None else render(item)
                message = {"type": "http.response.body", "body": chunk, "more_body": True}
                await self._send_with_timeout(send, message, task)
            except BaseException:
                await self._close(items)  # its cleanup (the reader's feed) before the error
                raise
        async with self._send_lock:  # (with a keep-alive's send, which takes it too)
            try:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            except BaseException:
                self._send_interrupted = True
                raise
            # only now: the disconnect listener, seeing it inactive, would end the response
            # (and so cut this last send) as soon as it woke
            self._response_complete = True
            self.active = False

    async def _close(self, items: object) -> None:
        aclose = getattr(items, "aclose", None)
        if aclose is None:
            return
        with anyio.move_on_after(self._cleanup_timeout, shield=True) as scope:
            try:
                await aclose()
            except Exception:
                logger.exception("closing a response's items after a failed send failed")
        if scope.cancel_called:
            logger.warning("closing a response's items took over %s s", self._cleanup_timeout)

    async def _send_with_timeout(
        self, send: Send, message: Message, task: asyncio.Task[object] | None = None
    ) -> None:
        """A send from ``task`` (this one when not given: a keep-alive's), under the limit."""
        limit = self.send_timeout
        task = task or asyncio.current_task()
        if limit is None or task is None:
            await super()._send_with_timeout(send, message)
            return
        loop = asyncio.get_running_loop()
        self._sending[task] = loop.time()
        if self._watch is None:
            self._watch = loop.call_later(limit, self._check_sends)
        try:
            await send(message)
        except asyncio.CancelledError:
            self._send_interrupted = True
            if task not in self._expired:
                raise
            self._expired.discard(task)
            task.uncancel()  # the cancel was the timer's, answered here
            raise SendTimeoutError() from None
        except BaseException:
            self._send_interrupted = True
            raise
        finally:
            del self._sending[task]

    def _check_sends(self) -> None:
        self._watch = None
        if not self._sending or self.send_timeout is None:
            return
        loop = asyncio.get_running_loop()
        now, limit = loop.time(), self.send_timeout
        for task, began in self._sending.items():
            if now - began >= limit and task not in self._expired:
                self._expired.add(task)
                task.cancel()
        waiting = [began for task, began in self._sending.items() if task not in self._expired]
        if waiting:
            self._watch = loop.call_at(min(waiting) + limit, self._check_sends)


def frame(event: Event) -> bytes:
    if isinstance(event, TransientError):
        # not in the log: no id, so a client's Last-Event-ID still names the last logged event
        data = event.model_dump_json(exclude={"id"})
        return f"event: {event.type}\ndata: {data}\n\n".encode()
    return f"id: {event.id}\nevent: {event.type}\ndata: {event.as_json}\n\n".encode()


def frames(batch: Sequence[Event]) -> bytes:
    """Events that are ready together, as one chunk."""
    return frame(batch[0]) if len(batch) == 1 else b"".join(map(frame, batch))


def event_stream_response(
    batches: AsyncIterator[Sequence[Event]],
    keepalive_s: float,
    headers: Mapping[str, str] | None = None,
) -> EventSourceResponse:
    """Send a reader's batches of events as SSE frames (``frames``)."""
    return _respond(batches, frames, keepalive_s, headers)


def sse_response(
    chunks: AsyncIterator[bytes],
    keepalive_s: float,
    headers: Mapping[str, str] | None = None,
    send_timeout_s: float = SEND_TIMEOUT_S,
) -> EventSourceResponse:
    """Send ready-made SSE frames, with keep-alive comments while the stream is quiet."""
    return _respond(chunks, None, keepalive_s, headers, send_timeout_s)


def _respond(
    items: AsyncIterator[Any],
    render: Callable[[Any], bytes] | None,
    keepalive_s: float,
    headers: Mapping[str, str] | None = None,
    send_timeout_s: float = SEND_TIMEOUT_S,
) -> EventSourceResponse:
    return _Response(
        items,
        render,
        ping=max(1, round(keepalive_s)),
        ping_message_factory=lambda: _KEEP_ALIVE,
        headers={**SSE_HEADERS, **(headers or {})},
        send_timeout=send_timeout_s,
    )
