"""GET /v1/streams/{id} and POST /v1/streams/{id}/cancel."""

from __future__ import annotations

from pydantic import BaseModel


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
