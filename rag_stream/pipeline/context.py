"""StreamContext: what a pipeline sees of the stream it produces."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from rag_stream.generation.engine import Engine, FinishReason
from rag_stream.pipeline.plan import Plan
from rag_stream.pipeline.tokens import TokenRun
from rag_stream.schemas.events import Done, Event
from rag_stream.streaming.event_log import EventLog
from rag_stream.streaming.writer import StopReason, StreamWriter


class Stopped(Exception):
    def __init__(self, reason: StopReason) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class StreamContext:
    stream_id: str
    request_id: str  # the engine request (new for every takeover)
    engine: Engine
    writer: StreamWriter
    event_log: EventLog
    started: float = field(default_factory=time.monotonic)
    plan: Plan | None = None
    run: TokenRun = field(default_factory=TokenRun)
    generated_before: int = 0  # token ids produced by earlier owners (takeover)
    text: list[str] = field(default_factory=list)
    retrieval_ms: float = 0.0
    queue_ms: float = 0.0

    def emit(self, make: Callable[[int], Event]) -> Event:
        return self.writer.emit(make)

    def check(self) -> None:
        """Raise Stopped if the stream was cancelled, abandoned or taken away."""
        if self.writer.stop_reason is not None:
            raise Stopped(self.writer.stop_reason)

    async def save_plan(self, plan: Plan) -> None:
        self.plan = plan
        await self.event_log.set_plan(self.stream_id, plan.to_dict())


# Ends a stream of one plan kind: persists the result, builds the `done` event with this id.
Finalizer = Callable[[StreamContext, FinishReason, int], Awaitable[Done]]
