"""What the streaming layer asks of a kind of stream (answers, generation, ...).

Each kind is one module in ``rag_stream.pipeline`` with one ``StreamKind`` object, registered
once at start-up. The streaming layer runs its producers and never knows a kind by name: the
name only travels through the log so that a takeover finds the same kind again.

- A ``Producer`` is one run of one stream in this process: the first run, built by the kind from
  a request, or a continuation after a takeover, built from the plan the first run saved and
  the events already in the log.
- ``run`` writes events through the context and returns the finish reason; ``finish`` then
  persists the result and builds the terminal ``done`` event (also after a cancel).
  ``log_lost`` is called instead when the stream ends because its log lost events.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from pydantic import ValidationError

from rag_stream.errors import IncompatiblePlan
from rag_stream.schemas.events import Done, ErrorEvent, Event, FinishReason
from rag_stream.streaming.context import StreamContext
from rag_stream.streaming.event_log import StreamMeta


class Producer(Protocol):
    @property
    def model(self) -> str: ...

    @property
    def conversation_id(self) -> str | None: ...

    @property
    def accepted_at(self) -> float:
        """time.monotonic() when its request was accepted (or the stream taken over)."""
        ...

    async def run(self, ctx: StreamContext) -> FinishReason: ...

    async def finish(self, ctx: StreamContext, reason: FinishReason, event_id: int) -> Done: ...

    async def log_lost(self, error: ErrorEvent) -> None:
        """The stream ended with ``error`` instead of ``finish``: its log lost events this run
        wrote (Redis restarted empty). Record that end where the kind keeps its state."""
        ...


class StreamKind(Protocol):
    name: str

    async def can_continue(self, meta: StreamMeta) -> bool:
        """Whether this process can continue the stream (e.g. it runs the same model)."""
        ...

    def continuation(self, plan_json: str, logged: Sequence[Event]) -> Producer:
        """A producer that continues after ``logged``, the events already in the log."""
        ...


def plan_error(kind: str, exc: ValidationError) -> IncompatiblePlan:
    """A stored plan this version cannot read (written by another version of the service)."""
    fields = ", ".join(".".join(map(str, e["loc"])) or "plan" for e in exc.errors()[:5])
    return IncompatiblePlan(
        f"the {kind} stream's saved plan does not match this version of the service "
        f"(fields: {fields}); it cannot be continued here"
    )


class KindRegistry:
    def __init__(self, kinds: Sequence[StreamKind]) -> None:
        self._kinds = {k.name: k for k in kinds}
        if len(self._kinds) != len(kinds):
            raise ValueError("two stream kinds share a name")

    def get(self, name: str) -> StreamKind | None:
        return self._kinds.get(name)
