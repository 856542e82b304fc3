"""The client's resume loop against scripted HTTP answers (httpx.MockTransport): every way a
stream can break off, and what the caller sees. The real thing, against a real server behind a
proxy that cuts connections, is tests/integration/test_client.py."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from rag_stream.client import AsyncClient, Client, Reconnect, RetryPolicy, StreamInterrupted
from rag_stream.errors import InvalidRequest, NotFound
from rag_stream.schemas.events import Done, Event, StreamStarted, Token, TransientError
from rag_stream.streaming.sse import frame
from tests.support.scripted_http import SID, ScriptedServer, SseBody, sse

SSE_HEADERS = {"content-type": "text/event-stream"}  # (no stream id)
FAST = RetryPolicy(max_retries=3, backoff_s=0.001, max_backoff_s=0.004)


def _events(n_tokens: int = 6) -> list[Event]:
    events: list[Event] = [StreamStarted(id=0, stream_id=SID, model="m", created=1.0)]
    for i in range(n_tokens):
        events.append(Token(id=i + 1, index=i, text=f"t{i} ", token_ids=[i]))
    events.append(Done(id=n_tokens + 1, finish_reason="stop"))
    return events


EVENTS = _events()
TEXT = "".join(e.text for e in EVENTS if isinstance(e, Token))


Handler = Callable[[httpx.Request], httpx.Response]


def _client(server: ScriptedServer, notices: list[Reconnect] | None = None) -> Client:
    on_reconnect = notices.append if notices is not None else None
    transport = httpx.MockTransport(server)
    return Client("http://rag.test", retry=FAST, on_reconnect=on_reconnect, transport=transport)


def _assert_one_clean_stream(events: list[Event]) -> None:
    assert [e.id for e in events] == list(range(len(events)))
    assert isinstance(events[0], StreamStarted) and isinstance(events[-1], Done)
    assert "".join(e.text for e in events if isinstance(e, Token)) == TEXT


def test_a_connection_cut_mid_body_is_resumed_from_the_last_event() -> None:
    server = ScriptedServer(
        sse(EVENTS[:3], fail=httpx.RemoteProtocolError("peer closed connection")),
        sse(EVENTS[3:]),
    )
    notices: list[Reconnect] = []
    with _client(server, notices) as client:
        events = list(client.ask("kb", "q?"))
    _assert_one_clean_stream(events)
    assert [(r.method, r.url.path) for r in server.requests] == [
        ("POST", "/v1/answers"),
        ("GET", f"/v1/streams/{SID}/events"),
    ]
    assert server.cursors == [None, "2"]
    assert [(n.attempt, n.last_event_id, n.stream_id) for n in notices] == [(1, 2, SID)]
    assert "RemoteProtocolError" in notices[0].reason


def test_a_body_that_ends_before_the_terminal_event_is_resumed() -> None:
    server = ScriptedServer(sse(EVENTS[:4]), sse(EVENTS[4:]))
    with _client(server) as client:
        events = list(client.generate("p"))
    _assert_one_clean_stream(events)
    assert server.cursors == [None, "3"]


def test_a_readers_own_error_is_not_the_end_the_stream_goes_on() -> None:
    # sent without an id (not in the log): docs/protocol.md
    transient = frame(TransientError(id=0, code="event_log_unavailable", message="redis down"))
    server = ScriptedServer(sse(EVENTS[:3], extra=transient), sse(EVENTS[3:]))
    with _client(server) as client:
        events = list(client.ask("kb", "q?"))
    _assert_one_clean_stream(events)
    assert all(e.type != "error" for e in events)


def test_events_sent_again_after_a_resume_are_passed_on_once() -> None:
    server = ScriptedServer(sse(EVENTS[:4], fail=httpx.ReadError("reset")), sse(EVENTS[1:]))
    with _client(server) as client:
        events = list(client.ask("kb", "q?"))
    _assert_one_clean_stream(events)


def test_follow_starts_after_the_given_event() -> None:
    server = ScriptedServer(sse(EVENTS[3:]))
    with _client(server) as client:
        events = list(client.follow(SID, after=2))
    assert [e.id for e in events] == list(range(3, len(EVENTS)))
    assert server.cursors == ["2"]


def test_retries_are_bounded_and_back_off() -> None:
    refused = httpx.ConnectError("refused")
    server = ScriptedServer(sse(EVENTS[:3], fail=httpx.ReadError("reset")), *[refused] * 4)
    notices: list[Reconnect] = []
    seen: list[Event] = []
    with _client(server, notices) as client, pytest.raises(StreamInterrupted) as caught:
        for event in client.ask("kb", "q?"):
            seen.append(event)
    assert [e.id for e in seen] == [0, 1, 2]  # everything before the cut was passed on
    assert caught.value.stream_id == SID and caught.value.last_event_id == 2
    assert "follow(" in caught.value.message
    assert [n.attempt for n in notices] == [1, 2, 3]
    assert [n.delay_s for n in notices] == [0.001, 0.002, 0.004]
    assert len(server.requests) == 1 + FAST.max_retries


def test_an_event_received_starts_the_retry_count_again() -> None:
    cut = httpx.ReadError("reset")
    # four cuts in a row would exceed max_retries (3); each resume brings one event
    answers = [sse(EVENTS[:2], fail=cut)] + [sse(EVENTS[i : i + 1], fail=cut) for i in (2, 3, 4)]
    server = ScriptedServer(*answers, sse(EVENTS[5:]))
    with _client(server) as client:
        events = list(client.ask("kb", "q?"))
    _assert_one_clean_stream(events)


def test_a_start_that_never_reached_the_server_is_sent_again() -> None:
    server = ScriptedServer(httpx.ConnectError("refused"), sse(EVENTS))
    with _client(server) as client:
        events = list(client.ask("kb", "q?"))
    _assert_one_clean_stream(events)
    assert [r.method for r in server.requests] == ["POST", "POST"]


def test_a_start_lost_after_sending_goes_again_with_its_key() -> None:
    # the server may have started the stream: the same key finds it (docs/protocol.md)
    lost = httpx.ReadError("reset before the response")
    server = ScriptedServer(lost, sse(EVENTS), sse(EVENTS))
    with _client(server) as client:
        events = list(client.ask("kb", "q?"))
        _assert_one_clean_stream(events)
        list(client.ask("kb", "q?"))  # another start: another key
    keys = [r.headers.get("idempotency-key") for r in server.requests]
    assert [r.method for r in server.requests] == ["POST"] * 3
    assert keys[0] and keys[0] == keys[1] and keys[2] not in (None, keys[0])


def test_a_start_that_never_gets_an_answer_gives_up_without_a_stream_id() -> None:
    lost = httpx.ReadError("reset before the response")
    server = ScriptedServer(*[lost] * (FAST.max_retries + 1))
    with _client(server) as client, pytest.raises(StreamInterrupted) as caught:
        list(client.ask("kb", "q?"))
    assert len(server.requests) == FAST.max_retries + 1
    assert caught.value.stream_id is None and "may have started" in caught.value.message


def test_a_stream_cut_before_its_first_event_resumes_from_the_start() -> None:
    server = ScriptedServer(sse([], fail=httpx.ReadError("reset")), sse(EVENTS))
    with _client(server) as client:
        stream = client.ask("kb", "q?")
        events = list(stream)
    _assert_one_clean_stream(events)
    assert server.cursors == [None, None]  # the id came from X-Stream-Id: replayed from 0
    assert stream.stream_id == SID


def test_a_stream_gone_from_the_server_raises_not_found_at_once() -> None:
    gone = httpx.Response(404, json={"error": {"code": "not_found", "message": "unknown stream"}})
    server = ScriptedServer(sse(EVENTS[:3], fail=httpx.ReadError("reset")), gone)
    with _client(server) as client, pytest.raises(NotFound) as caught:
        list(client.ask("kb", "q?"))
    assert caught.value.status_code == 404 and caught.value.message == "unknown stream"
    assert len(server.requests) == 2


def test_a_5xx_answer_to_a_resume_is_retried() -> None:
    down = httpx.Response(
        503, json={"error": {"code": "event_log_unavailable", "message": "redis down"}}
    )
    server = ScriptedServer(sse(EVENTS[:3], fail=httpx.ReadError("reset")), down, sse(EVENTS[3:]))
    notices: list[Reconnect] = []
    with _client(server, notices) as client:
        events = list(client.ask("kb", "q?"))
    _assert_one_clean_stream(events)
    assert "event_log_unavailable" in notices[1].reason


def test_keep_alive_blocks_and_unknown_event_types_are_skipped() -> None:
    future = b'id: 3\nevent: hologram\ndata: {"id": 3, "type": "hologram"}\n\n'
    chunks = [frame(e) for e in EVENTS[:3]] + [b": keep-alive\n\n", future]
    chunks += [frame(e.model_copy(update={"id": e.id + 1})) for e in EVENTS[3:]]
    body = httpx.Response(
        200, headers={"content-type": "text/event-stream"}, stream=SseBody(chunks)
    )
    with _client(ScriptedServer(body)) as client:
        events = list(client.ask("kb", "q?"))
    assert [e.id for e in events] == [0, 1, 2, *range(4, len(EVENTS) + 1)]
    assert isinstance(events[-1], Done)


def test_following_a_chat_completions_stream_says_what_to_use_instead() -> None:
    chunk = b'id: 0\ndata: {"id": "chatcmpl-x", "object": "chat.completion.chunk"}\n\n'
    body = httpx.Response(
        200, headers={"content-type": "text/event-stream"}, stream=SseBody([chunk])
    )
    server = ScriptedServer(body)
    with _client(server) as client, pytest.raises(InvalidRequest, match="OpenAI client"):
        list(client.follow(SID))
    assert len(server.requests) == 1  # not retried


async def test_the_async_client_resumes_the_same_way() -> None:
    server = ScriptedServer(
        sse(EVENTS[:3], fail=httpx.RemoteProtocolError("peer closed connection")),
        httpx.ConnectError("refused"),
        sse(EVENTS[3:]),
    )
    notices: list[Reconnect] = []
    transport = httpx.MockTransport(server)
    async with AsyncClient(
        "http://rag.test", retry=FAST, on_reconnect=notices.append, transport=transport
    ) as client:
        stream = client.ask("kb", "q?")
        events = [e async for e in stream]
    _assert_one_clean_stream(events)
    assert server.cursors == [None, "2", "2"]
    assert [n.attempt for n in notices] == [1, 2]
    assert stream.last_event_id == EVENTS[-1].id
