"""A stream's events as the AI SDK's UI message stream (v1): what ``useChat`` reads.

- ``stream`` (0): ``start``, with the message id and ``messageMetadata.streamId`` (the app
  cancels with it: ``POST /v1/streams/{streamId}/cancel``).
- ``citation``: one ``source-url`` each (``sourceId`` is the ``n`` of the ``[n]`` markers; the
  snippet and score in ``providerMetadata.ragStream``), all before any text.
- ``token``: ``text-start`` before the first, then ``text-delta``.
- ``done``: ``text-end``, ``abort`` if the stream was cancelled, ``finish`` (usage and
  rag-stream's finish reason in ``messageMetadata``), then ``data: [DONE]``.
- ``error``: an ``error`` part, then ``[DONE]``.

As in chat_format.py, the renderer shows the events after the cursor and knows of those before
it only what a resume gives it: the opening up to the first token (the stream id, whether text
began); only the last frame of an event carries its SSE ``id:``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from typing import Literal

from pydantic import BaseModel

from rag_stream.api.chat_format import chunk_url, rendered
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
from rag_stream.schemas.ui_chat import UIAbort, UIError, UIFinish, UISourceUrl, UIStart, UIWire

DONE_FRAME = b"data: [DONE]\n\n"
TEXT_ID = "text"  # one text part per answer
_FINISH: dict[str, Literal["stop", "length", "other", "error"]] = {
    "stop": "stop",
    "length": "length",
    "cancelled": "other",
    "error": "error",
}


def source_part(wire: UIWire, citation: CitationBody) -> UISourceUrl:
    return UISourceUrl(
        sourceId=str(citation.n),
        url=chunk_url(wire, citation),
        title=citation.title,
        providerMetadata={
            "ragStream": {
                "n": citation.n,
                "chunkId": citation.chunk_id,
                "documentId": citation.document_id,
                "heading": citation.heading,
                "snippet": citation.snippet,
                "score": citation.score,
            }
        },
    )


def finish_part(done: Done, stream_id: str) -> UIFinish:
    u = done.usage
    return UIFinish(
        finishReason=_FINISH[done.finish_reason],
        messageMetadata={
            "streamId": stream_id,
            "finishReason": done.finish_reason,
            "usage": {
                "promptTokens": u.prompt_tokens,
                "completionTokens": u.completion_tokens,
                "cachedTokens": u.cached_tokens,
            },
            "cited": done.cited,
        },
    )


def _frame(part: BaseModel | str, event_id: int | None = None) -> bytes:
    data = part if isinstance(part, str) else part.model_dump_json()
    head = "" if event_id is None else f"id: {event_id}\n"
    return f"{head}data: {data}\n\n".encode()


class UIParts:
    """Renders one stream's events, in order, as UI message stream frames."""

    def __init__(self, wire: UIWire, after: int = -1) -> None:
        self._wire = wire
        self._after = after
        self._stream_id = ""
        self._text_started = False

    def frames(self, batch: Sequence[Event]) -> bytes:
        out: list[bytes] = []
        for event in batch:
            self._render(event, out)
        return b"".join(out)

    def _render(self, event: Event, out: list[bytes]) -> None:
        if isinstance(event, TransientError):  # never in the log: no id, the client resumes
            out.append(_frame(UIError(errorText=f"{event.code}: {event.message}")))
            return
        show = event.id > self._after
        if isinstance(event, Token):
            first = not self._text_started
            self._text_started = True
            if show:
                if first:
                    out.append(_frame(f'{{"type":"text-start","id":"{TEXT_ID}"}}'))
                delta = json.dumps(event.text, ensure_ascii=False)
                out.append(
                    _frame(f'{{"type":"text-delta","id":"{TEXT_ID}","delta":{delta}}}', event.id)
                )
        elif isinstance(event, Citation):
            if show:
                out.append(_frame(source_part(self._wire, event), event.id))
        elif isinstance(event, StreamStarted):
            self._stream_id = event.stream_id
            if show:
                start = UIStart(
                    messageId=self._wire.message_id or f"msg-{event.stream_id}",
                    messageMetadata={"streamId": event.stream_id, "model": self._wire.model},
                )
                out.append(_frame(start, event.id))
        elif isinstance(event, Done):
            if show:
                if self._text_started:
                    out.append(_frame(f'{{"type":"text-end","id":"{TEXT_ID}"}}'))
                if event.finish_reason == "cancelled":
                    reason = "abandoned" if event.abandoned else "cancelled"
                    out.append(_frame(UIAbort(reason=reason)))
                out.append(_frame(finish_part(event, self._stream_id)))
                out.append(f"id: {event.id}\n".encode() + DONE_FRAME)
        elif isinstance(event, ErrorEvent) and show:
            out.append(_frame(UIError(errorText=f"{event.code}: {event.message}")))
            out.append(f"id: {event.id}\n".encode() + DONE_FRAME)


def ui_frames(
    wire: UIWire, batches: AsyncIterator[list[Event]], after: int = -1
) -> AsyncIterator[bytes]:
    """A stream's batches (from its first event) as UI message stream frames after ``after``."""
    return rendered(UIParts(wire, after), batches)
