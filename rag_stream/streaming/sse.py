"""The one place events become SSE frames."""

from __future__ import annotations

from collections.abc import AsyncIterator

from sse_starlette import EventSourceResponse, ServerSentEvent

from rag_stream.schemas.events import Event, TransientError

SSE_HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}


def to_sse(event: Event) -> ServerSentEvent:
    return ServerSentEvent(
        id=None if isinstance(event, TransientError) else str(event.id),
        event=event.type,
        data=event.model_dump_json(exclude={"id", "type"}),
    )


def event_stream_response(events: AsyncIterator[Event], keepalive_s: float) -> EventSourceResponse:
    async def frames() -> AsyncIterator[ServerSentEvent]:
        async for event in events:
            yield to_sse(event)

    return EventSourceResponse(
        frames(),
        ping=max(1, round(keepalive_s)),
        headers=SSE_HEADERS,
        send_timeout=30,
    )
