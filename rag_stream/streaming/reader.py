"""Readers: follow a stream's log from a cursor to its terminal event, from any process."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from redis.exceptions import RedisError

from rag_stream.schemas.events import Event, TransientError, is_terminal
from rag_stream.streaming.event_log import EventLog, StreamMeta
from rag_stream.streaming.takeover import Takeover


def transient_error(code: str, message: str) -> TransientError:
    """An error the reader saw itself (not in the log): sent without an SSE id (see to_sse)."""
    return TransientError(id=0, code=code, message=message)


class Readers:
    def __init__(self, event_log: EventLog, takeover: Takeover, read_block_ms: int) -> None:
        self._log = event_log
        self._takeover = takeover
        self._block_ms = read_block_ms

    async def follow(self, sid: str, after: int) -> AsyncIterator[Event]:
        """Every event after ``after``, then live events until the terminal one. A running
        stream whose producer died is taken over on the way."""
        cursor = after
        while True:
            try:
                events = await self._log.read(sid, cursor, self._block_ms)
            except RedisError as exc:
                yield transient_error("event_log_unavailable", f"event log unavailable: {exc}")
                return
            for event in events:
                yield event
                cursor = event.id
                if is_terminal(event):
                    return
            if events:
                continue
            try:
                meta = await self._log.meta(sid)
                if meta is None:
                    yield transient_error("not_found", "stream expired")
                    return
                if meta.status != "running" and cursor >= meta.last_event_id:
                    return
                if meta.status == "running" and meta.lease_owner is None:
                    await self._takeover.take_over(sid)
            except RedisError as exc:
                yield transient_error("event_log_unavailable", f"event log unavailable: {exc}")
                return

    async def wait_finished(self, sid: str, timeout_s: float) -> StreamMeta | None:
        deadline = time.monotonic() + timeout_s
        while True:
            meta = await self._log.meta(sid)
            if meta is None or meta.status != "running" or time.monotonic() > deadline:
                return meta
            await asyncio.sleep(0.05)
