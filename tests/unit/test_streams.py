"""The streaming layer with the stub engine on the in-process event log (no Redis, no models)."""

from __future__ import annotations

import asyncio

import pytest
from redis.exceptions import RedisError

from rag_stream.errors import NotFound
from rag_stream.generation.engine import Sampling
from rag_stream.schemas.events import Done, ErrorEvent, Event, Token
from rag_stream.schemas.tenants import LOCAL_TENANT
from rag_stream.streaming.memory_log import MemoryEventLog
from tests.support.fakes import ByteTokenizer, start_toy, stub_engine, toy_streams


def check_one_stream(events: list[Event], n_tokens: int | None = None) -> list[int]:
    """Contiguous ids, no token twice or missing, one terminal event; returns the token ids."""
    assert [e.id for e in events] == list(range(len(events)))
    tokens = [e for e in events if isinstance(e, Token)]
    sizes = [len(t.token_ids) for t in tokens]
    assert [t.index for t in tokens] == [sum(sizes[:i]) for i in range(len(sizes))]
    assert isinstance(events[-1], Done | ErrorEvent)
    ids = [i for t in tokens for i in t.token_ids]
    if n_tokens is not None:
        assert len(ids) == n_tokens
    return ids


async def test_events_are_contiguous_and_text_is_whole_characters() -> None:
    engine = stub_engine()
    streams, kind = toy_streams(MemoryEventLog(), engine)
    sid = await start_toy(streams, kind, list(b"hello"), 300)
    events = [e async for e in streams.follow(sid)]
    ids = check_one_stream(events, 300)
    tokens = [e for e in events if isinstance(e, Token)]
    text = "".join(t.text for t in tokens)
    assert text == ByteTokenizer().decode(ids)
    assert "断点续传" in text  # multi-byte characters, split over byte tokens
    assert all("\ufffd" not in t.text for t in tokens[:-1])  # only a cut at the end may split
    assert kind.finished == [text]
    await streams.close()


async def test_cancel_stops_a_running_stream() -> None:
    engine = stub_engine(delay_s=0.002)
    log = MemoryEventLog()
    streams, kind = toy_streams(log, engine)
    sid = await start_toy(streams, kind, [1, 2, 3], 100_000)
    seen: list[Event] = []
    async for event in streams.follow(sid):
        seen.append(event)
        if len(seen) == 5:  # the stream is demonstrably running
            outcome = await streams.cancel(sid, tenant=LOCAL_TENANT)
            assert outcome.cancelled
    check_one_stream(seen)
    done = seen[-1]
    assert isinstance(done, Done) and done.finish_reason == "cancelled"
    assert not done.abandoned
    assert done.usage.completion_tokens < 100_000
    again = await streams.cancel(sid, tenant=LOCAL_TENANT)
    assert not again.cancelled and "already finished" in again.message
    await streams.close()


async def test_takeover_continues_without_gap_or_repeat() -> None:
    engine = stub_engine(delay_s=0.001)
    log = MemoryEventLog()
    crashing, kind = toy_streams(log, engine, lease_ms=500)
    sid = await start_toy(crashing, kind, [7, 8, 9], 400, tenant="acme")
    first: list[Event] = []
    async for event in crashing.follow(sid):
        first.append(event)
        if len(first) == 20:
            break
    await crashing.close()  # its producer stops mid-stream; its lease runs out
    assert (await log.meta(sid)).status == "running"  # type: ignore[union-attr]
    survivor, kind2 = toy_streams(log, engine, lease_ms=500)
    events = [e async for e in survivor.follow(sid)]
    ids = check_one_stream(events, 400)
    reference = [
        t
        async for s in engine.generate("ref", [7, 8, 9], Sampling(max_tokens=400))
        for t in s.token_ids
    ]
    assert ids == reference
    assert [e.model_dump() for e in events[:20]] == [e.model_dump() for e in first]
    tokens = [e for e in events if isinstance(e, Token)]
    assert kind2.finished == ["".join(t.text for t in tokens)]  # logged text + its own
    # the stream is still its tenant's, for the finisher and for every reader
    assert kind2.finished_for == ["acme"]
    assert (await survivor.status(sid, tenant="acme")).status == "done"
    with pytest.raises(NotFound):
        await survivor.status(sid, tenant=LOCAL_TENANT)
    await survivor.close()


async def test_a_plan_from_another_version_ends_the_stream_with_a_clear_error() -> None:
    engine = stub_engine(delay_s=0.001)
    log = MemoryEventLog()
    crashing, kind = toy_streams(log, engine, lease_ms=500)
    sid = await start_toy(crashing, kind, [1], 1000)
    async for event in crashing.follow(sid):
        if isinstance(event, Token):
            break  # it is generating: interrupted mid-stream
    await crashing.close()
    await log.set_plan(sid, '{"prompt_ids": [1], "max_tokens": 1000, "renamed_field": 1}')
    survivor, _ = toy_streams(log, engine, lease_ms=500)
    events = [e async for e in survivor.follow(sid)]
    check_one_stream(events)
    error = events[-1]
    assert isinstance(error, ErrorEvent) and error.code == "incompatible_plan"
    assert "renamed_field" in error.message
    await survivor.close()


def test_cited_markers_are_the_answers_markers_that_name_a_source() -> None:
    from rag_stream.generation.markers import cited_markers

    sources = range(1, 4)
    text = "Herons [2] nest in the delta [1][2]; see also [9] and [0] and [ 3]."
    assert cited_markers(text, sources) == [1, 2]
    assert cited_markers("no markers", sources) == []
    assert cited_markers("a job's source [1204], not [12045]", {1204, 12045}) == [1204]


async def test_close_ends_the_sweeper_even_when_a_redis_call_swallows_the_cancel() -> None:
    """A cancel landing inside a Redis call can come out of it as a connection error, which
    the sweeper survives by design; close() waited for it for ever (a hung CI run)."""

    inside = asyncio.Event()

    class Swallowing(MemoryEventLog):
        swallowed = 0

        async def announce(self, owner: str) -> None:
            inside.set()
            try:
                await asyncio.sleep(0.5)
            except asyncio.CancelledError:
                if self.swallowed:  # only the first: the wait_for below can end the test
                    raise
                self.swallowed += 1
                raise RedisError("Connection closed by server.") from None

    log = Swallowing()
    streams, _ = toy_streams(log, stub_engine(), sweep_interval_s=0.001)
    streams.start_sweeper()
    await asyncio.wait_for(inside.wait(), 5)  # the sweeper is inside announce
    await asyncio.wait_for(streams.close(), 5)
    assert log.swallowed == 1  # the cancel did land inside the call, and was swallowed
