"""Resume, inspect and cancel streams, from any server process sharing the Redis."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query
from fastapi.responses import Response
from sse_starlette import EventSourceResponse

from rag_stream.api.chat_format import chat_frames, chat_wire
from rag_stream.api.cursor import resume_cursor
from rag_stream.api.deps import SettingsDep, StreamsDep, TenantDep
from rag_stream.schemas.streams import (
    EVENT_ID_MAX,
    SSE_RESPONSES,
    CancelResponse,
    StreamStatus,
)
from rag_stream.streaming.event_log import StreamMeta
from rag_stream.streaming.sse import event_stream_response, sse_response

router = APIRouter(tags=["streams"])


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
    responses=SSE_RESPONSES,
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
    last_event_id: Annotated[
        int | None,
        Query(
            ge=0, le=EVENT_ID_MAX, description="resume after this event id (wins over the header)"
        ),
    ] = None,
) -> Response:
    cursor = resume_cursor(last_event_id_header, last_event_id)
    meta = await streams.check_cursor(stream_id, cursor, tenant=tenant)
    if meta.wire is None:
        events = streams.follow_batches(stream_id, cursor)
        return event_stream_response(events, settings.streaming.keepalive_s)
    # a chat-completions stream: the same chunks again, from its first event (see chat_format)
    wire = chat_wire(meta.wire)
    frames = chat_frames(wire, streams.follow_batches(stream_id), after=cursor)
    return sse_response(frames, settings.streaming.keepalive_s, {"X-Stream-Id": stream_id})


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
