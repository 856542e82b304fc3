"""The streaming layer on the real Redis log, with the stub engine (no model needed)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis

from rag_stream.schemas.events import Done, Token
from rag_stream.streaming.event_log import EventLog
from rag_stream.streaming.memory_log import MemoryEventLog
from rag_stream.streaming.redis_log import RedisEventLog
from tests.conftest import REDIS_URL
from tests.support.fakes import ByteTokenizer, stub_engine, toy_streams
from tests.unit.test_streams import check_one_stream


class CountingLog(RedisEventLog):
    appends = 0

    async def append(self, *args: Any, **kwargs: Any) -> Any:
        self.appends += 1
        return await super().append(*args, **kwargs)


@pytest.fixture
async def redis_log() -> AsyncIterator[CountingLog]:
    client = Redis.from_url(REDIS_URL)
    yield CountingLog(client, prefix=f"rs-unit-{uuid.uuid4().hex[:8]}")
    await client.aclose()


async def test_appends_are_batched(redis_log: CountingLog) -> None:
    engine = stub_engine()
    streams, kind = toy_streams(redis_log, engine, flush_interval_ms=5, flush_max_events=32)
    sid = await streams.start(kind, kind.accept(list(b"hello"), 400))
    check_one_stream([e async for e in streams.follow(sid)], 400)
    assert redis_log.appends < 400 / 8, redis_log.appends
    await streams.close()


@pytest.mark.parametrize("where", ["redis", "memory"])
async def test_same_events_with_and_without_checkpointing(
    redis_log: CountingLog, where: str
) -> None:
    engine = stub_engine()
    log: EventLog = redis_log if where == "redis" else MemoryEventLog()
    streams, kind = toy_streams(log, engine)
    sid = await streams.start(kind, kind.accept(list(b"hello"), 60))
    events = [e async for e in streams.follow(sid)]
    ids = check_one_stream(events, 60)
    tokens = [e for e in events if isinstance(e, Token)]
    assert "".join(e.text for e in tokens) == ByteTokenizer().decode(ids)
    assert isinstance(events[-1], Done)
    meta = await log.meta(sid)
    assert meta is not None and meta.status == "done" and meta.kind == "toy"
    await streams.close()


async def test_takeover_on_redis_continues_without_gap_or_repeat(redis_log: CountingLog) -> None:
    engine = stub_engine(delay_s=0.002)
    crashing, kind = toy_streams(redis_log, engine, lease_ms=500)
    sid = await crashing.start(kind, kind.accept([7, 8, 9], 300))
    seen = 0
    async for _ in crashing.follow(sid):
        seen += 1
        if seen == 10:
            break
    await crashing.close()
    meta = await redis_log.meta(sid)
    assert meta is not None and meta.status == "running"  # interrupted mid-stream
    survivor, _ = toy_streams(redis_log, engine, lease_ms=500)
    events = [e async for e in survivor.follow(sid)]
    ids = check_one_stream(events, 300)
    reference = [
        t
        async for s in engine.generate("ref", [7, 8, 9], kind.accept([], 300).plan.sampling())
        for t in s.token_ids
    ]
    assert ids == reference
    await survivor.close()
