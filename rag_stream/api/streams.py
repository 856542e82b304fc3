"""Resume, inspect and cancel streams, from any server process sharing the Redis."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query
from fastapi.responses import Response

from rag_stream.api.deps import SettingsDep, StreamsDep
from rag_stream.errors import InvalidRequest
from rag_stream.schemas.streams import CancelResponse, StreamStatus
from rag_stream.streaming.event_log import StreamMeta
from rag_stream.streaming.sse import event_stream_response

router = APIRouter(tags=["streams"])


def _cursor(header: str | None, query: int | None) -> int:
    raw: str | int | None = query if query is not None else header
    if raw is None:
        return -1  # from the start
    try:
        cursor = int(raw)
    except ValueError:
        raise InvalidRequest(f"Last-Event-ID must be an integer event id, got {raw!r}") from None
    if cursor < 0:
        raise InvalidRequest(
            f"last_event_id must be >= 0 (omit it to replay from the start), got {cursor}"
        )
    return cursor


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


@router.get("/v1/streams/{stream_id}/events")
async def stream_events(
    stream_id: str,
    streams: StreamsDep,
    settings: SettingsDep,
    last_event_id_header: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
    last_event_id: Annotated[int | None, Query()] = None,
) -> Response:
    events = await streams.resume(stream_id, _cursor(last_event_id_header, last_event_id))
    return event_stream_response(events, settings.streaming.keepalive_s)


@router.get("/v1/streams/{stream_id}")
async def stream_status(stream_id: str, streams: StreamsDep) -> StreamStatus:
    return _status(await streams.status(stream_id))


@router.post("/v1/streams/{stream_id}/cancel")
async def cancel_stream(stream_id: str, streams: StreamsDep) -> CancelResponse:
    outcome = await streams.cancel(stream_id)
    return CancelResponse(
        stream_id=stream_id,
        cancelled=outcome.cancelled,
        status=_status(outcome.meta),
        message=outcome.message,
    )
