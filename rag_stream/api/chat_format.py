"""A stream's events in OpenAI's chat-completions format: ``chat.completion.chunk`` SSE frames,
or one ``chat.completion``.

One event becomes one or more frames; only the last frame of an event carries the SSE ``id:``
(the event's), so a client's Last-Event-ID always names an event whose frames it has all seen.

- ``stream`` (0): the first chunk, ``delta: {role: "assistant", content: ""}``.
- ``citation`` events (sent together): one chunk with no delta content and the sources, as
  top-level ``search_results`` and ``citations`` (URLs); or, for a request that asked for
  Open WebUI's shape (``X-Rag-Stream-Sources: open-webui``), one chunk per source with no
  choices and a top-level ``event`` that Open WebUI shows as a numbered source chip.
- ``token``: ``delta.content``.
- ``done``: a chunk with ``delta.annotations`` (one ``url_citation`` per source the answer
  cites, in ``n`` order, at its first marker's offsets; none in Open WebUI's shape), the chunk
  with ``finish_reason``, the usage chunk if the request asked for it, then ``data: [DONE]``.
- ``error``: ``data: {"error": {...}}`` (what the ``openai`` SDK raises as an APIError), then
  ``[DONE]``. So is a ``done`` of a stream stopped as abandoned (code ``stream_abandoned``): a
  client that comes back to it must not take the shortened text for a whole answer.

The renderer shows only the events after the client's cursor, and must know some from before it:
the stream event (it names the completion) and the citations. A resume gives it those and the
events after the cursor (``Streams.opening``), not the whole log; annotation offsets count the
whole answer, so when an answer with sources reaches its ``done`` the tokens before the cursor
are read then (``earlier``), once, and for no other stream.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Protocol
from urllib.parse import quote

from redis.exceptions import RedisError

from rag_stream.generation.markers import markers
from rag_stream.schemas.events import (
    Citation,
    CitationBody,
    Done,
    ErrorEvent,
    Event,
    StreamStarted,
    Token,
    TransientError,
)
from rag_stream.schemas.openai import (
    Annotation,
    AssistantMessage,
    ChatCompletion,
    ChatWire,
    Choice,
    CompletionUsage,
    PromptTokensDetails,
    SearchResult,
    UrlCitation,
    error_type,
)
from rag_stream.schemas.ui_chat import UIWire
from rag_stream.streaming.collect import Collected
from rag_stream.streaming.reader import log_unavailable

DONE_FRAME = b"data: [DONE]\n\n"


def completion_id(stream_id: str) -> str:
    return f"chatcmpl-{stream_id}"


def chunk_url(wire: ChatWire | UIWire, citation: CitationBody) -> str:
    """A source's URL (GET it for the chunk and its document), the same in every wire."""
    kb = quote(wire.kb or "", safe="")
    return f"{wire.chunk_url_base}/v1/kbs/{kb}/chunks/{quote(citation.chunk_id, safe='')}"


def search_result(wire: ChatWire, citation: CitationBody) -> SearchResult:
    body = CitationBody.model_validate(citation, from_attributes=True)
    return SearchResult(**body.model_dump(), url=chunk_url(wire, citation))


def url_citations(wire: ChatWire, text: str, citations: Sequence[CitationBody]) -> list[Annotation]:
    """One url_citation per source the answer cites with a ``[n]`` marker, in ``n`` order, at
    its first marker's offsets (clients that number sources as they arrive then number them
    like the markers, and show each once)."""
    by_n = {c.n: c for c in citations}
    first: dict[int, tuple[int, int]] = {}
    for match in markers(text):
        n = int(match.group(1))
        if n in by_n and n not in first:
            first[n] = match.span()
    return [
        Annotation(
            url_citation=UrlCitation(
                url=chunk_url(wire, by_n[n]),
                title=by_n[n].title,
                start_index=first[n][0],
                end_index=first[n][1],
            )
        )
        for n in sorted(first)
    ]


def open_webui_source(wire: ChatWire, citation: CitationBody) -> dict[str, object]:
    """A source as Open WebUI's ``source`` event: a chip named ``[n] title`` whose window
    shows the snippet and the score."""
    url = chunk_url(wire, citation)
    name = f"[{citation.n}] {citation.title}"
    return {
        "type": "source",
        "data": {
            "source": {"id": url, "name": name, "url": url},
            "document": [citation.snippet],
            # external: its page shows the name, not the URL, as the window's title
            "metadata": [{"source": url, "name": name, "external": True}],
            "distances": [citation.score],
        },
    }


