"""The Redis event log, counting the log entries its reads return for each stream: what a test
asserts a resume's cost on (entries read), rather than on a time."""

from __future__ import annotations

import asyncio
import contextvars
from collections import Counter
from collections.abc import Mapping
from typing import Any

from rag_stream.schemas.events import Event
from rag_stream.streaming.redis_log import RedisEventLog

# Inside ``read``: a ``read_many`` it makes (as versions before this one did) is not counted twice.
_reading = contextvars.ContextVar("reading", default=False)


class CountingRedisEventLog(RedisEventLog):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.entries_read: Counter[str] = Counter()
        # stream id -> seconds each ``read`` of it takes longer: widens the time a reader spends
        # filling a feed, so that what else runs meanwhile surely runs
        self.slow_reads: dict[str, float] = {}

    async def read(
        self, stream_id: str, after: int, block_ms: int | None, *args: Any
    ) -> list[Event]:
        token = _reading.set(True)
        try:
            if stream_id in self.slow_reads:
                await asyncio.sleep(self.slow_reads[stream_id])
            events = await super().read(stream_id, after, block_ms, *args)
        finally:
            _reading.reset(token)
        self.entries_read[stream_id] += len(events)
        return events

    async def read_many(
        self, cursors: Mapping[str, int], block_ms: int | None
    ) -> dict[str, list[Event]]:
        found = await super().read_many(cursors, block_ms)
        if not _reading.get():
            for sid, events in found.items():
                self.entries_read[sid] += len(events)
        return found
