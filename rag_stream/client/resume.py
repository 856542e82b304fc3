"""Following one stream across connections: what to request, which events to pass on, and
whether a failure is worth another connection.

The event streams (async_stream.py, and sync_stream.py generated from it) run one loop around
a ``Resumer``: open the request it names, hand it the response and then every SSE event, and
on a failure ask it how long to wait before the next connection (or get the exception to
raise). A stream is resumed from the last event id passed on (``Last-Event-ID``), so the
caller sees ids 0, 1, 2, ... once each: at ``/v1/streams/{id}/events``, or at the address it
was followed from (a job's events).

Worth another connection: a transport error (refused, reset, timed out, cut mid-body), a body
that ends before a terminal event, an ``error`` event without an id (a reader's own trouble,
e.g. its Redis connection, not the stream's end: see docs/protocol.md), and a 5xx answer to a
resume. Not worth it: any other error answer, which is raised as the server's typed error. A
request that starts a stream carries an ``Idempotency-Key`` of its own: sent again after a
connection lost before its answer, it reads the stream the first one began (if it began one)
from its first event, rather than starting a second (docs/protocol.md).
"""

from __future__ import annotations

import json
import logging
from typing import Any, get_args

import httpx
from httpx_sse import ServerSentEvent
from pydantic import ValidationError

from rag_stream.client.calls import StreamStart, stream_events_path
from rag_stream.client.errors import StreamInterrupted, api_error
from rag_stream.client.options import OnReconnect, Reconnect, RetryPolicy
from rag_stream.errors import InvalidRequest
from rag_stream.schemas.events import EVENT_ADAPTER, Event, StreamStarted, is_terminal

logger = logging.getLogger("rag_stream.client")

KEY_HEADER = "Idempotency-Key"  # (rag_stream.streaming.start_keys.HEADER)


class Interruption(Exception):
    """The stream broke off in a way a new connection can mend."""


# What the event streams catch and hand to ``Resumer.failed``.
RETRYABLE = (httpx.TransportError, Interruption)


class Resumer:
    def __init__(
        self,
        stream_id: str | None,
        after: int,
        retry: RetryPolicy,
        on_reconnect: OnReconnect | None,
        events_path: str | None = None,
    ) -> None:
        self.stream_id = stream_id
        self.last_event_id = after  # -1: nothing seen yet
        self.finished = False
        # where the events are read and resumed (None: the stream's own, once its id is known)
        self._events_path = events_path
        self._retry = retry
        self._on_reconnect = on_reconnect
        self._failures = 0  # in a row, without a new event

    def request(self, start: StreamStart | None) -> tuple[str, str, dict[str, Any]]:
        """Method, path and httpx arguments of the next connection."""
        if start is not None:
            return "POST", start.path, {"json": start.body, "headers": {KEY_HEADER: start.key}}
        headers = {"Last-Event-ID": str(self.last_event_id)} if self.last_event_id >= 0 else {}
        if self._events_path is not None:
            return "GET", self._events_path, {"headers": headers}
        assert self.stream_id is not None  # failed() never resumes a stream without an id
        return "GET", stream_events_path(self.stream_id), {"headers": headers}

    def opened(self, response: httpx.Response, starting: bool) -> None:
        """Check a response (its body read if it is an error) before its events are read."""
        if response.is_error:
            error = api_error(response)
            if not starting and response.status_code >= 500:
                raise Interruption(f"HTTP {response.status_code} {error.code}: {error.message}")
            raise error
        self.stream_id = self.stream_id or response.headers.get("x-stream-id")

    def accept(self, sse: ServerSentEvent) -> Event | None:
        """The event to pass on, or None for one to skip (a keep-alive, one already seen)."""
        if not sse.data:
            return None  # a keep-alive block to a parser that carries the last id over
        try:
            payload = json.loads(sse.data)
        except ValueError:
            if sse.data.strip() != "[DONE]":  # which ends a chat-completions stream
                raise Interruption(f"malformed event data: {sse.data[:80]!r}") from None
            payload = None
        if not isinstance(payload, dict) or payload.get("object") == "chat.completion.chunk":
            raise InvalidRequest(
                f"stream {self.stream_id} is a chat-completions stream: read it with an OpenAI "
                "client or any SSE client, not follow()"
            )
        if payload.get("type") == "error" and "id" not in payload:
            # an error the reader hit itself, not logged: the stream goes on (docs/protocol.md)
            raise Interruption(f"reader error {payload.get('code')}: {payload.get('message')}")
        if not isinstance(payload.get("id"), int):
            raise Interruption(f"malformed event: {sse.data[:80]!r}")
        if payload["id"] <= self.last_event_id:
            return None  # replayed
        if payload["id"] != self.last_event_id + 1:
            raise Interruption(f"event {payload['id']} came after {self.last_event_id}")
        try:
            event = EVENT_ADAPTER.validate_python(payload)
        except ValidationError:
            known = payload.get("type") in _KNOWN_TYPES
            if known:
                raise
            self.last_event_id += 1  # a type this version does not know: skipped, not lost
            return None
        self.last_event_id = event.id
        self._failures = 0
        if isinstance(event, StreamStarted):
            self.stream_id = self.stream_id or event.stream_id
        self.finished = is_terminal(event)
        return event

    def ended(self) -> Interruption:
        return Interruption("the connection closed before the stream's terminal event")

    def failed(self, exc: Exception, starting: bool) -> float:
        """Seconds to wait before the next connection; raises when there is none to make."""
        resumable = self.stream_id is not None or self._events_path is not None
        if not resumable and not starting:  # (an answer that named no stream)
            raise StreamInterrupted(
                f"connection lost before the stream's id arrived ({_describe(exc)})"
            ) from exc
        self._failures += 1
        where = self.stream_id or "(not started)"
        if self._failures > self._retry.max_retries:
            if self.stream_id is None and starting:
                raise StreamInterrupted(
                    f"the start had no answer in {self._retry.max_retries + 1} attempts "
                    f"({_describe(exc)}); it may have started a stream on the server"
                ) from exc
            if self.stream_id is None:
                raise StreamInterrupted(
                    f"could not reach the server in {self._retry.max_retries + 1} attempts "
                    f"({_describe(exc)})"
                ) from exc
            raise StreamInterrupted(
                f"stream {where}: gave up after {self._retry.max_retries} reconnections "
                f"({_describe(exc)}); resume it with follow(stream_id, after="
                f"{self.last_event_id})",
                stream_id=self.stream_id,
                last_event_id=self.last_event_id,
            ) from exc
        notice = Reconnect(
            stream_id=self.stream_id,
            last_event_id=self.last_event_id,
            attempt=self._failures,
            max_retries=self._retry.max_retries,
            delay_s=self._retry.delay(self._failures),
            reason=_describe(exc),
        )
        logger.info(
            "stream %s: %s; reconnecting (attempt %d)", where, notice.reason, notice.attempt
        )
        if self._on_reconnect is not None:
            self._on_reconnect(notice)
        return notice.delay_s


def _describe(exc: Exception) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _event_types() -> frozenset[str]:
    members = get_args(get_args(Event)[0])
    return frozenset(m.model_fields["type"].default for m in members)


_KNOWN_TYPES = _event_types()
