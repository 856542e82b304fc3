"""The stream manager with the stub engine, on the real Redis and on the in-process log."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis

from rag_stream.generation.engine import FinishReason, Sampling
from rag_stream.generation.stub import StubEngine
from rag_stream.pipeline.context import StreamContext
from rag_stream.pipeline.generate import generate_body, generation_plan
from rag_stream.schemas.events import Done, Event, Token
from rag_stream.settings import StreamingSettings
from rag_stream.streaming.event_log import EventLog, RedisEventLog
from rag_stream.streaming.manager import StreamManager
from rag_stream.streaming.memory_log import MemoryEventLog
from tests.conftest import REDIS_URL


class CountingLog(RedisEventLog):
    appends = 0

    async def append(self, *args: Any, **kwargs: Any) -> Any:
        self.appends += 1
        return await super().append(*args, **kwargs)


async def _finalize(ctx: StreamContext, reason: FinishReason, event_id: int) -> Done:
    return Done(id=event_id, finish_reason=reason, usage=ctx.run.usage())


def _manager(log: EventLog, engine: StubEngine, **cfg: Any) -> StreamManager:
    async def provide() -> StubEngine:
        return engine

    settings = StreamingSettings(**cfg)
    return StreamManager(log, settings, provide, {"generate": _finalize})  # type: ignore[arg-type]


@pytest.fixture
async def redis_log() -> AsyncIterator[CountingLog]:
    client = Redis.from_url(REDIS_URL)
    yield CountingLog(client, prefix=f"rs-unit-{uuid.uuid4().hex[:8]}")
    await client.aclose()


async def _run(manager: StreamManager, engine: StubEngine, n: int) -> tuple[str, list[Event]]:
    plan = generation_plan(engine.tokenizer.encode("hello", add_special_tokens=False), Sampling(n))
    sid = await manager.start(model="stub", kind="generate", body=lambda c: generate_body(c, plan))
    return sid, [e async for e in manager.follow(sid, -1)]


def _check(events: list[Event], n: int) -> None:
    assert [e.id for e in events] == list(range(len(events)))
    tokens = [e for e in events if isinstance(e, Token)]
    assert sum(len(t.token_ids) for t in tokens) == n
    assert isinstance(events[-1], Done)


async def test_appends_are_batched(tokenizer: Any, redis_log: CountingLog) -> None:
    engine = StubEngine(tokenizer)
    manager = _manager(redis_log, engine, flush_interval_ms=5, flush_max_events=32)
    _, events = await _run(manager, engine, 400)
    _check(events, 400)
    assert redis_log.appends < 400 / 8, redis_log.appends
    await manager.close()


@pytest.mark.parametrize("kind", ["redis", "memory"])
async def test_same_events_with_and_without_checkpointing(
    tokenizer: Any, redis_log: CountingLog, kind: str
) -> None:
    engine = StubEngine(tokenizer)
    log: EventLog = redis_log if kind == "redis" else MemoryEventLog()
    manager = _manager(log, engine)
    _, events = await _run(manager, engine, 60)
    _check(events, 60)
    tokens = [e for e in events if isinstance(e, Token)]
    ids = [t for e in tokens for t in e.token_ids]
    assert "".join(e.text for e in tokens) == tokenizer.decode(ids)
    # only the last event may end in an incomplete character (max_tokens cut it)
    assert all("\ufffd" not in e.text for e in tokens[:-1])
    assert "断点续传" in tokenizer.decode(ids)
    await manager.close()


async def test_cancel_ends_within_a_flush(tokenizer: Any, redis_log: CountingLog) -> None:
    engine = StubEngine(tokenizer, delay_s=0.01)
    manager = _manager(redis_log, engine)
    plan = generation_plan([1, 2, 3], Sampling(5000))
    sid = await manager.start(model="stub", kind="generate", body=lambda c: generate_body(c, plan))
    await asyncio.sleep(0.3)
    await redis_log.request_cancel(sid)
    events = [e async for e in manager.follow(sid, -1)]
    _check(events, sum(len(e.token_ids) for e in events if isinstance(e, Token)))
    done = events[-1]
    assert isinstance(done, Done) and done.finish_reason == "cancelled"
    assert done.usage.completion_tokens < 200
    await manager.close()


async def test_takeover_continues_without_gap_or_repeat(
    tokenizer: Any, redis_log: CountingLog
) -> None:
    engine = StubEngine(tokenizer, delay_s=0.005)
    crashing = _manager(redis_log, engine, lease_ms=500)
    plan = generation_plan([7, 8, 9], Sampling(300))
    sid = await crashing.start(model="stub", kind="generate", body=lambda c: generate_body(c, plan))
    await asyncio.sleep(0.4)
    await crashing.close()  # its producer stops mid-stream; its lease runs out
    survivor = _manager(redis_log, engine, lease_ms=500, read_block_ms=100)
    events = [e async for e in survivor.follow(sid, -1)]
    _check(events, 300)
    ids = [t for e in events if isinstance(e, Token) for t in e.token_ids]
    reference = [
        t async for s in engine.generate("ref", [7, 8, 9], Sampling(300)) for t in s.token_ids
    ]
    assert ids == reference
    # the stub's text has Chinese: deltas stay whole characters across the takeover too
    tokens = [e for e in events if isinstance(e, Token)]
    assert "".join(e.text for e in tokens) == tokenizer.decode(ids)
    assert all("\ufffd" not in e.text for e in tokens[:-1])
    await survivor.close()
