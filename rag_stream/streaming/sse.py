"""The one place events become SSE frames.

A frame is ``id:``, ``event:`` and one ``data:`` line holding the event as JSON (JSON never
contains a raw newline). Events that are ready together go out as one chunk: one write to the
socket instead of one per event.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from sse_starlette import EventSourceResponse

from rag_stream.schemas.events import Event, TransientError

SSE_HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}


def frame(event: Event) -> bytes:
    if isinstance(event, TransientError):
        # not in the log: no id, so a client's Last-Event-ID still names the last logged event
        data = event.model_dump_json(exclude={"id"})
        return f"event: {event.type}\ndata: {data}\n\n".encode()
    return f"id: {event.id}\nevent: {event.type}\ndata: {event.model_dump_json()}\n\n".encode()


def event_stream_response(
    batches: AsyncIterator[Sequence[Event]], keepalive_s: float
) -> EventSourceResponse:
    async def chunks() -> AsyncIterator[bytes]:
        async for batch in batches:
            yield b"".join(frame(event) for event in batch)

    return EventSourceResponse(
        chunks(),
        ping=max(1, round(keepalive_s)),
        headers=SSE_HEADERS,
        send_timeout=30,
    )
