"""Resume, inspect and cancel streams, from any server process sharing the Redis."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query
from fastapi.responses import JSONResponse, Response
from redis.exceptions import RedisError

from rag_stream.api.deps import ResourcesDep
from rag_stream.errors import EventLogUnavailable, InvalidRequest
from rag_stream.schemas.streams import CancelResponse, StreamStatus
from rag_stream.streaming.event_log import StreamMeta, require_meta
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
    resources: ResourcesDep,
    last_event_id_header: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
    last_event_id: Annotated[int | None, Query()] = None,
) -> Response:
    cursor = _cursor(last_event_id_header, last_event_id)
    meta = await require_meta(resources.streams.log, stream_id)
    if cursor > meta.last_event_id:
        raise InvalidRequest(
            f"last_event_id {cursor} is beyond the stream's last event ({meta.last_event_id})"
        )
    events = resources.streams.follow(stream_id, cursor)
    return event_stream_response(events, resources.settings.streaming.keepalive_s)


@router.get("/v1/streams/{stream_id}")
async def stream_status(stream_id: str, resources: ResourcesDep) -> StreamStatus:
    return _status(await require_meta(resources.streams.log, stream_id))


@router.post("/v1/streams/{stream_id}/cancel", response_model=None)
async def cancel_stream(stream_id: str, resources: ResourcesDep) -> JSONResponse | CancelResponse:
    streams = resources.streams
    meta = await require_meta(streams.log, stream_id)
    if meta.status != "running":
        return CancelResponse(
            stream_id=stream_id,
            cancelled=False,
            status=_status(meta),
            message=f"stream already finished ({meta.finish_reason}); nothing to cancel",
        )
    try:
        await streams.log.request_cancel(stream_id)
        if meta.lease_owner is None:  # its process died: end it from here
            await streams.take_over(stream_id)
        final = await streams.wait_finished(stream_id, timeout_s=10)
    except RedisError as exc:
        raise EventLogUnavailable(f"event log unavailable: {exc}") from exc
    final = final or meta
    return CancelResponse(
        stream_id=stream_id,
        cancelled=final.status == "running" or final.finish_reason == "cancelled",
        status=_status(final),
        message={"running": "cancel requested; the stream is ending"}.get(
            final.status,
            "cancelled" if final.finish_reason == "cancelled" else "the stream ended first",
        ),
    )
