"""GET /v1/streams/{id} and POST /v1/streams/{id}/cancel."""

from __future__ import annotations

from pydantic import BaseModel

# (a native event stream's ``responses=``: routes of job events import it from here)
from rag_stream.schemas.event_stream import SSE_RESPONSES

__all__ = ["EVENT_ID_MAX", "SSE_RESPONSES", "CancelResponse", "StreamStatus"]

# Event ids count from 0 in each stream; no stream comes near this, and a cursor above it (a
# signed 64-bit integer, what every store holds) is refused before it reaches one.
EVENT_ID_MAX = 2**63 - 1


class StreamStatus(BaseModel):
    stream_id: str
    status: str  # running | done | error
    model: str
    created: float
    last_event_id: int
    finish_reason: str | None
    owner_alive: bool
    cancel_requested: bool


class CancelResponse(BaseModel):
    stream_id: str
    cancelled: bool
    status: StreamStatus
    message: str
