"""A resume reads what is left of a stream, not what came before its cursor (issue 37.3).

On the real Redis log, counting the log entries each read returns (tests/support/counting_log.py):
a resume near the end of a long stream, in the native wire and in the chat and UI wires, reads
about as many entries as it replays, and its first batch is a few events, not a page of a
thousand. The resumed frames are exactly the original's after the cursor.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis

import rag_stream.app as app_module
from rag_stream.schemas.events import Event
from rag_stream.streaming.reader import FIRST_PAGE
from rag_stream.streaming.service import OPENING_PAGE
from tests.conftest import REDIS_URL
from tests.support.counting_log import CountingRedisEventLog
from tests.support.fakes import start_toy, stub_engine, toy_streams
from tests.support.inprocess import InProcess, InProcessFactory, make_kb
from tests.unit.test_streams import check_one_stream

LONG = 3000  # tokens: one event each (ASCII text, one byte a token)
TEXT = "Herons eat fish [1]. "
DOCS = [
    ("Herons", "Grey herons stand motionless in shallow water and spear fish with long beaks."),
    ("Tides", "Spring tides follow the full and new moon, when sun and moon pull together."),
]
# What a resume in another wire reads besides the events it replays: the stream's opening (a
# page from event 0: the stream event and, here, tokens).
OVERHEAD = OPENING_PAGE


@pytest.fixture(scope="module")
async def service(in_process_factory: InProcessFactory) -> AsyncIterator[InProcess]:
    """The service whose Redis event log counts the entries it reads."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(app_module, "RedisEventLog", CountingRedisEventLog)
        started = in_process_factory(text=TEXT, limits__max_tokens=4000)
        async with started as service:
            patch.undo()
            yield service


@pytest.fixture(scope="module")
async def kb(service: InProcess) -> str:
    return await make_kb(service.client, DOCS, prefix="resume")


def _log(service: InProcess) -> CountingRedisEventLog:
    log = service.resources.streams.event_log
    assert isinstance(log, CountingRedisEventLog)
    return log


def _frames(body: str) -> list[str]:
    """An SSE body's frames, keep-alive comments left out."""
    blocks = [b for b in body.replace("\r\n", "\n").split("\n\n") if b.strip()]
    kept = ["\n".join(x for x in b.split("\n") if not x.startswith(":")) for b in blocks]
    return [k for k in kept if k]


def _after(frames: list[str], event_id: int) -> list[str]:
    """The frames after the one that carries ``event_id`` (an event's last frame has its id)."""
    ends = [i for i, f in enumerate(frames) if f.startswith(f"id: {event_id}\n")]
    assert len(ends) == 1, f"no single frame has id {event_id}"
    return frames[ends[0] + 1 :]


async def _last_event_id(service: InProcess, sid: str) -> int:
    status = (await service.client.get(f"/v1/streams/{sid}")).json()
    assert status["status"] == "done", status
    return int(status["last_event_id"])


async def _resume(service: InProcess, sid: str, cursor: int) -> tuple[list[str], int]:
    """The frames of a resume after ``cursor``, and how many log entries it read."""
    log = _log(service)
    before = log.entries_read[sid]
    r = await service.client.get(
        f"/v1/streams/{sid}/events", headers={"Last-Event-ID": str(cursor)}
    )
    assert r.status_code == 200, r.text
    return _frames(r.text), log.entries_read[sid] - before


async def _start(service: InProcess, wire: str, model: str, **extra: Any) -> tuple[str, str]:
    """A whole stream in ``wire`` (chat chunks or UI parts): its id and body."""
    messages = [{"role": "user", "content": "What do herons eat?"}]
    if wire == "chat":
        body = {"model": model, "messages": messages, "stream": True, **extra}
        r = await service.client.post("/v1/chat/completions", json=body)
    else:
        parts = [{"type": "text", "text": "What do herons eat?"}]
        body = {
            "id": f"chat-{uuid.uuid4().hex[:8]}",
            "messages": [{"id": "u1", "role": "user", "parts": parts}],
            "model": model,
            **extra,
        }
        r = await service.client.post("/v1/ui/chat", json=body)
    assert r.status_code == 200, r.text
    return r.headers["x-stream-id"], r.text


