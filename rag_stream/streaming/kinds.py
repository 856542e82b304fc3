"""What the streaming layer asks of a kind of stream (answers, generation, jobs, ...).

Each kind is one folder in ``rag_stream.kinds`` with one ``StreamKind`` object, registered
once at start-up (``rag_stream/kinds/registry.py``). The streaming layer runs its producers and
never knows a kind by name: the name only travels through the log so that a takeover finds the
same kind again.

- ``accept`` turns the kind's intent (a typed request, already translated from whichever wire
  asked) into the first ``Producer``; ``Streams.launch`` calls it once admission let the request
  in, and nothing else starts a stream.
- A ``Producer`` is one run of one stream in this process: the first run, built by ``accept``,
  or a continuation after a takeover, built from the plan the first run saved and the events
  already in the log.
- ``run`` writes events through the context and returns the finish reason; ``finish`` then
  persists the result and builds the terminal ``done`` event (also after a cancel).
  ``log_lost`` is called instead when the stream ends because its log lost events.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol, TypeVar

from pydantic import BaseModel, ValidationError

from rag_stream.errors import IncompatiblePlan
from rag_stream.schemas.events import Done, ErrorEvent, Event, FinishReason
from rag_stream.streaming.admission import Priority
from rag_stream.streaming.context import StreamContext
from rag_stream.streaming.event_log import StreamMeta

IntentT = TypeVar("IntentT", contravariant=True)
ProducerT = TypeVar("ProducerT", bound="Producer")
K = TypeVar("K")


class Producer(Protocol):
    @property
    def model(self) -> str: ...

    @property
    def priority(self) -> Priority:
        """The class it waits in for a generation slot: what the request asked, or ``batch``
        for a long prompt (a continuation keeps its first run's; it takes no ticket)."""
        ...

    @property
    def initial_plan(self) -> BaseModel | None:
        """The plan saved with the stream as it is created (in the same write), so that a
        takeover finds one however early this process dies, its wait for a generation slot
        included; the first run may save a fuller one later. None: nothing to save yet (a
        continuation)."""
        ...

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
    """What a takeover needs of a kind: whether this process can continue one of its streams,
    and the producer that does."""

    @property
    def name(self) -> str: ...

    async def can_continue(self, meta: StreamMeta) -> bool:
        """Whether this process can continue the stream (e.g. it runs the same model)."""
        ...

    def continuation(self, plan_json: str, logged: Sequence[Event]) -> Producer:
        """A producer that continues after ``logged``, the events already in the log."""
        ...


class LaunchableKind(StreamKind, Protocol[IntentT, ProducerT]):
    """What ``Streams.launch`` needs of a kind to start one of its streams from an intent."""

    @property
    def detached(self) -> bool:
        """Whether its streams run to their end with no reader (never abandoned)."""
        ...

    async def accept(self, intent: IntentT, tenant: str) -> ProducerT:
        """Check the intent against the limits and plan its first run."""
        ...

    async def started(self, stream_id: str, producer: ProducerT) -> None:
        """The stream exists and its producer runs (e.g. link it to the kind's own record)."""
        ...

    async def not_started(self, producer: ProducerT, error: Exception) -> None:
        """Accepted, but the stream could not be created (the log refused it)."""
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


class KindSet:
    """The running kinds, found by their class (a route asks for the kind it serves)."""

    def __init__(self, kinds: Sequence[StreamKind]) -> None:
        self._kinds = list(kinds)

    def __iter__(self) -> Iterator[StreamKind]:
        return iter(self._kinds)

    def get(self, cls: type[K]) -> K:
        for kind in self._kinds:
            if isinstance(kind, cls):
                return kind
        raise LookupError(
            f"no {cls.__name__} is registered (rag_stream/kinds/registry.py lists them)"
        )