def completion_usage(done: Done) -> CompletionUsage:
    u = done.usage
    return CompletionUsage(
        prompt_tokens=u.prompt_tokens,
        completion_tokens=u.completion_tokens,
        total_tokens=u.prompt_tokens + u.completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=u.cached_tokens),
    )


def finish_reason(done: Done) -> tuple[str, str | None]:
    """OpenAI's finish_reason, and vLLM's ``stop_reason`` when OpenAI has no word for it."""
    if done.finish_reason == "length":
        return "length", None
    if done.finish_reason == "cancelled":
        return "stop", "abandoned" if done.abandoned else "cancelled"
    return "stop", None


def abandoned_error() -> dict[str, object]:
    """What a client that comes back to a stream stopped for want of readers reads instead of
    a finish: the text it has is cut short, and no one asked for that."""
    return {
        "error": {
            "message": "the stream was stopped because no client read it for its abandonment "
            "window (streaming.chat_abandon_after_s): the text above is incomplete",
            "type": error_type(409),
            "param": None,
            "code": "stream_abandoned",
        }
    }


def error_object(event: ErrorEvent) -> dict[str, object]:
    status = 503 if event.code.endswith("unavailable") else 500
    return {
        "error": {
            "message": event.message,
            "type": error_type(status),
            "param": None,
            "code": event.code,
        }
    }