@pytest.mark.parametrize("wire", ["chat", "ui"])
@pytest.mark.parametrize("left", [10, LONG // 2])
async def test_a_resume_in_another_wire_reads_what_is_left_not_the_whole_log(
    service: InProcess, wire: str, left: int
) -> None:
    """Before, the chat and UI renderers were given the log from its first event: a resume
    near the end of a long stream read all of it."""
    sid, whole = await _start(service, wire, "stub", max_tokens=LONG)
    last = await _last_event_id(service, sid)
    cursor = last - left
    frames, read = await _resume(service, sid, cursor)
    assert frames == _after(_frames(whole), cursor)  # exactly the original's rest
    assert left <= read <= left + OVERHEAD, f"read {read} log entries to replay {left} events"


@pytest.mark.parametrize("sources", ["default", "open-webui"])
async def test_a_resumed_answer_with_sources_is_the_original_at_every_kind_of_cut(
    service: InProcess, kb: str, sources: str
) -> None:
    """Cursors in the opening (stream event, citations), at the first token, in the text and
    at the end: the sources, the text and the annotations (offsets in the whole answer, which a
    resume past the opening reads once, at ``done``) are the original's."""
    headers = {"X-Rag-Stream-Sources": sources} if sources != "default" else {}
    body = {
        "model": f"kb:{kb}",
        "messages": [{"role": "user", "content": "What do herons eat?"}],
        "stream": True,
        "max_tokens": 120,
    }
    r = await service.client.post("/v1/chat/completions", json=body, headers=headers)
    assert r.status_code == 200, r.text
    sid, whole = r.headers["x-stream-id"], _frames(r.text)
    assert any('"annotations"' in f for f in whole) == (sources == "default")
    # the ids a client can resume after: those its frames carried (sources sent together
    # carry the last one's)
    ids = [int(f.split("\n", 1)[0][4:]) for f in whole if f.startswith("id: ")]
    assert ids[-1] == await _last_event_id(service, sid)
    for cursor in sorted({*ids[:5], ids[len(ids) // 2], *ids[-3:]}):
        frames, _ = await _resume(service, sid, cursor)
        assert frames == _after(whole, cursor), f"resumed after {cursor}"


@pytest.fixture
async def counted_log() -> AsyncIterator[CountingRedisEventLog]:
    client = Redis.from_url(REDIS_URL)
    prefix = f"rs-resume-{uuid.uuid4().hex[:8]}"
    try:
        yield CountingRedisEventLog(client, prefix=prefix)
    finally:
        for key in await client.keys(f"{prefix}:*"):
            await client.delete(key)
        await client.aclose()


async def test_a_resume_in_another_process_sends_its_first_events_after_a_small_read(
    counted_log: CountingRedisEventLog,
) -> None:
    """A finished stream resumed at its middle by a process that never held it, while that
    process's shared tail follows another stream: the first batch (one SSE write) is a few
    events, not the first thousand the log holds after the cursor, and nothing is read twice
    (the reader fills the process's feed; the tail leaves it alone until it has)."""
    producing, kind = toy_streams(counted_log, stub_engine())
    sid = await start_toy(producing, kind, [1, 2, 3], LONG)
    check_one_stream([e async for e in producing.follow(sid)], LONG)
    meta = await counted_log.meta(sid)
    assert meta is not None and meta.status == "done"
    cursor = meta.last_event_id // 2

    live_producer, live_kind = toy_streams(counted_log, stub_engine(delay_s=0.002))
    live = await start_toy(live_producer, live_kind, [7, 8], 5000)
    other, _ = toy_streams(counted_log, stub_engine())
    tailing = asyncio.Event()

    async def follow_live() -> None:
        async for event in other.follow(live, 0):
            if event.id > 20:  # past its first page: the other process's tail follows it
                tailing.set()

    follower = asyncio.create_task(follow_live())
    try:
        await asyncio.wait_for(tailing.wait(), 30)
        counted_log.entries_read.clear()
        counted_log.slow_reads[sid] = 0.05  # the tail surely goes round while the feed fills
        batches = [batch async for batch in other.follow_batches(sid, cursor)]
    finally:
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)
        for streams in (other, live_producer, producing):
            await streams.close()
    events = [e for batch in batches for e in batch]
    assert [e.id for e in events] == list(range(cursor + 1, meta.last_event_id + 1))
    assert len(batches[0]) <= FIRST_PAGE, f"the first write held {len(batches[0])} events"
    left = meta.last_event_id - cursor
    assert counted_log.entries_read[sid] <= left, counted_log.entries_read[sid]  # each once


async def test_readers_joining_a_feed_while_its_first_reader_fills_it_miss_nothing(
    counted_log: CountingRedisEventLog,
) -> None:
    """Readers of one stream in another process, from several cursors at once, while it is
    still produced: each gets every event after its cursor, in order, once."""
    producing, kind = toy_streams(counted_log, stub_engine(delay_s=0.001))
    sid = await start_toy(producing, kind, [4, 5, 6], 600)
    seen: list[Event] = []
    async for event in producing.follow(sid):
        seen.append(event)
        if event.id == 300:
            break
    other, _ = toy_streams(counted_log, stub_engine())

    async def follow(after: int) -> list[Event]:
        return [e async for e in other.follow(sid, after)]

    cursors = [-1, 5, 150, 299, 300]
    found = await asyncio.wait_for(asyncio.gather(*(follow(c) for c in cursors)), 60)
    whole = found[0]
    check_one_stream(whole, 600)
    for cursor, events in zip(cursors, found, strict=True):
        assert events == whole[cursor + 1 :], f"reader after {cursor}"
    await other.close()
    await producing.close()
