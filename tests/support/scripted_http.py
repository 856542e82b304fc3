"""Scripted HTTP answers for the client's unit tests (``httpx.MockTransport``): SSE bodies that
may break off with a transport error, and a server that answers requests in order."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx

from rag_stream.schemas.events import Event
from rag_stream.streaming.sse import frame

SID = "s" * 32  # the stream id the scripted answers carry


class SseBody(httpx.SyncByteStream, httpx.AsyncByteStream):
    """SSE frames, then optionally a transport error (the connection cut mid-body)."""

    def __init__(self, chunks: list[bytes], fail: Exception | None = None) -> None:
        self._chunks, self._fail = chunks, fail

    def __iter__(self) -> Iterator[bytes]:
        yield from self._chunks
        if self._fail is not None:
            raise self._fail

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self._chunks:
            yield chunk
        if self._fail is not None:
            raise self._fail


def sse(events: list[Event], fail: Exception | None = None, extra: bytes = b"") -> httpx.Response:
    """A 200 event stream of ``events`` (then ``extra`` bytes), named ``SID``."""
    chunks = [frame(e) for e in events] + ([extra] if extra else [])
    headers = {"content-type": "text/event-stream", "x-stream-id": SID}
    return httpx.Response(200, headers=headers, stream=SseBody(chunks, fail))


class ScriptedServer:
    """Answers requests in order from a script (a response, or an error to raise); records
    each request."""

    def __init__(self, *answers: httpx.Response | Exception) -> None:
        self._answers = list(answers)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self._answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    @property
    def cursors(self) -> list[str | None]:
        """The ``Last-Event-ID`` of each request."""
        return [r.headers.get("last-event-id") for r in self.requests]

    @property
    def seen(self) -> list[tuple[str, str | None]]:
        """Each request's path and ``Last-Event-ID``."""
        return [(r.url.path, r.headers.get("last-event-id")) for r in self.requests]
