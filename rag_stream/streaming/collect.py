"""Fold a stream's events into one result (for ``stream: false`` responses)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from rag_stream.errors import RagStreamError, from_code
from rag_stream.schemas.events import Citation, Done, ErrorEvent, Event, StreamStarted, Token


@dataclass
class Collected:
    started: StreamStarted | None = None
    citations: list[Citation] = field(default_factory=list)
    pieces: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    done: Done = field(default_factory=lambda: Done(id=0, finish_reason="error"))

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def start(self) -> StreamStarted:
        if self.started is None:
            raise RagStreamError("the stream has no stream event")
        return self.started


async def collect(events: AsyncIterator[Event]) -> Collected:
    result = Collected()
    async for event in events:
        if isinstance(event, StreamStarted):
            result.started = event
        elif isinstance(event, Citation):
            result.citations.append(event)
        elif isinstance(event, Token):
            result.pieces.append(event.text)
            result.token_ids.extend(event.token_ids)
        elif isinstance(event, ErrorEvent):
            raise from_code(event.code, event.message)
        elif isinstance(event, Done):
            result.done = event
            return result
    raise RagStreamError("the stream ended without a terminal event")
