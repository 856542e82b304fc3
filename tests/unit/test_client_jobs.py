"""``follow_job`` against scripted HTTP answers: a job's events are resumed where they were
read, ``/v1/jobs/{id}/events``, also when the first connection fails before the stream's id is
known. The real thing, a job on a real server behind a cutting proxy, is
tests/integration/test_client_jobs.py."""

from __future__ import annotations

import httpx
import pytest

from rag_stream.client import AsyncClient, Client, RetryPolicy, StreamInterrupted
from rag_stream.errors import NotFound
from rag_stream.schemas.events import (
    Done,
    Event,
    JobStarted,
    Outline,
    SectionDone,
    SectionStarted,
    StreamStarted,
    Token,
)
from rag_stream.streaming.sse import frame
from tests.support.scripted_http import SID, ScriptedServer, sse

JOB_ID = "j" * 32
FAST = RetryPolicy(max_retries=3, backoff_s=0.001, max_backoff_s=0.004)
EVENTS: list[Event] = [
    StreamStarted(id=0, stream_id=SID, model="m", created=1.0),
    JobStarted(id=1, job_id=JOB_ID, kb_id="k", title="T", sections=1),
    Outline(id=2, headings=["One"], planned=False),
    SectionStarted(id=3, index=0, heading="One"),
    Token(id=4, index=0, text="Hello", token_ids=[1], section=0),
    Token(id=5, index=1, text=" there", token_ids=[2], section=0),
    SectionDone(id=6, index=0, tokens=2, finish_reason="stop"),
    Done(id=7, finish_reason="stop"),
]


def _client(server: ScriptedServer) -> Client:
    return Client("http://rag.test", retry=FAST, transport=httpx.MockTransport(server))


def test_a_job_followed_through_a_refusal_and_a_cut_is_resumed_at_its_events() -> None:
    server = ScriptedServer(
        httpx.ConnectError("refused"),  # before anything: the stream's id is not known yet
        sse(EVENTS[:5], fail=httpx.RemoteProtocolError("peer closed connection")),
        sse(EVENTS[5:]),
    )
    with _client(server) as client:
        stream = client.follow_job(JOB_ID)
        events = list(stream)
    assert events == EVENTS
    path = f"/v1/jobs/{JOB_ID}/events"
    assert server.seen == [(path, None), (path, None), (path, "4")]
    assert stream.stream_id == SID


def test_follow_job_starts_after_the_given_event_and_a_missing_job_raises() -> None:
    server = ScriptedServer(sse(EVENTS[4:]))
    with _client(server) as client:
        events = list(client.follow_job(JOB_ID, after=3))
    assert [e.id for e in events] == [4, 5, 6, 7]
    assert server.seen == [(f"/v1/jobs/{JOB_ID}/events", "3")]

    gone = httpx.Response(404, json={"error": {"code": "not_found", "message": "no job"}})
    server = ScriptedServer(gone)
    with _client(server) as client, pytest.raises(NotFound, match="no job"):
        list(client.follow_job(JOB_ID))
    assert len(server.requests) == 1  # not retried


def test_an_unreachable_server_gives_up_after_the_retries() -> None:
    server = ScriptedServer(*[httpx.ConnectError("refused")] * (FAST.max_retries + 1))
    with _client(server) as client, pytest.raises(StreamInterrupted, match="could not reach"):
        list(client.follow_job(JOB_ID))
    assert len(server.requests) == FAST.max_retries + 1


async def test_the_async_client_follows_a_job_the_same_way() -> None:
    seen: list[tuple[str, str | None]] = []

    headers = {"content-type": "text/event-stream", "x-stream-id": SID}

    async def answer(request: httpx.Request) -> httpx.Response:
        cursor = request.headers.get("last-event-id")
        seen.append((request.url.path, cursor))
        if cursor is None:  # the first connection is cut after three events
            body = b"".join(frame(e) for e in EVENTS[:3])
            return httpx.Response(200, headers=headers, content=body)
        rest = b"".join(frame(e) for e in EVENTS[int(cursor) + 1 :])
        return httpx.Response(200, headers=headers, content=rest)

    transport = httpx.MockTransport(answer)
    async with AsyncClient("http://rag.test", retry=FAST, transport=transport) as client:
        events = [e async for e in client.follow_job(JOB_ID)]
    assert events == EVENTS
    assert seen == [(f"/v1/jobs/{JOB_ID}/events", None), (f"/v1/jobs/{JOB_ID}/events", "2")]
