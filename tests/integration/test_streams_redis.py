"""The streaming layer on the real Redis log, with the stub engine (no model needed)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from rag_stream.generation.engine import Sampling
from rag_stream.schemas.events import Done, StreamStarted, Token
from rag_stream.schemas.tenants import LOCAL_TENANT
from rag_stream.streaming.event_log import Append, EventLog, NewStream
from rag_stream.streaming.memory_log import MemoryEventLog
from rag_stream.streaming.redis_log import RedisEventLog
from tests.conftest import REDIS_URL
from tests.support.fakes import ByteTokenizer, ToyIntent, start_toy, stub_engine, toy_streams
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


# Text that a packing of the append's arguments could change: quotes, backslashes, control
# characters, line and paragraph separators, CJK and a character outside the BMP
AWKWARD = ['say "hi"\\n', "tab\there\nnew line", "\x00\x1f\u2028\u2029", "你好", "🙂 ok", "\\u0041"]


async def test_one_append_of_several_streams_lands_each_event_byte_for_byte(
    redis_log: CountingLog,
) -> None:
    """One append call carries four streams: one written, one whose lease another process
    holds, one whose log no longer ends where its writer left it, one only renewing its lease.
    Each stream gets its own status back, and the written events read back as the very JSON
    they were written as."""
    client = Redis.from_url(REDIS_URL)
    sids = [f"pack-{uuid.uuid4().hex[:8]}" for _ in range(4)]
    try:
        for sid in sids:
            first = StreamStarted(id=0, stream_id=sid, model="m", created=1.0)
            await redis_log.create(sid, first, NewStream("m", "toy", 1.0), "me", 30_000)
        tokens = [Token(id=i + 1, index=i, text=t, token_ids=[i]) for i, t in enumerate(AWKWARD)]
        stale = Token(id=2, index=1, text="x", token_ids=[1])
        results = await redis_log.append(
            [
                Append(sids[0], "me", tokens, 30_000, after=0),
                Append(sids[1], "someone-else", tokens[:1], 30_000, after=0),
                Append(sids[2], "me", [stale], 30_000, after=1),  # its log ends at 0
                Append(sids[3], "me", [], 45_000, after=0),
            ]
        )
        assert [(r.owned, r.log_lost) for r in results] == [
            (True, False),
            (False, False),
            (False, True),
            (True, False),
        ]
        entries = await client.xrange(f"{redis_log._p}:s:{sids[0]}:log")
        assert [e[b"e"] for _id, e in entries[1:]] == [t.model_dump_json().encode() for t in tokens]
        # event n is entry (n+1)-0 (the script numbers a batch's entries from its ``after``)
        assert [entry for entry, _ in entries] == [
            f"{i + 1}-0".encode() for i in range(len(entries))
        ]
        assert [entry_id for entry_id, _ in entries] == [f"{i}-0".encode() for i in range(1, 8)]
        assert await redis_log.read(sids[0], 0, None) == tokens
        for sid in sids[1:]:
            assert len(await client.xrange(f"{redis_log._p}:s:{sid}:log")) == 1
        assert 40_000 < await client.pttl(f"{redis_log._p}:s:{sids[3]}:lease") <= 45_000
    finally:
        for key in await client.keys(f"{redis_log._p}:*"):
            await client.delete(key)
        await client.aclose()


async def test_appends_are_batched(redis_log: CountingLog) -> None:
    engine = stub_engine()
    streams, kind = toy_streams(redis_log, engine, flush_interval_ms=5, flush_max_events=32)
    sid = await start_toy(streams, kind, list(b"hello"), 400)
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
    sid = await start_toy(streams, kind, list(b"hello"), 60)
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
    sid = await start_toy(crashing, kind, [7, 8, 9], 300)
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
        async for s in engine.generate("ref", [7, 8, 9], Sampling(max_tokens=300))
        for t in s.token_ids
    ]
    assert ids == reference
    await survivor.close()


async def test_a_running_stream_whose_meta_expired_leaves_the_running_list(
    redis_log: CountingLog,
) -> None:
    """A stream listed as running whose meta is gone (expired after the running TTL, when no
    live process could continue it) is dropped by the sweeper: before, it stayed in the list
    for ever, a lookup by every sweeper every few seconds, and the list's key never went."""
    engine = stub_engine(delay_s=0.002)
    crashing, kind = toy_streams(redis_log, engine, lease_ms=500)
    sid = await start_toy(crashing, kind, [7, 8, 9], 300)
    async for event in crashing.follow(sid):  # in the log, so listed as running (CI once
        if event.id == 5:  # closed it before its first append: the list was empty)
            break
    await crashing.close()  # its process stops mid-stream
    client = Redis.from_url(REDIS_URL)
    prefix = redis_log._p
    try:
        await client.delete(f"{prefix}:s:{sid}:meta")  # as the running TTL would
        assert await redis_log.running() == [sid]
        sweeping, _ = toy_streams(redis_log, engine, sweep_interval_s=0.1)
        sweeping.start_sweeper()
        for _ in range(50):
            if not await redis_log.running():
                break
            await asyncio.sleep(0.1)
        await sweeping.close()
        assert await redis_log.running() == []
        assert not await client.exists(f"{prefix}:active")
    finally:
        for key in await client.keys(f"{prefix}:*"):
            await client.delete(key)
        await client.aclose()


