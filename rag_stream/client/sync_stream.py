"""A stream's events for the sync client, resumed across dropped connections (see resume.py)."""

from __future__ import annotations

import time
from collections.abc import Generator
from types import TracebackType

import httpx
from httpx_sse import connect_sse

from rag_stream.client.calls import StreamStart
from rag_stream.client.resume import RETRYABLE, Resumer
from rag_stream.schemas.events import Event


class EventStream:
    """Iterate it for the stream's typed events, ``stream`` first and ``done`` or ``error``
    last, each id once and in order, across as many connections as it takes. ``stream_id`` is
    known as soon as the server has answered (before any event is read). Closing it (or leaving
    its ``with`` block) closes the connection; the stream goes on on the server."""

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
        return next(self._events)

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

    def _run(self, start: StreamStart | None) -> Generator[Event, None, None]:
        resumer = self._resumer
        while True:
            try:
                method, path, kwargs = resumer.request(start)
                with connect_sse(self._http, method, path, **kwargs) as source:
                    if source.response.is_error:
                        source.response.read()
                    resumer.opened(source.response, starting=start is not None)
                    start = None
                    for sse in source.iter_sse():
                        event = resumer.accept(sse)
                        if event is not None:
                            yield event
                        if resumer.finished:
                            return
                raise resumer.ended()
            except RETRYABLE as exc:
                time.sleep(resumer.failed(exc, starting=start is not None))
