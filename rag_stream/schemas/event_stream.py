"""How a ``text/event-stream`` response is described in the OpenAPI document.

One SSE frame is ``{"event", "data", "id"}`` as a client parses it, and each wire's frames carry
their JSON in ``data``: ``itemSchema`` describes one frame, with ``data``'s JSON under
``contentSchema`` (``contentMediaType: application/json``), as FastAPI describes its own SSE
routes and as schemathesis checks every frame it reads. The event models' schemas reference
``#/components/schemas/...`` and travel in ``$defs``, which ``rag_stream/api/openapi.py``
moves into the document's components.

- ``NATIVE``: rag-stream's events (docs/protocol.md), ``event:`` their type;
- ``CHAT``: OpenAI's ``chat.completion.chunk`` frames (or ``{"error": ...}``), then ``[DONE]``;
- ``UI``: the AI SDK's UI message parts, then ``[DONE]``.
"""

from __future__ import annotations

from typing import Any, get_args

from pydantic import BaseModel, TypeAdapter

from rag_stream.schemas.events import ErrorEvent, Event

_COMPONENTS = "#/components/schemas/{model}"
_EVENT_TYPES = sorted(m.model_fields["type"].default for m in get_args(get_args(Event)[0]))
_DONE_SENTINEL = {"const": "[DONE]", "description": "the last frame"}


def _transient_error() -> dict[str, Any]:
    """An error a reader hit itself (TransientError): an ``error`` event without an id."""
    schema = ErrorEvent.model_json_schema(ref_template=_COMPONENTS)
    del schema["properties"]["id"]
    schema["required"] = [name for name in schema.get("required", []) if name != "id"]
    schema["title"] = "TransientError"
    return schema


def _events() -> dict[str, Any]:
    union = TypeAdapter(Event).json_schema(ref_template=_COMPONENTS)
    defs = union.pop("$defs")
    defs["TransientError"] = _transient_error()
    return {
        "anyOf": [union, {"$ref": _COMPONENTS.format(model="TransientError")}],
        "$defs": defs,
    }


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {
        "type": "string",
        "contentMediaType": "application/json",
        "contentSchema": schema,
        "description": description,
    }


def _frame(event: dict[str, Any], data: dict[str, Any], *, id_: str) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["data"],
        "properties": {
            "event": event,
            "data": data,
            "id": {"type": "string", "pattern": "^[0-9]+$", "description": id_},
        },
    }


NATIVE = _frame(
    {"enum": _EVENT_TYPES, "description": "the event's type"},
    _json(_events(), "the event as JSON (docs/protocol.md)"),
    id_="the event's id; absent on an error the reader itself hit",
)
_CHAT_CHUNK = {
    "type": "object",
    "required": ["id", "object", "created", "model", "choices"],
    "properties": {
        "id": {"type": "string"},
        "object": {"const": "chat.completion.chunk"},
        "created": {"type": "integer"},
        "model": {"type": "string"},
        "choices": {"type": "array", "items": {"type": "object"}},
    },
}
_CHAT_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {"type": "object", "required": ["message", "type", "code"]}},
}
CHAT = _frame(
    {"const": "message", "description": "(no event: line)"},
    {"anyOf": [_DONE_SENTINEL, _json({"anyOf": [_CHAT_CHUNK, _CHAT_ERROR]}, "a chunk")]},
    id_="the stream event the frame ends, on its last frame only",
)
UI = _frame(
    {"const": "message", "description": "(no event: line)"},
    {
        "anyOf": [
            _DONE_SENTINEL,
            _json(
                {
                    "type": "object",
                    "required": ["type"],
                    "properties": {"type": {"type": "string"}},
                },
                "a UI message part (the AI SDK's UI message stream protocol v1)",
            ),
        ]
    },
    id_="the stream event the part ends, on its last part only",
)


def sse_responses(
    *frames: dict[str, Any], json: type[BaseModel] | None = None
) -> dict[int | str, dict[str, Any]]:
    """A route's ``responses=``: 200 as server-sent events of ``frames`` (one of them, or any
    of several), and as ``json`` too when the request may ask for one JSON body instead."""
    item = frames[0] if len(frames) == 1 else {"anyOf": list(frames)}
    ok: dict[str, Any] = {
        "description": "server-sent events (docs/protocol.md)"
        + (", or one JSON body with stream: false" if json is not None else ""),
        "content": {"text/event-stream": {"itemSchema": item}},
    }
    if json is not None:
        ok["model"] = json
    return {200: ok}


SSE_RESPONSES = sse_responses(NATIVE)
