"""Where a reader resumes a stream: the ``Last-Event-ID`` header or the ``last_event_id`` query
parameter, for every route that follows a stream (``/v1/streams/{id}/events``, a job's events)."""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import Query

from rag_stream.errors import InvalidRequest
from rag_stream.schemas.streams import EVENT_ID_MAX

# ASCII digits only: int() would also take "1_0", "+1" and other scripts' digits.
_EVENT_ID = re.compile(r"-?[0-9]+")


# The query form of the cursor, as every route that follows a stream declares it (resume_cursor
# reads it, as strictly as the header).
LastEventIdQuery = Annotated[
    str | None,
    Query(
        description="resume after this event id (wins over the header); ASCII digits",
        max_length=40,
        json_schema_extra={"pattern": r"^[0-9]+$"},
    ),
]


def resume_cursor(header: str | None, query: str | None) -> int:
    """Where a reader resumes: the ``last_event_id`` query parameter wins over the
    ``Last-Event-ID`` header, and both are read the same way (ASCII digits, 0 to EVENT_ID_MAX);
    -1 replays from the start."""
    if query is not None:
        return _event_id("last_event_id", query)
    return _event_id("Last-Event-ID", header)


def _event_id(name: str, given: str | None) -> int:
    raw = (given or "").strip() if name == "Last-Event-ID" else given or ""
    if not raw:
        return -1  # absent, or sent empty: browsers send none before their first event
    shown = raw if len(raw) <= 40 else raw[:40] + "..."
    if not _EVENT_ID.fullmatch(raw):
        raise InvalidRequest(f"{name} must be an integer event id, got {shown!r}", param=name)
    if raw.startswith("-"):
        raise InvalidRequest(
            f"{name} must be >= 0 (omit it to replay from the start), got {shown}", param=name
        )
    # compare lengths first: int() refuses strings of thousands of digits
    if len(raw.lstrip("0")) > len(str(EVENT_ID_MAX)) or int(raw) > EVENT_ID_MAX:
        raise InvalidRequest(f"{name} must be at most {EVENT_ID_MAX}, got {shown}", param=name)
    return int(raw)
