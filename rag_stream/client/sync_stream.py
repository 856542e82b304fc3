# Generated from async_stream.py by scripts/gen_sync_client.py: do not edit. Change
# async_stream.py and run `.venv/bin/python scripts/gen_sync_client.py`.
"""A stream's events, resumed across dropped connections (the loop around resume.py's
``Resumer``): ``AsyncEventStream`` (async_stream.py, written by hand) and ``EventStream``
(sync_stream.py, generated from it by scripts/gen_sync_client.py)."""

from __future__ import annotations

from collections.abc import Generator
from contextlib import nullcontext
from types import TracebackType

import httpx
from httpx_sse import connect_sse

from rag_stream.client.calls import StreamStart
from rag_stream.client.flavours import sleep
from rag_stream.client.resume import RETRYABLE, Resumer
from rag_stream.schemas.events import Event


class EventStream:
    """Iterate it for the stream's typed events, ``stream`` first and ``done`` or ``error``
    last, each id once and in order, across as many connections as it takes. ``stream_id`` is
    known as soon as the server has answered (before any event is read). Closing it (or leaving
    its ``with`` block) closes the connection; the stream goes on on the server.
    ``AsyncEventStream`` is the same with ``async for``, ``async with`` and ``aclose()``."""

    def __init__(self, http: httpx.Client, start: StreamStart | None, resumer: Resumer) -> None:
        self._http = http
        self._resumer = resumer
        self._events = self._run(start)

    @property
    def stream_id(self) -> str | None:
        return self._resumer.stream_id

    @property
    def last_event_id(self) -> int:
        return self._resumer.last_event_id

    def __iter__(self) -> EventStream:
        return self

    def __next__(self) -> Event:
        return self._events.__next__()

    def close(self) -> None:
        self._events.close()

    def __enter__(self) -> EventStream:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _run(self, start: StreamStart | None) -> Generator[Event, None]:
        resumer = self._resumer
        while True:
            try:
                method, path, kwargs = resumer.request(start)
                with connect_sse(self._http, method, path, **kwargs) as source:
                    if source.response.is_error:
                        source.response.read()
                    resumer.opened(source.response, starting=start is not None)
                    start = None
                    with nullcontext(source.iter_sse()) as events:
                        for sse in events:
                            event = resumer.accept(sse)
                            if event is not None:
                                yield event
                            if resumer.finished:
                                return
                raise resumer.ended()
            except RETRYABLE as exc:
                sleep(resumer.failed(exc, starting=start is not None))