async def test_a_reader_or_a_cancel_never_brings_back_a_stream_whose_meta_expired(
    redis_log: CountingLog,
) -> None:
    """A reader's heartbeat and a cancel write to the stream's meta hash; once it has expired,
    writing there made a hash with no expiry (a key that stayed for ever, and a stream that
    looked running). They write only to a meta that exists."""
    engine = stub_engine()
    streams, kind = toy_streams(redis_log, engine)
    sid = await start_toy(streams, kind, list(b"hello"), 20)
    assert len([e async for e in streams.follow(sid)]) > 1
    await streams.close()
    client = Redis.from_url(REDIS_URL)
    meta = f"{redis_log._p}:s:{sid}:meta"
    try:
        assert await client.hget(meta, "seen")  # the heartbeat of a live stream still lands
        await client.delete(meta, f"{redis_log._p}:s:{sid}:log")  # as its retention would
        await redis_log.read_many({sid: 0}, None)
        await redis_log.request_cancel(sid)
        assert not await client.exists(meta)
        assert await redis_log.meta(sid) is None
    finally:
        for key in await client.keys(f"{redis_log._p}:*"):
            await client.delete(key)
        await client.aclose()


async def test_a_stopped_process_leaves_no_presence_record_behind(redis_log: CountingLog) -> None:
    """Each process publishes its presence under a key of its own; a process that stops now
    lets it go once its leases have lapsed, where it used to stay a day: one more key for
    every start of a process."""
    streams, _ = toy_streams(redis_log, stub_engine(), lease_ms=500, sweep_interval_s=0.1)
    streams.start_sweeper()
    key = f"{redis_log._p}:proc:{streams.producers.owner}"
    client = Redis.from_url(REDIS_URL)
    try:
        for _ in range(50):
            if await client.exists(key):
                break
            await asyncio.sleep(0.1)
        assert await client.ttl(key) > 3600  # while it runs: republished by every sweep
        await streams.close()
        assert 0 < await client.pttl(key) <= 1000  # twice the lease
        await asyncio.sleep(1.2)
        assert not await client.exists(key)
    finally:
        for k in await client.keys(f"{redis_log._p}:*"):
            await client.delete(k)
        await client.aclose()


class FlakyPlans(RedisEventLog):
    """Plans cannot be saved while ``down`` (or for the first ``failures`` tries)."""

    def __init__(self, *args: Any, failures: int = 0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.failures = failures
        self.down = False
        self.tries = 0

    async def set_plan(self, stream_id: str, plan_json: str) -> None:
        self.tries += 1
        if self.down or self.tries <= self.failures:
            raise RedisConnectionError("Connection refused (a restart)")
        await super().set_plan(stream_id, plan_json)


async def test_a_plan_save_during_a_redis_blip_is_retried() -> None:
    """Saving the plan was the one Redis write of a producer that was not retried: a job
    whose next section began while Redis restarted failed (`internal_error`)."""
    client = Redis.from_url(REDIS_URL)
    log = FlakyPlans(client, prefix=f"rs-unit-{uuid.uuid4().hex[:8]}", failures=2)
    streams, kind = toy_streams(log, stub_engine(), redis_retries=3)
    try:
        sid = await start_toy(streams, kind, list(b"blip"), 50)
        events = [e async for e in streams.follow(sid)]
        check_one_stream(events, 50)
        assert isinstance(events[-1], Done) and log.tries == 3
    finally:
        await streams.close()
        for key in await client.keys(f"{log._p}:*"):
            await client.delete(key)
        await client.aclose()


async def test_a_plan_redis_never_takes_leaves_the_stream_to_a_takeover() -> None:
    """When Redis stays away beyond the retries, the stream is not ended with an error: it is
    left, as a failed append leaves it, and continued from its log and its last saved plan
    once Redis answers."""
    client = Redis.from_url(REDIS_URL)
    prefix = f"rs-unit-{uuid.uuid4().hex[:8]}"
    log = FlakyPlans(client, prefix=prefix)
    log.down = True
    engine = stub_engine(delay_s=0.002)
    first, kind = toy_streams(log, engine, lease_ms=500, redis_retries=1)
    try:
        launched = await first.launch(
            kind, ToyIntent([7, 8, 9], 200), tenant=LOCAL_TENANT, priority="interactive"
        )
        sid, run = launched.stream_id, launched.producer
        # the plan saved before the run, as a job saves it when it starts (and each section)
        await RedisEventLog.set_plan(log, sid, run.plan.model_dump_json())
        for _ in range(50):
            if log.tries >= 2:  # both tries failed: the producer stops
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.3)
        meta = await log.meta(sid)
        assert meta is not None and meta.status == "running"  # left, not ended
        logged = await log.read(sid, -1, None)
        assert [type(e).__name__ for e in logged] == ["StreamStarted"]  # and no error event
        log.down = False
        survivor, _ = toy_streams(log, engine, lease_ms=500)
        events = [e async for e in survivor.follow(sid)]
        check_one_stream(events, 200)
        assert isinstance(events[-1], Done)
        await survivor.close()
    finally:
        await first.close()
        for key in await client.keys(f"{prefix}:*"):
            await client.delete(key)
        await client.aclose()


async def test_a_run_whose_log_is_lost_is_told(redis_log: CountingLog) -> None:
    """A stream whose log vanishes under it ends with `log_lost`, and its kind hears of it (a
    job marks its row failed; it stayed `running` for good)."""
    streams, kind = toy_streams(redis_log, stub_engine(delay_s=0.005))
    client = Redis.from_url(REDIS_URL)
    try:
        sid = await start_toy(streams, kind, list(b"gone"), 400)
        events = []
        async for event in streams.follow(sid):
            events.append(event)
            if len(events) == 20:  # mid-stream: Redis "restarts empty"
                for key in await client.keys(f"{redis_log._p}:*"):
                    await client.delete(key)
        assert events[-1].type == "error" and events[-1].code == "log_lost"  # type: ignore[union-attr]
        assert kind.lost == ["log_lost"] and kind.finished == []
    finally:
        await streams.close()
        for key in await client.keys(f"{redis_log._p}:*"):
            await client.delete(key)
        await client.aclose()
