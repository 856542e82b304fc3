"""Resume, inspect and cancel streams, from any server process sharing the Redis."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Header
from fastapi.responses import Response
from pydantic import Field, TypeAdapter, ValidationError
from sse_starlette import EventSourceResponse

from rag_stream.api.chat_format import chat_frames
from rag_stream.api.cursor import LastEventIdQuery, resume_cursor
from rag_stream.api.deps import SettingsDep, StreamsDep, TenantDep
from rag_stream.api.ui_format import ui_frames
from rag_stream.errors import IncompatiblePlan
from rag_stream.schemas.event_stream import CHAT, NATIVE, UI, sse_responses
from rag_stream.schemas.events import Event
from rag_stream.schemas.openai import ChatWire
from rag_stream.schemas.streams import CancelResponse, StreamStatus
from rag_stream.schemas.ui_chat import UI_STREAM_HEADERS, UIWire
from rag_stream.streaming.event_log import StreamMeta
from rag_stream.streaming.sse import event_stream_response, sse_response

router = APIRouter(tags=["streams"])
_WIRES: TypeAdapter[ChatWire | UIWire] = TypeAdapter(
    Annotated[ChatWire | UIWire, Field(discriminator="format")]
)


def stream_wire(stored: str) -> ChatWire | UIWire:
    """The response format a stream was started in (chat chunks, or the AI SDK's UI parts),
    as this version reads it."""
    try:
        return _WIRES.validate_json(stored)
    except ValidationError:
        raise IncompatiblePlan(
            "the stream's response format was stored by another version of the service; it "
            "cannot be resumed here"
        ) from None


def _status(meta: StreamMeta) -> StreamStatus:
    return StreamStatus(
        stream_id=meta.stream_id,
        status=meta.status,
        model=meta.model,
        created=meta.created,
        last_event_id=meta.last_event_id,
        finish_reason=meta.finish_reason,
        owner_alive=meta.lease_owner is not None,
        cancel_requested=meta.cancel,
    )


@router.get(
    "/v1/streams/{stream_id}/events",
    response_class=EventSourceResponse,
    responses=sse_responses(NATIVE, CHAT, UI),  # in the format the stream started in
)
async def stream_events(
    stream_id: str,
    streams: StreamsDep,
    settings: SettingsDep,
    tenant: TenantDep,
    last_event_id_header: Annotated[
        str | None,
        Header(
            alias="Last-Event-ID",
            description="resume after this event id; empty or absent: from the start",
            # documented only: resume_cursor checks it, with messages that say what is wrong
            json_schema_extra={"pattern": r"^\s*[0-9]*\s*$"},
        ),
    ] = None,
    last_event_id: LastEventIdQuery = None,
) -> Response:
    cursor = resume_cursor(last_event_id_header, last_event_id)
    meta = await streams.check_cursor(stream_id, cursor, tenant=tenant)
    if meta.wire is None:
        events = streams.follow_batches(stream_id, cursor)
        return event_stream_response(events, settings.streaming.keepalive_s)
    # a stream started in another wire: the same frames again, after the cursor. The renderer
    # is told what it must know of the part before it (the opening: the stream event, the
    # sources, whether text began), not every event since the start: a resume's cost follows
    # what is left of the stream, not its length.
    wire = stream_wire(meta.wire)
    opening = await streams.opening(stream_id, cursor)
    batches = _prefixed(opening, streams.follow_batches(stream_id, cursor))
    headers = {"X-Stream-Id": stream_id}
    if isinstance(wire, UIWire):
        frames = ui_frames(wire, batches, after=cursor)
        headers |= UI_STREAM_HEADERS
    else:
        skipped_from = opening[-1].id if opening else cursor

        async def skipped() -> list[Event]:  # the tokens between the opening and the cursor
            if skipped_from >= cursor:
                return []
            return await streams.events_between(stream_id, skipped_from, cursor)

        frames = chat_frames(wire, batches, after=cursor, earlier=skipped)
    return sse_response(frames, settings.streaming.keepalive_s, headers)


async def _prefixed(
    first: list[Event], rest: AsyncGenerator[list[Event], None]
) -> AsyncIterator[list[Event]]:
    if first:
        yield first
    async with contextlib.aclosing(rest):
        async for batch in rest:
            yield batch


@router.get("/v1/streams/{stream_id}")
async def stream_status(stream_id: str, streams: StreamsDep, tenant: TenantDep) -> StreamStatus:
    return _status(await streams.status(stream_id, tenant=tenant))


@router.post("/v1/streams/{stream_id}/cancel")
async def cancel_stream(stream_id: str, streams: StreamsDep, tenant: TenantDep) -> CancelResponse:
    outcome = await streams.cancel(stream_id, tenant=tenant)
    return CancelResponse(
        stream_id=stream_id,
        cancelled=outcome.cancelled,
        status=_status(outcome.meta),
        message=outcome.message,
    )
