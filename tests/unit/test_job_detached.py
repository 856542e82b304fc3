"""A job's stream is detached: a reader that leaves (or none at all) never gets it ended as
abandoned, while an ordinary stream still is."""

from __future__ import annotations

import asyncio

from rag_stream.schemas.events import Done
from rag_stream.streaming.memory_log import MemoryEventLog
from tests.support.fakes import start_toy, stub_engine, toy_streams


async def _left_alone(detached: bool) -> Done:
    log = MemoryEventLog()
    # 400 tokens at 5 ms: 2 s of generation, far past the 0.2 s after which readers are missed
    streams, kind = toy_streams(
        log,
        stub_engine(delay_s=0.005),
        detached=detached,
        abandon_after_s=0.2,
        renew_interval_s=0.05,
    )
    sid = await start_toy(streams, kind, [1], 400)
    seen = 0
    async for _ in streams.follow(sid):  # a reader that takes a few events and leaves
        seen += 1
        if seen == 3:
            break
    await asyncio.sleep(1.0)  # nobody reads: far past abandon_after_s
    events = [e async for e in streams.follow(sid)]
    await streams.close()
    assert isinstance(events[-1], Done)
    return events[-1]


async def test_a_detached_stream_runs_to_its_end_with_no_reader() -> None:
    done = await _left_alone(detached=True)
    assert done.finish_reason == "length" and done.usage.completion_tokens == 400
    assert not done.abandoned


async def test_an_ordinary_stream_left_alone_is_still_ended_as_abandoned() -> None:
    done = await _left_alone(detached=False)
    assert done.finish_reason == "cancelled" and done.usage.completion_tokens < 400
    assert done.abandoned  # told apart from a cancel: nobody asked for the shortened text
