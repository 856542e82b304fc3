"""A stream's events, resumed across dropped connections (the loop around resume.py's
``Resumer``): ``AsyncEventStream`` (async_stream.py, written by hand) and ``EventStream``
(sync_stream.py, generated from it by scripts/gen_sync_client.py)."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from types import TracebackType

import httpx
from httpx_sse import aconnect_sse

from rag_stream.client.calls import StreamStart
from rag_stream.client.flavours import asleep
from rag_stream.client.resume import RETRYABLE, Resumer
from rag_stream.schemas.events import Event


class AsyncEventStream:
    """Iterate it for the stream's typed events, ``stream`` first and ``done`` or ``error``
    last, each id once and in order, across as many connections as it takes. ``stream_id`` is
    known as soon as the server has answered (before any event is read). Closing it (or leaving
    its ``with`` block) closes the connection; the stream goes on on the server.
    ``AsyncEventStream`` is the same with ``async for``, ``async with`` and ``aclose()``."""

    def __init__(
        self, http: httpx.AsyncClient, start: StreamStart | None, resumer: Resumer
    ) -> None:
        self._http = http
        self._resumer = resumer
        self._events = self._run(start)

    @property
    def stream_id(self) -> str | None:
        return self._resumer.stream_id

    @property
    def last_event_id(self) -> int:
        return self._resumer.last_event_id

    def __aiter__(self) -> AsyncEventStream:
        return self

    async def __anext__(self) -> Event:
        return await self._events.__anext__()

    async def aclose(self) -> None:
        await self._events.aclose()

    async def __aenter__(self) -> AsyncEventStream:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def _run(self, start: StreamStart | None) -> AsyncGenerator[Event, None]:
        resumer = self._resumer
        while True:
            try:
                method, path, kwargs = resumer.request(start)
                async with aconnect_sse(self._http, method, path, **kwargs) as source:
                    if source.response.is_error:
                        await source.response.aread()
                    resumer.opened(source.response, starting=start is not None)
                    start = None
                    async with aclosing(source.aiter_sse()) as events:
                        async for sse in events:
                            event = resumer.accept(sse)
                            if event is not None:
                                yield event
                            if resumer.finished:
                                return
                raise resumer.ended()
            except RETRYABLE as exc:
                await asleep(resumer.failed(exc, starting=start is not None))
