"""The typed events of every stream (see docs/protocol.md).

Each event has an integer ``id`` (one sequence per stream, from 0) and a ``type``; they become the
SSE ``id:`` and ``event:`` fields, and the whole event, as JSON, the ``data:`` body: the same JSON
the log stores.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal, Self, overload

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
)

# Why a stream (or one engine request) ended.
FinishReason = Literal["stop", "length", "cancelled", "error"]


class _JsonOnce:
    """``_Event.as_json``: the event serialized at its first read, then kept in the instance's
    dict, where later reads find it without calling this. ``functools.cached_property`` does
    the same, but on Python 3.11 takes a lock at each first read (a µs, for every token);
    events are made and read on the event loop's thread."""

    @overload
    def __get__(self, event: None, owner: type | None = None) -> Self: ...
    @overload
    def __get__(self, event: _Event, owner: type | None = None) -> str: ...
    def __get__(self, event: _Event | None, owner: type | None = None) -> str | Self:
        if event is None:
            return self
        # ``model_dump_json()`` itself, less its Python layer of options left at their defaults
        text: str = event.__pydantic_serializer__.to_json(event).decode()
        event.__dict__["as_json"] = text
        return text


class _Event(BaseModel):
    """Frozen: an event's JSON is made once (``as_json``) and then sent and logged as is."""

    model_config = ConfigDict(frozen=True)

    id: int = Field(ge=0)

    # The event as JSON: the log's entry and the SSE frame's data, serialized once for both (a
    # token's event is otherwise serialized twice, a few µs each, for every token).
    as_json: ClassVar[_JsonOnce] = _JsonOnce()

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        # pydantic copies the instance dict, where a cached ``as_json`` lives: a copy with other
        # fields must make its own
        copied = super().model_copy(update=update, deep=deep)
        copied.__dict__.pop("as_json", None)
        return copied


class StreamStarted(_Event):
    type: Literal["stream"] = "stream"
    stream_id: str
    conversation_id: str | None = None
    model: str
    created: float


class CitationBody(BaseModel):
    """What a citation says (also the citations of a non-streaming answer)."""

    n: int
    chunk_id: str
    document_id: str
    title: str
    heading: str | None
    snippet: str
    offsets: tuple[int, int]
    score: float


class Citation(_Event, CitationBody):
    type: Literal["citation"] = "citation"


def _absent(value: object) -> bool:
    return value is None


class Token(_Event):
    type: Literal["token"] = "token"
    index: int
    text: str
    token_ids: list[int]
    # a job's section (0-based); absent on other streams, whose token events stay exactly as
    # they were. Left out by a test of the field's value: a serializer of the model's own, as
    # before, turns every token event into a dict first (about a µs a token)
    section: int | None = Field(default=None, exclude_if=_absent)


class JobStarted(_Event):
    """A job's stream: its second event (id 1), after ``stream``."""

    type: Literal["job"] = "job"
    job_id: str
    kb_id: str
    title: str
    sections: int  # planned or given headings (the outline event names them)


class Outline(_Event):
    type: Literal["outline"] = "outline"
    headings: list[str]
    planned: bool  # written by the model (no outline in the request)


class SectionStarted(_Event):
    type: Literal["section"] = "section"
    index: int  # 0-based
    heading: str


class SectionDone(_Event):
    type: Literal["section_done"] = "section_done"
    index: int
    tokens: int  # generated for this section
    finish_reason: FinishReason
    prompt_tokens: int = 0  # the section's prompt
    cached_tokens: int = 0  # of which served from the prefix cache


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0


class Timings(BaseModel):
    queue_ms: float = 0.0
    retrieval_ms: float = 0.0
    ttft_ms: float = 0.0
    decode_ms: float = 0.0
    tpot_ms: float = 0.0


class Done(_Event):
    type: Literal["done"] = "done"
    finish_reason: FinishReason
    usage: Usage = Usage()
    timings: Timings = Timings()
    cited: list[int] = []
    dropped_sources: int = 0
    # ended ``cancelled`` because no reader followed it for its abandonment window, rather
    # than by a cancel: the text is cut short and nobody asked for that
    abandoned: bool = False


class ErrorEvent(_Event):
    type: Literal["error"] = "error"
    code: str
    message: str


class TransientError(ErrorEvent):
    """An error a reader hit itself (e.g. Redis went away): never in the log, so it is sent
    without an SSE id and a client's Last-Event-ID still points at the last logged event."""


Event = Annotated[
    StreamStarted
    | Citation
    | Token
    | Done
    | ErrorEvent
    | JobStarted
    | Outline
    | SectionStarted
    | SectionDone,
    Field(discriminator="type"),
]
EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)
TERMINAL_TYPES = frozenset({"done", "error"})


def is_terminal(event: Event) -> bool:
    return event.type in TERMINAL_TYPES
