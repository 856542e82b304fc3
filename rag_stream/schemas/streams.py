"""GET /v1/streams/{id} and POST /v1/streams/{id}/cancel."""

from __future__ import annotations

from typing import Any, get_args

from pydantic import BaseModel

from rag_stream.schemas.events import Event

# Event ids count from 0 in each stream; no stream comes near this, and a cursor above it (a
# signed 64-bit integer, what every store holds) is refused before it reaches one.
EVENT_ID_MAX = 2**63 - 1

_EVENT_TYPES = sorted(m.model_fields["type"].default for m in get_args(get_args(Event)[0]))

# OpenAPI for an SSE response (``responses=SSE_RESPONSES`` on a route): the schema describes one
# event as clients parse it; docs/protocol.md has each type's JSON body.
SSE_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "server-sent events, one per frame (docs/protocol.md)",
        "content": {
            "text/event-stream": {
                "schema": {
                    "type": "object",
                    "required": ["event", "data"],
                    "properties": {
                        "id": {
                            "type": "string",
                            "pattern": "^[0-9]+$",
                            "description": "absent on an error the reader itself hit",
                        },
                        "event": {"enum": _EVENT_TYPES},
                        "data": {"type": "string", "description": "the event's JSON body"},
                    },
                }
            }
        },
    }
}


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
