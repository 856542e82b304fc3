"""The one place events become SSE frames.

A frame is ``id:``, ``event:`` and one ``data:`` line holding the event as JSON (JSON never
contains a raw newline). Events that are ready together go out as one chunk: one write to the
socket instead of one per event.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence

from sse_starlette import EventSourceResponse, ServerSentEvent

from rag_stream.schemas.events import Event, TransientError

SSE_HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}


class _KeepAlive(ServerSentEvent):
    """A comment line with no blank line after it: bytes on a quiet connection (for proxies)
    that no parser turns into an event. A whole comment block (``: ping`` and a blank line) is
    an event with empty data to parsers that carry the last id over, and the ``openai`` SDK
    fails on it (it parses every event's data as JSON); a lone comment line is skipped by all."""

    def encode(self) -> bytes:
        return b": keep-alive\n"


_KEEP_ALIVE = _KeepAlive()


def frame(event: Event) -> bytes:
    if isinstance(event, TransientError):
        # not in the log: no id, so a client's Last-Event-ID still names the last logged event
        data = event.model_dump_json(exclude={"id"})
        return f"event: {event.type}\ndata: {data}\n\n".encode()
    return f"id: {event.id}\nevent: {event.type}\ndata: {event.as_json}\n\n".encode()


def event_stream_response(
    batches: AsyncIterator[Sequence[Event]],
    keepalive_s: float,
    headers: Mapping[str, str] | None = None,
) -> EventSourceResponse:
    async def chunks() -> AsyncIterator[bytes]:
        async for batch in batches:
            yield b"".join(frame(event) for event in batch)

    return sse_response(chunks(), keepalive_s, headers)


def sse_response(
    chunks: AsyncIterator[bytes], keepalive_s: float, headers: Mapping[str, str] | None = None
) -> EventSourceResponse:
    """Send ready-made SSE frames, with keep-alive comments while the stream is quiet."""
    return EventSourceResponse(
        chunks,
        ping=max(1, round(keepalive_s)),
        ping_message_factory=lambda: _KEEP_ALIVE,
        headers={**SSE_HEADERS, **(headers or {})},
        send_timeout=30,
    )
