"""The process's flusher: the new events of all its streams go to the log in one call."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from rag_stream.streaming.event_log import Append, AppendResult
from rag_stream.streaming.memory_log import MemoryEventLog
from tests.support.fakes import start_toy, stub_engine, toy_streams
from tests.unit.test_streams import check_one_stream


class CountingLog(MemoryEventLog):
    """The in-process log, counting append calls and the streams each carried."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[int] = []

    async def append(self, batches: Sequence[Append]) -> list[AppendResult]:
        self.calls.append(len({b.stream_id for b in batches}))
        await asyncio.sleep(0.001)  # a round trip: streams keep emitting meanwhile
        return await super().append(batches)


async def test_streams_decoding_together_share_each_append() -> None:
    log = CountingLog()
    # 8 streams at the same pace, as an engine batch decodes them: one token each per step
    streams, kind = toy_streams(log, stub_engine(delay_s=0.002))
    sids = [await start_toy(streams, kind, [i + 1], 150) for i in range(8)]

    async def read(sid: str) -> None:
        check_one_stream([e async for e in streams.follow(sid)], 150)

    await asyncio.gather(*(read(sid) for sid in sids))
    await streams.close()
    appended_tokens = 8 * 150
    assert sum(log.calls) >= 8  # every stream was appended
    # one call per stream per token would be 1,200 calls; shared, far fewer, most with all 8
    assert len(log.calls) < appended_tokens / 4, len(log.calls)
    assert max(log.calls) == 8


async def test_an_idle_stream_keeps_its_lease_through_the_flusher() -> None:
    log = CountingLog()
    # a token every 0.3 s against a 0.1 s renewal: renewals go out between the tokens
    streams, kind = toy_streams(log, stub_engine(delay_s=0.3), renew_interval_s=0.1)
    sid = await start_toy(streams, kind, [1], 3)
    check_one_stream([e async for e in streams.follow(sid)], 3)
    await streams.close()
    # 3 tokens give at most 3 appends with events; the rest renewed the lease
    assert len(log.calls) >= 6, log.calls


class StallingLog(MemoryEventLog):
    """The in-process log, stalled for its first append (Redis slow), recording each append's
    largest batch."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []

    async def append(self, batches: Sequence[Append]) -> list[AppendResult]:
        self.sizes.append(max((len(b.events) for b in batches), default=0))
        if len(self.sizes) == 1:
            # meanwhile the stream buffers hundreds of events: at least 150 (three appends'
            # worth) even at 6 ms a token (0.3 s once left 147 on a busy machine)
            await asyncio.sleep(1.0)
        return await super().append(batches)


async def test_a_writer_catches_up_after_a_stall_in_bounded_appends() -> None:
    log = StallingLog()
    streams, kind = toy_streams(log, stub_engine(delay_s=0.0002), append_max_events=50)
    sid = await start_toy(streams, kind, [1], 1000)
    check_one_stream([e async for e in streams.follow(sid)], 1000)  # whole, in order
    await streams.close()
    assert max(log.sizes) == 50, log.sizes  # the backlog went out 50 at a time
    assert sum(1 for s in log.sizes if s == 50) >= 3, log.sizes