def _dumps(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class ChatChunks:
    """Renders one stream's events, in order, as chunk frames (see the module docstring)."""

    def __init__(self, wire: ChatWire, after: int = -1) -> None:
        self._wire = wire
        self._after = after  # events up to this id were shown already: fold them silently
        self._head = ""  # set from the stream event (always the first)
        self._tail = ',"usage":null}' if wire.include_usage else "}"
        self._citations: list[Citation] = []
        self._unsent: list[Citation] = []
        self._pieces: list[tuple[int, str]] = []  # (event id, text): the answer, in any order

    def frames(self, batch: Sequence[Event]) -> bytes:
        out: list[bytes] = []
        for event in batch:
            self._render(event, out)
        self._send_sources(out)
        return b"".join(out)

    def needs_whole_text(self, batch: Sequence[Event]) -> bool:
        """Whether showing ``batch`` takes the answer's whole text: its ``done`` annotates the
        sources' markers at their offsets (none without sources, or in Open WebUI's shape)."""
        return (
            bool(self._citations)
            and self._wire.sources != "open-webui"
            and any(isinstance(e, Done) and e.id > self._after for e in batch)
        )

    def fold(self, earlier: Sequence[Event]) -> None:
        """Tokens from before the cursor that were not given to ``frames`` (a resume skips
        them): their text counts in the annotations' offsets."""
        self._pieces += ((e.id, e.text) for e in earlier if isinstance(e, Token))

    def _render(self, event: Event, out: list[bytes]) -> None:
        if isinstance(event, TransientError):  # never in the log: no id, the client resumes
            out.append(f"data: {_dumps(error_object(event))}\n\n".encode())
            return
        if not isinstance(event, Citation):
            self._send_sources(out)
        show = event.id > self._after
        if isinstance(event, Token):
            self._pieces.append((event.id, event.text))
            if show:
                out.append(self._frame(event.id, self._choice({"content": event.text})))
        elif isinstance(event, Citation):
            self._citations.append(event)
            if show:
                self._unsent.append(event)
        elif isinstance(event, StreamStarted):
            self._head = (
                f'{{"id":{_dumps(completion_id(event.stream_id))},'
                f'"object":"chat.completion.chunk","created":{int(event.created)},'
                f'"model":{_dumps(self._wire.model)},'
            )
            if show:
                delta = {"role": "assistant", "content": ""}
                out.append(self._frame(event.id, self._choice(delta)))
        elif isinstance(event, Done):
            if show:
                self._done(event, out)
        elif isinstance(event, ErrorEvent) and show:
            out.append(f"data: {_dumps(error_object(event))}\n\n".encode())
            out.append(f"id: {event.id}\n".encode() + DONE_FRAME)

    def _done(self, done: Done, out: list[bytes]) -> None:
        if done.abandoned:
            out.append(f"data: {_dumps(abandoned_error())}\n\n".encode())
            out.append(f"id: {done.id}\n".encode() + DONE_FRAME)
            return
        text = "".join(piece for _, piece in sorted(self._pieces))
        found = url_citations(self._wire, text, self._citations)
        if found and self._wire.sources != "open-webui":  # its chips came first
            delta = {"annotations": [a.model_dump() for a in found]}
            out.append(self._frame(None, self._choice(delta)))
        reason, stop_reason = finish_reason(done)
        choice = self._choice({}, reason)
        if stop_reason is not None:
            choice = choice[:-1] + f',"stop_reason":{_dumps(stop_reason)}}}'
        out.append(self._frame(None, choice))
        if self._wire.include_usage:
            usage = completion_usage(done).model_dump_json()
            out.append(f'data: {self._head}"choices":[],"usage":{usage}}}\n\n'.encode())
        out.append(f"id: {done.id}\n".encode() + DONE_FRAME)

    def _send_sources(self, out: list[bytes]) -> None:
        if not self._unsent:
            return
        sent, self._unsent = self._unsent, []
        if self._wire.sources == "open-webui":  # one event chunk per source; the last has the id
            for citation in sent:
                event = _dumps(open_webui_source(self._wire, citation))
                body = f'{self._head}"choices":[],"event":{event}{self._tail}'
                event_id = f"id: {citation.id}\n" if citation is sent[-1] else ""
                out.append(f"{event_id}data: {body}\n\n".encode())
            return
        results = [search_result(self._wire, c).model_dump() for c in sent]
        urls = [r["url"] for r in results]
        extra = f',"search_results":{_dumps(results)},"citations":{_dumps(urls)}'
        body = f'{self._head}"choices":[{self._choice({})}]{extra}{self._tail}'
        out.append(f"id: {sent[-1].id}\ndata: {body}\n\n".encode())

    @staticmethod
    def _choice(delta: Mapping[str, object], reason: str | None = None) -> str:
        return (
            f'{{"index":0,"delta":{_dumps(delta)},"logprobs":null,'
            f'"finish_reason":{_dumps(reason)}}}'
        )

    def _frame(self, event_id: int | None, choice: str) -> bytes:
        body = f'{self._head}"choices":[{choice}]{self._tail}'
        if event_id is None:
            return f"data: {body}\n\n".encode()
        return f"id: {event_id}\ndata: {body}\n\n".encode()


class FrameRenderer(Protocol):
    """A wire's renderer: one stream's batches, in order, as that wire's SSE frames."""

    def frames(self, batch: Sequence[Event]) -> bytes: ...


async def rendered(
    renderer: FrameRenderer, batches: AsyncIterator[list[Event]]
) -> AsyncIterator[bytes]:
    """Each batch's frames, as the renderer makes them (a batch may show nothing)."""
    async for batch in batches:
        frames = renderer.frames(batch)
        if frames:
            yield frames


Earlier = Callable[[], Awaitable[Sequence[Event]]]


def chat_frames(
    wire: ChatWire,
    batches: AsyncIterator[list[Event]],
    after: int = -1,
    earlier: Earlier | None = None,
) -> AsyncIterator[bytes]:
    """A stream's batches as chat-completion chunk frames after ``after``: from its first event,
    or (a resume) its opening and then from the cursor, with ``earlier`` reading the events in
    between when the annotations need them (see the module docstring)."""
    chunks = ChatChunks(wire, after)
    if earlier is not None:
        batches = _with_earlier(chunks, batches, earlier)
    return rendered(chunks, batches)


async def _with_earlier(
    chunks: ChatChunks, batches: AsyncIterator[list[Event]], earlier: Earlier
) -> AsyncIterator[list[Event]]:
    async for batch in batches:
        if chunks.needs_whole_text(batch):
            try:
                chunks.fold(await earlier())
            except RedisError as exc:
                yield [log_unavailable(exc)]
                return
        yield batch


def chat_completion(wire: ChatWire, result: Collected) -> ChatCompletion:
    """The non-streaming response: the collected stream as one ``chat.completion``."""
    started, done = result.start, result.done
    reason, stop_reason = finish_reason(done)
    sources = [search_result(wire, c) for c in result.citations]
    return ChatCompletion(
        id=completion_id(started.stream_id),
        created=int(started.created),
        model=wire.model,
        choices=[
            Choice(
                message=AssistantMessage(
                    content=result.text,
                    annotations=url_citations(wire, result.text, result.citations),
                ),
                finish_reason=reason,
                stop_reason=stop_reason,
            )
        ],
        usage=completion_usage(done),
        search_results=sources,
        citations=[s.url for s in sources],
        stream_id=started.stream_id,
    )
