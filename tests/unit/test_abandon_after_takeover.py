"""A stream with a short abandonment window of its own (a chat completion's) that is taken over
gives its readers, who all lost their connection with the dead process, the service's longer
window to come back; once one has, and leaves again, its own short window applies."""

from __future__ import annotations

from rag_stream.schemas.events import Done, Event
from rag_stream.streaming.memory_log import MemoryEventLog
from tests.support.fakes import start_toy, stub_engine, toy_streams
from tests.support.waiting import eventually

OWN_WINDOW_S = 0.3  # the stream's own (a chat stream's streaming.chat_abandon_after_s)
SERVICE_WINDOW_S = 30.0  # streaming.abandon_after_s
TOKENS = 5000  # 10 s at 2 ms a token: far longer than the test reads


async def test_a_taken_over_stream_waits_for_its_readers_then_keeps_its_own_window() -> None:
    engine = stub_engine(delay_s=0.002)
    log = MemoryEventLog()
    cfg = {"lease_ms": 500, "abandon_after_s": SERVICE_WINDOW_S, "sweep_interval_s": 0.1}
    crashing, kind = toy_streams(log, engine, renew_interval_s=0.05, **cfg)
    sid = await start_toy(crashing, kind, [4, 5, 6], TOKENS, abandon_after_s=OWN_WINDOW_S)
    first: list[Event] = []
    async for event in crashing.follow(sid):
        first.append(event)
        if len(first) == 20:
            break
    await crashing.close()  # its producer stops mid-stream, as a killed process's does
    survivor, _ = toy_streams(log, engine, renew_interval_s=0.05, **cfg)
    survivor.start_sweeper()  # it takes over running streams whose producer is gone

    async def produced(n: int) -> bool:
        meta = await log.meta(sid)
        return meta is not None and meta.status == "running" and meta.last_event_id >= n

    # taken over with no reader: 500 events at 2 ms are 1 s, over three times its own window
    await eventually(lambda: produced(len(first) + 500), "500 events after the takeover", 20)
    seen: list[Event] = []
    async for event in survivor.follow(sid, after=len(first) + 500):  # a reader is back...
        seen.append(event)
        if len(seen) == 5:
            break  # ...and leaves: now its own short window counts

    async def ended() -> bool:
        meta = await log.meta(sid)
        return meta is not None and meta.status != "running"

    await eventually(ended, "the stream ended with no reader", 20)  # (reading would keep it)
    events = [e async for e in survivor.follow(sid)]
    done = events[-1]
    assert isinstance(done, Done) and done.finish_reason == "cancelled" and done.abandoned
    assert done.id < TOKENS  # stopped long before its end
    await survivor.close()
